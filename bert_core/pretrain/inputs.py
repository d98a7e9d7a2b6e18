"""What pretraining reads from the ``vocab`` and ``pretrain_data`` stages: the checks that can fail before
training starts, and the unigram prior of the MLM targets (``init_mlm_bias: unigram``)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from bert_core.pretrain.params import PretrainParams


def _vocab_size(vocab_dir: Path) -> tuple[int, str]:
    from bert_core.vocab.info import read_vocab

    path = vocab_dir / "vocab.txt"
    if not path.is_file():
        raise FileNotFoundError(f"{path} not found: build the vocabulary first (dvc repro vocab)")
    info = read_vocab(path)
    return info.size, info.sha256


@dataclass(frozen=True)
class PhaseData:
    """One phase's data as read once before training: its directories and parsed ``index.json`` files.

    Attributes:
        train_dir, heldout_dir: ``<data_dir>/<phase>/{train,heldout}``.
        train_index, heldout_index: Their parsed ``index.json`` (handed to the loaders, which then read no
            index themselves).
        train_sha256: sha256 of the train ``index.json`` bytes (the data's identity in the checkpoint
            fingerprint).
    """

    train_dir: Path
    heldout_dir: Path
    train_index: dict[str, Any]
    heldout_index: dict[str, Any]
    train_sha256: str

    @property
    def max_seq_length(self) -> int:
        """The phase's sequence length, as the data records it."""
        return int(self.train_index["max_seq_length"])


@dataclass(frozen=True)
class PretrainInputs:
    """What :func:`read_inputs` found: the sizes the model takes from its inputs, the data per phase and
    the statistics reported with the model.

    Attributes:
        vocab_size: From ``vocab.txt``.
        max_position_embeddings: The position table the data was built for (``pretrain_data``'s
            ``max_position_embeddings``, recorded in each ``index.json``).
        phases: One :class:`PhaseData` per ``params.phases`` entry.
        stats: Per-phase statistics (instances, tokens, predictions, masking) and ``vocab_size``.
    """

    vocab_size: int
    max_position_embeddings: int
    phases: list[PhaseData]
    stats: dict[str, Any]


def check_inputs(
    params: PretrainParams, data_dir: Path, vocab_dir: Path, world_size: int = 1
) -> dict[str, Any]:
    """:func:`read_inputs`' checks; returns its per-phase data statistics."""
    return read_inputs(params, data_dir, vocab_dir, world_size).stats


