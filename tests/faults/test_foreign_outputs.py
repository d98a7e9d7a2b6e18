"""Outputs never destroy what the pipeline did not write: an existing path at an output location that is
not the pipeline's own earlier output (a user's folder, a directory where a file goes, a FIFO) is refused
before any work, naming it, and left byte for byte as it was."""

from __future__ import annotations

import json
import os
import subprocess

import pytest
import yaml

from .conftest import PY, REPO_ROOT, base_env, run_cmd, stage_env

pytestmark = pytest.mark.faults


def _tree(path):
    return {str(p.relative_to(path)): p.read_bytes() for p in sorted(path.rglob("*")) if p.is_file()}


def _predict(tmp_path, output) -> subprocess.CompletedProcess:
    src = tmp_path / "in.jsonl"
    src.write_text(json.dumps({"text": "a fine film"}) + "\n")
    cmd = [
        PY,
        "-m",
        "flows.predict",
        "--no-prefect",
        "--model",
        "models:/bert-sst2@champion",
        "--input",
        str(src),
        "--output",
        str(output),
    ]
    env = base_env(MLFLOW_TRACKING_URI=f"sqlite:///{tmp_path}/mlflow.db")
    return run_cmd(cmd, cwd=tmp_path, env=env, timeout=120)


def test_predict_output_on_an_existing_directory_is_refused_and_the_directory_kept(tmp_path):
    folder = tmp_path / "my-results"
    (folder / "sub").mkdir(parents=True)
    (folder / "notes.txt").write_text("keep me")
    (folder / "sub" / "data.bin").write_bytes(os.urandom(64))
    before = _tree(folder)
    res = _predict(tmp_path, folder)
    assert res.returncode == 1, res.stderr[-2000:]
    assert f"predict failed: ForeignOutputError: output {folder} is an existing directory" in res.stderr
    assert "nothing was written" in res.stderr
    assert "loading" not in res.stderr  # refused before the model was loaded
    assert _tree(folder) == before


def test_predict_output_on_a_fifo_is_refused(tmp_path):
    fifo = tmp_path / "out.jsonl"
    os.mkfifo(fifo)
    res = _predict(tmp_path, fifo)
    assert res.returncode == 1 and "a device, FIFO or socket" in res.stderr, res.stderr[-2000:]
    assert fifo.exists()


def test_predict_input_that_is_a_directory_says_so(tmp_path):
    src = tmp_path / "in"
    src.mkdir()
    cmd = [
        PY,
        "-m",
        "flows.predict",
        "--no-prefect",
        "--model",
        "models:/x@y",
        "--input",
        str(src),
        "--output",
        str(tmp_path / "out.jsonl"),
    ]
    res = run_cmd(cmd, cwd=tmp_path, env=base_env(MLFLOW_TRACKING_URI=f"sqlite:///{tmp_path}/m.db"))
    assert res.returncode == 1 and "the input is a directory" in res.stderr, res.stderr[-2000:]


def test_a_report_dir_on_a_users_folder_is_refused_before_any_work(tmp_path, prefect_api):
    """``evaluate.report_dir`` set in params to a folder outside the repository whose ``evaluate`` folder
    is the user's: refused, nothing replaced."""
    user = tmp_path / "Documents"
    (user / "evaluate").mkdir(parents=True)
    (user / "evaluate" / "thesis.tex").write_text("years of work")
    data = yaml.safe_load((REPO_ROOT / "params" / "evaluate.yaml").read_text())
    data["evaluate"]["report_dir"] = str(user)
    data["evaluate"]["results_dir"] = str(tmp_path / "results")  # a summary there: it gets as far as its outs
    (tmp_path / "results" / "sst2").mkdir(parents=True)
    (tmp_path / "results" / "sst2" / "summary.json").write_text("{}")
    params = tmp_path / "evaluate.yaml"
    params.write_text(yaml.safe_dump(data))
    (tmp_path / "finetune.yaml").write_text("finetune: {}\n")  # no task list: every summary found
    cmd = [
        PY,
        "-m",
        "flows.evaluate",
        "--params",
        str(params),
        "--metrics",
        str(tmp_path / "m.json"),
        "--finetune-params",
        str(tmp_path / "finetune.yaml"),
    ]
    env = stage_env(prefect_api, f"sqlite:///{tmp_path}/mlflow.db")
    res = run_cmd(cmd, cwd=tmp_path, env=env, timeout=300)
    assert res.returncode == 1, res.stderr[-3000:]
    assert f"ForeignOutputError: output {user / 'evaluate'} is an existing directory" in res.stderr
    assert (user / "evaluate" / "thesis.tex").read_text() == "years of work"
    assert sorted(p.name for p in user.iterdir()) == ["evaluate"]


def test_a_relative_form_path_cannot_leave_the_repository():
    from flows._stage import in_repo

    with pytest.raises(ValueError, match=r"output_path '\.\./\.\./x\.jsonl' is relative and leads out of"):
        in_repo("../../x.jsonl", "output_path")
    assert in_repo("data/x.jsonl") == REPO_ROOT / "data" / "x.jsonl"
    assert str(in_repo("/abs/x.jsonl")) == "/abs/x.jsonl"


@pytest.mark.parametrize(
    ("stage", "option"),
    [
        ("corpus", "--out"),
        ("vocab", "--out"),
        ("pretrain_data", "--out"),
        ("pretrain", "--out"),
        ("finetune", "--model-out"),
    ],
)
def test_a_file_where_a_stage_writes_a_directory_is_refused_before_any_work(
    stage, option, tmp_path, prefect_api
):
    """Refused when the stage starts, not after it trained to the end (and, for pretraining, registered a
    model it then withdrew)."""
    target = tmp_path / "notes.txt"
    target.write_text("a user's file")
    inputs = {  # present, so that the stage gets as far as its outputs
        "vocab": ["--corpus"],
        "pretrain_data": ["--corpus", "--vocab"],
        "pretrain": ["--data", "--vocab"],
        "finetune": ["sst2", "--model-source"],
    }.get(stage, [])
    args = [a for flag in inputs for a in ((flag, str(tmp_path)) if flag.startswith("-") else (flag,))]
    cmd = [PY, "-m", f"flows.{stage}", *args, option, str(target), "--metrics", str(tmp_path / "m.json")]
    res = run_cmd(
        cmd, cwd=REPO_ROOT, env=stage_env(prefect_api, f"sqlite:///{tmp_path}/mlflow.db"), timeout=300
    )
    assert res.returncode == 1, res.stderr[-3000:]
    assert (
        f"ForeignOutputError: output {target} is an existing file, and a directory goes there" in res.stderr
    )
    assert target.read_text() == "a user's file"
    assert {p.name for p in tmp_path.iterdir()} <= {"notes.txt", "mlflow.db"}  # no metrics, no reports
