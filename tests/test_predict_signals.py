"""``python -m flows.predict`` stopped by SIGTERM / SIGINT mid-run: exit 143 / 130, no output; the rows
predicted so far are kept beside it, and the same command then predicts only the rest."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time

import pytest
from test_predict import _classifier_signature, leftovers, register

from bert_core.constants import REPO_ROOT

SLOW_CODE = """
import os
import pathlib
import time

import mlflow


class Slow(mlflow.pyfunc.PythonModel):
    def predict(self, context, model_input, params=None):
        if os.environ.get("PREDICT_MARKER"):
            pathlib.Path(os.environ["PREDICT_MARKER"]).touch()
            time.sleep(0.5)
        return ["x"] * len(model_input)


mlflow.models.set_model(Slow())
"""


@pytest.mark.faults
@pytest.mark.parametrize(
    ("signum", "code"), [(signal.SIGTERM, 143), (signal.SIGINT, 130)], ids=["TERM", "INT"]
)
def test_a_signal_mid_run_exits_128_plus_n_and_the_rerun_continues(tmp_path, signum, code):
    import mlflow

    uri = register(tmp_path, "toy-slow", SLOW_CODE, _classifier_signature())
    src = tmp_path / "in.jsonl"
    src.write_text(
        "".join(json.dumps({"id": i, "text": f"row {i}"}) + "\n" for i in range(200)), encoding="utf-8"
    )
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    dst = out_dir / "pred.jsonl"
    marker = tmp_path / "predicting"
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_API")}
    env.update(
        PYTHONPATH=str(REPO_ROOT), MLFLOW_TRACKING_URI=mlflow.get_tracking_uri(), PREDICT_MARKER=str(marker)
    )
    cmd = [
        sys.executable,
        "-m",
        "flows.predict",
        "--model",
        uri,
        "--input",
        str(src),
        "--output",
        str(dst),
        "--batch-size",
        "2",
        "--no-prefect",
    ]
    proc = subprocess.Popen(
        cmd, env=env, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        deadline = time.monotonic() + 240
        while not marker.exists() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.1)
        assert marker.exists(), (
            f"predict never started; stderr: {proc.stderr.read()[-2000:] if proc.poll() is not None else ''}"
        )
        time.sleep(1.0)  # a few chunks written to the partial output
        proc.send_signal(signum)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == code, err[-2000:]
    assert f"predict interrupted: stopped by {signal.Signals(signum).name}; the output was not written" in err
    assert "row(s); they are kept in" in err
    assert sorted(p.name for p in out_dir.iterdir()) == [".pred.jsonl.partial", ".pred.jsonl.partial.json"]
    assert leftovers(tmp_path) == []

    del env["PREDICT_MARKER"]  # the rest at full speed
    rerun = subprocess.run(cmd, env=env, cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert rerun.returncode == 0, rerun.stderr[-2000:]
    assert re.search(r"predicted 200 row\(s\) \([1-9][0-9]* by an earlier run\)", rerun.stderr)
    assert [json.loads(line)["id"] for line in dst.read_text().splitlines()] == list(range(200))
    assert [p.name for p in out_dir.iterdir()] == ["pred.jsonl"]
