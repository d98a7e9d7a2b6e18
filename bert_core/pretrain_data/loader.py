"""Streaming, shuffled, DDP-aware, resumable batches of pretraining instances.

>>> loader = PretrainingLoader("data/pretrain_data/seq128/train", 32, rank=0, world_size=1, seed=0,
...                            expected_vocab_size=model.config.vocab_size)
>>> for batch in loader:            # one epoch (from the current position)
...     out = model(**batch)        # input_ids, token_type_ids, attention_mask, next_sentence_label and
...                                 # masked_lm_positions / masked_lm_ids / masked_lm_weights
>>> state = loader.state_dict()     # {"epoch": e, "offset": instances consumed in epoch e, ...}

Order: epoch ``e`` visits the instances in a pseudo-random permutation keyed by ``(seed, e)`` — a Feistel
network over ``[0, N)`` with cycle walking, so the shuffle is global (not limited to a buffer), costs O(1)
memory and any position of any epoch can be computed directly. Global step ``k`` takes permuted positions
``[k*B*W, (k+1)*B*W)``; rank ``r`` gets the ``r``-th block of ``B``, so ranks never overlap and all ranks
have the same number of batches (``drop_last=False`` pads the final global step by wrapping around to
the start of the epoch, as ``DistributedSampler`` does; with one rank the last batch is just smaller).

MLM targets: by default in Google's static-shape form (``masked_lm_positions``, ``masked_lm_ids``,
``masked_lm_weights``, each ``(B, max_predictions_per_seq)``; :func:`mlm_positions`), which
``bert_core.model.BertForPreTraining`` gathers without data-dependent shapes, so a compiled step is one
graph; ``mlm_format="labels"`` gives transformers' ``labels`` ``(B, T)`` (-100 = no prediction) instead,
for ``transformers.BertForPreTraining``.

Masking: static data carries its masks; dynamic data is masked here with a mask that depends only on
``(seed, epoch, instance)`` (:func:`.masking.mask_with_hash`): a fresh mask each epoch, identical after a
resume or with another world size.

The loader lives here rather than in :mod:`bert_core.pretrain` because this package owns the on-disk format
of the instances: :mod:`.storage` writes it, this module reads it back, and :mod:`.checks` validates the
written data through this loader. The ``pretrain`` stage only consumes it.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np

from bert_core.constants import IGNORE_INDEX
from bert_core.pretrain_data.masking import (
    KEEP_PROB,
    MASK_PROB,
    MaskingSpec,
    mask_with_hash,
    splitmix64,
    stream_key,
)
from bert_core.pretrain_data.storage import InstanceStore, read_index
from bert_core.vocab.info import read_vocab


def check_vocab_size(
    data_dir: str | Path, model_vocab_size: int, index: dict[str, Any] | None = None
) -> None:
    """Refuse a model whose ``vocab_size`` differs from the data's vocabulary.

    A mismatch gives index errors (ids beyond the embedding table) or silently wrong training (a larger
    table with untrained rows), so training must stop before it starts.

    Args:
        data_dir: The data directory.
        model_vocab_size: The model's ``vocab_size``.
        index: The directory's parsed ``index.json`` if already read (else it is read here).

    Raises:
        ValueError: naming both sizes and what to do.
    """
    index = read_index(data_dir) if index is None else index
    data_size = int(index["vocab_size"])
    if int(model_vocab_size) != data_size:
        raise ValueError(
            f"vocabulary size mismatch: the pretraining data in {data_dir} uses a vocabulary of "
            f"{data_size} tokens (vocab sha256 {index['vocab_sha256'][:12]}...), but the model config has "
            f"vocab_size={model_vocab_size}. Set the model's vocab_size to {data_size}, or rebuild the data "
            f"with the model's vocabulary (dvc repro vocab pretrain_data)."
        )


def check_max_seq_length(
    data_dir: str | Path, max_position_embeddings: int, index: dict[str, Any] | None = None
) -> None:
    """Refuse data longer than the model's position table.

    Args:
        data_dir: The data directory.
        max_position_embeddings: The model's position table.
        index: The directory's parsed ``index.json`` if already read (else it is read here).

    Raises:
        ValueError: naming both lengths.
    """
    index = read_index(data_dir) if index is None else index
    if int(index["max_seq_length"]) > int(max_position_embeddings):
        raise ValueError(
            f"the pretraining data in {data_dir} has sequences of {index['max_seq_length']} tokens but the "
            f"model has max_position_embeddings={max_position_embeddings}; use the matching phase's data "
            f"or a model with more positions"
        )


def feistel_permute(positions: np.ndarray, n: int, key: np.uint64, rounds: int = 4) -> np.ndarray:
    """A keyed pseudo-random permutation of ``[0, n)``, evaluated at ``positions`` (vectorised).

    A balanced Feistel network on the smallest ``2^(2h) >= n`` domain, made a bijection of ``[0, n)`` by
    cycle walking (re-apply while the image is out of range).

    Args:
        positions: ``(M,)`` ints in ``[0, n)``.
        n: Domain size.
        key: 64-bit key (e.g. from ``stream_key(seed, epoch)``).

    Returns:
        ``(M,)`` int64 images; distinct positions give distinct images.
    """
    if n <= 1:
        return np.asarray(positions, dtype=np.int64).copy()
    h = max(1, math.ceil((n - 1).bit_length() / 2))
    mask = np.uint64((1 << h) - 1)
    shift = np.uint64(h)
    with np.errstate(over="ignore"):
        round_keys = splitmix64(np.full(rounds, key, np.uint64) + np.arange(rounds, dtype=np.uint64))

    def once(x: np.ndarray) -> np.ndarray:
        left, right = x >> shift, x & mask
        for k in round_keys:
            left, right = right, left ^ (splitmix64(right ^ k) & mask)
        return (left << shift) | right

    with np.errstate(over="ignore"):
        y = once(np.asarray(positions, dtype=np.uint64))
        bad = y >= np.uint64(n)
        while bad.any():
            y[bad] = once(y[bad])
            bad = y >= np.uint64(n)
    return y.astype(np.int64)


MLM_FORMATS = ("positions", "labels")


def mlm_positions(labels: np.ndarray, max_predictions: int) -> dict[str, np.ndarray]:
    """Google's ``masked_lm_positions`` / ``masked_lm_ids`` / ``masked_lm_weights`` from dense labels.

    Args:
        labels: ``(B, T)`` original ids at the masked positions, :data:`IGNORE_INDEX` elsewhere.
        max_predictions: ``P``, the slots per row (the data's ``max_predictions_per_seq``).

    Returns:
        ``(B, P)`` arrays: positions (ascending within a row) and ids as int64, weights as float32 (1.0 at
        a real prediction); the unused slots hold position 0, id 0 and weight 0.0, as in Google's
        ``create_pretraining_data.py``.

    Raises:
        ValueError: a row has more than ``max_predictions`` masked positions.
    """
    chosen = labels != IGNORE_INDEX  # (B, T)
    count = chosen.sum(1)  # (B,)
    if count.size and int(count.max()) > max_predictions:
        raise ValueError(
            f"an instance has {int(count.max())} masked positions, more than max_predictions_per_seq="
            f"{max_predictions}; the masks disagree with index.json, rebuild the data (dvc repro pretrain_data)"
        )
    order = np.argsort(~chosen, axis=1, kind="stable")[:, :max_predictions]  # masked columns first, ascending
    if order.shape[1] < max_predictions:  # rows shorter than P
        order = np.pad(order, ((0, 0), (0, max_predictions - order.shape[1])))
    valid = np.arange(max_predictions)[None, :] < count[:, None]  # (B, P)
    positions = np.where(valid, order, 0)
    ids = np.where(valid, np.take_along_axis(labels, positions, axis=1), 0)
    return {
        "masked_lm_positions": positions.astype(np.int64),
        "masked_lm_ids": ids.astype(np.int64),
        "masked_lm_weights": valid.astype(np.float32),
    }


def segment_ids(lengths: np.ndarray, len_a: np.ndarray, width: int) -> tuple[np.ndarray, np.ndarray]:
    """``token_type_ids`` and ``attention_mask`` ``(N, width)`` int64 for ``[CLS] A [SEP] B [SEP] pad``:
    type 0 for [CLS], A and the first [SEP]; 1 for B and the last [SEP]; 0 (and mask 0) for padding."""
    pos = np.arange(width)[None, :]
    attention = pos < lengths[:, None]
    types = (pos > len_a[:, None] + 1) & attention
    return types.astype(np.int64), attention.astype(np.int64)


def build_batch(
    store: InstanceStore,
    idx: np.ndarray,
    *,
    seed: int,
    epoch: int,
    spec: MaskingSpec | None,
    continuation: np.ndarray | None = None,
    pad_to_multiple_of: int | None = None,
    mlm_format: str = "labels",
) -> dict[str, np.ndarray]:
    """The model inputs for instances ``idx`` as numpy arrays (names match ``BertForPreTraining``).

    Args:
        store: The data.
        idx: ``(B,)`` global instance numbers.
        seed, epoch: Key of the dynamic mask (ignored for static data).
        spec: Masking settings, required for dynamic data.
        continuation: ``(V,)`` ``##`` flags, for dynamic whole-word masking.
        pad_to_multiple_of: Pad to the batch's longest instance rounded up to this (dynamic padding);
            ``None`` pads to ``max_seq_length``.
        mlm_format: ``"labels"`` or ``"positions"`` (the MLM targets' form, see the module docstring).

    Returns:
        ``input_ids``, ``token_type_ids``, ``attention_mask`` ``(B, T)`` int64, ``next_sentence_label``
        ``(B,)`` int64 (0 = IsNext, 1 = NotNext), and either ``labels`` ``(B, T)`` int64 (``-100`` where
        not predicted) or ``masked_lm_positions`` / ``masked_lm_ids`` / ``masked_lm_weights``
        ``(B, max_predictions_per_seq)`` (:func:`mlm_positions`).
    """
    if mlm_format not in MLM_FORMATS:
        raise ValueError(f"mlm_format must be one of {MLM_FORMATS}, got {mlm_format!r}")
    rows = store.gather(idx, pad_id=store.index["special_token_ids"]["[PAD]"])
    ids, lengths, len_a = rows["ids"], rows["lengths"], rows["len_a"]
    if store.static:
        labels = rows["labels"]
    else:
        assert spec is not None, "dynamic data needs a MaskingSpec"
        masked, chosen = mask_with_hash(ids, lengths, len_a, spec, np.asarray(idx), seed, epoch, continuation)
        labels = np.where(chosen, ids, IGNORE_INDEX)
        ids = masked
    width = ids.shape[1]
    if pad_to_multiple_of:
        longest = int(lengths.max(initial=1))
        width = min(width, -(-longest // pad_to_multiple_of) * pad_to_multiple_of)
    types, attention = segment_ids(lengths, len_a, width)
    batch = {"input_ids": ids[:, :width], "token_type_ids": types, "attention_mask": attention}
    if mlm_format == "labels":
        batch["labels"] = labels[:, :width]
    else:
        try:
            batch |= mlm_positions(labels[:, :width], int(store.index["max_predictions_per_seq"]))
        except ValueError as e:
            raise ValueError(f"{store.data_dir}: {e}") from e
    batch["next_sentence_label"] = rows["nsp"]
    return batch


def masking_spec(data_dir: str | Path, index: dict[str, Any]) -> tuple[MaskingSpec, np.ndarray | None]:
    """The MLM settings recorded in ``index.json`` (and the ``##`` table for whole-word masking); an index
    without ``mask_split`` was built with the paper's 80/10/10."""
    vocab = read_vocab(Path(data_dir) / "vocab.txt") if index["whole_word_masking"] else None
    sp = index["special_token_ids"]
    split = index.get("mask_split", {"mask": MASK_PROB, "keep": KEEP_PROB})
    spec = MaskingSpec(
        masked_lm_prob=index["masked_lm_prob"],
        max_predictions_per_seq=index["max_predictions_per_seq"],
        vocab_size=index["vocab_size"],
        mask_id=sp["[MASK]"],
        special_ids=tuple(sorted(sp.values())),
        whole_word=index["whole_word_masking"],
        mask_prob=split["mask"],
        keep_prob=split["keep"],
    )
    return spec, (vocab.continuation if vocab is not None else None)


class PretrainingLoader:
    """Batches of one output directory (e.g. ``data/pretrain_data/seq128/train``) for one DDP rank.

    Args:
        data_dir: Directory with ``index.json`` written by the ``pretrain_data`` stage.
        batch_size: Instances per batch on this rank (the global batch is ``batch_size * world_size``).
        rank, world_size: This process's DDP rank and the number of ranks.
        seed: Seeds the epoch permutations (and the dynamic masks).
        shuffle: Permute the instances each epoch; ``False`` reads them in stored order.
        drop_last: Drop the final incomplete global batch (else pad it, see the module docstring).
        expected_vocab_size: The model's ``vocab_size``; a mismatch raises ``ValueError`` here.
        pad_to_multiple_of: Dynamic padding to the batch's longest instance rounded up to this multiple;
            ``None`` (default) pads every batch to ``max_seq_length``.
        epoch: Epoch to start at.
        mlm_format: ``"positions"`` (default: Google's static-shape ``masked_lm_*`` arrays) or
            ``"labels"`` (transformers' ``labels``); see the module docstring.
        index: The directory's parsed ``index.json`` when the caller has read it already (a loader made
            once per evaluation then reads no file but the memory-mapped shards).

    Raises:
        ValueError: bad arguments, a vocabulary mismatch, or fewer instances than one global batch.
    """

    def __init__(
        self,
        data_dir: str | Path,
        batch_size: int,
        *,
        rank: int = 0,
        world_size: int = 1,
        seed: int = 0,
        shuffle: bool = True,
        drop_last: bool = True,
        expected_vocab_size: int | None = None,
        pad_to_multiple_of: int | None = None,
        epoch: int = 0,
        mlm_format: str = "positions",
        index: dict[str, Any] | None = None,
    ) -> None:
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        if world_size < 1 or not 0 <= rank < world_size:
            raise ValueError(f"need 0 <= rank < world_size, got rank={rank}, world_size={world_size}")
        if pad_to_multiple_of is not None and pad_to_multiple_of < 1:
            raise ValueError(f"pad_to_multiple_of must be >= 1 or None, got {pad_to_multiple_of}")
        if mlm_format not in MLM_FORMATS:
            raise ValueError(f"mlm_format must be one of {MLM_FORMATS}, got {mlm_format!r}")
        self.mlm_format = mlm_format
        self.data_dir = Path(data_dir)
        self.store = InstanceStore(self.data_dir, index)
        if expected_vocab_size is not None:
            check_vocab_size(self.data_dir, expected_vocab_size, self.store.index)
        self.batch_size, self.rank, self.world_size = batch_size, rank, world_size
        self.seed, self.shuffle, self.drop_last = seed, shuffle, drop_last
        self.pad_to_multiple_of = pad_to_multiple_of
        self.global_batch = batch_size * world_size
        n = len(self.store)
        if n == 0 or (drop_last and n < self.global_batch):
            raise ValueError(
                f"{self.data_dir} holds {n} instances, fewer than one global batch of {self.global_batch} "
                f"(batch_size={batch_size} x world_size={world_size}); lower the batch size or build more data"
            )
        self.spec, self.continuation = masking_spec(self.data_dir, self.store.index)
        self.epoch, self.offset = epoch, 0

    # ---- sizes ---------------------------------------------------------------------------------------
    @property
    def num_instances(self) -> int:
        return len(self.store)

    @property
    def steps_per_epoch(self) -> int:
        """Batches per rank per epoch (equal on every rank)."""
        n = len(self.store)
        return n // self.global_batch if self.drop_last else -(-n // self.global_batch)

    def __len__(self) -> int:
        return self.steps_per_epoch

    @property
    def vocab_size(self) -> int:
        return int(self.store.vocab_size)

    @property
    def max_seq_length(self) -> int:
        return int(self.store.max_seq_length)

    @property
    def max_predictions_per_seq(self) -> int:
        return int(self.store.index["max_predictions_per_seq"])

    @property
    def masking(self) -> str:
        return str(self.store.index["masking"])

    # ---- order ---------------------------------------------------------------------------------------
    def positions(self, step: int) -> np.ndarray:
        """Permutation positions that this rank reads at ``step`` of an epoch."""
        n = len(self.store)
        start = step * self.global_batch
        rest = n - start
        per_rank = self.batch_size if rest >= self.global_batch else -(-rest // self.world_size)
        if self.world_size == 1:
            per_rank = min(per_rank, rest)
        first = start + self.rank * per_rank
        return np.arange(first, first + per_rank, dtype=np.int64) % n

    def indices(self, epoch: int, step: int) -> np.ndarray:
        """Instance numbers of this rank's batch ``step`` in ``epoch``."""
        pos = self.positions(step)
        if not self.shuffle:
            return pos
        return feistel_permute(pos, len(self.store), stream_key(self.seed, epoch, 0x5EED))

    def set_epoch(self, epoch: int) -> None:
        """Start ``epoch`` from its beginning."""
        self.epoch, self.offset = int(epoch), 0

    def __iter__(self):
        """Yield the remaining batches of the current epoch as dicts of torch tensors, then move to the
        next epoch. ``state_dict()`` taken after a batch resumes right after it."""
        import torch

        epoch = self.epoch
        for step in range(self.offset // self.global_batch, self.steps_per_epoch):
            batch = build_batch(
                self.store,
                self.indices(epoch, step),
                seed=self.seed,
                epoch=epoch,
                spec=self.spec,
                continuation=self.continuation,
                pad_to_multiple_of=self.pad_to_multiple_of,
                mlm_format=self.mlm_format,
            )
            self.offset = (step + 1) * self.global_batch
            yield {k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in batch.items()}
        self.epoch, self.offset = epoch + 1, 0

    # ---- resume --------------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """The position to resume from: epoch and instances consumed (globally) in it, plus identity."""
        return {
            "epoch": self.epoch,
            "offset": self.offset,
            "seed": self.seed,
            "shuffle": self.shuffle,
            "num_instances": len(self.store),
            "vocab_sha256": self.store.index["vocab_sha256"],
            "global_batch": self.global_batch,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resume at a recorded position.

        The world size may change as long as the global batch divides the recorded offset.

        Raises:
            ValueError: the state belongs to other data, another seed/shuffle, or the offset does not fall
                on a global batch boundary.
        """
        for key in ("num_instances", "vocab_sha256", "seed", "shuffle"):
            mine = self.state_dict()[key]
            if key in state and state[key] != mine:
                raise ValueError(
                    f"cannot resume: loader state has {key}={state[key]!r} but this loader has {mine!r} "
                    f"(data {self.data_dir}); resume with the same data and seed"
                )
        offset = int(state["offset"])
        if offset % self.global_batch:
            raise ValueError(
                f"cannot resume at offset {offset}: not a multiple of the global batch {self.global_batch} "
                f"(batch_size x world_size); keep the global batch of the interrupted run"
            )
        self.epoch, self.offset = int(state["epoch"]), offset
