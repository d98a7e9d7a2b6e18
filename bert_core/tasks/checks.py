"""Great Expectations checks on loaded task data (rows from :func:`bert_core.tasks.load_task_split`).

The loaders already reject malformed rows; these checks catch what a well-formed file can still get wrong
before a fine-tuning run spends hours on it: labels outside the label set, empty texts, SQuAD answers that
are not at their character offsets, SWAG questions without exactly four endings, NER tags outside the tag
set, duplicate ids.

GE checks columns of scalars, so :func:`task_frame` flattens the rows into one and adds derived columns
(``answers_at_offsets``, ``n_endings``, ``tags_in_label_set`` ...) that the expectations then test.
Empty-text checks tolerate up to 0.1% of rows (``mostly=0.999``): real training sets carry the odd empty
text and a handful does no harm; a systematic problem still fails.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

from bert_core.checks import Check, CheckReport, validate
from bert_core.tasks.base import TaskRows
from bert_core.tasks.registry import TaskSpec, get_task

EMPTY_TEXT_TOLERANCE = 0.999  # ``mostly`` for the non-empty-text expectations


def _strip_len(value: Any) -> int:
    return len(value.strip()) if isinstance(value, str) else 0


def task_frame(spec: TaskSpec, rows: Sequence[dict[str, Any]]):
    """Flatten canonical rows into a pandas frame of scalars for the expectations of :func:`task_checks`."""
    import pandas as pd

    records: list[dict[str, Any]] = []
    for r in rows:
        rec: dict[str, Any] = {"id": r["id"]}
        if spec.kind in ("classification", "regression"):
            rec["text_a_len"] = _strip_len(r["text_a"])
            rec["text_b_len"] = None if r["text_b"] is None else _strip_len(r["text_b"])
            rec["label"] = r["label"]
        elif spec.kind == "span_qa":
            ctx, ans = r["context"], r["answers"]
            rec["context_len"] = _strip_len(ctx)
            rec["question_len"] = _strip_len(r["question"])
            rec["answers_at_offsets"] = len(ans["text"]) == len(ans["answer_start"]) and all(
                isinstance(s, int) and s >= 0 and ctx[s : s + len(t)] == t
                for t, s in zip(ans["text"], ans["answer_start"])
            )
            # An answerable question has answers, an impossible one has none.
            rec["answers_match_is_impossible"] = bool(ans["text"]) != bool(r["is_impossible"])
        elif spec.kind == "multiple_choice":
            rec["context_len"] = _strip_len(r["context"])
            rec["n_endings"] = len(r["endings"])
            rec["min_ending_len"] = min((_strip_len(e) for e in r["endings"]), default=0)
            rec["label"] = r["label"]
        elif spec.kind == "token_classification":
            rec["n_tokens"] = len(r["tokens"])
            rec["tags_match_tokens"] = len(r["tags"]) == len(r["tokens"])
            rec["min_token_len"] = min((_strip_len(t) for t in r["tokens"]), default=0)
            rec["tags_in_label_set"] = all(t in spec.labels for t in r["tags"])
        records.append(rec)
    return pd.DataFrame.from_records(records)


def task_checks(spec: TaskSpec, split: str) -> list[Check]:
    """The expectations for one split of ``spec`` (on the columns :func:`task_frame` builds)."""
    import great_expectations as gx

    E = gx.expectations
    labelled = split not in spec.test_splits
    checks = [
        Check(E.ExpectColumnValuesToNotBeNull(column="id")),
        Check(E.ExpectColumnValuesToBeUnique(column="id")),
    ]

    def nonempty(column: str) -> Check:
        return Check(E.ExpectColumnValuesToBeBetween(column=column, min_value=1, mostly=EMPTY_TEXT_TOLERANCE))

    def all_true(column: str) -> Check:
        return Check(E.ExpectColumnValuesToBeInSet(column=column, value_set=[True]))

    if spec.kind in ("classification", "regression"):
        checks.append(nonempty("text_a_len"))
        if spec.name not in ("cola", "sst2"):  # sentence-pair tasks
            checks.append(nonempty("text_b_len"))
        if not labelled:
            checks.append(Check(E.ExpectColumnValuesToBeNull(column="label")))
        elif spec.kind == "regression":
            checks.append(Check(E.ExpectColumnValuesToNotBeNull(column="label")))
            checks.append(
                Check(E.ExpectColumnValuesToBeBetween(column="label", min_value=0.0, max_value=5.0))
            )
        else:
            checks.append(Check(E.ExpectColumnValuesToNotBeNull(column="label")))
            checks.append(
                Check(E.ExpectColumnValuesToBeInSet(column="label", value_set=list(range(len(spec.labels)))))
            )
    elif spec.kind == "span_qa":
        checks += [nonempty("context_len"), nonempty("question_len")]
        checks += [all_true("answers_at_offsets"), all_true("answers_match_is_impossible")]
    elif spec.kind == "multiple_choice":
        checks.append(nonempty("context_len"))
        checks.append(Check(E.ExpectColumnValuesToBeBetween(column="n_endings", min_value=4, max_value=4)))
        checks.append(nonempty("min_ending_len"))
        if labelled:
            checks.append(Check(E.ExpectColumnValuesToNotBeNull(column="label")))
            checks.append(Check(E.ExpectColumnValuesToBeInSet(column="label", value_set=[0, 1, 2, 3])))
        else:
            checks.append(Check(E.ExpectColumnValuesToBeNull(column="label")))
    elif spec.kind == "token_classification":
        checks.append(Check(E.ExpectColumnValuesToBeBetween(column="n_tokens", min_value=1)))
        checks += [all_true("tags_match_tokens"), all_true("tags_in_label_set")]
        checks.append(Check(E.ExpectColumnValuesToBeBetween(column="min_token_len", min_value=1)))
    return checks


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
