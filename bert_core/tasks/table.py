"""An own task's files (:mod:`bert_core.tasks.own`): CSV, TSV or JSON Lines with named fields; NER also
CoNLL columns.

Classification and regression: the format is the file's suffix, ``.csv`` (comma-separated, a header line,
quoted fields as spreadsheets and ``pandas.DataFrame.to_csv`` write them), ``.tsv`` (the same,
tab-separated) or ``.jsonl`` / ``.json`` (one JSON object a line). Canonical rows are the GLUE loaders'::

    {"id": str, "text_a": str, "text_b": str | None, "label": int | float}

``id`` is the row's ``id`` field where the file has one, else its 0-based row number; ``label`` indexes the
task's labels (a float for regression).

Multiple choice with ``choices``: the same files, a row's choices in one list field (JSON Lines) or one
field each (CSV columns); rows are the SWAG loader's, ``{"id", "context", "start", "endings", "label"}``
(``label`` the right choice's position).

NER (``token_classification``): JSON Lines with a word list and a tag list per sentence (``.jsonl`` /
``.json``), or any other suffix as CoNLL columns (a word per line, its tag in the last whitespace-separated
column, a blank line after each sentence, ``-DOCSTART-`` lines skipped: CoNLL-2003's and most NER
corpora's layout). Rows are the CoNLL-2003 loader's, ``{"id", "tokens", "tags"}`` in IOB2 (IOB1 converted).

Every row must be labelled: a missing field, an empty text, a label, score or tag that is not the task's
raises :class:`TaskDataError` naming the file and line.
"""

from __future__ import annotations

import csv
import functools
import json
import math
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from bert_core.tasks.base import (
    TaskDataError,
    TaskRows,
    check_line_endings,
    excerpt,
    hub_source,
    hub_split,
    not_utf8,
)
from bert_core.tasks.conll import iob1_to_iob2
from bert_core.tasks.registry import TaskSpec

#: File suffix -> the csv module's delimiter (``None``: JSON Lines).
SUFFIXES: dict[str, str | None] = {".csv": ",", ".tsv": "\t", ".jsonl": None, ".json": None}
_EXTRA = "\0extra"  # where csv puts the fields of a row beyond its header's


def records(path: Path) -> Iterator[tuple[int, dict[str, Any]]]:
    """``(line number, record)`` of every record of ``path`` (blank JSON lines skipped).

    Raises:
        TaskDataError: an unknown suffix, a record that is not a JSON object, a CSV row with more fields than
            its header.
    """
    suffix = path.suffix.lower()
    if suffix not in SUFFIXES:
        raise TaskDataError(
            f"{path}: an own task reads {', '.join(SUFFIXES)} files (by their suffix); convert the file or "
            "rename it for what it holds"
        )
    check_line_endings(path)
    try:
        yield from _records(path, SUFFIXES[suffix])
    except UnicodeDecodeError:  # as the paper's tasks' files: the line and byte
        raise not_utf8(path) from None


def _records(path: Path, delimiter: str | None) -> Iterator[tuple[int, dict[str, Any]]]:
    with path.open(encoding="utf-8-sig", newline="" if delimiter else None) as f:
        if delimiter is None:
            for lineno, line in enumerate(f, start=1):
                if not line.strip():
                    continue
                try:
                    record = json.loads(line)
                except json.JSONDecodeError as err:
                    raise TaskDataError(
                        f"{path}:{lineno}: not JSON ({err.msg}); one JSON object a line"
                    ) from None
                if not isinstance(record, dict):
                    raise TaskDataError(f"{path}:{lineno}: a JSON {type(record).__name__}, not an object")
                yield lineno, record
            return
        reader = csv.DictReader(f, delimiter=delimiter, restkey=_EXTRA)
        for record in reader:
            extra = record.pop(_EXTRA, None)
            header = len(reader.fieldnames or ())
            if extra is not None or None in record.values():
                found = (
                    header + len(extra) if extra is not None else sum(v is not None for v in record.values())
                )
                raise TaskDataError(
                    f"{path}:{reader.line_num}: {found} fields, the header has {header}; fix or remove the row "
                    "(a text holding the delimiter must be quoted)"
                )
            yield reader.line_num, record


def _field(spec: TaskSpec, path: str | Path, lineno: int, record: dict[str, Any], role: str) -> Any:
    name = spec.fields[role]
    value = record.get(name)
    if value is None:
        raise TaskDataError(
            f"{path}:{lineno}: no field {name!r} (the task's {role.replace('_', ' ')}; the row has "
            f"{excerpt(sorted(map(str, record)))}); fix the row, or finetune.tasks.{spec.name}.define"
        )
    return value


