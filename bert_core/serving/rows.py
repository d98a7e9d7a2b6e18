"""The input side of batch prediction (:mod:`bert_core.serving.batch`): a JSON Lines file read lazily, each
row parsed and checked against the model's MLflow input schema and, for this project's models, the model's
own record check, so that a bad row is named by its file and 1-based line before any prediction.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

DEFAULT_ID_FIELD = "id"
MAX_LINE_BYTES = 64 << 20  # one row; longer lines are refused (a file without newlines is not JSON Lines)
_SHOW_VALUE = 60


class BatchPredictionError(ValueError):
    """Batch prediction cannot run or go on; the message names the model, file, line and field."""


class BadRowError(BatchPredictionError):
    """A row of the input file is not valid for the model (``<file>:<line>: field '<f>': ...``)."""

    def __init__(self, path: Path, line: int, field_name: str | None, problem: str) -> None:
        where = f"{path}:{line}: " + (f"field '{field_name}': " if field_name else "")
        super().__init__(f"{where}{problem}; fix or remove the row. No output was written.")
        self.path, self.line, self.field = path, line, field_name


@dataclass(frozen=True)
class InputField:
    """One named input column of the model's schema."""

    name: str
    type: Any  # mlflow DataType, Array, Object, Map or AnyType
    required: bool = True


# ---------------------------------------------------------------------------------------------- schema


def input_fields(schema: Any, model_uri: str = "the model") -> list[InputField] | None:
    """The named input fields of an MLflow input schema, or ``None`` when the model has no schema.

    Raises:
        BatchPredictionError: a tensor-based or unnamed-column schema (JSON rows cannot be mapped to it).
    """
    if schema is None:
        return None
    if schema.is_tensor_spec():
        raise BatchPredictionError(
            f"{model_uri}: its input schema is tensor-based ({schema}); batch prediction reads JSON rows into "
            "named columns, so it needs a column-based signature"
        )
    fields = []
    for spec in schema.inputs:
        if not spec.name:
            raise BatchPredictionError(
                f"{model_uri}: its input schema has an unnamed column ({spec}); batch prediction needs named "
                "fields to read JSON rows"
            )
        fields.append(InputField(spec.name, spec.type, bool(getattr(spec, "required", True))))
    return fields


def _type_name(tp: Any) -> str:
    return getattr(tp, "name", None) or str(tp)


def _show(value: Any) -> str:
    text = json.dumps(value, ensure_ascii=False, default=str)
    return text if len(text) <= _SHOW_VALUE else text[: _SHOW_VALUE - 3] + "..."


def type_problem(value: Any, tp: Any) -> str | None:
    """Why ``value`` (parsed JSON) does not fit MLflow type ``tp``, or ``None`` when it does."""
    from mlflow.types.schema import Array, DataType, Map, Object

    if isinstance(tp, DataType):
        name = tp.name
        if name in ("string", "datetime"):
            if not isinstance(value, str):
                return f"expected a string, got {_show(value)}"
            if not value.strip():
                return "empty text" if name == "string" else "empty datetime"
            return None
        if name == "binary":
            return (
                None if isinstance(value, str) and value else f"expected a base64 string, got {_show(value)}"
            )
        if name == "boolean":
            return None if isinstance(value, bool) else f"expected true or false, got {_show(value)}"
        if name in ("integer", "long"):
            ok = isinstance(value, int) and not isinstance(value, bool)
            return None if ok else f"expected an integer, got {_show(value)}"
        if name in ("float", "double"):
            ok = isinstance(value, int | float) and not isinstance(value, bool)
            if ok and not math.isfinite(value):
                return f"expected a finite number, got {_show(value)}"
            return None if ok else f"expected a number, got {_show(value)}"
        return None
    if isinstance(tp, Array):
        if not isinstance(value, list):
            return f"expected a list of {_type_name(tp.dtype)}, got {_show(value)}"
        if not value:
            return "empty list"
        for i, item in enumerate(value):
            if problem := type_problem(item, tp.dtype):
                return f"item {i}: {problem}"
        return None
    if isinstance(tp, Object | Map):
        return None if isinstance(value, dict) else f"expected an object, got {_show(value)}"
    return None  # AnyType and types this version does not know: the model checks them


# ---------------------------------------------------------------------------------------------- rows


def _lines(path: Path, max_line_bytes: int = MAX_LINE_BYTES) -> Iterator[tuple[int, bytes]]:
    """``(line number, raw line)``, lazily: one line in memory at a time; every byte of the file passes."""
    with open(path, "rb") as fh:
        number = 0
        while True:
            raw = fh.readline(max_line_bytes + 1)
            if not raw:
                return
            number += 1
            if len(raw) > max_line_bytes and not raw.endswith(b"\n"):
                raise BadRowError(
                    path,
                    number,
                    None,
                    f"the line is longer than {max_line_bytes} bytes (is this JSON Lines?)",
                )
            yield number, raw


