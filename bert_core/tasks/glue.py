"""GLUE loaders: the official ``download_glue_data.py`` TSV files, or ``nyu-mll/glue`` on the Hub.

Canonical row (classification and regression)::

    {"id": str, "text_a": str, "text_b": str | None, "label": int | float | None}

``label`` indexes ``TaskSpec.labels`` (a float score for STS-B) and is ``None`` on unlabelled test sets.
``id`` is the file's ``index``/``id`` column where it has one (the test files: it is the id the leaderboard
expects) and the 0-based row number otherwise (as the Hub's ``idx``).

TSVs are read as GLUE's own processors read them: tab-split lines with quoting disabled (the texts contain
unbalanced ``"``), UTF-8 with an optional BOM (MRPC has one). Columns are found by their header names, so a
missing column is reported by name. A row with the wrong number of fields or an unknown label raises
:class:`TaskDataError` naming the file and line, except QQP's training file, which is known to contain a few
broken rows: those are skipped and counted, as GLUE's ``QqpProcessor`` skips them.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bert_core.tasks.base import TaskDataError, TaskRows, check_line_endings, excerpt, hub_source, hub_split
from bert_core.tasks.registry import TaskSpec


@dataclass(frozen=True)
class TsvLayout:
    """Which header columns hold what. ``label=None``: an unlabelled (test) file."""

    text_a: str
    text_b: str | None
    label: str | None
    id: str | None
    header: tuple[str, ...] | None = None  # column names of a file without a header line (CoLA)


_COLA_NAMES = ("source", "label", "original_label", "sentence")

#: (labelled layout, test layout) per task.
LAYOUTS: dict[str, tuple[TsvLayout, TsvLayout]] = {
    "cola": (
        TsvLayout("sentence", None, "label", None, header=_COLA_NAMES),
        TsvLayout("sentence", None, None, "index"),
    ),
    "sst2": (TsvLayout("sentence", None, "label", None), TsvLayout("sentence", None, None, "index")),
    "mrpc": (
        TsvLayout("#1 String", "#2 String", "Quality", None),
        TsvLayout("#1 String", "#2 String", None, "index"),
    ),
    "stsb": (
        TsvLayout("sentence1", "sentence2", "score", "index"),
        TsvLayout("sentence1", "sentence2", None, "index"),
    ),
    "qqp": (
        TsvLayout("question1", "question2", "is_duplicate", "id"),
        TsvLayout("question1", "question2", None, "id"),
    ),
    "mnli": (
        TsvLayout("sentence1", "sentence2", "gold_label", "index"),
        TsvLayout("sentence1", "sentence2", None, "index"),
    ),
    "qnli": (
        TsvLayout("question", "sentence", "label", "index"),
        TsvLayout("question", "sentence", None, "index"),
    ),
    "rte": (
        TsvLayout("sentence1", "sentence2", "label", "index"),
        TsvLayout("sentence1", "sentence2", None, "index"),
    ),
    "wnli": (
        TsvLayout("sentence1", "sentence2", "label", "index"),
        TsvLayout("sentence1", "sentence2", None, "index"),
    ),
}

# Tasks whose official files contain known-broken rows that GLUE's processors skip.
_SKIP_MALFORMED = {"qqp"}


def _tsv_lines(path: Path) -> Iterator[tuple[int, list[str]]]:
    """(line number, fields) of every non-empty line; quoting disabled, only ``\\n`` ends a line."""
    check_line_endings(path)
    with path.open(encoding="utf-8-sig", newline="\n") as f:
        for lineno, line in enumerate(f, start=1):
            line = line.rstrip("\n").rstrip("\r")
            if line:
                yield lineno, line.split("\t")


def is_score_task(spec: TaskSpec) -> bool:
    """Whether the task's label is a real-valued score (STS-B: it has no label names), not a class."""
    return not spec.labels


def _parse_label(spec: TaskSpec, raw: str, path: Path, lineno: int) -> int | float:
    if is_score_task(spec):
        try:
            value = float(raw)
        except ValueError:
            value = math.nan
        if not math.isfinite(value):
            raise TaskDataError(f"{path}:{lineno}: {spec.name} score {excerpt(raw)} is not a number")
        return value
    # The TSV spells labels the way the leaderboard does ("0"/"1", "entailment", ...).
    if raw in spec.submission_labels:
        return spec.submission_labels.index(raw)
    raise TaskDataError(
        f"{path}:{lineno}: unknown {spec.name} label {excerpt(raw)}; valid labels: {list(spec.submission_labels)}"
    )