def _text(spec: TaskSpec, path: str | Path, lineno: int, record: dict[str, Any], role: str) -> str:
    value = _field(spec, path, lineno, record, role)
    if not isinstance(value, str) or not value.strip():
        raise TaskDataError(
            f"{path}:{lineno}: field {spec.fields[role]!r} is {excerpt(value)}, not a text; fix or remove the row"
        )
    return value


def _label(spec: TaskSpec, path: str | Path, lineno: int, record: dict[str, Any]) -> int | float:
    value = _field(spec, path, lineno, record, "label")
    if spec.kind == "regression":
        try:
            score = float(value)
        except (TypeError, ValueError):
            score = math.nan
        if isinstance(value, bool) or not math.isfinite(score):
            raise TaskDataError(
                f"{path}:{lineno}: score {excerpt(value)} is not a number; fix or remove the row"
            )
        return score
    key = label_text(value)
    if key not in spec.labels:
        raise TaskDataError(
            f"{path}:{lineno}: label {excerpt(value)} is not one of the task's labels {list(spec.labels)}; fix "
            f"the row, or add it to finetune.tasks.{spec.name}.define.labels"
        )
    return spec.labels.index(key)


def label_text(value: Any) -> str:
    """A label as the task's label list spells it (JSON ``1`` and ``true`` as ``1`` and ``true``)."""
    return json.dumps(value) if isinstance(value, bool) else str(value)


def load_table(spec: TaskSpec, split: str, path: Path, limit: int | None = None) -> TaskRows:
    """Read an own task's file into canonical rows (see the module docstring)."""
    if spec.kind == "token_classification":
        words, tags = spec.fields["text_a"], spec.fields["label"]
        return _tagged_rows(spec, split, str(path), tagged_sentences(path, words, tags), limit)
    return _rows(spec, split, str(path), records(path), limit)


def _choices(spec: TaskSpec, path: str | Path, lineno: int, record: dict[str, Any]) -> list[str]:
    """A multiple-choice row's choices: its list field, or its fields one per choice; as many as the task's."""
    fields = spec.fields["choices"]
    if isinstance(fields, str):
        found = _field(spec, path, lineno, record, "choices")
    elif missing := [f for f in fields if record.get(f) is None]:
        raise TaskDataError(
            f"{path}:{lineno}: no field {missing[0]!r} (one of the task's choices; the row has "
            f"{excerpt(sorted(map(str, record)))}); fix the row, or finetune.tasks.{spec.name}.define"
        )
    else:
        found = [record[f] for f in fields]
    if not isinstance(found, list) or not all(isinstance(c, str) and c.strip() for c in found):
        raise TaskDataError(
            f"{path}:{lineno}: the choices {excerpt(found)} are not a list of non-empty texts; fix or remove the row"
        )
    if len(found) != len(spec.labels):
        raise TaskDataError(
            f"{path}:{lineno}: {len(found)} choices, the task has {len(spec.labels)} ({', '.join(spec.labels)}); "
            f"every row has as many (finetune.tasks.{spec.name}.define.labels names them)"
        )
    return found


def _rows(
    spec: TaskSpec, split: str, path: str, numbered: Iterable[tuple[int, dict[str, Any]]], limit: int | None
) -> TaskRows:
    """The classification or regression rows of ``(line or row number, record)`` pairs read from ``path``."""
    rows: list[dict[str, Any]] = []
    for lineno, record in numbered:
        if limit is not None and len(rows) >= limit:
            break
        row_id = str(record["id"]) if record.get("id") not in (None, "") else str(len(rows))
        text_a = _text(spec, path, lineno, record, "text_a")
        text_b = _text(spec, path, lineno, record, "text_b") if "text_b" in spec.fields else None
        label = _label(spec, path, lineno, record)
        if spec.kind == "multiple_choice":
            endings = _choices(spec, path, lineno, record)
            rows.append(
                {"id": row_id, "context": text_a, "start": text_b or "", "endings": endings, "label": label}
            )
        else:
            rows.append({"id": row_id, "text_a": text_a, "text_b": text_b, "label": label})
    if not rows:
        raise TaskDataError(f"{path}: no rows; an own task's {split} split needs labelled rows")
    return TaskRows(rows, task=spec.name, split=split, source=path)


