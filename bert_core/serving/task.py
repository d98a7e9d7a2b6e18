"""The served model's task JSON (``artifacts/task.json``) and the table of what serves each kind.

``SERVING`` maps a task JSON's ``kind`` to its component: the task kinds of :data:`bert_core.kinds.KINDS`
(their ``serve`` methods) and the pretrained model's fill-mask (:mod:`bert_core.serving.fill_mask`).
"""

from __future__ import annotations

from typing import Any

from bert_core.kinds import KINDS
from bert_core.kinds.task_json import DEFAULT_MAX_TEXT_CHARS, TASK_FORMAT, serving_task
from bert_core.serving.fill_mask import FillMask

__all__ = [
    "DEFAULT_MAX_TEXT_CHARS",
    "SERVING",
    "TASK_FORMAT",
    "fill_mask_task",
    "get_component",
    "serving_task",
]

#: ``kind`` -> the component that serves it.
SERVING: dict[str, Any] = {**KINDS, FillMask.name: FillMask()}


def get_component(kind: str) -> Any:
    """The component that serves ``kind`` (a :class:`bert_core.kinds.base.TaskKind` or :class:`FillMask`)."""
    try:
        return SERVING[kind]
    except KeyError:
        raise KeyError(f"no serving for kind {kind!r}; known kinds: {', '.join(SERVING)}") from None


def fill_mask_task(*, max_seq_length: int = 512, top_k: int = 5) -> dict[str, Any]:
    """The task JSON of a pretrained model (``bert-pretrained``): fill-mask."""
    return {
        "format": TASK_FORMAT,
        "task": "fill_mask",
        "kind": FillMask.name,
        "labels": [],
        "max_seq_length": max_seq_length,
        "top_k": top_k,
        "batch_size": 8,  # (B, T, vocab) logits: keep batches small
        "max_text_chars": DEFAULT_MAX_TEXT_CHARS,
    }
