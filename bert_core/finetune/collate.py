"""Efficient batching for fine-tuning: dynamic padding and length-grouped batches.

A batch is padded to its own longest sequence, not to ``max_seq_length``; batches are drawn from groups of
similar lengths so little padding remains. Training keeps randomness the way Hugging Face's
``group_by_length`` does: shuffle, cut into mega-batches of ``mega_batch_mult`` batches, sort each
mega-batch by length, split it into batches, then shuffle the order of the batches. Evaluation sorts
all features by length; ``feature_index`` in every batch maps outputs back to feature order.
"""

from __future__ import annotations

import math
import random
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import torch

from bert_core.constants import IGNORE_INDEX

#: On a GPU a batch's width is rounded up to this multiple: each distinct width costs the attention kernels
#: a new plan, and SST-2-shaped fine-tuning meets 32 widths without rounding and 7 with it (1.7 to 2 times
#: the examples a second on an H200, docs/benchmarks.md). A CPU builds no plans: it pads to the exact width.
GPU_WIDTH_MULTIPLE = 8


def width_multiple(device: torch.device | str) -> int | None:
    """The multiple a batch's width is rounded up to on ``device`` (``pad_to_multiple_of``)."""
    return GPU_WIDTH_MULTIPLE if torch.device(device).type == "cuda" else None


_SEQUENCE_KEYS = ("input_ids", "token_type_ids")
_SCALAR_LABEL_KEYS = ("start_positions", "end_positions")


def feature_length(feature: Mapping[str, Any]) -> int:
    """Padded length a feature needs: its token count (the longest row for multiple choice)."""
    ids = feature["input_ids"]
    return max(len(r) for r in ids) if ids and isinstance(ids[0], list) else len(ids)


def _pad_rows(rows: Sequence[Sequence[int]], length: int, value: int) -> list[list[int]]:
    return [list(r) + [value] * (length - len(r)) for r in rows]


def pad_collate(
    features: Sequence[Mapping[str, Any]],
    *,
    pad_token_id: int = 0,
    pad_to_multiple_of: int | None = None,
    feature_indices: Sequence[int] | None = None,
) -> dict[str, torch.Tensor]:
    """Stack features into padded tensors (the batch's longest sequence, not ``max_seq_length``).

    Args:
        features: Outputs of a kind's ``encode`` (:mod:`bert_core.kinds`); only the model's inputs and targets are
            read (``input_ids``, ``token_type_ids``, ``labels``, ``start_positions``, ``end_positions``).
        pad_token_id: Id used to pad ``input_ids``.
        pad_to_multiple_of: Round the padded length up (:func:`width_multiple` gives the device's choice).
        feature_indices: Positions of these features in their dataset, returned as ``feature_index``.

    Returns:
        ``input_ids``, ``token_type_ids``, ``attention_mask``: (B, T) or (B, C, T) for multiple choice;
        ``labels``: (B,) class ids / floats, or (B, T) token tags padded with -100; ``start_positions`` /
        ``end_positions``: (B,); ``feature_index``: (B,) when ``feature_indices`` is given.
    """
    assert features, "pad_collate needs at least one feature"
    length = max(feature_length(f) for f in features)
    if pad_to_multiple_of:
        length = int(math.ceil(length / pad_to_multiple_of) * pad_to_multiple_of)
    multiple_choice = isinstance(features[0]["input_ids"][0], list)
    batch: dict[str, torch.Tensor] = {}
    for key in _SEQUENCE_KEYS:
        value = pad_token_id if key == "input_ids" else 0
        if multiple_choice:
            rows = [_pad_rows(f[key], length, value) for f in features]
        else:
            rows = _pad_rows([f[key] for f in features], length, value)
        batch[key] = torch.tensor(rows, dtype=torch.long)
    if multiple_choice:
        mask = [[[1] * len(r) + [0] * (length - len(r)) for r in f["input_ids"]] for f in features]
    else:
        mask = [[1] * len(f["input_ids"]) + [0] * (length - len(f["input_ids"])) for f in features]
    batch["attention_mask"] = torch.tensor(mask, dtype=torch.long)
    if all("labels" in f for f in features):
        first = features[0]["labels"]
        if isinstance(first, list):  # token classification
            batch["labels"] = torch.tensor(_pad_rows([f["labels"] for f in features], length, IGNORE_INDEX))
        elif isinstance(first, float):
            batch["labels"] = torch.tensor([f["labels"] for f in features], dtype=torch.float)
        else:
            batch["labels"] = torch.tensor([f["labels"] for f in features], dtype=torch.long)
    for key in _SCALAR_LABEL_KEYS:
        if all(key in f for f in features):
            batch[key] = torch.tensor([f[key] for f in features], dtype=torch.long)
    if feature_indices is not None:
        batch["feature_index"] = torch.tensor(list(feature_indices), dtype=torch.long)
    return batch


