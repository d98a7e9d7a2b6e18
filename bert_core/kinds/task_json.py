"""The task JSON of a fine-tuned model: what serving needs besides the weights (task, kind, labels,
lengths, SQuAD v2.0's null threshold; an own task's definition, so that it is served without the params that
declared it).

It lives with the kinds because the finetune stage writes it beside the model it saves (``task.json`` in
``models/finetuned/<task>``) and the registered MLflow Model holds the same JSON
(:mod:`bert_core.serving.task` re-exports it); the finetune stage may not import the serving package.
"""

from __future__ import annotations

from typing import Any

#: Version of the task JSON layout.
TASK_FORMAT = 1
#: Longest text field a served model accepts (characters); a longer one is answered 400. SQuAD's longest
#: context has ~4,000 characters; 50,000 lets span QA read a long document (doc stride inside).
DEFAULT_MAX_TEXT_CHARS = 50_000


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
    from bert_core.kinds.base import max_seq_length
    from bert_core.tasks.own import own_task_json

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
        **({"own_task": own_task_json(spec)} if spec.own else {}),
    }
