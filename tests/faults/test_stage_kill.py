"""SIGKILL of a pipeline stage at a random point, then ``dvc repro``: the pipeline completes with the outputs
of an uninterrupted run, pretraining resumes from its last checkpoint, and no output is ever seen half
written.

The reference is the tiny pipeline of :mod:`.pipeline_repo`, built once per session. Each case copies its
workspace (without DVC's run cache and the pretraining checkpoints, and without the stage's entry in
``dvc.lock``, as when the stage never completed: DVC has to run it again rather than restore an output),
forces the stage to run (``dvc repro --force --single-item <stage>``),
SIGKILLs DVC's whole process group (DVC, the stage and its workers) at a random moment inside the stage's
measured run time (pretraining: after its first checkpoint), checks what the kill left, then runs
``dvc repro`` and compares every output hash in ``dvc.lock`` with the reference.

The kill times are random; the seed is printed on failure and ``FAULTS_SEED=<seed>`` replays it.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import re
import shutil
import signal
import time
from pathlib import Path

import pytest
import yaml

from tests.dvc_status import up_to_date

from .conftest import PY, Processes, kill_group, temp_leftovers
from .pipeline_repo import CHECKPOINTS, EXTRA, TinyPipeline, tree_digest

PRETRAIN_STEPS = EXTRA["params/pretrain.yaml"]["pretrain.max_steps"]
CHECKPOINT_EVERY = EXTRA["params/pretrain.yaml"]["pretrain.checkpoint_every"]
SEED = int(os.environ.get("FAULTS_SEED", str(time.time_ns() % 2**31)))
# In the fault run: the first data stage (its kill must not leak into the stages after it) and pretraining.
FAST = ("corpus", "pretrain")
SLOW = ("vocab", "pretrain_data", "finetune@sst2", "evaluate")
# Outputs that an uninterrupted run reproduces byte for byte (CPU, deterministic pretraining; the vocab's
# merges break ties by a total order, so a rerun of `vocab` reproduces it and everything after it).
EXACT = ("data/corpus", "data/vocab", "data/pretrain_data", "models/pretrained")


def _checkpoints(root: Path) -> list[int]:
    """Steps of the complete checkpoints under the pretraining checkpoint root."""
    base = root / CHECKPOINTS
    found = []
    for state in base.glob("*/step-*/state.json"):
        m = re.match(r"step-(\d+)$", state.parent.name)
        if m:
            found.append(int(m.group(1)))
    return sorted(found)


def _kill_inside(pipe: TinyPipeline, clone: Path, stage: str, rng: random.Random, log: Path) -> dict:
    """Run ``stage`` alone in ``clone`` and SIGKILL its process group at a random moment inside it.

    Returns what was killed when (for the failure message and the checks). Retries (at most 3 times,
    earlier each time) when the stage finished before the kill fell.
    """
    reference_s = pipe.record(stage).seconds
    procs = Processes()
    try:
        for attempt in range(3):
            for ckpt_dir in (clone / CHECKPOINTS).glob("*"):  # a finished run would not train again
                shutil.rmtree(ckpt_dir)
            cmd = [PY, "-m", "dvc", "repro", "--force", "--single-item", stage]
            started = time.monotonic()
            proc = procs.start(cmd, cwd=clone, env=pipe.env(clone), log=log)
            if stage == "pretrain":  # mid-training: just after a random checkpoint, before the next one
                target = rng.randint(1, PRETRAIN_STEPS // CHECKPOINT_EVERY - 1) * CHECKPOINT_EVERY
                deadline = started + 3 * reference_s + 120
                while max(_checkpoints(clone), default=0) < target and proc.poll() is None:
                    assert time.monotonic() < deadline, (
                        f"no checkpoint {target} in time:\n{log.read_text()[-3000:]}"
                    )
                    time.sleep(0.02)
                delay = time.monotonic() - started + rng.uniform(0, 0.4)
            else:
                delay = rng.uniform(0.25, 0.9) * reference_s / (attempt + 1)
            seen = False  # the stage's command ran: once it is gone, DVC is writing dvc.lock (in place)
            while proc.poll() is None and time.monotonic() - started < delay:
                running = _stage_command_running(proc.pid)
                if seen and not running:
                    break
                seen = seen or running
                time.sleep(0.02)
            if proc.poll() is None and not (seen and not _stage_command_running(proc.pid)):
                kill_group(proc, signal.SIGKILL)
                return {
                    "stage": stage,
                    "attempt": attempt,
                    "after_s": round(delay, 2),
                    "ref_s": round(reference_s, 2),
                }
            proc.wait(timeout=600)  # DVC's bookkeeping after the stage: the next attempt needs its lock
            log.write_text(
                log.read_text() + f"\n[attempt {attempt}: finished before the kill at {delay:.1f}s]\n"
            )
        raise AssertionError(f"{stage} always finished before the kill (reference {reference_s:.1f}s)")
    finally:
        procs.kill_all()


def _stage_command_running(dvc_pid: int) -> bool:
    """Whether DVC's stage command (``python -m flows.<stage>``) runs under DVC process ``dvc_pid``.

    A kill after it ended would land in DVC's own bookkeeping, which writes ``dvc.lock`` in place: a kill
    there leaves a truncated lock file, which is DVC's behaviour, not the stage's, and not what this test
    is about (``git checkout dvc.lock`` restores it).
    """
    import psutil

    try:
        children = psutil.Process(dvc_pid).children(recursive=True)
    except psutil.Error:
        return False
    for child in children:
        with contextlib.suppress(psutil.Error):
            if any(part.startswith("flows.") for part in child.cmdline()):
                return True
    return False


def _absent_or_whole(path: Path, reference: Path, *, exact: bool) -> bool:
    """``path`` is absent or the reference's bytes; unless ``exact``, also a whole output of another run:
    the reference's files, each JSON file parsing and each other file with the reference's line count."""
    digest = tree_digest(path)
    if digest in (None, tree_digest(reference)) or exact:
        return digest in (None, tree_digest(reference))
    files = [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file())
    refs = [reference] if reference.is_file() else sorted(p for p in reference.rglob("*") if p.is_file())
    if [f.relative_to(path) for f in files] != [r.relative_to(reference) for r in refs]:
        return False
    for f, r in zip(files, refs, strict=True):
        if f.suffix == ".json":
            try:
                json.loads(f.read_text(encoding="utf-8"))
            except ValueError:
                return False
        elif len(f.read_bytes().splitlines()) != len(r.read_bytes().splitlines()):
            return False
    return True


def _outs_of(pipe: TinyPipeline, stage: str) -> list[str]:
    return next(outs for name, outs in pipe.stage_order() if name == stage)


@pytest.mark.parametrize(
    "stage",
    # `make test-faults` (-m faults) runs FAST; `make test-slow` (-m slow) runs the others.
    [
        *(pytest.param(s, marks=pytest.mark.faults) for s in FAST),
        *(pytest.param(s, marks=pytest.mark.slow) for s in SLOW),
    ],
)
def test_sigkill_at_a_random_point_then_dvc_repro_completes_with_the_same_outputs(
    stage, tiny_pipeline, tmp_path
):
    pipe = tiny_pipeline
    until = "pretrain" if stage in FAST else None
    pipe.build(until=until)
    if stage not in {s.name for s in pipe.stages}:
        pytest.skip(f"no stage {stage} in dvc.yaml")
    rng = random.Random(f"{SEED}-{stage}")
    clone = pipe.clone(tmp_path / "clone")
    reference = pipe.lock_outs()
    log = tmp_path / "killed.log"

    # As in a first run, dvc.lock has no entry for the stage (DVC records one only when it completes), so
    # DVC must run it again rather than check its last output out of the cache.
    lock = yaml.safe_load((clone / "dvc.lock").read_text())
    del lock["stages"][stage]
    (clone / "dvc.lock").write_text(yaml.safe_dump(lock, sort_keys=False))
    kill = _kill_inside(pipe, clone, stage, rng, log)
    where = f"kill {kill} (FAULTS_SEED={SEED}); killed run's log:\n{log.read_text()[-3000:]}"

    # What the kill left: each output of the stage is absent, as before the run (persist: the reference's
    # bytes) or complete, never partial. A kill after the stage's commit leaves its new outputs, whose
    # metrics hold this run's timings: outside EXACT they are only checked whole.
    for out in _outs_of(pipe, stage):
        assert _absent_or_whole(clone / out, pipe.root / out, exact=out in EXACT), (
            f"{out} is half written after the {where}"
        )
    ckpts_at_kill = _checkpoints(clone)
    leftovers_at_kill = temp_leftovers(clone / "data") + temp_leftovers(clone / "models")
    kept_at_kill = list(clone.glob("data/.*.partial/*/*.json"))  # corpus units, pretrain_data tasks

    # `dvc repro` finishes the pipeline (up to the same stage as the reference).
    res = pipe.dvc("repro", *([until] if until else []), root=clone, timeout=1200)
    output = res.stdout + res.stderr
    assert res.returncode == 0, f"dvc repro after the {where}\n{output[-5000:]}"
    status = pipe.dvc("status", *([until, "--with-deps"] if until else []), root=clone)
    assert up_to_date(status.stdout), status.stdout

    # Same outputs as the uninterrupted run, bit for bit (DVC's hashes), for the stages whose outputs are
    # deterministic; the fine-tuning results and the report hold timings, so they are only checked complete.
    after = pipe.lock_outs(clone)
    exact = set(EXACT)
    different = {p: (md5, after.get(p)) for p, md5 in reference.items() if p in exact and after.get(p) != md5}
    assert not different, f"outputs differ from the uninterrupted run after the {where}: {different}"
    assert {p for p in reference if p not in EXACT} <= set(after), "an output is missing from dvc.lock"

    if stage == "pretrain":
        assert ckpts_at_kill and "Running stage 'pretrain'" in output, f"no mid-training kill: {where}"
        last = max(ckpts_at_kill)
        assert re.search(rf"resumed from \S*step-{last:08d}", output), (
            f"pretraining did not resume from step {last} after the {where}\n{output[-5000:]}"
        )

    if kept_at_kill:  # a data build killed after some tasks continues after them
        assert "continuing an unfinished build" in output, f"the build did not continue after the {where}"

    # Leftovers of the killed atomic writes are ignored by every reader and cleaned up by the rerun, and
    # the finished tasks a killed data build kept are gone once it completes.
    remaining = temp_leftovers(clone / "data") + temp_leftovers(clone / "models")
    remaining += list(clone.glob("data/.*.partial"))
    assert not remaining, f"temporary outputs left behind ({leftovers_at_kill} at the kill): {remaining}"