def labels_of(kind: str, path: Path, field: str, words: str = "tokens") -> list[str]:
    """An own task's classes when the params list none: the distinct labels in ``field`` of ``path``, sorted;
    NER: the entity types of its tags (JSON Lines: the tag lists in ``field``, beside the word lists in
    ``words``); multiple choice: ``0`` ... ``N-1`` for the N choices of the first row's list ``words``.

    The file is read once per process while unchanged (the command line's pre-check and the flow ask for
    the same labels).

    Raises:
        TaskDataError: a record without the field; a tag that is neither ``O`` nor ``B-``/``I-`` + type.
    """
    try:
        stat = path.stat()
    except OSError:  # the reader names the file
        return list(_read_labels(kind, path, field, words))
    return list(_read_labels_of(kind, path, stat.st_mtime_ns, stat.st_size, field, words))


@functools.lru_cache(maxsize=16)
def _read_labels_of(
    kind: str, path: Path, _mtime_ns: int, _size: int, field: str, words: str
) -> tuple[str, ...]:
    return _read_labels(kind, path, field, words)


def _read_labels(kind: str, path: Path, field: str, words: str) -> tuple[str, ...]:
    if kind == "multiple_choice":
        return _positions(str(path), records(path), words)
    if kind == "token_classification":
        return tuple(_entity_types(str(path), tagged_sentences(path, words, field)))
    return tuple(_distinct_labels(str(path), records(path), field))


def _distinct_labels(path: str, numbered: Iterable[tuple[int, dict[str, Any]]], field: str) -> list[str]:
    found: set[str] = set()
    for lineno, record in numbered:
        if record.get(field) in (None, ""):
            raise TaskDataError(f"{path}:{lineno}: no label in field {field!r}; fix or remove the row")
        found.add(label_text(record[field]))
    return sorted(found)


def _positions(path: str, numbered: Iterable[tuple[int, dict[str, Any]]], field: str) -> tuple[str, ...]:
    """``0`` ... ``N-1`` for the N choices in ``field`` of the first record."""
    for lineno, record in numbered:
        choices = record.get(field)
        if not isinstance(choices, list) or len(choices) < 2:
            raise TaskDataError(
                f"{path}:{lineno}: field {field!r} is {excerpt(choices)}, not a list of two or more choices; fix "
                "the row, or define.choices"
            )
        return tuple(str(i) for i in range(len(choices)))
    raise TaskDataError(f"{path}: no rows to count the choices of")


def _entity_types(path: str, sentences: Iterable[tuple[int, list[str], list[str]]]) -> list[str]:
    found: set[str] = set()
    for lineno, _, tags in sentences:
        found |= {_tag_type(path, lineno, tag) for tag in tags if tag != "O"}
    return sorted(found)


# ---------------------------------------------------------------------------------------------- NER


def _tag_type(path: str | Path, lineno: int, tag: str) -> str:
    if tag[:2] not in ("B-", "I-") or not tag[2:]:
        raise TaskDataError(
            f"{path}:{lineno}: tag {excerpt(tag)} is not O, B-<type> or I-<type> (IOB); fix the tag"
        )
    return tag[2:]


def tagged_sentences(path: Path, words: str, tags: str) -> Iterator[tuple[int, list[str], list[str]]]:
    """``(line number, words, tags)`` of every sentence of an NER file: JSON Lines (the ``words`` and
    ``tags`` lists of each record) or CoNLL columns (see the module docstring).

    Raises:
        TaskDataError: a record without the lists, lists of different lengths, a CoNLL line of one column.
    """
    if path.suffix.lower() in (".jsonl", ".json"):
        for lineno, record in records(path):
            yield _tagged_record(str(path), lineno, record, words, tags)
        return
    check_line_endings(path)
    sentence: tuple[int, list[str], list[str]] = (0, [], [])
    with path.open(encoding="utf-8-sig") as f:
        for lineno, line in enumerate(f, start=1):
            fields = line.split()
            if not fields or fields[0] == "-DOCSTART-":
                if sentence[1]:
                    yield sentence
                sentence = (0, [], [])
                continue
            if len(fields) < 2:
                raise TaskDataError(
                    f"{path}:{lineno}: one column {excerpt(line.strip())}; a CoNLL line is a word and its tag "
                    "(the last column), a blank line after each sentence"
                )
            sentence = (sentence[0] or lineno, [*sentence[1], fields[0]], [*sentence[2], fields[-1]])
    if sentence[1]:
        yield sentence


