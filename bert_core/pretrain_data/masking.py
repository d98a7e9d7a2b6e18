"""Masked-LM corruption, vectorised over a batch of instances (used at build time and, for dynamic
masking, at load time).

Follows ``create_masked_lm_predictions`` of Google's ``create_pretraining_data.py`` (BERT paper §3.1):

* candidates are the non-special positions; ``num_to_predict = min(max_predictions_per_seq,
  max(1, round(n * masked_lm_prob)))`` positions are chosen uniformly at random among them;
* each chosen position becomes ``[MASK]`` with probability 0.8, a uniformly random vocabulary id with 0.1,
  and stays unchanged with 0.1 (the paper's split; ``pretrain_data.mask_split`` chooses another, e.g. the
  paper's 100/0/0 ablation, recorded in ``index.json`` and applied alike at build and at load time); the
  label is the original id;
* whole-word masking: a word (a piece and its ``##`` continuations) is chosen or skipped as a unit, words
  in random order, skipping a word that would overshoot ``num_to_predict``; the 80/10/10 draw stays per
  token, as in Google's code.

Deviations, on purpose: ``n`` counts the *candidate* positions (Google multiplies the full length,
[CLS]/[SEP] included, so its share of maskable tokens is slightly above 15%, e.g. 19/125 at length 128);
literal special tokens in text (``[UNK]``, ``[PAD]``, ...) are never candidates, as in Hugging Face's
collator (Google only excludes [CLS] and [SEP]); and a ``##`` piece only joins the word right before it
(Google's loop attaches a segment-initial ``##`` piece to the last word of segment A).

Randomness is passed in (``keys``, ``action_u``, ``random_ids``) so the build can draw it from a seeded
generator and the loader from a counter-based hash (:func:`hash_uniform`) that makes an instance's mask a
function of (seed, epoch, instance) only.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

MASK_PROB = 0.8  # the paper's share of chosen positions replaced by [MASK]
KEEP_PROB = 0.1  # the paper's share left unchanged; the remaining 0.1 get a random id


@dataclass(frozen=True)
class MaskingSpec:
    """The MLM settings recorded with each output (``index.json``)."""

    masked_lm_prob: float
    max_predictions_per_seq: int
    vocab_size: int
    mask_id: int
    special_ids: tuple[int, ...]
    whole_word: bool = False
    cls_id: int = -1
    sep_id: int = -1
    pad_id: int = -1
    mask_prob: float = MASK_PROB
    keep_prob: float = KEEP_PROB

    @property
    def random_prob(self) -> float:
        """Share of the chosen positions given a random id (the rest of the split; never below 0)."""
        return max(0.0, 1.0 - self.mask_prob - self.keep_prob)

    @property
    def layout_ids(self) -> tuple[int, int, int]:
        """``([CLS], [SEP], [PAD])`` ids for :func:`bert_core.pretrain_data.instances.materialize`."""
        return self.cls_id, self.sep_id, self.pad_id


def eligible_positions(
    ids: np.ndarray, lengths: np.ndarray, len_a: np.ndarray, special_ids: tuple[int, ...] | np.ndarray
) -> np.ndarray:
    """Positions that may be masked.

    Args:
        ids: ``(N, T)`` unmasked token ids laid out ``[CLS] A [SEP] B [SEP] pad``.
        lengths: ``(N,)`` tokens per instance before padding.
        len_a: ``(N,)`` tokens of segment A.
        special_ids: ids never masked even inside a segment.

    Returns:
        ``(N, T)`` bool.
    """
    pos = np.arange(ids.shape[1])[None, :]
    inside = (pos > 0) & (pos < lengths[:, None] - 1) & (pos != len_a[:, None] + 1)
    return inside & ~np.isin(ids, np.asarray(special_ids))


def num_to_predict(n_eligible: np.ndarray, masked_lm_prob: float, max_predictions: int) -> np.ndarray:
    """``min(max_predictions, max(1, round(n * p)))`` per instance (round half to even, like Python 3),
    never more than ``n``."""
    k = np.rint(n_eligible * masked_lm_prob).astype(np.int64)
    k = np.clip(k, 1, max_predictions)
    return np.minimum(k, n_eligible)


def _word_starts(ids: np.ndarray, eligible: np.ndarray, continuation: np.ndarray) -> np.ndarray:
    """``(N, T)`` bool: eligible positions that start a word (a ``##`` piece after an eligible position
    belongs to the word before it)."""
    cont = eligible & continuation[ids]
    cont[:, 1:] &= eligible[:, :-1]
    cont[:, 0] = False
    return eligible & ~cont


def choose_positions(
    keys: np.ndarray,
    eligible: np.ndarray,
    k: np.ndarray,
    *,
    ids: np.ndarray | None = None,
    continuation: np.ndarray | None = None,
) -> np.ndarray:
    """Choose ``k[i]`` eligible positions of row ``i`` uniformly at random.

    Args:
        keys: ``(N, T)`` uniform random numbers in [0, 1); lower keys are chosen first.
        eligible: ``(N, T)`` bool candidates.
        k: ``(N,)`` how many to choose.
        ids: ``(N, T)`` token ids, only for whole-word masking.
        continuation: ``(V,)`` bool, ``##`` pieces; given = whole-word masking.

    Returns:
        ``(N, T)`` bool, the chosen positions.
    """
    n, t = keys.shape
    chosen = np.zeros((n, t), dtype=bool)
    if continuation is None:
        kmax = int(k.max(initial=0))
        if kmax == 0:
            return chosen
        order = np.argsort(np.where(eligible, keys, 2.0), axis=1, kind="stable")[:, :kmax]
        np.put_along_axis(chosen, order, np.arange(kmax)[None, :] < k[:, None], axis=1)
        return chosen
    assert ids is not None, "whole-word masking needs the token ids"
    starts = _word_starts(ids, eligible, continuation)
    word = np.cumsum(starts, axis=1)  # word number (1-based) of every position in its row
    for i in range(n):
        s = np.flatnonzero(starts[i])
        if s.size == 0 or k[i] == 0:
            continue
        members = eligible[i] & (word[i] > 0)
        sizes = np.bincount(word[i][members], minlength=s.size + 1)[1:]
        order = np.argsort(keys[i, s], kind="stable")
        picked, filled, budget = [], 0, int(k[i])
        for w, size in zip(order.tolist(), sizes[order].tolist()):
            if filled >= budget:
                break
            if filled + size <= budget:  # a word that would overshoot is skipped (Google's rule)
                picked.append(w + 1)
                filled += size
        chosen[i] = members & np.isin(word[i], picked)
    return chosen


def corrupt(
    ids: np.ndarray,
    chosen: np.ndarray,
    action_u: np.ndarray,
    random_ids: np.ndarray,
    mask_id: int,
    mask_prob: float = MASK_PROB,
    keep_prob: float = KEEP_PROB,
) -> np.ndarray:
    """Apply the [MASK]/random/keep split (80/10/10 by default) to the chosen positions.

    A position becomes ``[MASK]`` when its uniform is below ``mask_prob``, stays unchanged up to
    ``mask_prob + keep_prob`` and gets its random id above: the paper's split draws exactly as before the
    split was a parameter, so its outputs keep their bytes.

    Args:
        ids: ``(N, T)`` unmasked ids.
        chosen: ``(N, T)`` bool.
        action_u: ``(C,)`` uniforms in [0, 1), one per chosen position in row-major order.
        random_ids: ``(C,)`` random vocabulary ids, same order.
        mask_id: id of ``[MASK]``.
        mask_prob: Share of the chosen positions replaced by ``[MASK]``.
        keep_prob: Share left unchanged (the rest get a random id).

    Returns:
        ``(N, T)`` corrupted ids (a copy).
    """
    out = ids.copy()
    rows, cols = np.nonzero(chosen)
    to_mask = action_u < mask_prob
    to_random = action_u >= mask_prob + keep_prob
    out[rows[to_mask], cols[to_mask]] = mask_id
    out[rows[to_random], cols[to_random]] = random_ids[to_random]
    return out


def mask_with_generator(
    ids: np.ndarray,
    lengths: np.ndarray,
    len_a: np.ndarray,
    spec: MaskingSpec,
    rng: np.random.Generator,
    continuation: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Static masking at build time: all randomness from ``rng``.

    Returns:
        ``(masked_ids, chosen)``, both ``(N, T)``.
    """
    eligible = eligible_positions(ids, lengths, len_a, spec.special_ids)
    k = num_to_predict(eligible.sum(axis=1), spec.masked_lm_prob, spec.max_predictions_per_seq)
    keys = rng.random(ids.shape)
    chosen = choose_positions(
        keys, eligible, k, ids=ids, continuation=continuation if spec.whole_word else None
    )
    c = int(chosen.sum())
    out = corrupt(
        ids,
        chosen,
        rng.random(c),
        rng.integers(0, spec.vocab_size, c),
        spec.mask_id,
        spec.mask_prob,
        spec.keep_prob,
    )
    return out, chosen


