"""Two runs on one workspace at the same time, below the Prefect level: plain ``dvc repro`` twice, and a
pipeline run started while a plain ``dvc repro`` holds the workspace.

Runs served through Prefect (queued by ``limit=1``) and command-line pipeline runs (queued on the workspace
lock) are covered by ``tests/e2e/test_concurrency_e2e.py``. Here the stand-in pipeline of
``tests/e2e/standin.py`` (real flows, stages that sleep so the runs surely overlap) shows what a user sees
when something bypasses that queue: the second run is refused with DVC's lock message (naming the PID that holds it), the first finishes,
and the outputs all come from the first.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from tests.dvc_status import up_to_date
from tests.e2e.standin import make_standin_repo

from .conftest import PY, Processes, run_cmd, stage_env

pytestmark = pytest.mark.faults

OUTPUTS = ("prepare.txt", "finetune-a.txt", "finetune-b.txt", "evaluate.txt")


@pytest.fixture
def standin(tmp_path) -> Path:
    return make_standin_repo(tmp_path / "repo", sleep=1.0)


def _start_dvc_repro(procs: Processes, root: Path, env: dict[str, str], log: Path):
    proc = procs.start([PY, "-m", "dvc", "repro"], cwd=root, env=env, log=log)
    deadline = time.monotonic() + 120
    while "Running stage" not in (log.read_text() if log.exists() else ""):  # it holds DVC's lock now
        assert proc.poll() is None, log.read_text()[-3000:]
        assert time.monotonic() < deadline, "dvc repro did not start a stage"
        time.sleep(0.2)
    return proc


def _assert_outputs_from(root: Path, run_id: str) -> None:
    for name in OUTPUTS:
        text = (root / "outputs" / name).read_text()
        assert f'"run": "{run_id}"' in text, (name, text)


def test_runs_started_while_a_dvc_repro_runs_are_refused_and_nothing_is_mixed(
    standin, tmp_path, procs, prefect_api
):
    env_a = stage_env(prefect_api, f"sqlite:///{tmp_path}/mlflow.db", BERT_PIPELINE_RUN_ID="run-A")
    first = _start_dvc_repro(procs, standin, env_a, tmp_path / "a.log")

    # A second plain `dvc repro`: refused at once by DVC, naming the process that holds the workspace.
    second = run_cmd([PY, "-m", "dvc", "repro"], cwd=standin, env={**env_a, "BERT_PIPELINE_RUN_ID": "run-B"})
    assert second.returncode != 0
    assert "is busy, it is being blocked by" in second.stderr, second.stderr[-2000:]
    assert f"(PID {first.pid})" in second.stderr

    # A pipeline run (what `make pipeline` and the Prefect deployment run): DVC refuses it the same way.
    pipe_env = {k: v for k, v in env_a.items() if k != "BERT_PIPELINE_RUN_ID"}
    pipeline = run_cmd([PY, "-m", "flows.pipeline"], cwd=standin, env=pipe_env, timeout=600)
    assert pipeline.returncode == 1, pipeline.stdout[-3000:]
    assert "error: DVC failed before running a stage" in pipeline.stderr, pipeline.stderr[-3000:]
    assert "is busy, it is being blocked by" in pipeline.stderr

    assert first.wait(timeout=600) == 0, (tmp_path / "a.log").read_text()[-3000:]
    _assert_outputs_from(standin, "run-A")
    status = run_cmd([PY, "-m", "dvc", "status"], cwd=standin, env=env_a, timeout=120)
    assert status.returncode == 0 and up_to_date(status.stdout), status.stdout
