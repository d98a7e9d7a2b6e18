"""What pretraining reads from the ``vocab`` and ``pretrain_data`` stages: the checks that can fail before
training starts, and the unigram prior of the MLM targets (``init_mlm_bias: unigram``)."""

from __future__ import annotations

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


def check_inputs(
    params: PretrainParams, data_dir: Path, vocab_dir: Path, world_size: int = 1
) -> dict[str, Any]:
    """Every check that can fail before training starts; returns per-phase data statistics.

    Raises:
        FileNotFoundError: a missing vocab or data directory (the message names it and how to build it).
        ValueError: vocab mismatch between data and model, data of another sequence length, no
            ``max_predictions_per_seq`` (the slots of the static-shape MLM batches), or a global batch that
            the processes cannot split evenly.
    """
    from bert_core.pretrain_data.loader import check_vocab_size
    from bert_core.pretrain_data.storage import read_index

    vocab_size, vocab_sha = _vocab_size(vocab_dir)
    stats: dict[str, Any] = {"vocab_size": vocab_size}
    for i, phase in enumerate(params.phases):
        per_process = phase.micro_batch * world_size
        if phase.global_batch % per_process:
            raise ValueError(
                f"pretrain.phases[{i}].global_batch = {phase.global_batch} cannot be split over {world_size} "
                f"process(es) x micro_batch {phase.micro_batch}: it must be a multiple of {per_process}"
            )
        for split in ("train", "heldout"):
            d = data_dir / phase.name / split
            index = read_index(d)  # FileNotFoundError naming the directory
            check_vocab_size(d, vocab_size)
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
            if int(index["max_seq_length"]) != phase.max_seq_length:
                raise ValueError(
                    f"pretrain.phases[{i}].max_seq_length = {phase.max_seq_length} but {d} holds "
                    f"{index['max_seq_length']}-token instances; make them agree"
                )
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
    return stats


def unigram_log_prior(train_dir: Path, max_items: int = 20_000_000) -> torch.Tensor:
    """Log frequencies ``(V,)`` of the MLM targets in a training data directory (add-one smoothed).

    Uses the stored labels of statically masked data, else the stored tokens (minus special tokens),
    reading at most ``max_items`` of them. Setting the MLM output bias to this makes the untrained model
    predict the unigram distribution (the best context-free guess) from step 0; the default (zeros) is
    the paper's initialisation.
    """
    import numpy as np

    from bert_core.pretrain_data.storage import InstanceStore

    store = InstanceStore(train_dir)
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