class EpochShuffle(torch.utils.data.Sampler[int]):
    """A shuffle of ``n`` indices whose order depends on the seed and the epoch alone (:meth:`set_epoch`), so
    that a resumed trial draws the order an uninterrupted one would (the first epoch's order is
    ``RandomSampler``'s with a generator seeded ``seed``)."""

    def __init__(self, n: int, seed: int) -> None:
        self.n, self.seed, self.epoch = n, seed, 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __iter__(self) -> Iterator[int]:
        generator = torch.Generator().manual_seed(self.seed + self.epoch)
        yield from torch.randperm(self.n, generator=generator).tolist()

    def __len__(self) -> int:
        return self.n


class LengthGroupedBatchSampler(torch.utils.data.Sampler[list[int]]):
    """Batches of indices with similar lengths.

    Args:
        lengths: Length of each feature (see :func:`feature_length`).
        batch_size: Features per batch.
        shuffle: Training order (mega-batch grouping, shuffled batch order, new order each epoch via
            :meth:`set_epoch`); ``False`` sorts everything by length (evaluation).
        seed: Base seed of the shuffle; the epoch is added to it.
        mega_batch_mult: Batches per sorted group when shuffling.
        drop_last: Drop a final short batch.
    """

    def __init__(
        self,
        lengths: Sequence[int],
        batch_size: int,
        *,
        shuffle: bool,
        seed: int = 0,
        mega_batch_mult: int = 50,
        drop_last: bool = False,
    ) -> None:
        if batch_size < 1:
            raise ValueError(f"batch_size={batch_size} is invalid: expected an integer >= 1")
        self.lengths = list(lengths)
        self.batch_size = batch_size
        self.shuffle = shuffle
        self.seed = seed
        self.mega_batch_mult = max(1, mega_batch_mult)
        self.drop_last = drop_last
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def _batches(self) -> list[list[int]]:
        n = len(self.lengths)
        if not self.shuffle:
            order = sorted(range(n), key=lambda i: (-self.lengths[i], i))
            return [order[i : i + self.batch_size] for i in range(0, n, self.batch_size)]
        rng = random.Random(self.seed + self.epoch)
        order = list(range(n))
        rng.shuffle(order)
        mega = self.batch_size * self.mega_batch_mult
        batches = []
        for m in range(0, n, mega):
            group = sorted(order[m : m + mega], key=lambda i: -self.lengths[i])
            batches += [group[i : i + self.batch_size] for i in range(0, len(group), self.batch_size)]
        if self.drop_last:
            batches = [b for b in batches if len(b) == self.batch_size]
        rng.shuffle(batches)
        return batches

    def __iter__(self) -> Iterator[list[int]]:
        yield from self._batches()

    def __len__(self) -> int:
        if self.drop_last and self.shuffle:
            return len(self._batches())
        return math.ceil(len(self.lengths) / self.batch_size)


class FeatureDataset(torch.utils.data.Dataset):
    """Features as a map-style dataset whose items remember their index (for reordering outputs)."""

    def __init__(self, features: Sequence[Mapping[str, Any]]) -> None:
        self.features = list(features)

    def __len__(self) -> int:
        return len(self.features)

    def __getitem__(self, index: int) -> tuple[int, Mapping[str, Any]]:
        return index, self.features[index]

    def lengths(self) -> list[int]:
        return [feature_length(f) for f in self.features]


class Collator:
    """Picklable collate function for :class:`FeatureDataset` items (works with worker processes)."""

    def __init__(self, *, pad_token_id: int = 0, pad_to_multiple_of: int | None = None) -> None:
        self.pad_token_id = pad_token_id
        self.pad_to_multiple_of = pad_to_multiple_of

    def __call__(self, items: Sequence[tuple[int, Mapping[str, Any]]]) -> dict[str, torch.Tensor]:
        return pad_collate(
            [f for _, f in items],
            pad_token_id=self.pad_token_id,
            pad_to_multiple_of=self.pad_to_multiple_of,
            feature_indices=[i for i, _ in items],
        )


def make_loader(
    features: Sequence[Mapping[str, Any]],
    batch_size: int,
    *,
    shuffle: bool,
    seed: int = 0,
    pad_token_id: int = 0,
    pad_to_multiple_of: int | None = None,
    group_by_length: bool = True,
    drop_last: bool = False,
) -> torch.utils.data.DataLoader:
    """A DataLoader over features with dynamic padding (and length grouping unless disabled).

    With ``group_by_length=False`` batches are a plain (seeded) shuffle or the natural order, still
    dynamically padded.
    """
    dataset = FeatureDataset(features)
    if group_by_length:
        sampler: Any = LengthGroupedBatchSampler(
            dataset.lengths(), batch_size, shuffle=shuffle, seed=seed, drop_last=drop_last
        )
    else:
        base = EpochShuffle(len(dataset), seed) if shuffle else torch.utils.data.SequentialSampler(dataset)
        sampler = torch.utils.data.BatchSampler(base, batch_size, drop_last=drop_last)
    return torch.utils.data.DataLoader(
        dataset,
        batch_sampler=sampler,
        collate_fn=Collator(pad_token_id=pad_token_id, pad_to_multiple_of=pad_to_multiple_of),
    )
