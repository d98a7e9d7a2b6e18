"""Ctrl-C and SIGTERM, as a terminal and a scheduler send them, and a Prefect API that does not answer.

Ctrl-C is SIGINT to the whole foreground process group: the stage (or DVC and the stage it runs) *and*,
before this was fixed, Prefect's temporary server, which then took minutes of retries and a ConnectError
with it. Each case checks: the exit within 10 s of the signal, its status (130 / 143; DVC's own 255 for
a failed stage command, with the stage's 130 in its message), one line saying what happened, no
ConnectError, the Prefect flow run not left Running, and where DVC ran it, a ``dvc status`` that calls the
stage changed and a re-run that gives the uninterrupted run's outputs.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import threading
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from tests.dvc_status import up_to_date

from .conftest import PY, PrefectServer, free_port, kill_group, migrated_prefect_home, stage_env
from .pipeline_repo import CHECKPOINTS, EXTRA, TinyPipeline, tree_digest

# Every test is marked `faults` (`make test-faults`) but the dvc repro variant, which is `slow` only.

STOP_WITHIN_S = 10.0
#: `make pipeline` stops DVC's process group with SIGTERM and SIGKILLs what is left after 30 s. A stage is
#: gone within seconds (about 1 s; 3 s for the whole stop); the limit stays under the grace, so that a
#: stage that hangs instead of stopping fails the test rather than being killed in time.
PIPELINE_STOP_WITHIN_S = 20.0
#: How long `flows.serve` serves before a test signals it: its runner has started and polled.
RUNNER_STARTED_S = 8.0
FLOW_RUN_RE = re.compile(r"Beginning flow run '(?P<name>[^']+)' for flow '(?P<flow>[^']+)'")


@dataclass
class Interrupted:
    returncode: int
    seconds: float  # from the signal to the exit
    output: str
    children: list[int]  # processes of the run when the signal was sent
    stamped: list[tuple[float, str]]  # (seconds after the signal, line)

    def seconds_to(self, pattern: str) -> float | None:
        """When the first line matching ``pattern`` arrived, in seconds after the signal."""
        return next((t for t, line in self.stamped if re.search(pattern, line)), None)

    def flow_runs(self) -> dict[str, str]:
        """``{flow run name: flow name}`` of the flow runs the output announces."""
        return {m["name"]: m["flow"] for m in FLOW_RUN_RE.finditer(self.output)}


def signal_when(
    cmd: list[str],
    *,
    cwd: Path,
    env: dict[str, str],
    ready: Callable[[str], bool],
    sig: int,
    ignore_sigint: bool = False,
    to_group: bool = True,
    start_timeout: float = 300.0,
) -> Interrupted:
    """Start ``cmd`` in its own process group, send ``sig`` to the group (``to_group``; else to the process
    alone) once ``ready(output so far)``.

    ``ignore_sigint`` starts it with SIGINT ignored, as a non-interactive shell starts ``cmd &``: the
    process must install its own handler (Python keeps an inherited SIG_IGN).
    """
    import psutil

    proc = subprocess.Popen(
        cmd,
        cwd=cwd,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
        preexec_fn=(lambda: signal.signal(signal.SIGINT, signal.SIG_IGN)) if ignore_sigint else None,
    )
    lines: list[str] = []
    arrived: list[float] = []

    def read() -> None:
        for line in proc.stdout:  # type: ignore[union-attr]
            arrived.append(time.monotonic())
            lines.append(line)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        deadline = time.monotonic() + start_timeout
        while not ready("".join(lines)):
            if proc.poll() is not None:
                reader.join(5)
                raise AssertionError(
                    f"{cmd} ended (rc {proc.returncode}) before the signal:\n{''.join(lines)[-4000:]}"
                )
            assert time.monotonic() < deadline, f"{cmd} never got ready:\n{''.join(lines)[-4000:]}"
            time.sleep(0.05)
        try:
            children = [p.pid for p in psutil.Process(proc.pid).children(recursive=True)]
        except psutil.Error:
            children = []
        sent = time.monotonic()
        (os.killpg if to_group else os.kill)(proc.pid, sig)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=60)
        seconds = time.monotonic() - sent
        reader.join(10)
        assert proc.returncode is not None, f"still running 60 s after {sig!r}:\n{''.join(lines)[-4000:]}"
        stamped = [(t - sent, line) for t, line in zip(arrived, lines, strict=False)]
        return Interrupted(proc.returncode, seconds, "".join(lines), children, stamped)
    finally:
        kill_group(proc, wait_s=5)


def alive(pids: list[int]) -> list[int]:
    import psutil

    out = []
    for pid in pids:
        try:
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                out.append(pid)
        except psutil.Error:
            pass
    return out


def wait_gone(pids: list[int], timeout_s: float = 10.0) -> list[int]:
    deadline = time.monotonic() + timeout_s
    while (left := alive(pids)) and time.monotonic() < deadline:
        time.sleep(0.2)
    return left


def flow_run_states(api: str, names: list[str]) -> dict[str, str]:
    """``{flow run name: state type}`` from the Prefect API."""
    body = json.dumps({"flow_runs": {"name": {"any_": names}}}).encode()
    req = urllib.request.Request(
        f"{api}/flow_runs/filter", data=body, headers={"Content-Type": "application/json"}, method="POST"
    )
    with urllib.request.urlopen(req, timeout=10) as resp:
        return {r["name"]: r["state"]["type"] for r in json.loads(resp.read())}


def assert_one_line(res: Interrupted, expected: str, *, traceback: bool = False) -> None:
    """No ConnectError, the ``expected`` line; no traceback unless the flow *failed* (``traceback``: Prefect
    logs one for every failed flow run, as for any stage error)."""
    assert "ConnectError" not in res.output, res.output[-4000:]
    assert traceback or "Traceback" not in res.output, res.output[-4000:]
    assert re.search(expected, res.output), f"no {expected!r} in:\n{res.output[-4000:]}"


def flow_started(out: str) -> bool:
    return FLOW_RUN_RE.search(out) is not None


# ------------------------------------------------------------------------------- a stage on its own


@pytest.mark.faults
def test_ctrl_c_to_a_stage_without_a_prefect_server_exits_130_at_once(
    tiny_pipeline, prefect_server, tmp_path
):
    """The common case: no PREFECT_API_URL, so the stage starts a temporary Prefect server; Ctrl-C while
    the stage reads its data (started with SIGINT ignored, as ``cmd &`` in a script leaves it)."""
    clone = tiny_pipeline.clone(tmp_path / "clone")
    home = migrated_prefect_home(prefect_server, tmp_path / "prefect-home")  # only to skip the migrations
    env = stage_env(None, f"sqlite:///{clone / 'mlflow.db'}", PREFECT_HOME=str(home))
    env.pop("PREFECT_API_URL", None)
    res = signal_when(
        [PY, "-m", "flows.corpus"],
        cwd=clone,
        env=env,
        ready=flow_started,
        sig=signal.SIGINT,
        ignore_sigint=True,
    )
    assert res.returncode == 130, res.output[-4000:]
    assert res.seconds < STOP_WITHIN_S, f"{res.seconds:.1f}s:\n{res.output[-4000:]}"
    assert_one_line(res, r"corpus stage interrupted: stopped by SIGINT before it finished; run it again")
    # What Prefect's runner reports: the flow run is Crashed, reported to a server that was still up.
    assert "Finished in state Crashed('Execution was aborted by an interrupt signal.')" in res.output
    assert "Error logging to API" not in res.output, res.output[-4000:]
    # The temporary server (its own session, so the signal missed it) is stopped with the run.
    assert res.children, "no temporary server was seen"
    assert not wait_gone(res.children), f"processes left behind: {alive(res.children)}"
    assert not (clone / "data" / "corpus").exists() or tree_digest(clone / "data" / "corpus") == tree_digest(
        tiny_pipeline.root / "data" / "corpus"
    ), "a half-written corpus"


@pytest.mark.faults
def test_sigterm_to_a_stage_marks_its_prefect_run_crashed(tiny_pipeline, prefect_api, tmp_path):
    clone = tiny_pipeline.clone(tmp_path / "clone")
    res = signal_when(
        [PY, "-m", "flows.corpus"],
        cwd=clone,
        env=tiny_pipeline.env(clone),
        ready=flow_started,
        sig=signal.SIGTERM,
    )
    assert res.returncode == 143, res.output[-4000:]
    assert res.seconds < STOP_WITHIN_S, f"{res.seconds:.1f}s:\n{res.output[-4000:]}"
    assert_one_line(res, r"corpus stage interrupted: stopped by SIGTERM before it finished; run it again")
    runs = res.flow_runs()
    assert runs, res.output[-4000:]
    assert set(flow_run_states(prefect_api, list(runs)).values()) == {"CRASHED"}


# ------------------------------------------------------------------------------------- through DVC


def _checkpoint_written(root: Path, step: int) -> Callable[[str], bool]:
    def ready(_out: str) -> bool:
        steps = [
            int(m.group(1))
            for p in (root / CHECKPOINTS).glob("*/step-*/state.json")
            if (m := re.match(r"step-(\d+)$", p.parent.name))
        ]
        return max(steps, default=0) >= step

    return ready


# Late in training (the last checkpoint but one), so that the resumed re-run is short.
LATE_CHECKPOINT = (
    EXTRA["params/pretrain.yaml"]["pretrain.max_steps"]
    - 2 * EXTRA["params/pretrain.yaml"]["pretrain.checkpoint_every"]
)


@pytest.mark.parametrize(
    "command",
    # `make test-faults` runs the pipeline's own way (dvc exp run); `make test-slow` also runs dvc repro.
    [pytest.param(["repro"], marks=pytest.mark.slow), pytest.param(["exp", "run"], marks=pytest.mark.faults)],
    ids=["dvc repro", "dvc exp run"],
)
def test_ctrl_c_to_dvc_during_pretraining_then_a_rerun_gives_the_same_model(
    command, tiny_pipeline: TinyPipeline, prefect_api, tmp_path
):
    pipe = tiny_pipeline
    pipe.build(until="pretrain")
    clone = pipe.clone(tmp_path / "clone")
    lock = yaml.safe_load((clone / "dvc.lock").read_text())
    del lock["stages"]["pretrain"]  # as in a first run (see test_stage_kill.py): DVC must run it
    (clone / "dvc.lock").write_text(yaml.safe_dump(lock, sort_keys=False))

    res = signal_when(
        [PY, "-m", "dvc", *command, "--force", "--single-item", "pretrain"],
        cwd=clone,
        env=pipe.env(clone),
        ready=_checkpoint_written(clone, LATE_CHECKPOINT),
        sig=signal.SIGINT,
    )
    # The stage stops within seconds; DVC's own clean-up after a failed stage (`exp run` restores the
    # workspace through git) takes a few more on a loaded machine.
    stage_stopped = res.seconds_to(r"pretrain stage interrupted")
    assert stage_stopped is not None and stage_stopped < STOP_WITHIN_S, (
        f"{stage_stopped}:\n{res.output[-4000:]}"
    )
    assert res.seconds < 3 * STOP_WITHIN_S, f"{res.seconds:.1f}s:\n{res.output[-4000:]}"
    # DVC answers any failed stage command with its own 255; the stage's status is in its message.
    assert res.returncode == 255, res.output[-4000:]
    assert_one_line(
        res, r"pretrain stage interrupted: training stopped by SIGINT after step \d+; checkpoint \S+"
    )
    assert "exited with 130" in res.output, res.output[-4000:]
    runs = res.flow_runs()
    assert runs, res.output[-4000:]
    states = flow_run_states(prefect_api, list(runs))
    assert set(states.values()) == {"CRASHED"}, states
    assert not wait_gone(res.children), f"processes left behind: {alive(res.children)}"

    status = pipe.dvc("status", "pretrain", root=clone)
    assert status.returncode == 0 and "pretrain" in status.stdout and not up_to_date(status.stdout), (
        status.stdout + status.stderr
    )
    rerun = pipe.dvc("repro", "pretrain", root=clone, timeout=900)
    assert rerun.returncode == 0, (rerun.stdout + rerun.stderr)[-4000:]
    assert re.search(r"resumed from \S*step-\d+", rerun.stdout + rerun.stderr), rerun.stdout[-4000:]
    assert up_to_date(pipe.dvc("status", "pretrain", root=clone).stdout)
    after, reference = pipe.lock_outs(clone), pipe.lock_outs()
    assert after["models/pretrained"] == reference["models/pretrained"], "not the uninterrupted run's model"
    # the rerun's MLflow run holds the whole loss curve: the records before the stop again, then the rest
    (rerun_run,) = [
        r for r in _runs(clone) if r.data.tags.get("stage") == "pretrain" and r.info.status == "FINISHED"
    ]
    reference_run = next(r for r in _runs(pipe.root) if r.data.tags.get("stage") == "pretrain")
    assert _curve(clone, rerun_run, "train/loss") == _curve(pipe.root, reference_run, "train/loss") != []


@pytest.mark.faults
def test_ctrl_c_to_pretraining_on_two_processes_then_a_rerun_resumes(
    tiny_pipeline: TinyPipeline, prefect_api, tmp_path
):
    """``pretrain.processes: 2`` (gloo on CPU): the stage command starts its two ranks; Ctrl-C to DVC's
    process group reaches each once, through the command: one checkpoint, rank 0's line, no process left;
    the rerun resumes on two processes and completes."""
    pipe = tiny_pipeline
    pipe.build(until="pretrain")
    clone = pipe.clone(tmp_path / "clone")
    params = clone / "params" / "pretrain.yaml"
    doc = yaml.safe_load(params.read_text())
    doc["pretrain"]["processes"] = 2  # a changed param: DVC runs the stage again
    params.write_text(yaml.safe_dump(doc, sort_keys=False))

    res = signal_when(
        [PY, "-m", "dvc", "repro", "--single-item", "pretrain"],
        cwd=clone,
        env=pipe.env(clone),
        ready=_checkpoint_written(clone, LATE_CHECKPOINT),
        sig=signal.SIGINT,
    )
    assert res.returncode == 255 and "exited with 130" in res.output, res.output[-4000:]
    assert_one_line(
        res, r"pretrain stage interrupted: training stopped by SIGINT after step \d+; checkpoint \S+"
    )
    assert (
        "2 processes (DDP, ranks 0-1)" in res.output and "(rank 1): training stopped by SIGINT" in res.output
    )
    assert not wait_gone(res.children), f"processes left behind: {alive(res.children)}"
    states = [json.loads(p.read_text()) for p in (clone / CHECKPOINTS).glob("*/step-*/state.json")]
    assert states and {s["world_size"] for s in states} == {2}

    rerun = pipe.dvc("repro", "pretrain", root=clone, timeout=900)
    assert rerun.returncode == 0, (rerun.stdout + rerun.stderr)[-4000:]
    assert re.search(r"resumed from \S*step-\d+", rerun.stdout + rerun.stderr), rerun.stdout[-4000:]
    assert up_to_date(pipe.dvc("status", "pretrain", root=clone).stdout)


TRIALS = Path("data") / "finetune" / "trials"


@pytest.mark.faults
def test_ctrl_c_to_fine_tuning_inside_a_trial_then_a_rerun_continues_it_and_gives_the_same_model(
    tiny_pipeline: TinyPipeline, prefect_api, tmp_path
):
    """Two trials of MRPC, long enough to stop inside the second: it writes a checkpoint and the stage stops;
    the rerun reuses the first trial, continues the second from its checkpoint and commits the model an
    uninterrupted run commits."""
    pipe, stage = tiny_pipeline, "finetune@mrpc"
    pipe.build(until=stage)
    clones = []
    for name in ("whole", "stopped"):
        clone = pipe.clone(tmp_path / name)
        params = clone / "params" / "finetune.yaml"
        doc = yaml.safe_load(params.read_text())
        doc["finetune"]["small_task_seeds"] = [1, 2]
        doc["finetune"]["tasks"]["mrpc"].update(train_limit=1000, epochs=2)  # 2 x 64 steps
        doc["finetune"]["checkpoint_minutes"] = 0.0005  # about every step; not a DVC param
        params.write_text(yaml.safe_dump(doc, sort_keys=False))
        clones.append(clone)
    whole, clone = clones
    uninterrupted = pipe.dvc("repro", "--single-item", stage, root=whole, timeout=900)
    assert uninterrupted.returncode == 0, (uninterrupted.stdout + uninterrupted.stderr)[-4000:]

    def inside_the_second_trial(_out: str) -> bool:  # the first one's record, the second one's checkpoint
        kept = clone / TRIALS
        return any(kept.glob("*/*.json")) and any(kept.glob("*/checkpoints-*/step-*/state.json"))

    res = signal_when(
        [PY, "-m", "dvc", "repro", "--single-item", stage],
        cwd=clone,
        env=pipe.env(clone),
        ready=inside_the_second_trial,
        sig=signal.SIGINT,
    )
    assert res.returncode == 255 and "exited with 130" in res.output, res.output[-4000:]
    assert_one_line(
        res,
        r"finetune stage interrupted \(mrpc\): training stopped by SIGINT after step \d+; checkpoint \S+",
    )
    assert not wait_gone(res.children), f"processes left behind: {alive(res.children)}"

    rerun = pipe.dvc("repro", "--single-item", stage, root=clone, timeout=900)
    out = rerun.stdout + rerun.stderr
    assert rerun.returncode == 0, out[-4000:]
    assert "finished by an earlier run" in out and re.search(r"resumed from \S*step-\d+", out), out[-4000:]
    model = "models/finetuned/mrpc"
    assert pipe.lock_outs(clone)[model] == pipe.lock_outs(whole)[model], "not the uninterrupted run's model"
    assert not (clone / TRIALS).exists()  # committed: nothing kept
    # in MLflow: the continued trial's run is tagged with its step and holds the uninterrupted trial's curve
    trials = [r for r in _runs(clone) if "trial" in r.data.tags and "trial_reused" not in r.data.tags]
    (resumed,) = [r for r in trials if "trial_resumed_from_step" in r.data.tags]
    (uninterrupted_run,) = [r for r in _runs(whole) if r.data.tags.get("trial") == resumed.data.tags["trial"]]
    assert resumed.info.status == "FINISHED"
    assert _curve(clone, resumed, "train.loss") == _curve(whole, uninterrupted_run, "train.loss")


def _runs(root: Path) -> list:
    """Every run in a workspace's MLflow store, the newest first."""
    from mlflow import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{root / 'mlflow.db'}")
    return client.search_runs([e.experiment_id for e in client.search_experiments()])


