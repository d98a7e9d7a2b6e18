"""``python -m flows.predict`` checks every row before the first prediction, as the model itself would
check it (its length limit, a kind's impossible record), and names the input file and the 1-based line; an
input that is not a regular file is named as what it is.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from .conftest import PY, base_env, run_cmd

pytestmark = pytest.mark.faults

ROWS, BAD_LINE, LONG = 3000, 2901, 100_000


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> dict[str, Path]:
    """Tiny random models of four kinds as a stage writes them (weights, tokenizer, task.json)."""
    from serving_models import build_model, task_json

    root = tmp_path_factory.mktemp("predict-rows")
    dirs = {}
    for task in ("sst2", "swag", "conll2003", "fill_mask"):
        dirs[task] = build_model(task, root / task)
        (dirs[task] / "task.json").write_text(json.dumps(task_json(task)), encoding="utf-8")
    return dirs


class Spy:
    """A loaded model that counts its ``predict`` calls."""

    def __init__(self, model) -> None:
        self.model, self.calls = model, 0
        self.metadata = model.metadata

    def unwrap_python_model(self):
        return self.model.unwrap_python_model()

    def predict(self, frame):
        self.calls += 1
        return self.model.predict(frame)


def _write(path: Path, rows: list[dict | None]) -> Path:
    """One JSON object per line; ``None`` is a blank line."""
    path.write_text("".join(("" if r is None else json.dumps(r)) + "\n" for r in rows), encoding="utf-8")
    return path


def _issue_file(tmp_path: Path) -> Path:
    """3,000 lines; line 10 blank, line 2,901 a 100,000-character text (the model accepts 50,000)."""
    rows: list[dict | None] = [{"id": i, "text": f"row {i} is fine"} for i in range(1, ROWS + 1)]
    rows[9] = None
    rows[BAD_LINE - 1] = {"id": BAD_LINE, "text": "a" * LONG}
    return _write(tmp_path / "in.jsonl", rows)


def test_an_over_long_row_near_the_end_is_refused_by_line_before_any_prediction(models, tmp_path):
    src, out = _issue_file(tmp_path), tmp_path / "out.jsonl"
    cmd = [PY, "-m", "flows.predict", "--no-prefect", "--model", str(models["sst2"])]
    cmd += ["--input", str(src), "--output", str(out), "--batch-size", "16"]
    res = run_cmd(
        cmd, cwd=tmp_path, env=base_env(MLFLOW_TRACKING_URI=f"sqlite:///{tmp_path}/m.db"), timeout=600
    )
    assert res.returncode == 1, res.stderr[-3000:]
    assert res.stderr.strip().splitlines()[-1] == (
        f"predict failed: BadRowError: {src}:{BAD_LINE}: field 'text' has {LONG} characters, more than this "
        "model accepts (50000, max_text_chars in the model's task.json); shorten or split it; fix or remove "
        "the row. No output was written."
    )
    assert "row(s) checked" not in res.stderr and "rows/s" not in res.stderr  # no prediction started
    assert not out.exists() and not [p for p in tmp_path.iterdir() if ".tmp-" in p.name]


def test_the_model_is_never_called_when_a_row_is_bad(models, tmp_path):
    from bert_core.serving.batch import BadRowError, load_model, predict_file

    spy = Spy(load_model(str(models["sst2"])))
    src = _issue_file(tmp_path)
    with pytest.raises(BadRowError, match=rf"^{src}:{BAD_LINE}: field 'text' has {LONG} characters") as err:
        predict_file("sst2", src, tmp_path / "out.jsonl", model=spy, batch_size=16)
    assert err.value.line == BAD_LINE and spy.calls == 0
    fine = _write(tmp_path / "fine.jsonl", [{"id": 1, "text": "b" * 50_000}, None, {"id": 3, "text": "ok"}])
    result = predict_file("sst2", fine, tmp_path / "out.jsonl", model=spy)
    assert result.rows == 2 and spy.calls == 1  # the limit itself is accepted


@pytest.mark.parametrize(
    ("task", "bad", "problem"),
    [
        (
            "swag",
            {"context": "she opens the door.", "endings": ["walks in."]},
            "field 'endings' needs at least 2",
        ),
        (
            "conll2003",
            {"text": "peter", "words": ["peter"]},
            "give exactly one of the fields 'text' and 'words'",
        ),
        ("fill_mask", {"text": "no mask here"}, "field 'text' has no [MASK] within its first 512 tokens"),
    ],
)
def test_a_kinds_impossible_record_is_refused_by_line_before_any_prediction(
    models, tmp_path, task, bad, problem
):
    from serving_models import REQUESTS

    from bert_core.serving.batch import BadRowError, load_model, predict_file

    spy = Spy(load_model(str(models[task])))
    good = REQUESTS[task][0]
    src = _write(tmp_path / "in.jsonl", [good, good, bad, good])
    with pytest.raises(BadRowError) as err:
        predict_file(task, src, tmp_path / "out.jsonl", model=spy)
    assert str(err.value).startswith(f"{src}:3: {problem}"), str(err.value)
    assert spy.calls == 0 and not (tmp_path / "out.jsonl").exists()


def test_an_input_that_is_not_a_regular_file_is_named_as_what_it_is(tmp_path):
    fifo = tmp_path / "in.fifo"
    os.mkfifo(fifo)
    env = base_env(MLFLOW_TRACKING_URI=f"sqlite:///{tmp_path}/m.db")
    for src, said in (
        (fifo, "the input is not a regular file (a FIFO, device or socket)"),
        (tmp_path, "the input is a directory"),
        (tmp_path / "missing.jsonl", "no such input file"),
    ):
        cmd = [PY, "-m", "flows.predict", "--no-prefect", "--model", "models:/x@y"]
        cmd += ["--input", str(src), "--output", str(tmp_path / "out.jsonl")]
        res = run_cmd(cmd, cwd=tmp_path, env=env, timeout=120)  # a FIFO is never opened (it would block)
        assert res.returncode == 1, res.stderr[-2000:]
        assert (
            res.stderr.strip()
            .splitlines()[-1]
            .startswith(f"predict failed: BatchPredictionError: {src}: {said}")
        )
    assert not (tmp_path / "out.jsonl").exists()
