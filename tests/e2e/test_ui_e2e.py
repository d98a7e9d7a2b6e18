"""``make ui`` (``python -m flows.ui``): a real ``mlflow ui`` on a free loopback port prints the links that
open the pipeline's experiments in the Model-training view, serves them, and stops on Ctrl-C with 130 and
the commands' one line."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request

import pytest
from mlflow import MlflowClient

from bert_core.constants import REPO_ROOT
from bert_core.tracking import FINETUNE_EXPERIMENT, stage_run


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.e2e
def test_make_ui_prints_the_runs_table_links_and_stops_on_ctrl_c(tmp_path):
    with stage_run("finetune", {"task": "sst2"}, experiment=FINETUNE_EXPERIMENT, run_name="finetune-sst2"):
        pass
    experiment_id = MlflowClient().get_experiment_by_name(FINETUNE_EXPERIMENT).experiment_id
    port = _free_port()
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "flows.ui",
            "--backend-store-uri",
            os.environ["MLFLOW_TRACKING_URI"],
            "--port",
            str(port),
        ],
        cwd=REPO_ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    lines: list[str] = []
    threading.Thread(target=lambda: lines.extend(proc.stdout), daemon=True).start()  # type: ignore[arg-type]
    try:
        deadline = time.monotonic() + 240
        while not any(f"{FINETUNE_EXPERIMENT}:" in line for line in list(lines)):
            assert proc.poll() is None, "".join(lines)[-3000:]
            assert time.monotonic() < deadline, "".join(lines)[-3000:]
            time.sleep(0.5)
        [link] = [line.split(": ", 1)[1].strip() for line in list(lines) if f"{FINETUNE_EXPERIMENT}:" in line]
        assert link.startswith(f"http://127.0.0.1:{port}/#/experiments/{experiment_id}/runs?workflowType=")
        assert link.endswith(
            "&viewStateShareKey=bert-task-runs"
        )  # the view, written into the experiment first
        assert "mlflow.sharedViewState.bert-task-runs" in MlflowClient().get_experiment(experiment_id).tags
        with urllib.request.urlopen(link.split("#")[0], timeout=30) as resp:  # the UI page itself
            assert resp.status == 200 and b"<html" in resp.read(2000).lower()
        os.killpg(proc.pid, signal.SIGINT)  # Ctrl-C in the terminal: the launcher and the UI server
        assert proc.wait(timeout=60) == 130, "".join(lines)[-3000:]
        stopped = "ui interrupted: stopped by SIGINT; the MLflow UI server was stopped\n"
        deadline = time.monotonic() + 10  # the reader thread takes the last lines
        while stopped not in lines and time.monotonic() < deadline:
            time.sleep(0.1)
        assert stopped in lines, lines[-20:]
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