def _curve(root: Path, run, key: str) -> list[tuple[int, float]]:
    """The (step, value) points of one metric of a run, by step."""
    from mlflow import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{root / 'mlflow.db'}")
    return sorted((m.step, m.value) for m in client.get_metric_history(run.info.run_id, key))


# ------------------------------------------------------------------------------- Prefect unreachable


@pytest.mark.faults
@pytest.mark.parametrize("module", ["flows.corpus", "flows.pipeline"])
def test_an_unreachable_prefect_api_is_a_clear_error_within_seconds(module, tiny_pipeline, tmp_path):
    clone = tiny_pipeline.clone(tmp_path / "clone")
    url = f"http://127.0.0.1:{free_port()}/api"  # nothing listens there
    env = stage_env(url, f"sqlite:///{clone / 'mlflow.db'}")
    started = time.monotonic()
    res = subprocess.run(
        [PY, "-m", module],
        cwd=clone,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        start_new_session=True,
    )
    seconds = time.monotonic() - started
    assert res.returncode == 1, res.stderr[-4000:]
    assert seconds < 60, f"{seconds:.0f}s"
    last = res.stderr.strip().splitlines()[-1]
    assert f"the Prefect API at PREFECT_API_URL={url} does not answer" in last, res.stderr[-4000:]
    assert "make serve" in last and "unset it" in last and len(last) < 600, last
    assert "ConnectError" not in res.stderr and "Traceback" not in res.stderr, res.stderr[-4000:]


