"""What every task kind shares at run time: the model's inputs, the tokenizer, the prediction loop.

- :func:`load_tokenizer` loads the fast WordPiece tokenizer saved with a model.
- :func:`predict` runs a model over features in length-sorted, dynamically padded batches and returns one
  unpadded output array per feature, in feature order; the task's kind
  (:meth:`bert_core.kinds.base.TaskKind.score`) turns them into predictions and scores.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import torch
from torch import nn

from bert_core.constants import TOKENIZER_VOCAB_FILES
from bert_core.device import HostCopy, to_device
from bert_core.finetune.collate import (
    LengthGroupedBatchSampler,
    feature_length,
    pad_collate,
    width_multiple,
)
from bert_core.progress import Progress

log = logging.getLogger(__name__)

#: The model's inputs in a batch, and the training targets (what the collator adds besides is bookkeeping).
MODEL_INPUTS = ("input_ids", "attention_mask", "token_type_ids")
TARGETS = ("labels", "start_positions", "end_positions")


def load_tokenizer(model_dir: str | Path, vocab_size: int | None = None) -> Any:
    """The fast WordPiece tokenizer saved with a model (``tokenizer.json`` or ``vocab.txt``).

    Raises:
        FileNotFoundError: the directory has no tokenizer files (transformers would silently build an
            empty tokenizer that maps everything to ``[UNK]``).
        ValueError: the vocabulary is larger than the model's embedding table.
    """
    from transformers import BertTokenizerFast

    model_dir = Path(model_dir)
    if not any((model_dir / name).is_file() for name in TOKENIZER_VOCAB_FILES):
        raise FileNotFoundError(
            f"{model_dir} has no tokenizer files ({' or '.join(TOKENIZER_VOCAB_FILES)}); the pretrain stage "
            f"copies them into its model directory - copy the vocab.txt the model was trained with there"
        )
    tokenizer = BertTokenizerFast.from_pretrained(str(model_dir))
    if vocab_size is not None and len(tokenizer) > vocab_size:
        raise ValueError(
            f"{model_dir}: the tokenizer has {len(tokenizer)} tokens but the model's vocab_size is {vocab_size}; "
            "use the vocab the model was pretrained with"
        )
    return tokenizer


def autocast(device: torch.device, precision: str) -> contextlib.AbstractContextManager:
    """bf16 autocast on a CUDA device that has it (``precision`` auto/bf16), else nothing."""
    if device.type == "cuda" and precision in ("auto", "bf16") and torch.cuda.is_bf16_supported():
        return torch.autocast("cuda", dtype=torch.bfloat16)
    return contextlib.nullcontext()


@torch.no_grad()
def predict(
    model: nn.Module,
    features: Sequence[dict[str, Any]],
    *,
    batch_size: int,
    device: torch.device | str = "cpu",
    precision: str = "auto",
    label: str | None = None,
) -> list[np.ndarray]:
    """Run the model over features; one float32 output per feature, in feature order, padding cut off.

    With a ``label`` (e.g. ``"sst2 dev eval"``), long runs log their progress (:class:`~bert_core.progress.Progress`:
    batches done / total, examples per second, ETA); served models pass none.

    Returns:
        Per feature: (num_labels,) for sequence classification/regression, (num_choices,) for multiple
        choice, (L, num_labels) for token classification, (L, 2) start/end logits for span QA.
    """
    device = torch.device(device)
    was_training = model.training
    if was_training:  # Module.train walks every submodule: a served model (always eval) skips it per call
        model.eval()
    out: list[np.ndarray | None] = [None] * len(features)
    pending: _Pending | None = None
    try:
        # make_loader's evaluation batches (longest first), collated in place: a DataLoader adds ~1 ms per call
        sampler = LengthGroupedBatchSampler([feature_length(f) for f in features], batch_size, shuffle=False)
        progress = Progress(label, len(sampler), noun="batch", logger=log) if label else None
        multiple = width_multiple(device)

        def read(done: _Pending) -> None:
            done.store(out)
            if progress is not None:
                progress.advance(1, examples=len(done.index))

        for index in sampler:
            batch = pad_collate([features[i] for i in index], pad_to_multiple_of=multiple)
            inputs = to_device({k: batch[k] for k in MODEL_INPUTS}, device)
            with autocast(device, precision):
                result = model(**inputs)
            if hasattr(result, "start_logits"):
                logits = torch.stack([result.start_logits, result.end_logits], dim=-1)  # (B, T, 2)
            else:
                logits = result.logits  # (B, C) or (B, T, C)
            queued = _Pending(index, batch["attention_mask"].sum(-1).tolist(), HostCopy.start(logits.float()))
            if pending is not None:
                read(pending)  # the batch before, read while the device runs this one
            pending = queued
        if pending is not None:
            read(pending)
        if progress is not None:
            progress.finish()
    finally:
        if was_training:
            model.train()
    return out  # type: ignore[return-value]


class _Pending(NamedTuple):
    """One batch's outputs on their way to the host (on a GPU, read while the device runs the next batch)."""

    index: list[int]
    lengths: list[int]
    logits: HostCopy

    def store(self, out: list[np.ndarray | None]) -> None:
        """Each feature's output, padding cut off, into its place in ``out``."""
        logits = self.logits.wait().numpy()
        per_token = logits.ndim == 3
        for j, i in enumerate(self.index):
            out[i] = logits[j][: self.lengths[j]] if per_token else logits[j]
