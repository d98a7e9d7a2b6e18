"""The served model's task JSON (``artifacts/task.json``) and the table of what serves each kind.

``SERVING`` maps a task JSON's ``kind`` to its component: the task kinds of :data:`bert_core.kinds.KINDS`
(their ``serve`` methods) and the pretrained model's fill-mask (:mod:`bert_core.serving.fill_mask`).
"""

from __future__ import annotations

from typing import Any

from bert_core.kinds import KINDS
from bert_core.serving.fill_mask import FillMask

#: Version of the task JSON layout.
TASK_FORMAT = 1
#: Longest text field a served model accepts (characters); a longer one is answered 400. SQuAD's longest
#: context has ~4,000 characters; 50,000 lets span QA read a long document (doc stride inside).
DEFAULT_MAX_TEXT_CHARS = 50_000

#: ``kind`` -> the component that serves it.
SERVING: dict[str, Any] = {**KINDS, FillMask.name: FillMask()}


def get_component(kind: str) -> Any:
    """The component that serves ``kind`` (a :class:`bert_core.kinds.base.TaskKind` or :class:`FillMask`)."""
    try:
        return SERVING[kind]
    except KeyError:
        raise KeyError(f"no serving for kind {kind!r}; known kinds: {', '.join(SERVING)}") from None


def serving_task(
    spec: Any, settings: Any, *, null_threshold: float | None = None, batch_size: int | None = None
) -> dict[str, Any]:
    """The task JSON of a fine-tuned model.

    Args:
        spec: The task (:class:`bert_core.tasks.TaskSpec`).
        settings: Its fine-tuning settings (:class:`bert_core.finetune.TaskSettings`): lengths, windows.
        null_threshold: SQuAD v2.0's threshold tuned on dev (``dev.null_threshold`` of the stage metrics).
        batch_size: Prediction batch size (default: the settings' ``eval_batch_size``, at most 64).
    """
    from bert_core.kinds import max_seq_length

    return {
        "format": TASK_FORMAT,
        "task": spec.name,
        "kind": spec.kind,
        "labels": [str(label) for label in spec.labels],
        "max_seq_length": max_seq_length(spec, settings),
        "doc_stride": settings.doc_stride,
        "max_query_length": settings.max_query_length,
        "n_best_size": settings.n_best_size,
        "max_answer_length": settings.max_answer_length,
        "null_threshold": None if null_threshold is None else float(null_threshold),
        "batch_size": batch_size or min(int(settings.eval_batch_size), 64),
        "max_text_chars": DEFAULT_MAX_TEXT_CHARS,
    }


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
