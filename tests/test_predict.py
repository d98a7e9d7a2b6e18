"""Batch prediction (``python -m flows.predict``, :mod:`bert_core.serving.batch`) with toy pyfunc models.

The models are small ``mlflow.pyfunc.PythonModel`` classes logged as "models from code" with the signatures
of a classifier (``text``, optional ``text_pair``) and a span-QA model (``question``, ``context``),
registered in the test's own MLflow store and loaded by ``models:/<name>@champion``.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from bert_core.constants import REPO_ROOT
from bert_core.serving import batch
from bert_core.serving.batch import BadRowError, BatchPredictionError, predict_file
from flows import predict  # imports Prefect, which configures logging: at collection, not inside a test

CLASSIFIER_CODE = """
import mlflow
import pandas as pd


class ToyClassifier(mlflow.pyfunc.PythonModel):
    def predict(self, context, model_input, params=None):
        labels, probs = [], []
        pairs = model_input["text_pair"] if "text_pair" in model_input else [None] * len(model_input)
        for text, pair in zip(model_input["text"], pairs):
            good = "good" in text + (pair if isinstance(pair, str) else "")
            labels.append("positive" if good else "negative")
            probs.append([0.1, 0.9] if good else [0.8, 0.2])
        return pd.DataFrame({"label": labels, "probabilities": probs, "length": model_input["text"].str.len()})


mlflow.models.set_model(ToyClassifier())
"""

QA_CODE = """
import mlflow


class ToyQA(mlflow.pyfunc.PythonModel):
    def predict(self, context, model_input, params=None):
        out = []
        for question, ctx in zip(model_input["question"], model_input["context"]):
            word = ctx.split()[0]
            out.append({"answer": word, "start": 0, "end": len(word), "score": len(question) / 100})
        return out