# --------------------------------------------------------------------------- make pipeline, make serve


@pytest.mark.faults
def test_ctrl_c_to_make_pipeline_stops_dvc_and_the_stage(tiny_pipeline, prefect_api, tmp_path):
    clone = tiny_pipeline.clone(tmp_path / "clone")
    res = signal_when(
        [PY, "-m", "flows.pipeline", "corpus", "--force"],
        cwd=clone,
        env=tiny_pipeline.env(clone),
        ready=lambda out: "Running stage 'corpus'" in out and out.count("Beginning flow run") >= 2,
        sig=signal.SIGINT,
    )
    assert res.returncode == 130, res.output[-4000:]
    assert res.seconds < PIPELINE_STOP_WITHIN_S, f"{res.seconds:.1f}s:\n{res.output[-4000:]}"
    assert_one_line(res, r"pipeline interrupted: stopped by SIGINT; DVC and the running stage were stopped")
    runs = res.flow_runs()
    assert set(runs.values()) == {"bert-pipeline", "corpus"}, runs
    assert set(flow_run_states(prefect_api, list(runs)).values()) == {"CRASHED"}, runs
    assert not wait_gone(res.children), f"processes left behind: {alive(res.children)}"


@pytest.mark.faults
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["INT", "TERM"])
def test_a_signal_to_make_serve_stops_it_and_its_server(sig, prefect_server, tmp_path):
    """SIGINT / SIGTERM to the serving process alone (started with SIGINT ignored, as `make serve &` in a
    script), once Prefect's runner serves (it installs its own SIGTERM handler, which hung in 3.8)."""
    from flows.serve import api_url

    home = migrated_prefect_home(prefect_server, tmp_path / "home")
    port = free_port()
    env = stage_env(None, f"sqlite:///{tmp_path / 'mlflow.db'}")
    env.pop("PREFECT_API_URL", None)
    res = signal_when(
        [PY, "-m", "flows.serve", "--port", str(port), "--home", str(home)],
        cwd=Path.cwd(),
        env=env,
        ready=lambda out: "being served" in out,
        sig=sig,
        ignore_sigint=True,
        to_group=False,
    )
    assert res.returncode == 128 + sig, res.output[-4000:]
    assert res.seconds < STOP_WITHIN_S + 20, f"{res.seconds:.1f}s:\n{res.output[-4000:]}"  # server grace
    assert_one_line(
        res, rf"serve interrupted: stopped by {signal.Signals(sig).name}; no longer serving the flows"
    )
    assert not wait_gone(res.children), f"processes left behind: {alive(res.children)}"
    from flows._served import is_healthy

    assert not is_healthy(api_url("127.0.0.1", port))


