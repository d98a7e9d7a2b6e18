"""Batch prediction over a JSON Lines file with any MLflow pyfunc model (``python -m flows.predict``).

:func:`predict_file` loads the model (:func:`load_model`: ``models:/<name>@<alias>``,
``models:/<name>/<version>``, ``runs:/...``, an MLflow Model directory, or a stage's Hugging Face model
directory such as ``models/finetuned/sst2``; only as a model from code, :mod:`bert_core.serving.trusted`),
reads its input schema and then:

1. **checks every row first** (one streaming pass that also counts the rows): each non-blank line must be a
   JSON object whose fields match the schema (required fields present, types right, strings not empty),
   and, for this project's models, pass the model's own record check (:func:`record_check`: the length
   limit, a kind's impossible records). A bad row stops the run before any prediction, with
   ``<input>:<line>: field '<name>': <what is wrong>`` (1-based line);
2. **predicts in chunks** (``batch_size`` rows per ``model.predict`` call on a pandas DataFrame holding the
   schema's fields), streaming: memory holds one chunk, never the file;
3. writes one JSON object per input row, in input order: the row's id field (``id``) when it has one, then
   the prediction's fields (a model returning scalars gives ``{"prediction": <value>}``).

The output is written to a temporary file next to it and renamed into place at the end
(:func:`bert_core.atomic.atomic_path`): an error, a signal or a crash leaves no output, never half of one.
Progress (rows done / total, rows per second, ETA) is logged on the ``bert_core.serving.batch`` logger,
which the console and Prefect show. Blank lines are skipped. A model without a signature gets every field
of the row except the id.
"""

from __future__ import annotations

import json
import logging
import math
import os
import re
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bert_core.atomic import atomic_path, check_writable
from bert_core.progress import Progress

log = logging.getLogger("bert_core.serving.batch")

DEFAULT_BATCH_SIZE = 64
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


@dataclass
class BatchResult:
    """What :func:`predict_file` did."""

    model_uri: str
    input_path: Path
    output_path: Path
    rows: int
    blank_lines: int
    seconds: float  # in all: loading the model, checking the rows, predicting
    fields: list[str] = field(default_factory=list)
    predict_seconds: float = 0.0

    @property
    def rows_per_second(self) -> float:
        """Prediction throughput (model loading and the check pass excluded)."""
        return self.rows / self.predict_seconds if self.predict_seconds > 0 else float("nan")

    def as_record(self) -> dict[str, Any]:
        return {
            "model_uri": self.model_uri,
            "input": str(self.input_path),
            "output": str(self.output_path),
            "rows": self.rows,
            "blank_lines": self.blank_lines,
            "seconds": round(self.seconds, 3),
            "predict_seconds": round(self.predict_seconds, 3),
            "rows_per_second": round(self.rows_per_second, 2) if self.predict_seconds > 0 else None,
        }


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


def _lines(path: Path, max_line_bytes: int = MAX_LINE_BYTES) -> Iterator[tuple[int, bytes, int]]:
    """``(line number, raw line, bytes read so far)``, lazily: one line in memory at a time."""
    with open(path, "rb") as fh:
        number, done = 0, 0
        while True:
            raw = fh.readline(max_line_bytes + 1)
            if not raw:
                return
            number += 1
            done += len(raw)
            if len(raw) > max_line_bytes and not raw.endswith(b"\n"):
                raise BadRowError(
                    path,
                    number,
                    None,
                    f"the line is longer than {max_line_bytes} bytes (is this JSON Lines?)",
                )
            yield number, raw, done


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
) -> tuple[int, int]:
    """Check every row of ``path`` (streaming) against the schema and, given ``check`` (:func:`record_check`),
    as the model itself would; return ``(rows, blank lines)``.

    Raises:
        BadRowError: at the first bad row (its file and 1-based line).
    """
    from bert_core.kinds.base import ServingInputError

    rows = blanks = 0
    for number, raw, _ in _lines(path):
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
    for number, raw, _ in _lines(path):
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


# ---------------------------------------------------------------------------------------------- output


def _jsonable(value: Any) -> Any:
    """Plain JSON values from what models return (numpy scalars and arrays, pandas NA, NaN -> null)."""
    if value is None or isinstance(value, str | bool | int):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_jsonable(v) for v in value]
    if hasattr(value, "tolist"):  # numpy scalars and arrays
        return _jsonable(value.tolist())
    if hasattr(value, "isoformat"):
        return value.isoformat()
    try:
        import pandas as pd

        if value is pd.NA or value is pd.NaT:
            return None
    except ImportError:  # pragma: no cover
        pass
    return str(value)


def prediction_records(predictions: Any, expected: int, model_uri: str) -> list[dict[str, Any]]:
    """One dict per row from a pyfunc output (DataFrame, Series, array, list of dicts or of values).

    Raises:
        BatchPredictionError: the model returned a different number of predictions than it got rows.
    """
    import pandas as pd

    if isinstance(predictions, pd.DataFrame):
        items: list[Any] = predictions.to_dict("records")
    elif isinstance(predictions, pd.Series) or hasattr(predictions, "tolist"):  # numpy arrays too
        items = predictions.tolist()
    elif isinstance(predictions, dict):  # columns -> values
        frame = pd.DataFrame(predictions)
        items = frame.to_dict("records")
    else:
        items = list(predictions)
    if len(items) != expected:
        raise BatchPredictionError(
            f"{model_uri}: the model returned {len(items)} prediction(s) for {expected} row(s); a batch "
            "prediction model must return one prediction per input row"
        )
    out = []
    for item in items:
        item = _jsonable(item)
        out.append(item if isinstance(item, dict) else {"prediction": item})
    return out


