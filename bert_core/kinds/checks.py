"""Great Expectations checks on loaded task data (rows from :func:`bert_core.tasks.load_task_split`).

The loaders already reject malformed rows; these checks catch what a well-formed file can still get wrong
before a fine-tuning run spends hours on it: labels outside the label set, empty texts, SQuAD answers that
are not at their character offsets, SWAG questions without exactly four endings, NER tags outside the tag
set, duplicate ids.

GE checks columns of scalars, so :func:`task_frame` flattens the rows into one, with the columns the
task's kind derives (``answers_at_offsets``, ``n_endings``, ``tags_in_label_set`` ...,
:meth:`~bert_core.kinds.base.TaskKind.frame_columns`) that its expectations
(:meth:`~bert_core.kinds.base.TaskKind.checks`) then test. Empty-text checks tolerate up to 0.1% of rows
(``mostly=0.999``): real training sets carry the odd empty text and a handful does no harm; a systematic
problem still fails.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

from bert_core.checks import Check, CheckReport, validate
from bert_core.kinds import get_kind
from bert_core.kinds.base import EMPTY_TEXT_TOLERANCE, expectations
from bert_core.tasks.base import TaskRows
from bert_core.tasks.registry import TaskSpec, get_task

__all__ = ["EMPTY_TEXT_TOLERANCE", "check_task_split", "task_checks", "task_frame"]


def task_frame(spec: TaskSpec, rows: Sequence[dict[str, Any]]):
    """Flatten canonical rows into a pandas frame of scalars for the expectations of :func:`task_checks`."""
    import pandas as pd

    kind = get_kind(spec)
    records = [{"id": r["id"], **kind.frame_columns(spec, r)} for r in rows]
    return pd.DataFrame.from_records(records)


def task_checks(spec: TaskSpec, split: str) -> list[Check]:
    """The expectations for one split of ``spec`` (on the columns :func:`task_frame` builds)."""
    E = expectations()
    return [
        Check(E.ExpectColumnValuesToNotBeNull(column="id")),
        Check(E.ExpectColumnValuesToBeUnique(column="id")),
        *get_kind(spec).checks(spec, labelled=split not in spec.test_splits),
    ]


def check_task_split(
    rows: TaskRows | Sequence[dict[str, Any]],
    task: str | TaskSpec | None = None,
    split: str | None = None,
    report_dir: str | os.PathLike[str] | None = None,
) -> CheckReport:
    """Run the task's expectations on loaded rows.

    Args:
        rows: Canonical rows; a :class:`TaskRows` carries its task and split.
        task, split: Needed when ``rows`` is a plain list.
        report_dir: Where to write the Data Docs HTML report.

    Returns:
        The :class:`~bert_core.checks.CheckReport`; ``.raise_for_critical()`` fails the caller.
    """
    task = task if task is not None else getattr(rows, "task", None)
    split = split if split is not None else getattr(rows, "split", None)
    if task is None or split is None:
        raise ValueError("check_task_split needs the task and split (pass them, or pass TaskRows)")
    spec = task if isinstance(task, TaskSpec) else get_task(task)
    if not rows:
        raise ValueError(f"{spec.name}/{split}: no rows to check")
    frame = task_frame(spec, rows)
    return validate(frame, f"task-{spec.name}-{split}", task_checks(spec, split), report_dir=report_dir)