def served_for(seconds: float) -> Callable[[str], bool]:
    """A ``ready`` for ``flows.serve``: ``seconds`` after Prefect printed "being served". Prefect prints it
    before its runner starts; a signal that early stops a runner that has not yet started its loops."""
    seen: list[float] = []

    def ready(out: str) -> bool:
        if "being served" not in out:
            return False
        seen.append(time.monotonic())
        return time.monotonic() - seen[0] >= seconds

    return ready


@pytest.mark.faults
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["INT", "TERM"])
def test_a_signal_to_make_serves_process_group_stops_it_within_seconds(sig, prefect_server, tmp_path):
    """SIGINT / SIGTERM to the whole process group, as a terminal or systemd sends it, once the flows are
    served: the server `flows.serve` started sits in its own session, so the runner pauses its deployments
    on a live server and the command exits within seconds, with one line and no traceback."""
    from flows._served import is_healthy
    from flows.serve import api_url

    home = migrated_prefect_home(prefect_server, tmp_path / "home")
    port = free_port()
    env = stage_env(None, f"sqlite:///{tmp_path / 'mlflow.db'}")
    env.pop("PREFECT_API_URL", None)
    res = signal_when(
        [PY, "-m", "flows.serve", "--port", str(port), "--home", str(home)],
        cwd=Path.cwd(),
        env=env,
        ready=served_for(RUNNER_STARTED_S),
        sig=sig,
        to_group=True,
    )
    assert res.returncode == 128 + sig, res.output[-4000:]
    assert res.seconds < 15, f"{res.seconds:.1f}s:\n{res.output[-4000:]}"
    assert_one_line(
        res, rf"serve interrupted: stopped by {signal.Signals(sig).name}; no longer serving the flows"
    )
    assert "not paused" not in res.output, res.output[-4000:]  # paused on the live server
    assert not wait_gone(res.children), f"processes left behind: {alive(res.children)}"
    assert not is_healthy(api_url("127.0.0.1", port))


