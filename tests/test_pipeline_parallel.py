"""Stages at once: the order, each stage's device share, and the pipeline flow on a small real DVC repo."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import yaml

from flows import _driver, _fanout, pipeline

NEEDS = {
    "corpus": (),
    "pretrain": ("corpus",),
    "finetune@sst2": ("pretrain",),
    "finetune@rte": ("pretrain",),
    "finetune@cola": ("pretrain",),
    "evaluate": ("finetune@sst2", "finetune@rte", "finetune@cola"),
}

# ------------------------------------------------------------------------------------------ shares


def test_one_gpu_per_slot_and_a_share_of_the_cores():
    gpus = ["0", "1", "2", "3"]
    assert _fanout.default_jobs(gpus, 16) == 4
    envs = _fanout.slot_envs(4, gpus, 16)
    assert [e["CUDA_VISIBLE_DEVICES"] for e in envs] == ["0", "1", "2", "3"]
    assert {e["OMP_NUM_THREADS"] for e in envs} == {"4"}
    # Fewer slots than GPUs: each slot gets its own, disjoint, GPUs.
    assert [e["CUDA_VISIBLE_DEVICES"] for e in _fanout.slot_envs(2, gpus, 16)] == ["0,2", "1,3"]
    # More slots than GPUs: refused unless asked.
    with pytest.raises(ValueError, match=r"jobs=3 but 2 GPU\(s\) \(5,7\).*share_gpus"):
        _fanout.slot_envs(3, ["5", "7"], 8)
    shared = _fanout.slot_envs(3, ["5", "7"], 8, share_gpus=True)
    assert [e["CUDA_VISIBLE_DEVICES"] for e in shared] == ["5", "7", "5"]


def test_cpu_shares_and_default(monkeypatch):
    assert _fanout.default_jobs([], 2) == 2
    assert _fanout.default_jobs([], 1) == 1
    envs = _fanout.slot_envs(2, [], 2)
    assert envs == [dict.fromkeys(("OMP_NUM_THREADS", "MKL_NUM_THREADS", "RAYON_NUM_THREADS"), "1")] * 2
    assert _fanout.slot_envs(3, [], 2)[0]["OMP_NUM_THREADS"] == "1"  # never 0 threads
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3, 1")
    assert _fanout.visible_gpus() == ["3", "1"]
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    assert _fanout.visible_gpus() == []


def test_solo_stages_and_closure():
    assert _fanout.solo_stages(NEEDS) == {"corpus", "pretrain", "evaluate"}
    assert list(_fanout.closure(NEEDS, ["finetune@rte"])) == ["corpus", "pretrain", "finetune@rte"]
    assert _fanout.closure(NEEDS, []) == NEEDS
    with pytest.raises(
        ValueError, match=r"\['finetune@sst'\]: no such stage in dvc.yaml; give stage names \(corpus, "
    ):
        _fanout.closure(NEEDS, ["finetune@sst"])
    assert list(_fanout.closure(NEEDS, ["finetune"])) == [s for s in NEEDS if s != "evaluate"]


# ---------------------------------------------------------------------------------------- the order


def _recorder(fail: set[str] = frozenset(), seconds: float = 0.05):
    log: list[tuple[str, str, int]] = []
    lock = threading.Lock()

    def run(stage: str, slot: int) -> bool:
        with lock:
            log.append(("start", stage, slot))
        time.sleep(seconds)
        with lock:
            log.append(("end", stage, slot))
        return stage not in fail

    return run, log


def test_independent_stages_run_together_in_their_own_slots():
    run, log = _recorder()
    assert set(_fanout.run_graph(NEEDS, 2, run).values()) == {"ok"}
    order = [(e, s) for e, s, _ in log]
    assert order.index(("end", "pretrain")) < min(order.index(("start", s)) for s in NEEDS if "@" in s)
    assert order.index(("start", "evaluate")) > max(order.index(("end", s)) for s in NEEDS if "@" in s)
    running, most, slots = set(), 0, {}
    for event, stage, slot in log:  # never more than 2 at once, and never two in one slot
        if event == "start":
            assert slot not in slots.values()
            running.add(stage)
            slots[stage] = slot
        else:
            running.discard(stage)
            slots.pop(stage)
        most = max(most, len(running))
    assert most == 2


def test_a_failed_stage_lets_the_others_finish_or_stops_them_with_fail_fast():
    run, _ = _recorder(fail={"finetune@sst2"})
    outcome = _fanout.run_graph(NEEDS, 2, run)
    assert outcome == {**dict.fromkeys(NEEDS, "ok"), "finetune@sst2": "failed", "evaluate": "not run"}
    run, _ = _recorder(fail={"finetune@sst2"})
    outcome = _fanout.run_graph(NEEDS, 1, run, fail_fast=True)
    assert outcome["finetune@sst2"] == "failed" and outcome["finetune@cola"] == "not run"


def test_an_interrupt_aborts_the_running_stages():
    release = threading.Event()
    aborted: list[bool] = []

    def run(stage: str, slot: int) -> bool:
        if stage == "corpus":
            raise KeyboardInterrupt  # stands in for the signal the main thread gets
        return release.wait(10)

    with pytest.raises(KeyboardInterrupt):
        _fanout.run_graph({"corpus": ()}, 1, run, abort=lambda: aborted.append(True) or release.set())
    assert aborted == [True]


# ------------------------------------------------------------------- the flow on a real DVC repository

STAMP = (
    "python -c \"import os,sys,time; open(os.environ['STAMPS'],'a').write(f'{sys.argv[1]} start {time.time()}\\n');"
    "time.sleep(float(sys.argv[2])); open(sys.argv[1] + '.out','w').write(os.environ.get('OMP_NUM_THREADS','-'));"
    "open(os.environ['STAMPS'],'a').write(f'{sys.argv[1]} end {time.time()}\\n'); sys.exit(int(sys.argv[3]))\""
)


def _git(root: Path, *args: str) -> None:
    subprocess.run(
        ["git", "-c", "user.email=t@e", "-c", "user.name=t", *args], cwd=root, check=True, capture_output=True
    )


def _dvc(root: Path, *args: str) -> str:
    res = subprocess.run([sys.executable, "-m", "dvc", *args], cwd=root, capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
    return res.stdout


@pytest.fixture
def dvc_repo(tmp_path, monkeypatch):
    """prep -> (b, c, d: two seconds each) -> report, in a git + DVC repository."""
    root = tmp_path / "repo"
    (root / "params" / "profiles").mkdir(parents=True)
    (root / "params" / "finetune.yaml").write_text("finetune:\n  defaults: {seeds: [1]}\n")
    stages = {"prep": {"cmd": f"{STAMP} prep 0 0", "outs": ["prep.out"]}}
    for name in ("b", "c", "d"):
        stages[name] = {"cmd": f"{STAMP} {name} 2 0", "deps": ["prep.out"], "outs": [f"{name}.out"]}
    stages["report"] = {
        "cmd": f"{STAMP} report 0 0",
        "deps": ["b.out", "c.out", "d.out"],
        "outs": ["report.out"],
    }
    stages["prep"]["params"] = [{"params/finetune.yaml": ["finetune.defaults.seeds"]}]
    (root / "dvc.yaml").write_text(yaml.safe_dump({"stages": stages}, width=1000))
    _git(root, "init", "-q")
    subprocess.run([sys.executable, "-m", "dvc", "init", "-q"], cwd=root, check=True)
    _git(root, "add", "-A")
    _git(root, "commit", "-qm", "init")
    monkeypatch.setattr(pipeline, "REPO_ROOT", root)
    monkeypatch.setattr(_fanout, "visible_gpus", lambda: [])
    monkeypatch.setattr(_fanout, "cpu_cores", lambda: 4)
    monkeypatch.setenv("OMP_NUM_THREADS", "7")  # what a stage that runs alone keeps
    monkeypatch.setenv("STAMPS", str(tmp_path / "stamps.txt"))
    return root


def _spans(path: Path) -> dict[str, tuple[float, float]]:
    times: dict[str, dict[str, float]] = {}
    for line in path.read_text().splitlines():
        name, event, at = line.split()
        times.setdefault(name, {})[event] = float(at)
    return {n: (t["start"], t["end"]) for n, t in times.items()}


@pytest.fixture(scope="module")
def harness():
    from prefect.testing.utilities import prefect_test_harness

    with prefect_test_harness(server_startup_timeout=120):
        yield


def test_the_flow_runs_independent_stages_at_once_through_dvc(harness, dvc_repo, tmp_path):
    result = pipeline.pipeline_flow(profile=None, as_experiment=False, jobs=2)
    assert {s: r["outcome"] for s, r in result["stages"].items()} == dict.fromkeys(
        ["prep", "b", "c", "d", "report"], "ran"
    )
    spans = _spans(tmp_path / "stamps.txt")
    overlaps = [
        (x, y)
        for x in "bcd"
        for y in "bcd"
        if x < y and spans[x][0] < spans[y][1] and spans[y][0] < spans[x][1]
    ]
    assert overlaps, spans  # two of the three ran together
    assert spans["report"][0] > max(spans[x][1] for x in "bcd")
    # Shares: 4 cores / 2 jobs for the stages that ran beside another; the whole machine for the others.
    threads = {n: (dvc_repo / f"{n}.out").read_text() for n in ("prep", "b", "c", "d", "report")}
    assert threads == {"prep": "7", "b": "2", "c": "2", "d": "2", "report": "7"}
    # DVC recorded every stage (no process lost another's dvc.lock entry) and finds nothing to do.
    assert set(yaml.safe_load((dvc_repo / "dvc.lock").read_text())["stages"]) == set(threads)
    assert "up to date" in _dvc(dvc_repo, "status")
    stamps = (tmp_path / "stamps.txt").read_text()
    again = pipeline.pipeline_flow(profile=None, as_experiment=False, jobs=2)
    assert {r["outcome"] for r in again["stages"].values()} == {"cached"}
    assert (tmp_path / "stamps.txt").read_text() == stamps
    # A changed first stage: the later ones go to DVC, which finds their inputs the same and skips them.
    sets = ["params/finetune.yaml:finetune.defaults.seeds=[3]"]
    third = pipeline.pipeline_flow(profile=None, as_experiment=False, jobs=2, extra_overrides=sets)
    assert {s: r["outcome"] for s, r in third["stages"].items()} == {
        **dict.fromkeys(threads, "cached"),
        "prep": "ran",
    }


def test_a_failed_stage_is_named_and_the_others_finish(harness, dvc_repo, tmp_path):
    spec = yaml.safe_load((dvc_repo / "dvc.yaml").read_text())
    for name in ("c", "d"):
        spec["stages"][name]["cmd"] = spec["stages"][name]["cmd"].replace(f"{name} 2 0", f"{name} 0 3")
    (dvc_repo / "dvc.yaml").write_text(yaml.safe_dump(spec, width=1000))
    state = pipeline.pipeline_flow(profile=None, as_experiment=False, jobs=2, return_state=True)
    with pytest.raises(_driver.PipelineFailed, match=r"stages '[cd]', '[cd]' failed"):
        state.result()
    lock = yaml.safe_load((dvc_repo / "dvc.lock").read_text())["stages"]
    assert set(lock) == {"prep", "b"}  # b finished beside them; report never started
    status = json.loads(_dvc(dvc_repo, "status", "--json"))
    assert set(status) == {"c", "d", "report"}


def test_an_experiment_run_at_once_is_saved_as_a_dvc_experiment(harness, dvc_repo):
    result = pipeline.pipeline_flow(
        profile=None,
        jobs=3,
        experiment_name="par1",
        extra_overrides=["params/finetune.yaml:finetune.defaults.seeds=[2]"],
    )
    assert result["dvc_experiment"] == "par1"
    assert "par1" in _dvc(dvc_repo, "exp", "list")
    params = yaml.safe_load((dvc_repo / "params" / "finetune.yaml").read_text())
    assert params["finetune"]["defaults"]["seeds"] == [2]


def test_an_experiment_of_some_stages_is_saved_while_the_others_never_ran(harness, dvc_repo):
    """`dvc exp save` of the stages that ran: without them it commits every stage and fails on the
    outputs of those that never ran here (b.out ... report.out)."""
    result = pipeline.pipeline_flow(profile=None, jobs=2, experiment_name="part", targets=["b"])
    assert set(result["stages"]) == {"prep", "b"} and not (dvc_repo / "report.out").exists()
    assert "part" in _dvc(dvc_repo, "exp", "list")


class _Dvc:
    """A DVC process that prints ``lines`` and exits with ``code``."""

    def __init__(self, lines: list[str], code: int) -> None:
        self._lines, self.code = lines, code

    def lines(self):
        yield from self._lines

    def wait(self) -> int:
        return self.code

    def stop(self, on_line=None) -> None:
        pass

    def signal(self, signum: int) -> None:
        pass


def test_a_stage_dvc_refused_on_a_busy_lock_is_tried_again(harness, monkeypatch, tmp_path):
    from prefect import flow

    from flows import _dvc

    calls: list[list[str]] = []
    busy = "ERROR: Unable to acquire lock. Most likely another DVC process is running or was terminated"

    def start(args, *, cwd, env):
        calls.append(args)
        return _Dvc([busy], 255) if len(calls) == 1 else _Dvc(["Running stage 'b':", "done"], 0)

    monkeypatch.setattr(_driver, "start_dvc", start)
    monkeypatch.setattr(_dvc, "stage_infos", lambda root: [])
    code, reports, _ = flow(lambda: _driver.fan_out({"b": ()}, jobs=1, root=tmp_path, env={}, slots=[{}]))()
    assert code == 0 and [(r.stage, r.outcome) for r in reports] == [("b", "ran")]
    assert calls == [["--wait-for-lock", "repro", "--single-item", "b"]] * 2


def test_the_inputs_stage_runs_first_and_only_what_its_records_changed_runs(
    harness, dvc_repo, tmp_path, monkeypatch
):
    """The always-changed ``inputs`` stage (its records of files outside the repository, ``dvc.yaml``) runs
    before the others are asked ``dvc status``: an edited outside file re-runs the stage whose record
    changed, and DVC is started for it and what follows it only, not for every stage after ``inputs``."""
    started, repro = [], _driver._repro_single
    monkeypatch.setattr(_driver, "_repro_single", lambda stage, *a: started.append(stage) or repro(stage, *a))
    outside = tmp_path / "outside"
    outside.mkdir()
    for name in "bc":
        (outside / name).write_text("1")
    copy = f"import pathlib as p; p.Path('rec').mkdir(exist_ok=True); [p.Path('rec', n).write_text(p.Path(r'{outside}', n).read_text()) for n in 'bc']"
    spec = yaml.safe_load((dvc_repo / "dvc.yaml").read_text())
    inputs = {"cmd": f'python -c "{copy}"', "always_changed": True, "outs": [{"rec": {"persist": True}}]}
    spec["stages"] = {"inputs": inputs, **spec["stages"]}
    for name in "bc":
        spec["stages"][name]["deps"].append(f"rec/{name}")
    (dvc_repo / "dvc.yaml").write_text(yaml.safe_dump(spec, width=1000))
    first = pipeline.pipeline_flow(profile=None, as_experiment=False, jobs=2)
    assert {r["outcome"] for r in first["stages"].values()} == {"ran"}
    (outside / "b").write_text("2")
    started.clear()
    again = pipeline.pipeline_flow(profile=None, as_experiment=False, jobs=2)
    assert sorted(started) == ["b", "inputs", "report"]
    assert {s: r["outcome"] for s, r in again["stages"].items()} == {
        **dict.fromkeys(["prep", "c", "d", "report"], "cached"),
        "inputs": "ran",
        "b": "ran",
    }
