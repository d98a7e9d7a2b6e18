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

The rows go to ``.<output>.partial`` beside the output, which is renamed into place once every row is
written (:mod:`bert_core.serving.partial`): the output appears whole or not at all, and a run stopped by an
error, a signal or a crash leaves its finished rows there for the same command to continue after them.
Progress (rows done / total, rows per second, ETA) is logged on the ``bert_core.serving.batch`` logger.
Blank lines are skipped. A model without a signature gets every field of the row except the id.
"""

from __future__ import annotations

import json
import logging
import math
import os
import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import xxhash

from bert_core.atomic import check_writable
from bert_core.progress import Progress
from bert_core.serving.partial import SAVE_INTERVAL_S, PartialOutput, run_identity
from bert_core.serving.rows import (  # noqa: F401 - InputField and BadRowError are part of this module's API
    DEFAULT_ID_FIELD,
    BadRowError,
    BatchPredictionError,
    InputField,
    check_file,
    input_fields,
    read_chunks,
    record_check,
)

log = logging.getLogger("bert_core.serving.batch")

DEFAULT_BATCH_SIZE = 64


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
    resumed_rows: int = 0  # written by an earlier, unfinished run of the same input, model and settings

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
            "resumed_rows": self.resumed_rows,
        }


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


#: The suffixes of a batch prediction's output (JSON Lines): a path with another is refused.
OUTPUT_SUFFIXES = (".jsonl", ".ndjson")


def predict_file(
    model_uri: str,
    input_path: str | os.PathLike[str],
    output_path: str | os.PathLike[str],
    *,
    batch_size: int = DEFAULT_BATCH_SIZE,
    id_field: str = DEFAULT_ID_FIELD,
    model: Any = None,
    restart: bool = False,
    progress_interval_s: float | None = None,
    save_interval_s: float = SAVE_INTERVAL_S,
) -> BatchResult:
    """Predict every row of a JSON Lines file; write the predictions atomically (see the module docstring).

    Args:
        model_uri: MLflow model URI, e.g. ``models:/bert-sst2@champion``.
        input_path: JSON Lines input, one object per line.
        output_path: JSON Lines output; replaced only when every row was predicted.
        batch_size: Rows per ``model.predict`` call.
        id_field: Field copied from each input row to its output row (when present).
        model: An already loaded pyfunc model (``model_uri`` is then only its name in messages).
        restart: Predict every row, dropping the rows an earlier unfinished run of the same input, model
            and settings kept (by default the run continues after them: :mod:`bert_core.serving.partial`).
        progress_interval_s: Least seconds between progress log lines (default: ``BERT_PROGRESS_INTERVAL_S``
            or 20; see :class:`bert_core.progress.Progress`).
        save_interval_s: Seconds between two saves of the rows written (what a SIGKILL can cost at most).

    Raises:
        BatchPredictionError: the model cannot be loaded or used, the input is missing, or a row is bad
            (:class:`BadRowError`); the output is not written.
        bert_core.serving.partial.OutputInUseError: another batch prediction is writing the same output.
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
    if dst.suffix.lower() not in OUTPUT_SUFFIXES:  # nor, by a slip of the hand, a user's notes or params
        raise BatchPredictionError(
            f"{dst}: the predictions are JSON Lines; give an output path ending in {' or '.join(OUTPUT_SUFFIXES)}"
        )
    t0 = time.monotonic()
    with PartialOutput(dst, save_interval_s=save_interval_s) as partial:  # a second run on dst fails here
        if model is None:
            log.info("loading %s", model_uri)
            model = load_model(model_uri)
        fields = input_fields(model.metadata.get_input_schema(), model_uri)
        names = [f.name for f in fields] if fields is not None else []
        log.info(
            "model %s: input fields %s",
            model_uri,
            names if fields is not None else "(no schema: every field)",
        )
        t_check = time.monotonic()
        read = xxhash.xxh3_128()
        total, blanks = check_file(src, fields, id_field, record_check(model), digest=read)
        log.info(
            "%s: %d row(s) checked (%d blank line(s) skipped) in %.1fs",
            src,
            total,
            blanks,
            time.monotonic() - t_check,
        )
        if total == 0:
            log.warning("%s holds no row (%d blank line(s)): the output will be empty", src, blanks)
        identity = run_identity(src, model_uri, model, batch_size, id_field, read.hexdigest())
        done = partial.resume(identity, total, restart=restart)
        what = f"{src.name} -> {dst.name}"
        progress = Progress(
            what, total, noun="rows", unit="rows", logger=log, interval_s=progress_interval_s, initial=done
        )
        skipped = 0
        for ids, rows, lines in read_chunks(src, fields, batch_size, id_field):
            if skipped < done:  # written by the earlier run, in the same chunks
                skipped += len(rows)
                continue
            try:
                predictions = model.predict(_frame(rows, fields))
            except Exception as err:
                raise _predict_error(err, model_uri, src, partial.rows, lines) from err
            records = prediction_records(predictions, len(rows), model_uri)
            partial.write(
                "".join(_line(row_id, record, id_field) for row_id, record in zip(ids, records)), len(rows)
            )
            progress.update(partial.rows)
        partial.commit()
    log.info("%s; wrote %s", progress.line(done=True), dst)
    return BatchResult(
        model_uri,
        src,
        dst,
        partial.rows,
        blanks,
        time.monotonic() - t0,
        names,
        progress.elapsed_s,
        partial.resumed_rows,
    )


def _line(row_id: Any, record: dict[str, Any], id_field: str) -> str:
    """One output line: the row's id (when it has one) first, then the prediction's fields."""
    if row_id is not None:
        record = {id_field: _jsonable(row_id), **{k: v for k, v in record.items() if k != id_field}}
    return json.dumps(record, ensure_ascii=False) + "\n"
