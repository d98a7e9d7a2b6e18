"""A tracking URI that does not answer, through a real stage command: a clear error in seconds, no output.

``MLFLOW_TRACKING_URI=http://127.0.0.1:<port>`` with nothing listening (a typo in the address, a server
not started): left to MLflow, every tracking call would retry for about 4 minutes (urllib3 backoff inside
MLflow's REST client) and the stage's own retries would start another cycle; ``stage_run``'s pre-flight
check fails the stage before it does any work. The library-level cases (a
server that accepts and never answers, 401/503 answers, a store removed mid-run) are in
``tests/test_tracking_failfast.py``.
"""

from __future__ import annotations

import time

import pytest

from .conftest import PY, REPO_ROOT, free_port, run_cmd, stage_env

pytestmark = pytest.mark.faults


def test_an_unreachable_tracking_server_fails_the_stage_at_once(tmp_path, prefect_api):
    uri = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    work = tmp_path / "work"
    work.mkdir()
    args = [
        "--params",
        str(REPO_ROOT / "params" / "corpus.yaml"),
        "--out",
        "out",
        "--metrics",
        "metrics.json",
    ]
    # This checkout's code, even where the venv's editable install points at another one.
    env = stage_env(prefect_api, uri, PYTHONPATH=str(REPO_ROOT))
    started = time.monotonic()
    res = run_cmd([PY, "-m", "flows.corpus", *args], cwd=work, env=env, timeout=300)
    elapsed = time.monotonic() - started
    assert res.returncode == 1, f"exit {res.returncode}\n{res.stderr[-3000:]}"
    failed = [line for line in res.stderr.splitlines() if line.startswith("corpus stage failed")]
    assert failed, res.stderr[-3000:]
    assert failed[-1].startswith(
        f"corpus stage failed: TrackingUnavailable: the MLflow tracking server {uri} "
    )
    assert "connection refused" in failed[-1] and "MLFLOW_TRACKING_URI" in failed[-1]
    assert "mlflow server --host 127.0.0.1" in failed[-1] and len(failed[-1]) < 600
    assert elapsed < 60, f"took {elapsed:.0f} s"
    assert not list(work.iterdir()), f"left behind: {sorted(p.name for p in work.iterdir())}"
