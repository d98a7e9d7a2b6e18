"""Two pipeline runs at once on one workspace: both complete, one after the other, nothing mixed.

Runs on the stand-in pipeline (tests/e2e/standin.py): its stages sleep, so concurrent runs would surely
overlap if nothing kept them apart. Two paths are covered: two UI/API-triggered runs of the served
deployment (queued by the runner's ``limit=1``), and a command-line run started while a served run is going
(it waits on the workspace lock).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import mlflow
import pytest
import yaml

from tests.e2e.conftest import serve_repository
from tests.e2e.standin import make_standin_repo

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(1200)]


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("concurrency")
    root = make_standin_repo(tmp / "repo", sleep=2.0)
    with serve_repository(root, tmp) as served:
        yield served


def _stage_runs(served, pipeline_run_id: str) -> list:
    client = mlflow.MlflowClient(served.mlflow_uri)
    exps = [e.experiment_id for e in client.search_experiments()]
    return client.search_runs(exps, f"tags.pipeline_run_id = '{pipeline_run_id}'", max_results=100)


def _window(runs: list) -> tuple[int, int]:
    return min(r.info.start_time for r in runs), max(r.info.end_time for r in runs)


def test_two_triggered_runs_queue_and_do_not_mix(served):
    a = served.trigger("bert-pipeline/local", {"profile": "tiny", "experiment_name": "exp-tiny"})
    b = served.trigger("bert-pipeline/local", {"profile": "big", "experiment_name": "exp-big"})
    runs = {name: served.wait(fr.id, 600) for name, fr in (("tiny", a), ("big", b))}
    for name, run in runs.items():
        assert run.state.type.value == "COMPLETED", f"{name}: {run.state}\n{served.log_tail()}"
    first, second = sorted(runs.values(), key=lambda r: r.start_time)
    assert second.start_time >= first.end_time, "the second run started before the first one ended"

    # Each run's stage runs in MLflow: all four stages, its own params, and no overlap in time.
    size = {"tiny": "1", "big": "100"}
    windows = []
    for name, run in runs.items():
        stage_runs = _stage_runs(served, str(run.id))
        assert sorted(r.data.tags["stage"] for r in stage_runs) == [
            "evaluate",
            "finetune",
            "finetune",
            "prepare",
        ]
        assert {r.data.params["size"] for r in stage_runs} == {size[name]}
        assert {r.data.tags["dvc_experiment"] for r in stage_runs} == {f"exp-{name}"}
        windows.append(_window(stage_runs))
    windows.sort()
    assert windows[0][1] <= windows[1][0], "stage runs of the two pipeline runs interleaved"

    # Each is a DVC experiment with its own params; the workspace holds the last one's, consistently.
    exps = subprocess.run(
        [sys.executable, "-m", "dvc", "exp", "show", "--json"],
        cwd=served.root,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert exps.returncode == 0, exps.stderr
    assert "exp-tiny" in exps.stdout and "exp-big" in exps.stdout
    last = "tiny" if second.id == a.id else "big"
    params = yaml.safe_load((served.root / "params" / "standin.yaml").read_text())["standin"]
    assert str(params["size"]) == size[last]
    out = (served.root / "outputs" / "evaluate.txt").read_text()
    assert str(second.id) in out  # the final outputs come from the run that ran last


def test_command_line_run_waits_for_the_served_run(served):
    served_run = served.trigger("bert-pipeline/local", {"profile": "tiny", "force": True})
    # Start the CLI run while the served one is (about to be) running: it must wait on the workspace lock.
    cli_log = served.root.parent / "cli.log"
    cli = subprocess.Popen(
        [sys.executable, "-m", "flows.pipeline", "--profile", "big", "--force"],
        cwd=served.root,
        env={**served.env, "PREFECT_API_URL": served.api_url},
        stdout=open(cli_log, "wb"),  # noqa: SIM115
        stderr=subprocess.STDOUT,
    )
    try:
        assert cli.wait(timeout=900) == 0, Path(cli_log).read_text()[-3000:]
    finally:
        cli.kill()
    run = served.wait(served_run.id, 600)
    assert run.state.type.value == "COMPLETED", served.log_tail()
    text = Path(cli_log).read_text()
    cli_id = text.rsplit("pipeline_run_id=", 1)[1].split()[0]
    served_window, cli_window = (
        _window(_stage_runs(served, str(run.id))),
        _window(_stage_runs(served, cli_id)),
    )
    ordered = sorted([served_window, cli_window])
    assert ordered[0][1] <= ordered[1][0], "the command-line run's stages overlapped the served run's"
    if cli_window > served_window:
        assert "waiting for the workspace" in text
