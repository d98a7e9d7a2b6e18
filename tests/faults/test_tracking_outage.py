"""A real MLflow tracking server stopped during training, then restarted: nothing is lost, nothing waits.

The server is ``mlflow server`` on a free loopback port with a SQLite store; it is killed (SIGKILL to its
process group, as a crash) at training step 3, stays down until training has finished, and is started
again on the same port and store. Training uses the same metric sink as the ``pretrain`` stage
(:func:`bert_core.tracking.sink.mlflow_sink`): every metric logged while the server was down must be
on the server afterwards, with its step and value, and nothing is spilled to the fallback file.
"""

from __future__ import annotations

import logging
import threading
import time
from pathlib import Path

import pytest
import torch

from bert_core.tracking.sink import fan_out, mlflow_sink

from .conftest import VENV_BIN, Processes, base_env, free_port, kill_group, wait_http

pytestmark = pytest.mark.faults


class MlflowServer:
    """``mlflow server`` on 127.0.0.1 that can be killed and started again on the same port and store."""

    def __init__(self, root: Path, procs: Processes) -> None:
        self.root, self.procs = root, procs
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc = None
        self.starts = 0

    def start(self) -> None:
        self.starts += 1
        cmd = [
            str(VENV_BIN / "mlflow"),
            "server",
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
            "--backend-store-uri",
            f"sqlite:///{self.root / 'mlflow.db'}",
            "--artifacts-destination",
            str(self.root / "artifacts"),
            "--workers",
            "1",
        ]
        log = self.root / f"server-{self.starts}.log"
        env = base_env(MLFLOW_SERVER_ENABLE_JOB_EXECUTION="false")
        self.proc = self.procs.start(cmd, log=log, env=env, cwd=self.root)
        wait_http(f"{self.url}/health", timeout_s=240, proc=self.proc, log=log)

    def kill(self) -> None:
        assert self.proc is not None
        kill_group(self.proc)


@pytest.fixture
def mlflow_server(tmp_path, procs) -> MlflowServer:
    server = MlflowServer(tmp_path, procs)
    server.start()
    return server


def test_metrics_logged_while_the_server_is_down_reach_it_after_a_restart(
    tmp_path, mlflow_server, monkeypatch, caplog
):
    from mlflow.tracking import MlflowClient
    from training_fakes import run

    monkeypatch.setenv("MLFLOW_TRACKING_URI", mlflow_server.url)
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "1")  # MLflow's own retries: keep the test short
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_TIMEOUT", "10")
    client = MlflowClient()
    run_id = client.create_run(client.create_experiment("faults-outage")).info.run_id
    spill = tmp_path / "unsent-metrics.jsonl"
    sink = mlflow_sink(run_id, spill_path=spill)

    logged: list[tuple[int, dict[str, float]]] = []
    down = threading.Event()

    def pacer(step: int, metrics: dict[str, float]) -> None:
        logged.append((step, dict(metrics)))
        if step == 3 and not down.is_set() and "loss" in metrics:
            assert sink.flush(timeout_s=60), "metrics did not reach the live server"
            mlflow_server.kill()  # the tracking server crashes in the middle of the run
            down.set()

    caplog.set_level(logging.WARNING, logger="bert_core.tracking.sink")
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        _, result = run(tmp_path / "ck", max_steps=10, checkpoint_every=5, on_metrics=fan_out(sink, pacer))
    finally:
        torch.set_num_threads(n)
    assert down.is_set() and result.step == 10  # training finished while the server was down

    deadline = time.monotonic() + 120
    while sink.failures == 0 and time.monotonic() < deadline:  # the sink has noticed the outage
        time.sleep(0.2)
    assert sink.failures >= 1 and sink.pending > 0
    assert "sending metrics failed" in caplog.text and "retrying with backoff" in caplog.text

    mlflow_server.start()  # back on the same port and store
    assert sink.close(timeout_s=240) == 0, "records were left unsent"
    assert not spill.exists()
    assert "backend reachable again" in caplog.text

    expected: dict[str, dict[int, float]] = {}
    for step, metrics in logged:
        for key, value in metrics.items():
            expected.setdefault(key, {})[step] = value
    after = [s for s, m in logged if s > 3 and "loss" in m]
    assert after, "no metric was logged during the outage"
    for key, by_step in expected.items():
        history = {m.step: m.value for m in client.get_metric_history(run_id, key)}
        assert history.keys() == by_step.keys(), (key, sorted(by_step), sorted(history))
        for step, value in by_step.items():
            assert history[step] == pytest.approx(value, rel=1e-6, abs=1e-9), (key, step)


KILLED_DURING_STORE_CREATION = """
import os, signal
import mlflow.store.db.utils as db_utils
from sqlalchemy import event

real_upgrade = db_utils._upgrade_db

def upgrade_then_die(engine):  # SIGKILL half-way through MLflow's schema migrations
    @event.listens_for(engine, "after_cursor_execute")
    def after(conn, cursor, statement, *args):
        if statement.lstrip().upper().startswith("CREATE TABLE DATASETS"):
            os.kill(os.getpid(), signal.SIGKILL)

    real_upgrade(engine)

db_utils._upgrade_db = upgrade_then_die
from bert_core.tracking import stage_run
with stage_run("corpus", {"a": 1}):
    pass
"""

STAGE_RUN = """
from bert_core.tracking import stage_run
with stage_run("corpus", {"a": 1}) as run:
    run.log_metrics({"documents": 3})
print("logged", run.run_id)
"""


def test_a_stage_killed_while_creating_the_tracking_store_leaves_no_broken_store(tmp_path):
    """The first stage run of a repository creates ``mlflow.db``; a kill then must not break every later run."""
    import subprocess
    import sys

    env = base_env(MLFLOW_TRACKING_URI=f"sqlite:///{tmp_path / 'store' / 'mlflow.db'}")
    killed = subprocess.run(
        [sys.executable, "-c", KILLED_DURING_STORE_CREATION],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert killed.returncode == -9, killed.stderr[-2000:]
    assert not (tmp_path / "store" / "mlflow.db").exists()  # no half-migrated store, on which every later
    # run would fail with "table datasets already exists"
    again = subprocess.run(
        [sys.executable, "-c", STAGE_RUN], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300
    )
    assert again.returncode == 0 and "logged" in again.stdout, again.stderr[-3000:]
    assert [p.name for p in (tmp_path / "store").iterdir()] == ["mlflow.db"]  # the killed one's temp removed