def _tagged_record(
    path: str, lineno: int, record: dict[str, Any], words: str, tags: str
) -> tuple[int, list[str], list[str]]:
    """A JSON record's (or Hub row's) sentence: its ``words`` and ``tags`` lists, checked."""
    got = [record.get(words), record.get(tags)]
    if not all(isinstance(v, list) and v and all(isinstance(x, str) and x.strip() for x in v) for v in got):
        raise TaskDataError(
            f"{path}:{lineno}: fields {words!r} and {tags!r} must be non-empty lists of strings (the words and "
            f"their tags), got {excerpt(got)}; fix the row, or define.text / define.label"
        )
    if len(got[0]) != len(got[1]):
        raise TaskDataError(f"{path}:{lineno}: {len(got[0])} words but {len(got[1])} tags; fix the row")
    return lineno, got[0], got[1]


def _tagged_rows(
    spec: TaskSpec,
    split: str,
    path: str,
    sentences: Iterable[tuple[int, list[str], list[str]]],
    limit: int | None,
) -> TaskRows:
    rows: list[dict[str, Any]] = []
    for lineno, words, tags in sentences:
        if limit is not None and len(rows) >= limit:
            break
        bad = next((t for t in tags if t not in spec.labels), None)
        if bad is not None:
            raise TaskDataError(
                f"{path}:{lineno}: tag {excerpt(bad)} in the sentence starting here is not one of the task's "
                f"(O, B-/I- of {sorted({t[2:] for t in spec.labels if t != 'O'})}); fix it, or add its type to "
                f"finetune.tasks.{spec.name}.define.labels"
            )
        rows.append({"id": str(len(rows)), "tokens": words, "tags": iob1_to_iob2(tags)})
    if not rows:
        raise TaskDataError(f"{path}: no sentences; an own task's {split} split needs labelled rows")
    return TaskRows(rows, task=spec.name, split=split, source=path)


# ---------------------------------------------------------------------------------------------- the Hub


def _class_names(feature: Any) -> list[str] | None:
    """The names of a ``ClassLabel`` feature, or of a sequence of them; ``None`` for any other feature."""
    names = getattr(feature, "names", None) or getattr(getattr(feature, "feature", None), "names", None)
    return list(names) if names else None


def _hub_records(ds: Any, field: str) -> Iterator[tuple[int, dict[str, Any]]]:
    """``(row number, row)`` of a Hub split, its ``field`` (a class id, or a list of them) as class names."""
    names = _class_names(ds.features.get(field))
    for number, example in enumerate(ds, start=1):
        record = dict(example)
        value = record.get(field)
        if names is not None and value is not None:
            name = lambda i: names[i] if isinstance(i, int) and 0 <= i < len(names) else None  # noqa: E731
            record[field] = [name(v) for v in value] if isinstance(value, list) else name(value)
        yield number, record


def load_table_hub(spec: TaskSpec, split: str, limit: int | None = None) -> TaskRows:
    """An own task's split from the Hugging Face Hub (``define.hub``), read as its files would be; a
    ``ClassLabel`` label (or tag) is read by its name."""
    if not spec.hub_path:
        raise TaskDataError(
            f"{spec.name}/{split}: an own task reads its own files or a Hub dataset; set "
            f"finetune.tasks.{spec.name}.train_file and dev_file, or define.hub"
        )
    hub_name = spec.hub_splits[split]
    ds = hub_split(spec.hub_path, spec.hub_config, hub_name, limit, spec.hub_revision)
    source = hub_source(spec.hub_path, spec.hub_config, hub_name, spec.hub_revision)
    records = _hub_records(ds, spec.fields["label"])
    if spec.kind == "token_classification":
        words, tags = spec.fields["text_a"], spec.fields["label"]
        sentences = (_tagged_record(source, n, r, words, tags) for n, r in records)
        return _tagged_rows(spec, split, source, sentences, limit)
    return _rows(spec, split, source, records, limit)


def hub_labels(
    kind: str,
    hub: str,
    config: str | None,
    split: str,
    field: str,
    words: str = "tokens",
    revision: str | None = None,
) -> list[str]:
    """An own Hub task's classes when the params list none: the names of its ``ClassLabel`` (in their
    order; multiple choice: of its answer's), else what :func:`labels_of` finds in a file, from the rows of
    ``split``."""
    ds = hub_split(hub, config, split, None, revision)
    names = _class_names(ds.features.get(field))
    source = hub_source(hub, config, split, revision)
    ner = kind == "token_classification"
    if names is not None:  # NER: the types in the order of their tags
        return list(dict.fromkeys(_tag_type(source, 0, t) for t in names if t != "O")) if ner else names
    records = _hub_records(ds, field)
    if kind == "multiple_choice":
        return list(_positions(source, records, words))
    if ner:
        return _entity_types(source, (_tagged_record(source, n, r, words, field) for n, r in records))
    return _distinct_labels(source, records, field)
