"""All-or-nothing stage outputs: the last write of a stage fails, and every previous out stays.

Each stage writes its DVC metrics file last. In a copy of the built tiny pipeline, the stage's previous
outs (data or model directories, metrics file, plot files, reports) are marked as a previous run's, then
the stage command runs with the write of its metrics file failing halfway (``bert_core.atomic``'s text
writer patched in the stage process). The stage must fail, every previous out must be exactly as it was
(nothing new next to a stale file, no half-written metrics file), no ``.<name>.tmp-*`` temporary may be
left, and the registry must hold the same versions and aliases (pretrain registers before it commits).
"""

from __future__ import annotations

import shlex
from pathlib import Path

import pytest

from .conftest import PY, run_cmd, temp_leftovers
from .pipeline_repo import TinyPipeline, tree_digest

# Runs a stage module as `python -m` does, with the write of one file (by name) failing halfway.
INJECT = r"""
import errno, runpy, sys
from pathlib import Path
import bert_core.atomic as atomic
name, module, args = sys.argv[1], sys.argv[2], sys.argv[3:]
real = atomic.write_text_atomic
def failing(path, text):
    p = Path(path)
    if p.name == name or p.name.startswith(f".{name}{atomic.TEMP_MARKER}"):
        p.write_text(text[: len(text) // 2], encoding="utf-8")
        raise OSError(errno.EIO, f"injected failure while writing {p}")
    return real(path, text)
atomic.write_text_atomic = failing
sys.argv = [module, *args]
runpy.run_module(module, run_name="__main__", alter_sys=True)
"""

# In the fault run: the stages the session's pipeline is built for anyway (up to pretrain); the two that
# need the fine-tuned tasks run with `make test-slow`.
FAST = ("corpus", "vocab", "pretrain_data", "pretrain")
SLOW = ("finetune@sst2", "evaluate")


def _stage(pipe: TinyPipeline, name: str) -> tuple[list[str], list[str], str]:
    """(every out incl. metrics and plots, the stage command's module + args, the metrics file)."""
    from dvc.repo import Repo

    with Repo(str(pipe.root)) as repo:
        stage = next(s for s in repo.index.stages if getattr(s, "cmd", None) and s.name == name)
        outs = [o.def_path for o in stage.outs]
        (metrics,) = [o.def_path for o in stage.outs if o.metric]
        argv = shlex.split(stage.cmd)
    assert argv[:3] == ["exec", "python", "-m"], stage.cmd
    return outs, argv[3:], metrics


def _registry(root: Path) -> set[tuple[str, str, tuple[str, ...]]]:
    """Every registered version in the workspace's MLflow store, with its aliases."""
    from mlflow import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{root / 'mlflow.db'}")
    return {(v.name, str(v.version), tuple(sorted(v.aliases or ()))) for v in client.search_model_versions()}


def _mark_previous(root: Path, outs: list[str]) -> None:
    """Make each out recognisably a previous run's (a rerun with the same inputs would rewrite the same
    bytes, and an unchanged digest would prove nothing)."""
    for rel in outs:
        path = root / rel
        if path.is_dir():
            (path / "previous-run.txt").write_text("previous run\n")
        else:
            path.unlink()  # never write through a link into DVC's cache
            path.write_text("previous run\n")


@pytest.mark.parametrize(
    "stage",
    [
        *(pytest.param(s, marks=pytest.mark.faults) for s in FAST),
        *(pytest.param(s, marks=[pytest.mark.faults, pytest.mark.slow]) for s in SLOW),
    ],
)
def test_a_failing_last_write_leaves_every_previous_out_and_no_temporaries(stage, tiny_pipeline, tmp_path):
    pipe = tiny_pipeline
    pipe.build(until=None if stage in SLOW else "pretrain")
    if stage not in {s.name for s in pipe.stages}:
        pytest.skip(f"no stage {stage} in dvc.yaml")
    clone = pipe.clone(tmp_path / "clone")
    outs, command, metrics = _stage(pipe, stage)
    _mark_previous(clone, outs)
    before = {rel: tree_digest(clone / rel) for rel in outs}
    assert all(before.values()), f"the built pipeline lacks an out of {stage}: {before}"
    leftovers = set(temp_leftovers(clone))
    registry = _registry(clone)

    env = {**pipe.env(clone), "PYTHONPATH": str(clone)}  # the copy's code: its REPO_ROOT is the copy
    res = run_cmd([PY, "-c", INJECT, Path(metrics).name, *command], cwd=clone, env=env, timeout=900)

    assert res.returncode == 1, f"rc={res.returncode}\n{res.stdout[-3000:]}\n{res.stderr[-3000:]}"
    assert "stage failed" in res.stderr and "injected failure while writing" in res.stderr, res.stderr[-3000:]
    after = {rel: tree_digest(clone / rel) for rel in outs}
    changed = [rel for rel in outs if after[rel] != before[rel]]
    assert not changed, f"{stage}: outs replaced although the stage failed: {changed}"
    assert set(temp_leftovers(clone)) == leftovers, sorted(set(temp_leftovers(clone)) - leftovers)
    # pretrain registers before it commits (the record goes into its metrics file): it must withdraw.
    assert _registry(clone) == registry, f"{stage}: the registry changed although the stage failed"
