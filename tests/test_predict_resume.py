"""Batch prediction continues after the rows a stopped or killed run kept (:mod:`bert_core.serving.partial`).

A toy classifier registered in the test's MLflow store (it has a ``model_uuid``, as every registered version
does) predicts a file in chunks; the run is stopped (an exception, or ``os._exit`` in a subprocess: no
clean-up at all) after some chunks, and the next run must predict only the rest and write the output an
uninterrupted run writes, byte for byte.
"""

from __future__ import annotations

import json
import logging
import subprocess
import sys
from pathlib import Path

import pytest
from test_predict import _classifier_signature, register, write_jsonl

from bert_core.constants import REPO_ROOT
from bert_core.serving.batch import BadRowError, load_model, predict_file
from bert_core.serving.partial import OutputInUseError, PartialOutput, run_identity

CODE = """
import mlflow
import pandas as pd


class Echo(mlflow.pyfunc.PythonModel):
    def predict(self, context, model_input, params=None):
        return pd.DataFrame({"label": ["good" if "good" in t else "bad" for t in model_input["text"]]})


mlflow.models.set_model(Echo())
"""


class Stopping:
    """The loaded model, counting the rows it predicts, stopped (``stop``) at its ``after``-th call + 1."""

    def __init__(self, model, after: int | None = None, stop=KeyboardInterrupt) -> None:
        self.model, self.after, self.stop, self.calls, self.rows = model, after, stop, 0, 0
        self.metadata = model.metadata

    def unwrap_python_model(self):
        return self.model.unwrap_python_model()

    def predict(self, frame):
        if self.after is not None and self.calls >= self.after:
            raise self.stop()
        self.calls += 1
        self.rows += len(frame)
        return self.model.predict(frame)


@pytest.fixture
def setup(tmp_path):
    uri = register(tmp_path, "toy-echo", CODE, _classifier_signature())
    src = write_jsonl(
        tmp_path / "in.jsonl", [{"id": i, "text": f"row {i} {'good' * (i % 3)}"} for i in range(23)]
    )
    whole = tmp_path / "whole.jsonl"
    predict_file(uri, src, whole, batch_size=4)
    return uri, src, whole, tmp_path / "out" / "pred.jsonl"


def stopped_after_two_chunks(uri: str, src: Path, dst: Path, model) -> None:
    """A run of ``src`` into ``dst`` stopped (KeyboardInterrupt) when its third chunk of 4 rows starts."""
    with pytest.raises(KeyboardInterrupt):
        predict_file(uri, src, dst, batch_size=4, model=Stopping(model, after=2))


def kept(dst: Path) -> list[str]:
    return sorted(p.name for p in dst.parent.iterdir() if p.name != dst.name) if dst.parent.is_dir() else []


def test_a_stopped_run_keeps_its_rows_and_the_next_continues_after_them(setup, caplog):
    uri, src, whole, dst = setup
    model = load_model(uri)
    with caplog.at_level(logging.INFO, "bert_core.serving.batch"), pytest.raises(KeyboardInterrupt):
        predict_file(uri, src, dst, batch_size=4, model=Stopping(model, after=3))
    assert not dst.exists()
    assert kept(dst) == [".pred.jsonl.partial", ".pred.jsonl.partial.json"]
    assert "stopped after 12 row(s); they are kept in" in caplog.text

    again = Stopping(model)
    with caplog.at_level(logging.INFO, "bert_core.serving.batch"):
        result = predict_file(uri, src, dst, batch_size=4, model=again)
    assert "after the 12 row(s) an earlier run of the same input and model wrote" in caplog.text
    assert (again.calls, again.rows, result.rows, result.resumed_rows) == (3, 11, 23, 12)
    assert dst.read_bytes() == whole.read_bytes()
    assert kept(dst) == []  # the partial file became the output; its record is gone


def test_a_killed_run_keeps_the_rows_it_saved(setup):
    """``os._exit`` in the model's fourth call: no ``finally``, no ``__exit__``; every chunk was saved
    (``save_interval_s=0``), so the next run predicts the last chunks only."""
    uri, src, whole, dst = setup
    script = f"""
import os, sys
sys.path.insert(0, {str(Path(__file__).parent)!r})
from test_predict_resume import Stopping
from bert_core.serving.batch import load_model, predict_file
model = load_model({uri!r})
stopping = Stopping(model, after=3, stop=lambda: os._exit(9))
predict_file({uri!r}, {str(src)!r}, {str(dst)!r}, batch_size=4, model=stopping, save_interval_s=0)
"""
    import mlflow

    env = {
        "PYTHONPATH": str(REPO_ROOT),
        "MLFLOW_TRACKING_URI": mlflow.get_tracking_uri(),
        "PATH": "/usr/bin:/bin",
    }
    proc = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 9, proc.stderr[-2000:]
    assert kept(dst) == [".pred.jsonl.partial", ".pred.jsonl.partial.json"]
    state = json.loads((dst.parent / ".pred.jsonl.partial.json").read_text())
    assert state["rows"] == 12

    again = Stopping(load_model(uri))
    result = predict_file(uri, src, dst, batch_size=4, model=again)
    assert (again.rows, result.resumed_rows) == (11, 12)
    assert dst.read_bytes() == whole.read_bytes()


