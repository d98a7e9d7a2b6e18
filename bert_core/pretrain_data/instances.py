"""Sentence-pair instances for MLM + NSP, as Google's ``create_instances_from_document`` builds them.

For each document (BERT paper §3.1, appendix A.2; ``create_pretraining_data.py``):

* a target length is drawn once per document: ``max_seq_length - 3``, or with ``short_seq_prob`` a random
  length in ``[2, max_seq_length - 3]``;
* whole sentences are gathered into a chunk until it reaches the target (or the document ends); the
  first ``a_end`` sentences (random, at least one) form segment A;
* IsNext: B is the rest of the chunk. NotNext (always when the chunk has one sentence, else with
  ``random_next_prob``): B is a run of sentences from a random start in a *different* document, long
  enough for the remaining target, and the chunk's unused sentences are put back (``i -= unused``);
* the pair is truncated to ``max_seq_length - 3`` tokens by removing tokens from the longer segment
  (from the front or the back, at random, one token at a time).

Deviations (documented in ``docs``):

* Streaming: the random document for NotNext comes from the same *window* (a few thousand documents of
  the same corpus shard held in memory), not from the whole corpus; the window always has at least two
  documents so B is never from A's document (Google retries 10 times and then accepts the same document).
* ``nsp_balance`` (default on): chunks of a single sentence are forced to NotNext, which pushes the
  NotNext share above 50% on corpora of short documents. With balancing, the choice for multi-sentence
  chunks leans against the running imbalance (IsNext when NotNext is ahead, NotNext when behind, a coin
  otherwise), so the share ends at ``random_next_prob``. Off = Google's coin exactly. Here the imbalance
  is that of one task (an :class:`NspCounter` carried across its windows and passes) plus the counter's
  ``offset``, through which the builder asks a task to lean further one way so that the *whole output*
  balances (:mod:`.build` explains the corpus-level scheme).
* Front/back truncation is drawn as a binomial count per segment (the same distribution as Google's
  token-by-token coin) so very long sentences cost O(1).

Segments are kept as (start, length) slices of a window's flat token array: no per-token Python work.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

import numpy as np


@dataclass
class Window:
    """Tokenised documents held in memory at once.

    Attributes:
        tokens: ``(n_tokens,)`` int32, all sentences of all documents, in order.
        sent_starts: ``(n_sents + 1,)`` int64, sentence ``s`` is ``tokens[sent_starts[s]:sent_starts[s+1]]``.
        doc_sents: ``(n_docs + 1,)`` int64, document ``d`` has sentences ``doc_sents[d]:doc_sents[d+1]``.
        doc_rows: ``(n_docs,)`` int64, the row of each document in the task's corpus stream.
    """

    tokens: np.ndarray
    sent_starts: np.ndarray
    doc_sents: np.ndarray
    doc_rows: np.ndarray

    @property
    def num_docs(self) -> int:
        return len(self.doc_sents) - 1


@dataclass
class Pairs:
    """Instances of one pass over a window, before masking; all arrays ``(N,)``."""

    a_start: np.ndarray
    a_len: np.ndarray
    b_start: np.ndarray
    b_len: np.ndarray
    random_next: np.ndarray
    a_doc: np.ndarray
    b_doc: np.ndarray
    truncated: np.ndarray
    short_target: np.ndarray
    forced: np.ndarray  # NotNext because the chunk has a single sentence (no choice was made)

    def __len__(self) -> int:
        return len(self.a_start)

    def slice(self, start: int, stop: int) -> Pairs:
        """Instances ``start:stop`` (views)."""
        return Pairs(**{k: getattr(self, k)[start:stop] for k in self.__dataclass_fields__})


def truncation_pops(len_a: int, len_b: int, max_tokens: int) -> tuple[int, int]:
    """How many tokens Google's ``truncate_seq_pair`` removes from A and from B.

    The loop removes from A while it is strictly longer, else from B, until ``len_a + len_b <= max_tokens``.
    """
    excess = len_a + len_b - max_tokens
    if excess <= 0:
        return 0, 0
    pop_a = pop_b = 0
    if len_a > len_b:
        pop_a = min(excess, len_a - len_b)
    else:
        pop_b = min(excess, len_b - len_a)
    rest = excess - pop_a - pop_b  # from equal lengths: B, A, B, A, ...
    return pop_a + rest // 2, pop_b + (rest + 1) // 2


def _front_pops(rng: random.Random, pops: int) -> int:
    """Binomial(pops, 1/2): how many of ``pops`` removals hit the front."""
    return rng.getrandbits(pops).bit_count() if pops > 0 else 0


@dataclass
class NspCounter:
    """Running NotNext and total counts that ``nsp_balance`` steers by; pass the same counter to every
    window and pass of a task so the share is balanced over the task, not just over each call.

    Attributes:
        random_next: NotNext instances so far.
        total: Instances so far.
        offset: Added to the imbalance ``random_next - random_next_prob * total`` the balancer steers to
            zero: ``+c`` makes the task end with about ``c`` NotNext fewer than its share, ``-c`` with ``c``
            more (while it has choices left to make).
    """

    random_next: int = 0
    total: int = 0
    offset: float = 0.0


def create_pairs(
    window: Window,
    *,
    max_seq_length: int,
    short_seq_prob: float,
    random_next_prob: float,
    nsp_balance: bool,
    rng: random.Random,
    counter: NspCounter | None = None,
) -> Pairs:
    """One pass of Google's per-document algorithm over every document of ``window``.

    Args:
        window: The documents; must hold at least two.
        max_seq_length: Instance length including [CLS] and two [SEP].
        short_seq_prob: Probability of a shorter target length for a document.
        random_next_prob: NotNext probability for chunks of two or more sentences.
        nsp_balance: Compensate forced NotNext (see the module docstring).
        rng: Source of every random choice.
        counter: Counts carried over from earlier calls (updated in place); a fresh one when omitted.

    Returns:
        The instances' segment slices and labels.
    """
    n_docs = window.num_docs
    assert n_docs >= 2, "NSP needs two documents per window"
    max_tokens = max_seq_length - 3
    ss = window.sent_starts.tolist()
    ds = window.doc_sents.tolist()
    rows: list[tuple[int, ...]] = []  # one tuple per instance, in Pairs field order
    counter = counter if counter is not None else NspCounter()
    n_random, n_total = counter.random_next, counter.total
    lean = counter.offset
    uniform = rng.random

    for d in range(n_docs):
        first, end = ds[d], ds[d + 1]
        target = max_tokens
        short = uniform() < short_seq_prob
        if short:
            target = 2 + int(uniform() * (max_tokens - 1))  # uniform in [2, max_tokens]
        chunk_first, length, i = first, 0, first
        while i < end:
            length += ss[i + 1] - ss[i]
            if i == end - 1 or length >= target:
                n_chunk = i - chunk_first + 1
                a_end = 1 + int(uniform() * (n_chunk - 1)) if n_chunk >= 2 else 1  # in [1, n_chunk - 1]
                a_s, a_e = ss[chunk_first], ss[chunk_first + a_end]
                if n_chunk == 1:
                    is_random = True
                elif nsp_balance and n_random - random_next_prob * n_total + lean >= 0.5:
                    is_random = False
                elif nsp_balance and n_random - random_next_prob * n_total + lean <= -0.5:
                    is_random = True
                else:
                    is_random = uniform() < random_next_prob
                if is_random:
                    target_b = target - (a_e - a_s)
                    rd = int(uniform() * (n_docs - 1))
                    rd += rd >= d  # any document but this one
                    r_first, r_end = ds[rd], ds[rd + 1]
                    j = r_first + int(uniform() * (r_end - r_first))
                    b_s, b_len = ss[j], 0
                    while j < r_end:
                        b_len += ss[j + 1] - ss[j]
                        j += 1
                        if b_len >= target_b:
                            break
                    b_e, b_doc = ss[j], rd
                    i -= n_chunk - a_end  # put the unused sentences back
                else:
                    b_s, b_e, b_doc = a_e, ss[i + 1], d
                la, lb = a_e - a_s, b_e - b_s
                pop_a, pop_b = truncation_pops(la, lb, max_tokens)
                front_a, front_b = _front_pops(rng, pop_a), _front_pops(rng, pop_b)
                rows.append(
                    (
                        a_s + front_a,
                        la - pop_a,
                        b_s + front_b,
                        lb - pop_b,
                        is_random,
                        d,
                        b_doc,
                        pop_a + pop_b > 0,
                        short,
                        n_chunk == 1,
                    )
                )
                n_random += is_random
                n_total += 1
                chunk_first, length = i + 1, 0
            i += 1

    counter.random_next, counter.total = n_random, n_total
    table = np.array(rows, dtype=np.int64).reshape(len(rows), len(Pairs.__dataclass_fields__))
    flags = {"random_next", "truncated", "short_target", "forced"}
    return Pairs(
        **{
            k: table[:, c].astype(bool) if k in flags else table[:, c].copy()
            for c, k in enumerate(Pairs.__dataclass_fields__)
        }
    )


def materialize(
    tokens: np.ndarray, pairs: Pairs, max_seq_length: int, cls_id: int, sep_id: int, pad_id: int
) -> tuple[np.ndarray, np.ndarray]:
    """Lay the pairs out as ``[CLS] A [SEP] B [SEP]`` rows, padded.

    Args:
        tokens: The window's flat token array.
        pairs: Segment slices (already truncated to fit).

    Returns:
        ``ids`` ``(N, max_seq_length)`` int32 and ``lengths`` ``(N,)`` int64.
    """
    la = pairs.a_len[:, None]
    lb = pairs.b_len[:, None]
    pos = np.arange(max_seq_length)[None, :]
    in_a = (pos >= 1) & (pos <= la)
    in_b = (pos >= la + 2) & (pos < la + 2 + lb)
    src = np.where(in_a, pairs.a_start[:, None] + pos - 1, pairs.b_start[:, None] + pos - la - 2)
    src = np.where(in_a | in_b, src, 0)
    ids = np.where(in_a | in_b, tokens[src], pad_id).astype(np.int32)
    rows = np.arange(len(pairs))
    lengths = pairs.a_len + pairs.b_len + 3
    ids[:, 0] = cls_id
    ids[rows, pairs.a_len + 1] = sep_id
    ids[rows, lengths - 1] = sep_id
    return ids, lengths
