"""A team shares the pipeline's outputs through a DVC remote: what one clone pushes, a fresh clone pulls, and
DVC then finds nothing to rerun; the stages read the pulled outputs (checksums verified) as their own; an
object damaged in the remote is refused by the pull and never reaches the workspace."""

from __future__ import annotations

import hashlib
import subprocess
from pathlib import Path

import pytest

from tests.dvc_status import up_to_date

from .conftest import git_commit_all

pytestmark = pytest.mark.faults


def _ok(res: subprocess.CompletedProcess) -> str:
    assert res.returncode == 0, f"{res.args}:\n{res.stdout[-3000:]}\n{res.stderr[-3000:]}"
    return res.stdout + res.stderr


def _pushed(tiny_pipeline, tmp_path: Path) -> tuple[Path, Path]:
    """A clone of the built pipeline whose outputs are pushed to the team's remote: (its root, the remote)."""
    tiny_pipeline.build()
    ours, remote = tiny_pipeline.clone(tmp_path / "ours"), tmp_path / "remote"
    _ok(tiny_pipeline.dvc("remote", "add", "-d", "team", str(remote), root=ours))
    git_commit_all(ours, "the run's dvc.lock and the team's remote")
    _ok(tiny_pipeline.dvc("push", root=ours))
    return ours, remote


def _git_clone(source: Path, dest: Path) -> Path:
    """A teammate's checkout: the repository alone, no outputs."""
    _ok(subprocess.run(["git", "clone", "-q", str(source), str(dest)], capture_output=True, text=True))
    return dest


def test_outputs_pushed_to_a_remote_need_no_rerun_in_a_fresh_clone(tiny_pipeline, tmp_path):
    ours, _ = _pushed(tiny_pipeline, tmp_path)
    theirs = _git_clone(ours, tmp_path / "theirs")
    assert not (theirs / "models" / "pretrained").exists()  # outputs travel through the remote, not git
    _ok(tiny_pipeline.dvc("pull", root=theirs))
    assert tiny_pipeline.lock_outs(theirs) == tiny_pipeline.lock_outs(ours)
    assert up_to_date(_ok(tiny_pipeline.dvc("status", root=theirs)))
    # The evaluation stage reads the pulled fine-tuning results (each verified against its checksums) and
    # scores them as the original run did.
    _ok(tiny_pipeline.dvc("repro", "--force", "--single-item", "evaluate", root=theirs))
    assert tiny_pipeline.metrics("metrics/evaluate.json", theirs) == tiny_pipeline.metrics(
        "metrics/evaluate.json", ours
    )


def test_an_object_damaged_in_the_remote_is_refused_by_the_pull_or_by_the_stage_that_reads_it(
    tiny_pipeline, tmp_path
):
    ours, remote = _pushed(tiny_pipeline, tmp_path)
    weights = ours / "models" / "pretrained" / "model.safetensors"
    digest = hashlib.md5(weights.read_bytes()).hexdigest()  # DVC stores a file under its md5
    stored = remote / "files" / "md5" / digest[:2] / digest[2:]
    stored.chmod(0o644)
    stored.write_bytes(b"not the weights")

    # With `verify true` the pull hashes what it downloads: the damaged object never reaches the workspace.
    strict = _git_clone(ours, tmp_path / "strict")
    _ok(tiny_pipeline.dvc("remote", "modify", "team", "verify", "true", root=strict))
    res = tiny_pipeline.dvc("pull", root=strict)
    assert res.returncode != 0 and "models/pretrained" in res.stdout + res.stderr
    assert not (strict / "models" / "pretrained").exists()

    # DVC's default trusts the remote, and `dvc status` then calls the workspace up to date; the stage that
    # reads the model checks it against the checksums written beside it and refuses it by name.
    trusting = _git_clone(ours, tmp_path / "trusting")
    _ok(tiny_pipeline.dvc("pull", root=trusting))
    res = tiny_pipeline.dvc("repro", "--force", "--single-item", "finetune@sst2", root=trusting)
    said = res.stdout + res.stderr
    assert res.returncode != 0 and "CorruptOutputError" in said and "model.safetensors is damaged" in said
