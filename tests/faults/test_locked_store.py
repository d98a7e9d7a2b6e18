"""The SQLite tracking store locked by another process for longer than a stage waits.

Another process holds an exclusive transaction on the stage's ``mlflow.db`` (as a long write by another
stage, a script or a database browser would); the stage command must fail in bounded time naming the file
and what to do, not with ``OperationalError: database is locked`` after a minute of retries.
"""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from bert_core.tracking.run import ensure_tracking_store

from .test_bad_input import params_file, run_stage, stage_args

pytestmark = pytest.mark.faults

HOLD = """
import sqlite3, sys, time
con = sqlite3.connect(sys.argv[1], isolation_level=None)
con.execute("BEGIN EXCLUSIVE")
print("locked", flush=True)
time.sleep(600)
"""


@pytest.fixture
def env(tmp_path, prefect_api):
    from .conftest import stage_env

    return stage_env(prefect_api, f"sqlite:///{tmp_path}/mlflow.db")


def test_a_store_locked_by_another_process_is_named_within_a_minute(tmp_path, env):
    db = tmp_path / "mlflow.db"
    ensure_tracking_store(f"sqlite:///{db}")
    holder = subprocess.Popen([sys.executable, "-c", HOLD, str(db)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "locked"
        params = params_file(tmp_path, "corpus", {})
        started = time.monotonic()
        res = run_stage("corpus", stage_args("corpus", params), tmp_path / "work", env, timeout=180)
        elapsed = time.monotonic() - started
    finally:
        holder.kill()
        holder.wait()
    assert res.returncode == 1, res.stderr[-3000:]
    line = next(x for x in res.stderr.splitlines() if "corpus stage failed" in x)
    assert f"TrackingStoreBusy: the MLflow store {db} is locked: another process is writing it" in line
    assert "use a tracking server (docs/reliability.md)" in line
    # two attempts of SQLite's own wait (5 s while opening the store, 20 s later), and the stage's start
    assert elapsed < 90, elapsed
    assert not (tmp_path / "work" / "out").exists()
