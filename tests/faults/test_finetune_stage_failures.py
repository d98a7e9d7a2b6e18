"""Finetune stage failures through the stage command: a read-only output is refused before training and
nothing is committed; a task file with CR-only line endings gives a short, bounded "stage failed" line.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from bert_core.owned import OUTPUT_MARK, mark_output

from .conftest import REPO_ROOT, stage_env
from .test_bad_input import finetune_params, run_stage

pytestmark = pytest.mark.faults


@pytest.fixture
def env(tmp_path, prefect_api) -> dict[str, str]:
    # This checkout's code, whichever checkout the venv's editable install points at.
    return stage_env(prefect_api, f"sqlite:///{tmp_path}/mlflow.db", PYTHONPATH=str(REPO_ROOT))


@pytest.fixture
def built(tiny_pipeline):
    """The tiny reference pipeline's pretrained model (built once per session)."""
    tiny_pipeline.build(until="pretrain")
    return tiny_pipeline.root


@pytest.fixture
def read_only_dir(tmp_path) -> Path:
    """An empty read-only mount (a real EROFS: root may not write there either)."""
    mnt = tmp_path / "ro"
    mnt.mkdir()
    res = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "ro,size=64k", "tmpfs", str(mnt)], capture_output=True, text=True
    )
    if res.returncode != 0:
        pytest.skip(f"cannot mount a read-only tmpfs here ({res.stderr.strip() or 'not root'})")
    yield mnt
    subprocess.run(["umount", str(mnt)], check=False)


def test_read_only_model_out_fails_before_training_and_commits_nothing(tmp_path, env, built, read_only_dir):
    work = tmp_path / "work"
    (work / "out").mkdir(parents=True)  # the previous run's outputs
    (work / "out" / "summary.json").write_text('{"old": true}')
    mark_output(work / "out")  # written by the pipeline: replaceable, unlike a folder of the user's
    (work / "metrics.json").write_text('{"old": true}')
    model_out = read_only_dir / "model"
    args = [
        "sst2",
        "--params",
        str(finetune_params(tmp_path)),
        "--model-source",
        str(built / "models" / "pretrained"),
        "--out",
        "out",
        "--model-out",
        str(model_out),
        "--metrics",
        "metrics.json",
        "--plots",
        "plots",
    ]
    res = run_stage("finetune", args, work, env)
    assert res.returncode == 1, res.stderr[-3000:]
    line = next(x for x in res.stderr.splitlines() if "finetune stage failed (sst2)" in x)
    assert f"OutputNotWritableError: cannot write output {model_out}: {read_only_dir} is not writable" in line
    assert "Read-only file system" in line and "nothing was written" in line
    # Nothing new next to the old outputs: same results, same metrics, no plots, no temporaries.
    assert (work / "out" / "summary.json").read_text() == '{"old": true}'
    assert (work / "metrics.json").read_text() == '{"old": true}'
    assert sorted(p.name for p in work.iterdir()) == ["metrics.json", "out"]
    assert sorted(p.name for p in (work / "out").iterdir()) == [OUTPUT_MARK, "summary.json"]


def test_cr_only_tsv_gives_a_short_stage_failed_line(tmp_path, env, built):
    root = tmp_path / "data"
    sst2 = root / "glue" / "SST-2"
    sst2.mkdir(parents=True)
    rows = "".join(f"a sentence of review number {i} " + "word " * 40 + "\t1\r" for i in range(20_000))
    (sst2 / "train.tsv").write_bytes(("sentence\tlabel\r" + rows).encode())  # ~4.5 MB on one "line"
    (sst2 / "dev.tsv").write_bytes(b"sentence\tlabel\ngood .\t1\n")
    args = [
        "sst2",
        "--params",
        str(finetune_params(tmp_path)),
        "--model-source",
        str(built / "models" / "pretrained"),
        "--out",
        "out",
        "--model-out",
        "model-out",
        "--metrics",
        "metrics.json",
        "--plots",
        "plots",
    ]
    res = run_stage("finetune", args, tmp_path / "work", {**env, "BERT_DATA_ROOT": str(root)})
    assert res.returncode == 1, res.stderr[-3000:]
    line = next(x for x in res.stderr.splitlines() if "finetune stage failed (sst2)" in x)
    assert f"{sst2 / 'train.tsv'}: file uses CR-only line endings; convert to LF" in line
    assert len(line) < 600
    assert len(res.stdout) + len(res.stderr) < 200_000  # the log quotes no megabytes either
    assert not list((tmp_path / "work").iterdir())