mlflow.models.set_model(ToyQA())
"""


def _classifier_signature():
    from mlflow.models import ModelSignature
    from mlflow.types.schema import ColSpec, Schema

    return ModelSignature(
        inputs=Schema([ColSpec("string", "text"), ColSpec("string", "text_pair", required=False)])
    )


def _qa_signature():
    from mlflow.models import ModelSignature
    from mlflow.types.schema import ColSpec, Schema

    return ModelSignature(inputs=Schema([ColSpec("string", "question"), ColSpec("string", "context")]))


def register(tmp_path: Path, name: str, code: str, signature) -> str:
    """Log ``code`` as a pyfunc model, register it as ``name`` with alias ``champion``; return its URI."""
    import mlflow
    from mlflow.tracking import MlflowClient

    path = tmp_path / f"{name}_model.py"
    path.write_text(code, encoding="utf-8")
    with mlflow.start_run():
        info = mlflow.pyfunc.log_model(
            name="model", python_model=str(path), signature=signature, registered_model_name=name
        )
    MlflowClient().set_registered_model_alias(name, "champion", info.registered_model_version)
    return f"models:/{name}@champion"


@pytest.fixture
def classifier(tmp_path) -> str:
    return register(tmp_path, "toy-clf", CLASSIFIER_CODE, _classifier_signature())


class FakeModel:
    """What predict_file uses of a pyfunc model: ``metadata.get_input_schema()`` and ``predict``."""

    def __init__(self, schema, predict) -> None:
        self.metadata = type("Meta", (), {"get_input_schema": lambda _self: schema})()
        self._predict = predict

    def predict(self, frame):
        return self._predict(frame)


def write_jsonl(path: Path, rows: list) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def leftovers(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir() if ".tmp-" in p.name)


# ------------------------------------------------------------------------------------------ happy paths


def test_classifier_keeps_ids_and_order_across_chunks(tmp_path, classifier, caplog):
    rows = [
        {"id": "a", "text": "a good film"},
        {"id": 7, "text": "dull", "text_pair": "but good"},  # optional pair, int id
        {"text": "no id here"},
        {"id": "d", "text": "bad", "extra": [1, 2]},  # extra fields are not given to the model
        {"id": "e", "text": "good", "text_pair": None},  # null optional field = absent
    ]
    src = write_jsonl(tmp_path / "in.jsonl", rows)
    src.write_text(src.read_text() + "\n   \n", encoding="utf-8")  # blank lines are skipped
    dst = tmp_path / "out" / "pred.jsonl"
    with caplog.at_level(logging.INFO, logger="bert_core"):
        result = predict_file(classifier, src, dst, batch_size=2, progress_interval_s=0)
    out = read_jsonl(dst)
    assert [r.get("id") for r in out] == ["a", 7, None, "d", "e"]
    assert "id" not in out[2]
    assert [r["label"] for r in out] == ["positive", "positive", "negative", "negative", "positive"]
    assert out[0] == {"id": "a", "label": "positive", "probabilities": [0.1, 0.9], "length": 11}
    assert (result.rows, result.blank_lines) == (5, 2)
    assert result.fields == ["text", "text_pair"]
    progress = [r.getMessage() for r in caplog.records if "rows/s" in r.getMessage()]
    assert any("rows 2/5 (40.0%)" in m and "ETA" in m for m in progress), progress
    assert any("rows 5/5 (100.0%)" in m for m in progress), progress
    assert leftovers(dst.parent) == []


def test_an_input_without_rows_writes_an_empty_output_and_says_so(tmp_path, classifier, caplog):
    src = tmp_path / "in.jsonl"
    src.write_text("\n  \n", encoding="utf-8")
    with caplog.at_level(logging.INFO, logger="bert_core"):
        result = predict_file(classifier, src, tmp_path / "out.jsonl")
    assert (result.rows, result.blank_lines) == (0, 2) and (tmp_path / "out.jsonl").read_text() == ""
    warned = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert warned == [f"{src} holds no row (2 blank line(s)): the output will be empty"]


def test_qa_model_with_its_own_schema(tmp_path):
    uri = register(tmp_path, "toy-qa", QA_CODE, _qa_signature())
    rows = [{"id": f"q{i}", "question": "who" + "?" * i, "context": f"Name{i} wrote it."} for i in range(7)]
    src = write_jsonl(tmp_path / "qa.jsonl", rows)
    dst = tmp_path / "qa.out.jsonl"
    predict_file(uri, src, dst, batch_size=3)
    out = read_jsonl(dst)
    assert [r["id"] for r in out] == [f"q{i}" for i in range(7)]
    assert out[2] == {"id": "q2", "answer": "Name2", "start": 0, "end": 5, "score": 0.05}


def test_model_without_a_schema_gets_every_field_but_the_id(tmp_path):
    import pandas as pd

    class Meta:
        def get_input_schema(self):
            return None

    class Echo:
        metadata = Meta()

        def predict(self, frame):
            assert "id" not in frame.columns
            return pd.Series([sorted(frame.columns)] * len(frame)).to_numpy()

    src = write_jsonl(tmp_path / "in.jsonl", [{"id": 1, "x": 1, "y": "a"}, {"id": 2, "x": 2, "y": "b"}])
    src.write_bytes(b"\xef\xbb\xbf" + src.read_bytes())  # a byte-order mark is accepted
    predict_file("echo", src, tmp_path / "out.jsonl", model=Echo())
    assert read_jsonl(tmp_path / "out.jsonl") == [
        {"id": 1, "prediction": ["x", "y"]},
        {"id": 2, "prediction": ["x", "y"]},
    ]


# ------------------------------------------------------------------------------------------ bad input

BAD_ROWS = [
    pytest.param(b'{"id": 2, "text": "fine"', None, "not valid JSON", id="not JSON"),
    pytest.param(b'["a list"]', None, 'expected a JSON object, got ["a list"]', id="not an object"),
    pytest.param(b'{"id": 2, "txt": "typo"}', "text", "missing (required by the model", id="missing field"),
    pytest.param(b'{"id": 2, "text": 5}', "text", "expected a string, got 5", id="wrong type"),
    pytest.param(
        b'{"id": 2, "text": "ok", "text_pair": true}', "text_pair", "expected a string", id="bad optional"
    ),
    pytest.param(b'{"id": 2, "text": "  "}', "text", "empty text", id="empty text"),
    pytest.param(b'{"id": 2, "text": "caf\xe9"}', None, "not UTF-8 (byte b'\\xe9'", id="not UTF-8"),
]


@pytest.mark.parametrize(("line", "field", "problem"), BAD_ROWS)
def test_a_bad_row_names_file_line_and_field_and_writes_nothing(tmp_path, line, field, problem):
    src = tmp_path / "in.jsonl"
    src.write_bytes(b'{"id": 1, "text": "good"}\n' + line + b'\n{"id": 3, "text": "bad"}\n')
    dst = tmp_path / "out.jsonl"
    dst.write_text("previous output\n", encoding="utf-8")
    model = FakeModel(_classifier_signature().inputs, lambda frame: ["x"] * len(frame))
    with pytest.raises(BadRowError) as info:
        predict_file("toy-clf", src, dst, model=model)
    message = str(info.value)
    assert message.startswith(f"{src}:2: " + (f"field '{field}': " if field else ""))
    assert problem in message
    assert "fix or remove the row" in message
    assert len(message) < 400
    assert (info.value.line, info.value.field) == (2, field)
    assert dst.read_text(encoding="utf-8") == "previous output\n"  # untouched
    assert leftovers(tmp_path) == []


def test_bad_row_near_the_end_fails_before_any_prediction(tmp_path):
    """Rows are checked in a first pass: a bad last row costs no model time."""
    calls = []

    class Meta:
        def get_input_schema(self):
            from mlflow.types.schema import ColSpec, Schema

            return Schema([ColSpec("string", "text")])

    class Model:
        metadata = Meta()

        def predict(self, frame):
            calls.append(len(frame))
            return [0] * len(frame)

    src = write_jsonl(tmp_path / "in.jsonl", [{"text": f"row {i}"} for i in range(50)] + [{"text": ""}])
    with pytest.raises(BadRowError, match=r":51: field 'text': empty text"):
        predict_file("m", src, tmp_path / "out.jsonl", model=Model(), batch_size=4)
    assert calls == []
    assert not (tmp_path / "out.jsonl").exists()


def test_a_model_failing_midway_leaves_no_output(tmp_path):
    class Meta:
        def get_input_schema(self):
            return None

    class Flaky:
        metadata = Meta()
        seen = 0

        def predict(self, frame):
            self.seen += len(frame)
            if self.seen > 4:
                raise RuntimeError("CUDA out of memory")
            return [1] * len(frame)

    src = write_jsonl(tmp_path / "in.jsonl", [{"x": i} for i in range(10)])
    with pytest.raises(
        BatchPredictionError,
        match=r"predict failed on rows 5-6 of .*in.jsonl \(RuntimeError: CUDA .*\); lines 5-6 of the input$",
    ):
        predict_file("flaky", src, tmp_path / "out.jsonl", model=Flaky(), batch_size=2)
    assert not (tmp_path / "out.jsonl").exists()
    assert leftovers(tmp_path) == []


def test_a_record_the_model_refuses_while_predicting_is_named_by_its_line(tmp_path):
    """A model without a record check of its own (checked against its schema only) that refuses a record
    while predicting: the error names the input line of that record (blank lines counted)."""

    class Meta:
        def get_input_schema(self):
            return None

    class Picky:
        metadata = Meta()

        def predict(self, frame):
            bad = [i for i, x in enumerate(frame["x"]) if x == 3]
            if bad:
                raise ValueError(f"record {bad[0]}: field 'x' is 3")
            return [1] * len(frame)

    src = tmp_path / "in.jsonl"
    src.write_text('{"x": 1}\n\n{"x": 2}\n{"x": 3}\n', encoding="utf-8")
    with pytest.raises(BatchPredictionError, match=rf"record 2: field 'x' is 3\); record 2 is {src}:4$"):
        predict_file("picky", src, tmp_path / "out.jsonl", model=Picky(), batch_size=4)


def test_wrong_number_of_predictions_is_an_error(tmp_path):
    class Meta:
        def get_input_schema(self):
            return None

    class Short:
        metadata = Meta()

        def predict(self, frame):
            return [1]

    src = write_jsonl(tmp_path / "in.jsonl", [{"x": 1}, {"x": 2}])
    with pytest.raises(BatchPredictionError, match="returned 1 prediction\\(s\\) for 2 row\\(s\\)"):
        predict_file("short", src, tmp_path / "out.jsonl", model=Short())
    assert not (tmp_path / "out.jsonl").exists()


def test_unknown_model_and_missing_input_are_clear_errors(tmp_path):
    import mlflow

    src = write_jsonl(tmp_path / "in.jsonl", [{"text": "x"}])
    mlflow.MlflowClient().search_experiments()  # the store exists (a missing one is refused as a typo)
    with pytest.raises(
        BatchPredictionError, match=r"cannot load model 'models:/nope@champion' .*Check the name"
    ):
        predict_file("models:/nope@champion", src, tmp_path / "out.jsonl")
    with pytest.raises(
        BatchPredictionError, match=r"model '/no/such/model': /no/such/model is not a directory"
    ):
        predict_file("/no/such/model", src, tmp_path / "out.jsonl")
    with pytest.raises(BatchPredictionError, match=r"missing.jsonl: no such input file"):
        predict_file("models:/nope@champion", tmp_path / "missing.jsonl", tmp_path / "out.jsonl")
    assert not (tmp_path / "out.jsonl").exists()


@pytest.mark.parametrize("name", ["notes.md", "finetune.yaml", "predictions"])
def test_an_output_path_that_is_not_json_lines_is_refused_and_the_file_there_kept(tmp_path, name):
    src, dst = write_jsonl(tmp_path / "in.jsonl", [{"text": "x"}]), tmp_path / name
    dst.write_text("a user's file")
    with pytest.raises(
        BatchPredictionError, match=rf"{name}: the predictions are JSON Lines; .*\.jsonl or \.ndjson"
    ):
        predict_file("models:/nope@champion", src, dst)  # refused before the model is looked up
    assert dst.read_text() == "a user's file"


# ------------------------------------------------------------------------------------------ streaming


def test_the_reader_is_lazy_it_yields_a_chunk_before_the_file_ends(tmp_path):
    """A FIFO that stays open after the first chunk: a reader that read the whole file would block."""
    fifo = tmp_path / "in.fifo"
    os.mkfifo(fifo)
    release, finished = threading.Event(), threading.Event()

    def writer():
        with open(fifo, "w", encoding="utf-8") as fh:
            for i in range(4):
                fh.write(json.dumps({"id": i, "text": f"row {i}"}) + "\n")
            fh.flush()
            release.wait(timeout=20)
            fh.write(json.dumps({"id": 4, "text": "last"}) + "\n")
        finished.set()

    thread = threading.Thread(target=writer, daemon=True)
    thread.start()
    fields = [batch.InputField("text", _classifier_signature().inputs.inputs[0].type)]
    chunks = batch.read_chunks(fifo, fields, batch_size=4)
    ids, rows, _ = next(chunks)
    assert not finished.is_set()  # the first chunk came while the writer still held the rest
    assert ids == [0, 1, 2, 3] and rows[0] == {"text": "row 0"}
    release.set()
    assert [c[0] for c in chunks] == [[4]]
    thread.join(timeout=20)


@pytest.mark.slow
def test_memory_stays_bounded_on_a_large_file(tmp_path):
    """~300 MB of rows through the whole path; after a warm-up on a small file the process grows by far
    less than the file (measured: 0 MiB; without the warm-up ~130 MiB of first-use allocations)."""
    import psutil

    class Meta:
        def get_input_schema(self):
            from mlflow.types.schema import ColSpec, Schema

            return Schema([ColSpec("string", "text")])

    class Model:
        metadata = Meta()

        def predict(self, frame):
            return frame["text"].str.len().to_numpy()

    src = tmp_path / "big.jsonl"
    line = (json.dumps({"id": 0, "text": "x" * 1000}) + "\n").encode()
    with open(src, "wb") as fh:
        for _ in range(300):
            fh.write(line * 1000)
    size = src.stat().st_size
    small = tmp_path / "small.jsonl"  # warm-up: first-use imports and allocations are not per-row growth
    small.write_bytes(line * 600)
    predict_file("len", small, tmp_path / "small.out.jsonl", model=Model(), batch_size=256)
    proc = psutil.Process()
    before = proc.memory_info().rss
    peak = [before]
    stop = threading.Event()

    def sample():
        while not stop.is_set():
            peak[0] = max(peak[0], proc.memory_info().rss)
            time.sleep(0.05)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    try:
        result = predict_file("len", src, tmp_path / "out.jsonl", model=Model(), batch_size=256)
    finally:
        stop.set()
        sampler.join()
    assert result.rows == 300_000
    growth = peak[0] - before
    assert growth < 50 << 20, f"RSS grew by {growth >> 20} MiB on a {size >> 20} MiB input"


# ------------------------------------------------------------------------------------------ entry points


def test_command_line_bad_row_exits_1_with_one_line(tmp_path, classifier):
    import mlflow

    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_API")}
    env.update(PYTHONPATH=str(REPO_ROOT), MLFLOW_TRACKING_URI=mlflow.get_tracking_uri())
    src = tmp_path / "in.jsonl"
    src.write_text('{"id": 1, "text": "good"}\n{"id": 2, "text": ""}\n', encoding="utf-8")
    dst = tmp_path / "out.jsonl"
    cmd = [
        sys.executable,
        "-m",
        "flows.predict",
        "--model",
        classifier,
        "--input",
        str(src),
        "--output",
        str(dst),
        "--no-prefect",
    ]
    bad = subprocess.run(cmd, env=env, cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert bad.returncode == 1, bad.stderr
    assert bad.stderr.strip().splitlines()[-1] == (
        f"predict failed: BadRowError: {src}:2: field 'text': empty text; fix or remove the row. "
        "No output was written."
    )
    assert not dst.exists() and leftovers(tmp_path) == []


def test_command_line_main_in_process(tmp_path, classifier, monkeypatch, caplog):
    import signal

    handlers = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}  # main() installs its own
    bert_logger = logging.getLogger("bert_core")
    monkeypatch.setattr(bert_logger, "level", bert_logger.level)
    monkeypatch.delenv("PREFECT_API_URL", raising=False)
    src = write_jsonl(tmp_path / "in.jsonl", [{"id": 1, "text": "good"}, {"id": 2, "text": "meh"}])
    dst = tmp_path / "out.jsonl"
    try:
        with caplog.at_level(logging.INFO, logger="bert_core"):
            rc = predict.main(
                ["--model", classifier, "--input", str(src), "--output", str(dst), "--no-prefect"]
            )
    finally:
        for signum, handler in handlers.items():
            signal.signal(signum, handler)
    assert rc == 0
    assert [r["label"] for r in read_jsonl(dst)] == ["positive", "negative"]
    assert any("rows 2/2 (100.0%)" in r.getMessage() for r in caplog.records)


def test_an_unreachable_prefect_api_is_named_with_the_way_around_it(monkeypatch):
    import socket

    from flows._prefect_api import PrefectApiUnreachable

    with socket.socket() as sock:  # a loopback port with nothing listening
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    monkeypatch.setenv("PREFECT_API_URL", f"http://127.0.0.1:{port}/api")
    monkeypatch.setattr("flows._prefect_api.time.sleep", lambda s: None)
    with pytest.raises(PrefectApiUnreachable, match=r"does not answer .*or run with --no-prefect"):
        predict._prefect_settings(no_prefect=False)
    assert predict._prefect_settings(no_prefect=True) is None


def test_predict_is_served_with_a_run_form():
    from prefect.utilities.callables import parameter_schema

    from flows import serve
    from flows.predict import predict_flow

    assert "flows.predict:predict_flow" in [path for path, _ in serve.EXTRA_FLOWS]
    assert predict_flow.name == "predict"
    schema = parameter_schema(predict_flow)
    assert {"input_path", "output_path", "model", "batch_size", "id_field"} <= set(schema.properties)
    assert set(schema.required) == {"input_path", "output_path"}
    assert "models:/" in schema.properties["model"]["description"]
