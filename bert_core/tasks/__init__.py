"""Downstream tasks of the BERT paper: GLUE, SQuAD v1.1/v2.0, SWAG, CoNLL-2003 NER.

* :func:`get_task` / :data:`TASKS` -- a :class:`TaskSpec` per task (kind, labels, splits, metric, Hub id,
  local files, GLUE submission file); :func:`own_task_spec` -- a user's own classification, regression or
  NER task on their own files (:mod:`bert_core.tasks.own`, read by :mod:`bert_core.tasks.table`).
* :func:`load_task_split` -- one split as canonical rows, from local official files (``BERT_DATA_ROOT``)
  or the Hugging Face Hub.
* The data checks on loaded rows depend on the task's kind: :mod:`bert_core.kinds.checks`.
"""

from bert_core.tasks.base import TaskDataError, TaskRows
from bert_core.tasks.conll import iob1_to_iob2
from bert_core.tasks.glue import glue_submission_text
from bert_core.tasks.loader import load_task_split
from bert_core.tasks.own import own_task_json, own_task_spec, task_from_json
from bert_core.tasks.registry import CONLL_TAGS, GLUE_TASKS, TASKS, TaskSpec, get_task

__all__ = [
    "CONLL_TAGS",
    "GLUE_TASKS",
    "TASKS",
    "TaskDataError",
    "TaskRows",
    "TaskSpec",
    "get_task",
    "glue_submission_text",
    "iob1_to_iob2",
    "load_task_split",
    "own_task_json",
    "own_task_spec",
    "task_from_json",
]
