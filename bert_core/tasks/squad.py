"""SQuAD v1.1 / v2.0 loaders: the official JSON files, or ``rajpurkar/squad`` / ``rajpurkar/squad_v2``, or
JSON Lines of one question a line in the Hub's columns (``.jsonl``: what ``Dataset.to_json`` writes).

Canonical row (one per question)::

    {"id": str, "title": str, "context": str, "question": str,
     "answers": {"text": [str, ...], "answer_start": [int, ...]}, "is_impossible": bool}

Training files hold one answer per question, dev files several (all kept, in order: scoring takes the max).
v2.0's unanswerable questions have no answers and ``is_impossible`` true; their ``plausible_answers`` are
dropped. Every answer is checked against its context: ``context[start:start + len(text)] == text`` must
hold, else :class:`TaskDataError` names the file and question id (the span-extraction labels would be
wrong otherwise).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from bert_core.tasks.base import TaskDataError, TaskRows, excerpt, hub_source, hub_split
from bert_core.tasks.registry import TaskSpec


def check_answer_offsets(row: Mapping[str, Any], where: str) -> None:
    """Raise :class:`TaskDataError` unless every answer of ``row`` is found at its character offset."""
    answers = row["answers"]
    if len(answers["text"]) != len(answers["answer_start"]):
        raise TaskDataError(
            f"{where}: question {row['id']}: {len(answers['text'])} answer texts but "
            f"{len(answers['answer_start'])} offsets"
        )
    if row["is_impossible"] and answers["text"]:
        raise TaskDataError(f"{where}: question {row['id']} is marked impossible but has answers")
    if not row["is_impossible"] and not answers["text"]:
        raise TaskDataError(f"{where}: question {row['id']} has no answer and is not marked is_impossible")
    context = row["context"]
    for text, start in zip(answers["text"], answers["answer_start"]):
        if not isinstance(start, int) or isinstance(start, bool):
            raise TaskDataError(
                f"{where}: question {row['id']}: answer_start must be an integer (a character offset into "
                f"the context), got {excerpt(start)} ({type(start).__name__}); fix the file"
            )
        found = context[start : start + len(text)] if isinstance(start, int) and start >= 0 else None
        if found != text:
            raise TaskDataError(
                f"{where}: question {row['id']}: answer {excerpt(text)} is not at answer_start={start} of "
                f"its context (found {excerpt(found)}); fix the offset"
            )


def _version_ok(spec: TaskSpec, version: str) -> bool:
    v = version.lstrip("v")
    return v.startswith("2") if spec.no_answers else v.startswith("1")


def load_squad_json(spec: TaskSpec, split: str, path: Path, limit: int | None = None) -> TaskRows:
    """Read an official SQuAD JSON file (or a ``.jsonl`` file, :func:`_squad_lines`) into canonical rows,
    checking every answer offset."""
    if path.suffix == ".jsonl":
        return _squad_lines(spec, split, path, limit)
    articles = read_squad_articles(spec, path)
    return squad_rows(spec, split, path, articles, range(len(articles)), limit)


def _squad_lines(spec: TaskSpec, split: str, path: Path, limit: int | None) -> TaskRows:
    """JSON Lines of one question a line: ``id``, ``context``, ``question``, ``answers`` (``{"text": [...],
    "answer_start": [...]}`` as on the Hub, or a list of ``{"text", "answer_start"}``), optionally ``title``
    and ``is_impossible`` (default: no answers). Errors name the file and line."""
    rows: list[dict[str, Any]] = []
    seen: dict[str, str] = {}
    available = 0
    with path.open(encoding="utf-8") as f:
        for number, line in enumerate(f, start=1):
            if not line.strip():
                continue
            available += 1
            if limit is not None and len(rows) >= limit:
                continue  # counted, not read
            where = f"{path}:{number}"
            try:
                ex = json.loads(line)
                answers = ex["answers"]
                if isinstance(answers, list):
                    answers = {k: [a[k] for a in answers] for k in ("text", "answer_start")}
                row = {
                    "id": str(ex["id"]),
                    "title": str(ex.get("title") or ""),
                    "context": ex["context"],
                    "question": ex["question"],
                    "answers": {"text": list(answers["text"]), "answer_start": list(answers["answer_start"])},
                    "is_impossible": bool(ex.get("is_impossible", not answers["text"])),
                }
            except json.JSONDecodeError as err:
                raise TaskDataError(f"{where}: not valid JSON ({err.msg})") from None
            except (KeyError, TypeError, AttributeError) as err:
                raise TaskDataError(
                    f"{where}: missing or malformed field {err} (a line holds one question: id, context, question, "
                    "answers with text and answer_start)"
                ) from None
            rows.append(_checked(spec, row, where, f"line {number}", seen, where))
    return _counted(TaskRows(rows, task=spec.name, split=split, source=str(path)), available)


def _checked(
    spec: TaskSpec, row: dict[str, Any], where: str, at: str, seen: dict[str, str], source: str
) -> dict[str, Any]:
    """``row`` once its id is new (``seen``: id -> where first), its ``is_impossible`` allowed by ``spec`` and
    every answer found at its offset; else :class:`TaskDataError` naming ``where``."""
    if row["id"] in seen:  # predictions and scores are keyed by id: one would overwrite the other
        raise TaskDataError(
            f"{where}: duplicate question id {excerpt(row['id'])} (first at {seen[row['id']]}); "
            "question ids must be unique: fix or remove one of them"
        )
    seen[row["id"]] = at
    if row["is_impossible"] and not spec.no_answers:
        fix = "set define.no_answers: true" if spec.own else "use the squad_v2 task for SQuAD 2.0 data"
        raise TaskDataError(
            f"{where}: question {excerpt(row['id'])} is marked is_impossible, which a "
            f"{spec.name} (SQuAD v1.1) file cannot have; {fix}, or remove the question"
        )
    check_answer_offsets(row, source)
    return row


def read_squad_articles(spec: TaskSpec, path: Path) -> list[Any]:
    """The ``data`` list (articles) of an official SQuAD JSON file, its version checked against ``spec``."""
    try:
        with path.open(encoding="utf-8") as f:
            doc = json.load(f)
    except json.JSONDecodeError as err:
        raise TaskDataError(f"{path}:{err.lineno}: not valid JSON ({err.msg})") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("data"), list):
        raise TaskDataError(f"{path}: expected an object with a 'data' list (the official SQuAD format)")
    version = str(doc.get("version", ""))
    if version and not _version_ok(spec, version):
        raise TaskDataError(f"{path}: file says version {version!r}, which is not a {spec.name} file")
    return doc["data"]


def squad_rows(
    spec: TaskSpec,
    split: str,
    path: Path,
    articles: list[Any],
    indices: range,
    limit: int | None = None,
) -> TaskRows:
    """Canonical rows of the articles ``indices`` of ``articles`` (errors name ``data[<index>]`` in ``path``).

    The returned rows' ``available`` attribute is the number of questions in those articles before ``limit``.
    """
    rows: list[dict[str, Any]] = []
    seen: dict[str, str] = {}  # question id -> where it first appeared
    available = sum(
        len(p["qas"])
        for a in indices
        if isinstance(articles[a], dict)
        for p in articles[a].get("paragraphs") or []
        if isinstance(p, dict) and isinstance(p.get("qas"), list)
    )
    for a in indices:
        article = articles[a]
        if not isinstance(article, dict):
            raise TaskDataError(f"{path} data[{a}]: expected an article object with 'title' and 'paragraphs'")
        for p, paragraph in enumerate(article.get("paragraphs", [])):
            for q, qa in enumerate(paragraph.get("qas", [])):
                where = f"{path} data[{a}].paragraphs[{p}].qas[{q}]"
                try:
                    row = {
                        "id": str(qa["id"]),
                        "title": str(article.get("title", "")),
                        "context": paragraph["context"],
                        "question": qa["question"],
                        "answers": {
                            "text": [ans["text"] for ans in qa["answers"]],
                            "answer_start": [ans["answer_start"] for ans in qa["answers"]],
                        },
                        "is_impossible": bool(qa.get("is_impossible", False)),
                    }
                except (KeyError, TypeError) as err:
                    raise TaskDataError(f"{where}: missing or malformed field {err}") from None
                at = f"data[{a}].paragraphs[{p}].qas[{q}]"
                rows.append(_checked(spec, row, where, at, seen, str(path)))
                if limit is not None and len(rows) >= limit:
                    return _counted(TaskRows(rows, task=spec.name, split=split, source=str(path)), available)
    return _counted(TaskRows(rows, task=spec.name, split=split, source=str(path)), available)


def load_squad_hub(spec: TaskSpec, split: str, limit: int | None = None) -> TaskRows:
    """Load SQuAD from the Hub (already one row per question) into canonical rows."""
    hub_name = spec.hub_splits[split]
    ds = hub_split(spec.hub_path, spec.hub_config, hub_name, limit, spec.hub_revision)
    source = hub_source(spec.hub_path, spec.hub_config, hub_name, spec.hub_revision)
    rows = []
    for ex in ds:
        answers = {
            "text": list(ex["answers"]["text"]),
            "answer_start": [int(s) for s in ex["answers"]["answer_start"]],
        }
        row = {
            "id": str(ex["id"]),
            "title": ex["title"],
            "context": ex["context"],
            "question": ex["question"],
            "answers": answers,
            "is_impossible": not answers["text"],
        }
        check_answer_offsets(row, source)
        rows.append(row)
    return TaskRows(rows, task=spec.name, split=split, source=source)


def _counted(rows: TaskRows, available: int) -> TaskRows:
    rows.available = available
    return rows