def _frame(rows: list[dict[str, Any]], fields: list[InputField] | None) -> Any:
    import pandas as pd

    if fields is None:
        return pd.DataFrame.from_records(rows)
    present = [f.name for f in fields if any(f.name in r for r in rows)]
    data = {name: [r.get(name) for r in rows] for name in present}
    return pd.DataFrame(data, columns=present)


# ---------------------------------------------------------------------------------------------- entry


def load_model(model_uri: str) -> Any:
    """Load a model the pipeline produced (:func:`bert_core.serving.trusted.load_model`: a registry or run
    URI, an MLflow Model directory or a stage's model directory; checked to be a model from code first).

    Raises:
        UntrustedModelError: the model would load by unpickling; nothing was loaded.
        BatchPredictionError: the model cannot be loaded; the message says what to check.
    """
    from bert_core.serving import trusted

    try:
        return trusted.load_model(model_uri)
    except trusted.ModelLoadError as err:
        raise BatchPredictionError(str(err)) from None


def _predict_error(
    err: Exception, model_uri: str, src: Path, done: int, lines: list[int]
) -> BatchPredictionError:
    """The error of a failed ``model.predict`` on the chunk of rows ``done + 1`` ... on input ``lines``."""
    first = (str(err).strip().splitlines() or [""])[0][:300]
    where = f"lines {lines[0]}-{lines[-1]} of the input"
    record = re.search(r"\brecord (\d+): ", first)  # a record the model refused, 0-based in the chunk
    if record and int(record.group(1)) < len(lines):
        where = f"record {record.group(1)} is {src}:{lines[int(record.group(1))]}"
    return BatchPredictionError(
        f"{model_uri}: predict failed on rows {done + 1}-{done + len(lines)} of {src} "
        f"({type(err).__name__}: {first}); {where}"
    )


def predict_file(
    model_uri: str,
    input_path: str | os.PathLike[str],
    output_path: str | os.PathLike[str],
    *,
    batch_size: int = DEFAULT_BATCH_SIZE,
    id_field: str = DEFAULT_ID_FIELD,
    model: Any = None,
    progress_interval_s: float | None = None,
) -> BatchResult:
    """Predict every row of a JSON Lines file; write the predictions atomically (see the module docstring).

    Args:
        model_uri: MLflow model URI, e.g. ``models:/bert-sst2@champion``.
        input_path: JSON Lines input, one object per line.
        output_path: JSON Lines output; replaced only when every row was predicted.
        batch_size: Rows per ``model.predict`` call.
        id_field: Field copied from each input row to its output row (when present).
        model: An already loaded pyfunc model (``model_uri`` is then only its name in messages).
        progress_interval_s: Least seconds between progress log lines (default: ``BERT_PROGRESS_INTERVAL_S``
            or 20; see :class:`bert_core.progress.Progress`).

    Raises:
        BatchPredictionError: the model cannot be loaded or used, the input is missing, or a row is bad
            (:class:`BadRowError`); no output is written.
    """
    if batch_size < 1:
        raise BatchPredictionError(f"batch_size must be at least 1, got {batch_size}")
    src, dst = Path(input_path), Path(output_path)
    if not src.exists():
        raise BatchPredictionError(f"{src}: no such input file (JSON Lines, one object per line)")
    if not src.is_file():
        kind = "a directory" if src.is_dir() else "not a regular file (a FIFO, device or socket)"
        raise BatchPredictionError(f"{src}: the input is {kind}; give a JSON Lines file, one object per line")
    if src.resolve() == dst.resolve():
        raise BatchPredictionError(f"{dst}: the output would replace the input; choose another output path")
    check_writable(dst, is_dir=False)  # before any work: never replace a directory or a device
    t0 = time.monotonic()
    if model is None:
        log.info("loading %s", model_uri)
        model = load_model(model_uri)
    fields = input_fields(model.metadata.get_input_schema(), model_uri)
    names = [f.name for f in fields] if fields is not None else []
    log.info(
        "model %s: input fields %s", model_uri, names if fields is not None else "(no schema: every field)"
    )
    t_check = time.monotonic()
    total, blanks = check_file(src, fields, id_field, record_check(model))
    log.info(
        "%s: %d row(s) checked (%d blank line(s) skipped) in %.1fs",
        src,
        total,
        blanks,
        time.monotonic() - t_check,
    )
    progress = Progress(
        f"{src.name} -> {dst.name}",
        total,
        noun="rows",
        unit="rows",
        logger=log,
        interval_s=progress_interval_s,
    )
    done = 0
    with atomic_path(dst) as tmp, open(tmp, "w", encoding="utf-8") as out:
        for ids, rows, lines in read_chunks(src, fields, batch_size, id_field):
            try:
                predictions = model.predict(_frame(rows, fields))
            except Exception as err:
                raise _predict_error(err, model_uri, src, done, lines) from err
            for row_id, record in zip(ids, prediction_records(predictions, len(rows), model_uri)):
                if row_id is not None:
                    record = {
                        id_field: _jsonable(row_id),
                        **{k: v for k, v in record.items() if k != id_field},
                    }
                out.write(json.dumps(record, ensure_ascii=False) + "\n")
            done += len(rows)
            progress.update(done)
        out.flush()
    log.info("%s; wrote %s", progress.line(done=True), dst)
    return BatchResult(model_uri, src, dst, done, blanks, time.monotonic() - t0, names, progress.elapsed_s)
