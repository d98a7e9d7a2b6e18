"""Runs of one task that register at the same moment: the champion alias is a compare-and-set.

Several processes (``spawn``, as work-pool workers and parallel experiments are separate processes) wait on a
barrier, then each registers a version with its own score against one SQLite store. Whatever the
interleaving, the alias must end on the best version, and the alias moves that the processes report must
form one chain: each moved registration replaced the one reported just before it (by score), which only
holds when every read-compare-set ran alone (without the lock two runs read the same champion, both
report a move, and the later set may be the worse one).
"""

from __future__ import annotations

import multiprocessing
import os
import random
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.faults

PROCESSES = 4
TRIALS = 3


def _warm() -> None:
    import mlflow  # noqa: F401  (imported before the barrier, so the processes start registering together)

    import bert_core.tracking.registry  # noqa: F401


def _register(job: tuple[str, str, str, float, Any]) -> dict[str, Any]:
    from bert_core.tracking import register

    name, run_id, model_dir, value, barrier = job
    barrier.wait(timeout=60)
    reg = register(model_dir, name=name, run_id=run_id, alias="champion", metric_key="dev.score", value=value)
    return {
        "pid": os.getpid(),
        "version": reg.version,
        "value": value,
        "moved": reg.alias_moved,
        "previous": reg.previous_version,
    }


def test_concurrent_registrations_leave_the_alias_on_the_best_version(tmp_path):
    import mlflow
    from mlflow import MlflowClient

    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    mlflow.set_experiment("race")
    ctx = multiprocessing.get_context("spawn")
    rng = random.Random(0)
    with ctx.Manager() as manager, ctx.Pool(PROCESSES, initializer=_warm) as pool:
        for trial in range(TRIALS):
            name = f"bert-race-{trial}"
            run_ids = []
            for _ in range(PROCESSES):
                with mlflow.start_run() as run:
                    run_ids.append(run.info.run_id)
            values = rng.sample(range(10, 100), PROCESSES)
            barrier = manager.Barrier(PROCESSES)
            jobs = [
                (name, rid, str(model), float(v), barrier) for rid, v in zip(run_ids, values, strict=True)
            ]
            results = pool.map(_register, jobs, chunksize=1)

            assert len({r["pid"] for r in results}) == PROCESSES, "every registration in its own process"
            champion = MlflowClient().get_model_version_by_alias(name, "champion")
            best = max(results, key=lambda r: r["value"])
            assert str(champion.version) == best["version"], (trial, results)
            moved = sorted((r for r in results if r["moved"]), key=lambda r: r["value"])
            assert moved[-1] is best, (trial, results)
            chain = [None, *(r["version"] for r in moved[:-1])]
            assert [r["previous"] for r in moved] == chain, (trial, results)
            for r in results:
                if not r["moved"]:  # it lost against the champion of its moment, a moved one
                    loser_of = next(m for m in moved if m["version"] == r["previous"])
                    assert loser_of["value"] > r["value"], (trial, results)
    assert (
        Path(os.environ["MLFLOW_TRACKING_URI"].removeprefix("sqlite:///"))
        .with_name(".mlflow.db.locks")
        .is_dir()
    )