def read_inputs(
    params: PretrainParams, data_dir: Path, vocab_dir: Path, world_size: int = 1
) -> PretrainInputs:
    """Every check that can fail before training starts, reading each ``index.json`` once.

    Raises:
        FileNotFoundError: a missing vocab or data directory (the message names it and how to build it).
        ValueError: vocab mismatch between data and model, data longer than its position table or built
            for other position tables in different phases, no ``max_predictions_per_seq`` (the slots of
            the static-shape MLM batches), or a global batch that the processes cannot split evenly.
    """
    from bert_core.pretrain_data.loader import check_max_seq_length, check_vocab_size
    from bert_core.pretrain_data.storage import read_index_with_digest

    data_dir, vocab_dir = Path(data_dir), Path(vocab_dir)
    vocab_size, vocab_sha = _vocab_size(vocab_dir)
    stats: dict[str, Any] = {"vocab_size": vocab_size}
    phases: list[PhaseData] = []
    max_pos: int | None = None
    for i, phase in enumerate(params.phases):
        try:
            phase.split(world_size)
        except ValueError as err:
            raise ValueError(f"pretrain.phases[{i}].{err}") from None
        read: dict[str, tuple[dict[str, Any], str]] = {}
        for split in ("train", "heldout"):
            d = data_dir / phase.name / split
            index, digest = read_index_with_digest(d)  # FileNotFoundError naming the directory
            read[split] = index, digest
            check_vocab_size(d, vocab_size, index)
            if index.get("vocab_sha256") not in (None, vocab_sha):
                raise ValueError(
                    f"{d} was built with another vocabulary of the same size (sha256 "
                    f"{index['vocab_sha256'][:12]}... vs {vocab_dir / 'vocab.txt'} {vocab_sha[:12]}...); "
                    "rebuild the data with this vocab (dvc repro pretrain_data)"
                )
            slots = index.get("max_predictions_per_seq")
            if not isinstance(slots, int) or slots < 1:
                raise ValueError(
                    f"{d}/index.json has max_predictions_per_seq = {slots!r}; the static-shape MLM batches "
                    "need a positive integer there, rebuild the data (dvc repro pretrain_data)"
                )
            table = _position_table(d, index)
            if max_pos is None:
                max_pos = table
            elif table != max_pos:
                raise ValueError(
                    f"{d} was built for max_position_embeddings = {table} but {data_dir / params.phases[0].name} "
                    f"for {max_pos}; the phases train one model: rebuild the data (dvc repro pretrain_data)"
                )
            check_max_seq_length(d, max_pos, index)
            n = sum(s["num_instances"] for s in index["shards"])
            stats[f"{phase.name}.{split}"] = {
                "instances": n,
                "tokens": sum(s["num_tokens"] for s in index["shards"]),
                "predictions": sum(s.get("num_predictions", 0) for s in index["shards"]),
                "max_predictions_per_seq": index.get("max_predictions_per_seq"),
                "masking": index.get("masking"),
            }
            if split == "train" and n < phase.global_batch:
                raise ValueError(
                    f"{d} holds {n} instances, fewer than one global batch of {phase.global_batch}; "
                    f"lower pretrain.phases[{i}].global_batch or build more data"
                )
        (train_index, train_sha), (heldout_index, _) = read["train"], read["heldout"]
        if train_index["max_seq_length"] != heldout_index["max_seq_length"]:
            raise ValueError(
                f"{data_dir / phase.name}: train holds {train_index['max_seq_length']}-token instances but "
                f"heldout {heldout_index['max_seq_length']}-token ones; rebuild the data (dvc repro pretrain_data)"
            )
        phases.append(
            PhaseData(
                data_dir / phase.name / "train",
                data_dir / phase.name / "heldout",
                train_index,
                heldout_index,
                train_sha,
            )
        )
    assert max_pos is not None  # params have at least one phase
    return PretrainInputs(vocab_size, max_pos, phases, stats)


def _position_table(data_dir: Path, index: dict[str, Any]) -> int:
    """The ``max_position_embeddings`` the data was built for (recorded with its params)."""
    value = (index.get("params") or {}).get("max_position_embeddings")
    if not isinstance(value, int) or value < 1:
        raise ValueError(
            f"{data_dir}/index.json records no params.max_position_embeddings (got {value!r}); the model's "
            "position table is the one the data was built for: rebuild the data (dvc repro pretrain_data)"
        )
    return value


def unigram_log_prior(
    train_dir: Path, max_items: int = 20_000_000, index: dict[str, Any] | None = None
) -> torch.Tensor:
    """Log frequencies ``(V,)`` of the MLM targets in a training data directory (add-one smoothed).

    Uses the stored labels of statically masked data, else the stored tokens (minus special tokens),
    reading at most ``max_items`` of them. Setting the MLM output bias to this makes the untrained model
    predict the unigram distribution (the best context-free guess) from step 0; the default (zeros) is
    the paper's initialisation. ``index`` is the directory's parsed ``index.json`` if already read.
    """
    import numpy as np

    from bert_core.pretrain_data.storage import InstanceStore

    store = InstanceStore(train_dir, index)
    counts = np.zeros(store.vocab_size, dtype=np.int64)
    left = max_items
    for shard in store.shards:
        values = shard.arrays.get("mlm_labels") if store.static else None
        if values is None:
            values = shard.arrays["tokens"]
        chunk = np.asarray(values[:left], dtype=np.int64)
        counts += np.bincount(chunk, minlength=store.vocab_size)
        left -= len(chunk)
        if left <= 0:
            break
    if not store.static:
        counts[list(store.index["special_token_ids"].values())] = 0
    probs = (counts + 1) / (counts.sum() + len(counts))
    return torch.from_numpy(np.log(probs)).float()
