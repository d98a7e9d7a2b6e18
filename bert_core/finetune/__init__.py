"""Fine-tuning on the BERT paper's downstream tasks (GLUE, SQuAD v1.1/v2.0, SWAG, CoNLL-2003 NER).

Public API:

- :func:`finetune_task` (``run``): the ``finetune`` stage function for one task -> :class:`FinetuneResult`.
- :class:`FinetuneParams`, :class:`TaskSettings` (``params``): the stage's typed params.
- :class:`FinetuneResult`, :class:`TrialResult` (``results``): trials, selection, flat DVC metrics.
- ``collate`` / ``inference``: dynamic padding and length-grouped batches; the tokenizer and the prediction
  loop. What depends on the task's kind (head, encoding, post-processing, scoring, prediction files) is
  in :mod:`bert_core.kinds`.
- MLflow (model source resolution, nested trial runs, registration + alias): :mod:`bert_core.tracking`.
"""

from bert_core.finetune.params import FinetuneParams, TaskSettings
from bert_core.finetune.results import FinetuneResult, TrialResult


def finetune_task(*args, **kwargs):
    from bert_core.finetune.run import finetune_task as _finetune_task

    return _finetune_task(*args, **kwargs)


finetune_task.__doc__ = "See :func:`bert_core.finetune.run.finetune_task`."

__all__ = ["FinetuneParams", "FinetuneResult", "TaskSettings", "TrialResult", "finetune_task"]