def parse_row(
    path: Path, number: int, raw: bytes, fields: list[InputField] | None, id_field: str
) -> tuple[dict[str, Any], Any] | None:
    """``(the row's fields for the model, its id or None)``, or ``None`` for a blank line. The model gets
    the schema's fields (without a schema: every field but the id).

    Raises:
        BadRowError: not UTF-8, not JSON, not an object, a missing required field, a wrong type, empty text.
    """
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as err:
        raise BadRowError(
            path,
            number,
            None,
            f"not UTF-8 (byte {raw[err.start : err.start + 1]!r} at "
            f"offset {err.start}); save the file as UTF-8",
        ) from None
    if number == 1:
        text = text.removeprefix("\ufeff")  # a UTF-8 byte-order mark (files saved by some editors)
    if not text.strip():
        return None
    try:
        obj = json.loads(text)
    except json.JSONDecodeError as err:
        raise BadRowError(path, number, None, f"not valid JSON ({err.msg} at column {err.colno})") from None
    if not isinstance(obj, dict):
        raise BadRowError(path, number, None, f"expected a JSON object, got {_show(obj)}")
    row_id = obj.get(id_field)
    if fields is None:
        return {k: v for k, v in obj.items() if k != id_field}, row_id
    row = {}
    for spec in fields:
        value = obj.get(spec.name)
        if value is None:
            if spec.required:
                present = (", ".join(sorted(obj)[:10]) or "none")[:120]
                raise BadRowError(
                    path, number, spec.name, f"missing (required by the model; fields present: {present})"
                )
            continue
        if problem := type_problem(value, spec.type):
            raise BadRowError(path, number, spec.name, problem)
        row[spec.name] = value
    return row, row_id


def record_check(model: Any) -> Callable[[dict[str, Any]], None] | None:
    """The model's own check of one input record, when it has one, else ``None``.

    This project's models have one (:meth:`bert_core.serving.pyfunc.BertPyfunc.check_record`: what
    ``predict`` would refuse, such as a text over the model's length limit or a kind's impossible record,
    found without running the model); other pyfunc models are checked against their schema only.
    """
    try:
        inner = model.unwrap_python_model()
    except Exception:  # not a PythonModel-based pyfunc (or a stand-in without the method)
        return None
    check = getattr(inner, "check_record", None)
    return check if callable(check) else None


def check_file(
    path: Path,
    fields: list[InputField] | None,
    id_field: str = DEFAULT_ID_FIELD,
    check: Callable[[dict[str, Any]], None] | None = None,
    digest: Any = None,
) -> tuple[int, int]:
    """Check every row of ``path`` (streaming) against the schema and, given ``check`` (:func:`record_check`),
    as the model itself would; return ``(rows, blank lines)``. ``digest`` (a hash object) is updated with
    every byte read: the file's checksum without a second pass.

    Raises:
        BadRowError: at the first bad row (its file and 1-based line).
    """
    from bert_core.kinds.base import ServingInputError

    rows = blanks = 0
    for number, raw in _lines(path):
        if digest is not None:
            digest.update(raw)
        parsed = parse_row(path, number, raw, fields, id_field)
        if parsed is None:
            blanks += 1
            continue
        if check is not None:
            try:
                check(parsed[0])
            except ServingInputError as err:  # names the field and the problem
                raise BadRowError(path, number, None, str(err).rstrip(". ")) from None
        rows += 1
    return rows, blanks


def read_chunks(
    path: Path, fields: list[InputField] | None, batch_size: int, id_field: str = DEFAULT_ID_FIELD
) -> Iterator[tuple[list[Any], list[dict[str, Any]], list[int]]]:
    """Lazily yield ``(ids, rows, line numbers)`` chunks of at most ``batch_size`` rows (ids are ``None``
    for rows without the id field; line numbers are 1-based). Only the current chunk is held in memory."""
    ids: list[Any] = []
    rows: list[dict[str, Any]] = []
    lines: list[int] = []
    for number, raw in _lines(path):
        parsed = parse_row(path, number, raw, fields, id_field)
        if parsed is None:
            continue
        rows.append(parsed[0])
        ids.append(parsed[1])
        lines.append(number)
        if len(rows) >= batch_size:
            yield ids, rows, lines
            ids, rows, lines = [], [], []
    if rows:
        yield ids, rows, lines