# ---- counter-based randomness for load-time (dynamic) masking -------------------------------------------

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)


def splitmix64(x: np.ndarray) -> np.ndarray:
    z = x + _GOLDEN
    z = (z ^ (z >> np.uint64(30))) * _M1
    z = (z ^ (z >> np.uint64(27))) * _M2
    return z ^ (z >> np.uint64(31))


def stream_key(*words: int) -> np.uint64:
    """A 64-bit key derived from integers (seed, epoch, stream, ...)."""
    state = np.random.SeedSequence([int(w) & 0xFFFFFFFF for w in words]).generate_state(2, dtype=np.uint64)
    return np.uint64(state[0] ^ (state[1] << np.uint64(1)))


def hash_uniform(key: np.uint64, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Uniform floats in [0, 1) that depend only on ``(key, a, b)`` elementwise (splitmix64 mixing)."""
    with np.errstate(over="ignore"):
        h = splitmix64(splitmix64(a.astype(np.uint64) ^ key) ^ b.astype(np.uint64))
    return (h >> np.uint64(11)).astype(np.float64) * (1.0 / (1 << 53))


def mask_with_hash(
    ids: np.ndarray,
    lengths: np.ndarray,
    len_a: np.ndarray,
    spec: MaskingSpec,
    instance_ids: np.ndarray,
    seed: int,
    epoch: int,
    continuation: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Dynamic masking at load time: instance ``i``'s mask depends only on (seed, epoch, instance id).

    Args:
        instance_ids: ``(N,)`` global instance numbers.

    Returns:
        ``(masked_ids, chosen)``, both ``(N, T)``.
    """
    n, t = ids.shape
    eligible = eligible_positions(ids, lengths, len_a, spec.special_ids)
    k = num_to_predict(eligible.sum(axis=1), spec.masked_lm_prob, spec.max_predictions_per_seq)
    inst = np.broadcast_to(instance_ids.astype(np.uint64)[:, None], (n, t))
    pos = np.broadcast_to(np.arange(t, dtype=np.uint64)[None, :], (n, t))
    keys = hash_uniform(stream_key(seed, epoch, 0), inst, pos)
    chosen = choose_positions(
        keys, eligible, k, ids=ids, continuation=continuation if spec.whole_word else None
    )
    rows, cols = np.nonzero(chosen)
    a, b = instance_ids.astype(np.uint64)[rows], cols.astype(np.uint64)
    action = hash_uniform(stream_key(seed, epoch, 1), a, b)
    rand = (hash_uniform(stream_key(seed, epoch, 2), a, b) * spec.vocab_size).astype(np.int64)
    return corrupt(ids, chosen, action, rand, spec.mask_id, spec.mask_prob, spec.keep_prob), chosen
