"""SWAG loader: the official ``rowanz/swagaf`` CSV files, or ``allenai/swag`` (config ``regular``).

Canonical row::

    {"id": str, "context": str, "start": str, "endings": [str, str, str, str], "label": int | None}

``context`` is ``sent1`` (the first sentence), ``start`` is ``sent2`` (the beginning of the second, which
each ending completes), ``label`` the index of the right ending (``None`` in the unlabelled test file).
``id`` is the CSV's unnamed first column (the row index) when present, else the 0-based row number. The
files are real CSV (quoted fields with commas), read with Python's ``csv`` module.
"""

from __future__ import annotations

import csv
from pathlib import Path

from bert_core.tasks.base import TaskDataError, TaskRows, excerpt, hub_source, hub_split
from bert_core.tasks.registry import TaskSpec

ENDINGS = ("ending0", "ending1", "ending2", "ending3")
_REQUIRED = ("sent1", "sent2", *ENDINGS)


def _label(raw: str | None, path: Path, lineno: int) -> int:
    if raw not in ("0", "1", "2", "3"):
        raise TaskDataError(f"{path}:{lineno}: SWAG label {excerpt(raw)} is not one of 0, 1, 2, 3")
    return int(raw)


def load_swag_csv(spec: TaskSpec, split: str, path: Path, limit: int | None = None) -> TaskRows:
    """Read an official SWAG CSV (``train.csv``/``val.csv`` labelled, ``test.csv`` not).

    Raises:
        TaskDataError: naming the file and line: missing columns, a row with the wrong number of fields,
            or a label outside 0-3.
    """
    rows = []
    with path.open(encoding="utf-8", newline="") as f:
        reader = csv.reader(f)
        try:
            header = next(reader)
        except StopIteration:
            raise TaskDataError(f"{path}: empty file; expected the SWAG CSV header") from None
        absent = [c for c in _REQUIRED if c not in header]
        labelled = split not in spec.test_splits
        if labelled and "label" not in header:
            absent.append("label")
        if absent:
            raise TaskDataError(f"{path}:1: missing column(s) {absent} in header {excerpt(header)}")
        col = {name: i for i, name in enumerate(header)}
        has_index = header[0] == ""
        for fields in reader:
            lineno = reader.line_num
            if not fields:
                continue
            if len(fields) != len(header):
                raise TaskDataError(
                    f"{path}:{lineno}: {len(fields)} fields, the header has {len(header)}; fix or remove the row"
                )
            rows.append(
                {
                    "id": fields[0] if has_index else str(len(rows)),
                    "context": fields[col["sent1"]],
                    "start": fields[col["sent2"]],
                    "endings": [fields[col[e]] for e in ENDINGS],
                    "label": _label(fields[col["label"]], path, lineno) if labelled else None,
                }
            )
            if limit is not None and len(rows) >= limit:
                break
    return TaskRows(rows, task=spec.name, split=split, source=str(path))


def load_swag_hub(spec: TaskSpec, split: str, limit: int | None = None) -> TaskRows:
    """Load SWAG from ``allenai/swag`` (``regular``); the Hub's test labels (-1) become ``None``."""
    hub_name = spec.hub_splits[split]
    ds = hub_split(spec.hub_path, spec.hub_config, hub_name, limit, spec.hub_revision)
    rows = []
    for i, ex in enumerate(ds):
        label = ex.get("label")
        rows.append(
            {
                "id": str(i),
                "context": ex["sent1"],
                "start": ex["sent2"],
                "endings": [ex[e] for e in ENDINGS],
                "label": None if label is None or int(label) < 0 else int(label),
            }
        )
    return TaskRows(
        rows,
        task=spec.name,
        split=split,
        source=hub_source(spec.hub_path, spec.hub_config, hub_name, spec.hub_revision),
    )