def load_glue_tsv(spec: TaskSpec, split: str, path: Path, limit: int | None = None) -> TaskRows:
    """Read one official GLUE TSV into canonical rows (see module docstring)."""
    labelled_layout, test_layout = LAYOUTS[spec.name]
    lines = _tsv_lines(path)
    if labelled_layout.header is not None and split in ("train", "dev"):
        layout, header = labelled_layout, list(labelled_layout.header)
    else:
        try:
            _, header = next(lines)
        except StopIteration:
            raise TaskDataError(f"{path}: empty file; expected a header line") from None
        has_label = (labelled_layout.label in header) and split not in spec.test_splits
        layout = labelled_layout if has_label else test_layout
        if split not in spec.test_splits and not has_label:
            raise TaskDataError(
                f"{path}:1: header has no {labelled_layout.label!r} column (found {excerpt(header)}); a {split} file "
                f"must be labelled"
            )
    needed = [c for c in (layout.text_a, layout.text_b, layout.label, layout.id) if c is not None]
    absent = [c for c in needed if c not in header]
    if absent:
        raise TaskDataError(
            f"{path}:1: missing column(s) {absent} in header {excerpt(header)}; is this the {spec.name} file?"
        )
    col = {name: header.index(name) for name in needed}
    skipped = {}
    rows: list[dict[str, Any]] = []
    for lineno, fields in lines:
        if len(fields) != len(header):
            if spec.name in _SKIP_MALFORMED:
                skipped["malformed row"] = skipped.get("malformed row", 0) + 1
                continue
            raise TaskDataError(
                f"{path}:{lineno}: {len(fields)} tab-separated fields, the header has {len(header)} "
                f"({excerpt(header)}); fix or remove the row"
            )
        rows.append(
            {
                "id": fields[col[layout.id]] if layout.id else str(len(rows)),
                "text_a": fields[col[layout.text_a]],
                "text_b": fields[col[layout.text_b]] if layout.text_b else None,
                "label": _parse_label(spec, fields[col[layout.label]], path, lineno)
                if layout.label
                else None,
            }
        )
        if limit is not None and len(rows) >= limit:
            break
    return TaskRows(rows, task=spec.name, split=split, source=str(path), skipped=skipped)


# Hub column names per nyu-mll/glue config.
_HUB_COLUMNS = {
    "cola": ("sentence", None),
    "sst2": ("sentence", None),
    "mrpc": ("sentence1", "sentence2"),
    "stsb": ("sentence1", "sentence2"),
    "qqp": ("question1", "question2"),
    "mnli": ("premise", "hypothesis"),
    "ax": ("premise", "hypothesis"),
    "qnli": ("question", "sentence"),
    "rte": ("sentence1", "sentence2"),
    "wnli": ("sentence1", "sentence2"),
}


def load_glue_hub(spec: TaskSpec, split: str, limit: int | None = None) -> TaskRows:
    """Load a GLUE split from ``nyu-mll/glue`` into canonical rows (Hub label -1 -> ``None``)."""
    config, hub_name = spec.hub_config, spec.hub_splits[split]
    if ":" in hub_name:  # "ax:test": another config of the same dataset
        config, hub_name = hub_name.split(":", 1)
    ds = hub_split(spec.hub_path, config, hub_name, limit, spec.hub_revision)
    text_a, text_b = _HUB_COLUMNS[config]
    scores = is_score_task(spec)
    if not scores:
        names = tuple(ds.features["label"].names)
        if names != spec.labels:
            raise TaskDataError(f"{spec.hub_path}/{config}: Hub labels {names} differ from {spec.labels}")
    rows = []
    for ex in ds:
        label = ex["label"]
        if label is None or label < 0:
            label = None
        else:
            label = float(label) if scores else int(label)
        rows.append(
            {
                "id": str(ex["idx"]),
                "text_a": ex[text_a],
                "text_b": ex[text_b] if text_b else None,
                "label": label,
            }
        )
    return TaskRows(
        rows,
        task=spec.name,
        split=split,
        source=hub_source(spec.hub_path, config, hub_name, spec.hub_revision),
    )


def glue_submission_text(spec: TaskSpec, ids: Sequence[str], predictions: Sequence[Any]) -> str:
    """The GLUE leaderboard file for one test split: ``index<TAB>prediction`` lines under a header.

    Args:
        spec: The task (its ``submission_labels`` turn label indices into the official strings).
        ids: Row ids from the test split, in order (its ``index`` column).
        predictions: Predicted label indices (floats for a score, written with 3 decimals, clipped to the
            task's ``score_range``: STS-B's [0, 5]).
    """
    if len(ids) != len(predictions):
        raise ValueError(f"{spec.name}: {len(ids)} ids but {len(predictions)} predictions")
    lines = ["index\tprediction"]
    for idx, pred in zip(ids, predictions):
        if is_score_task(spec):
            low, high = spec.score_range or (-math.inf, math.inf)
            value = f"{min(high, max(low, float(pred))):.3f}"
        else:
            value = spec.submission_labels[int(pred)]
        lines.append(f"{idx}\t{value}")
    return "\n".join(lines) + "\n"