@pytest.mark.faults
def test_make_serve_stops_within_seconds_when_its_server_is_already_gone(prefect_server, tmp_path):
    """A server the user started (``flows.serve`` uses it), gone before the SIGTERM: the runner does not
    spend a minute of client retries pausing deployments on it; one warning, the one line, no traceback."""
    from flows.serve import api_url

    server = PrefectServer(migrated_prefect_home(prefect_server, tmp_path / "home"))
    server.start()
    env = stage_env(None, f"sqlite:///{tmp_path / 'mlflow.db'}")
    env.pop("PREFECT_API_URL", None)

    served = served_for(RUNNER_STARTED_S)

    def served_then_server_killed(out: str) -> bool:
        if not served(out):
            return False
        server.stop()
        return True

    try:
        res = signal_when(
            [PY, "-m", "flows.serve", "--port", str(server.port), "--home", str(server.home)],
            cwd=Path.cwd(),
            env=env,
            ready=served_then_server_killed,
            sig=signal.SIGTERM,
            to_group=True,
        )
    finally:
        server.stop()
    assert "using the Prefect server already running" in res.output, res.output[-4000:]
    assert res.returncode == 143, res.output[-4000:]
    assert res.seconds < 15, f"{res.seconds:.1f}s:\n{res.output[-4000:]}"
    assert_one_line(res, r"serve interrupted: stopped by SIGTERM; no longer serving the flows")
    assert f"the Prefect server at {api_url('127.0.0.1', server.port)} is gone" in res.output, res.output