def test_a_torn_tail_is_cut_and_a_record_that_does_not_fit_the_file_or_its_checksum_starts_over(setup):
    uri, src, whole, dst = setup
    model = load_model(uri)
    stopped_after_two_chunks(uri, src, dst, model)
    partial = dst.parent / ".pred.jsonl.partial"
    with open(partial, "ab") as fh:  # half a line after the saved rows, as a crash mid-write leaves
        fh.write(b'{"id": 8, "lab')
    again = Stopping(model)
    assert predict_file(uri, src, dst, batch_size=4, model=again).resumed_rows == 8
    assert dst.read_bytes() == whole.read_bytes()

    stopped_after_two_chunks(uri, src, dst, model)
    with open(partial, "r+b") as fh:
        fh.truncate(10)  # the file lost what its record claims (a disk that did not keep the order)
    again = Stopping(model)
    assert predict_file(uri, src, dst, batch_size=4, model=again).resumed_rows == 0
    assert again.rows == 23 and dst.read_bytes() == whole.read_bytes()

    stopped_after_two_chunks(uri, src, dst, model)
    record = dst.parent / ".pred.jsonl.partial.json"
    state = json.loads(record.read_text())
    record.write_text(json.dumps({**state, "rows": 7}))  # not where a chunk ends: not this run's record
    assert predict_file(uri, src, dst, batch_size=4, model=model).resumed_rows == 0
    assert dst.read_bytes() == whole.read_bytes()

    stopped_after_two_chunks(uri, src, dst, model)
    data = bytearray(partial.read_bytes())
    data[5] ^= 1  # one flipped bit in the kept rows
    partial.write_bytes(bytes(data))
    assert predict_file(uri, src, dst, batch_size=4, model=model).resumed_rows == 0
    assert dst.read_bytes() == whole.read_bytes()


@pytest.mark.parametrize("change", ["batch size", "input", "restart"])
def test_another_input_batch_size_or_restart_predicts_every_row(setup, change, caplog):
    uri, src, whole, dst = setup
    model = load_model(uri)
    stopped_after_two_chunks(uri, src, dst, model)
    batch_size, restart = (5 if change == "batch size" else 4), change == "restart"
    if change == "input":
        src.write_text(src.read_text().replace("row 22", "row twenty-two"))
        whole = dst.with_name("expected.jsonl")
        predict_file(uri, src, whole, batch_size=4)
    again = Stopping(model)
    with caplog.at_level(logging.INFO, "bert_core.serving.batch"):
        result = predict_file(uri, src, dst, batch_size=batch_size, model=again, restart=restart)
    assert (again.rows, result.resumed_rows) == (23, 0)
    assert "discarding the unfinished rows in" in caplog.text
    assert dst.read_bytes() == whole.read_bytes()


def test_a_bad_row_or_a_failed_load_leaves_an_earlier_runs_rows_alone(setup):
    uri, src, _, dst = setup
    model = load_model(uri)
    stopped_after_two_chunks(uri, src, dst, model)
    partial = dst.parent / ".pred.jsonl.partial"
    before = partial.read_bytes()
    bad = write_jsonl(src.with_name("bad.jsonl"), [{"id": 1, "text": ""}])
    with pytest.raises(BadRowError):
        predict_file(uri, bad, dst, batch_size=4, model=model)
    with pytest.raises(Exception, match="cannot load model"):
        predict_file("models:/no-such-model@champion", src, dst, batch_size=4)
    assert partial.read_bytes() == before
    assert predict_file(uri, src, dst, batch_size=4, model=model).resumed_rows == 8


def test_a_second_run_on_the_same_output_is_refused_while_the_first_writes(setup):
    uri, src, whole, dst = setup
    dst.parent.mkdir()
    dst.write_text("the user's earlier output\n")
    with PartialOutput(dst), pytest.raises(OutputInUseError, match="another batch prediction is writing"):
        predict_file(uri, src, dst, batch_size=4)
    assert dst.read_text() == "the user's earlier output\n"
    predict_file(uri, src, dst, batch_size=4)  # the lock went with the first
    assert dst.read_bytes() == whole.read_bytes()


def test_a_model_without_an_identity_is_never_continued(tmp_path):
    """A model with no ``model_uuid`` (a stand-in): its rows cannot be matched to a later run's, so a stop
    leaves nothing behind."""

    class Meta:
        def get_input_schema(self):
            return None

    class Anonymous:
        metadata = Meta()

        def predict(self, frame):
            if frame["x"].iloc[0] >= 4:
                raise KeyboardInterrupt
            return [1] * len(frame)

    src = write_jsonl(tmp_path / "in.jsonl", [{"x": i} for i in range(8)])
    with pytest.raises(KeyboardInterrupt):
        predict_file("anonymous", src, tmp_path / "out.jsonl", model=Anonymous(), batch_size=2)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.jsonl"]


def test_a_stage_directory_is_identified_by_its_files(tmp_path):
    """A stage's Hugging Face directory is turned into a new MLflow Model (new ``model_uuid``) on every
    load: its files are what identify it."""
    model_dir = tmp_path / "sst2"
    model_dir.mkdir()
    (model_dir / "config.json").write_text("{}")
    (model_dir / "model.safetensors").write_bytes(b"weights")
    src = write_jsonl(tmp_path / "in.jsonl", [{"text": "x"}])
    first = run_identity(src, str(model_dir), None, 4, "id")
    assert first["model"].startswith("files:")
    assert run_identity(src, str(model_dir), None, 4, "id") == first
    (model_dir / "model.safetensors").write_bytes(b"other weights")
    assert run_identity(src, str(model_dir), None, 4, "id")["model"] != first["model"]
