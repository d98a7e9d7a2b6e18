"""Stages at once (``python -m flows.pipeline --jobs 2``) under a signal: all stop, DVC stays consistent.

The repository is the project's code with a ``dvc.yaml`` of stand-in stages (``prep``, then ``b`` and ``c``
together, then ``report``), so the case costs seconds, not a pipeline run.
"""

from __future__ import annotations

import json
import re
import signal
from pathlib import Path

import pytest
import yaml

from .conftest import PY, copy_project, git_commit_all, git_dvc_init, run_cmd, stage_env
from .test_interrupt import PIPELINE_STOP_WITHIN_S, assert_one_line, signal_when, wait_gone

STUB = """import os, sys, time
name = sys.argv[1]
print(f"{name} started", flush=True)
time.sleep(float(os.environ.get("STUB_SLEEP", "0")) if name in ("b", "c") else 0)
open(f"{name}.out", "w").write(name)
"""


def _stand_in(root: Path) -> Path:
    copy_project(root, ("bert_core", "flows", "params", "pyproject.toml"))
    (root / "stub.py").write_text(STUB)
    stages = {
        name: {"cmd": f"exec python stub.py {name}", "deps": ["stub.py", *deps], "outs": [f"{name}.out"]}
        for name, deps in (
            ("prep", []),
            ("b", ["prep.out"]),
            ("c", ["prep.out"]),
            ("report", ["b.out", "c.out"]),
        )
    }
    (root / "dvc.yaml").write_text(yaml.safe_dump({"stages": stages}))
    git_dvc_init(root)
    git_commit_all(root, "stand-in stages")
    return root


def _outcomes(stdout: str) -> dict[str, str]:
    return dict(re.findall(r"^(\S+)\s+(ran|cached|failed|not run|interrupted)$", stdout, re.M))


@pytest.mark.faults
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["INT", "TERM"])
def test_a_signal_stops_every_running_stage_and_a_rerun_runs_what_is_missing(sig, prefect_api, tmp_path):
    root = _stand_in(tmp_path / "repo")
    env = stage_env(prefect_api, f"sqlite:///{tmp_path / 'mlflow.db'}", STUB_SLEEP="600")
    res = signal_when(
        [PY, "-m", "flows.pipeline", "--jobs", "2"],
        cwd=root,
        env=env,
        ready=lambda out: "b started" in out and "c started" in out,
        sig=sig,
    )
    assert res.returncode == 128 + sig, res.output[-4000:]
    assert res.seconds < PIPELINE_STOP_WITHIN_S, f"{res.seconds:.1f}s:\n{res.output[-4000:]}"
    assert_one_line(res, rf"pipeline interrupted: stopped by {signal.Signals(sig).name}")
    assert not wait_gone(res.children), "processes left behind"
    # DVC recorded the stage that finished, and nothing of the two it was stopped in.
    assert set(yaml.safe_load((root / "dvc.lock").read_text())["stages"]) == {"prep"}
    status = run_cmd([PY, "-m", "dvc", "status", "--json"], cwd=root, env=env)
    assert status.returncode == 0 and set(json.loads(status.stdout)) == {"b", "c", "report"}, status
    rerun = run_cmd([PY, "-m", "flows.pipeline", "--jobs", "2"], cwd=root, env={**env, "STUB_SLEEP": "0"})
    assert rerun.returncode == 0, rerun.stderr[-4000:]
    assert _outcomes(rerun.stdout) == {"prep": "cached", "b": "ran", "c": "ran", "report": "ran"}


@pytest.mark.faults
def test_a_failed_stage_is_named_and_the_stage_beside_it_finishes(prefect_api, tmp_path):
    root = _stand_in(tmp_path / "repo")
    (root / "stub.py").write_text(STUB + "sys.exit(3 if name == 'c' else 0)\n")
    git_commit_all(root, "c fails")
    env = stage_env(prefect_api, f"sqlite:///{tmp_path / 'mlflow.db'}", STUB_SLEEP="1")
    res = run_cmd([PY, "-m", "flows.pipeline", "--jobs", "2"], cwd=root, env=env)
    assert res.returncode == 1, res.stderr[-4000:]
    assert "error: stage 'c' failed" in res.stderr, res.stderr[-4000:]
    assert set(yaml.safe_load((root / "dvc.lock").read_text())["stages"]) == {"prep", "b"}
    status = run_cmd([PY, "-m", "dvc", "status", "--json"], cwd=root, env=env)
    assert status.returncode == 0 and set(json.loads(status.stdout)) == {"c", "report"}, status
