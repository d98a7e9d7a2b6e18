"""A stage on several processes (``pretrain.processes``): ``flows._cli.run_ranks`` starts the ranks with
torchrun's environment, passes a stop signal to each once, stops the others when one fails, and its ranks
stop themselves (once) when it is killed. The ranks are stand-ins (``tests/ranks_fake.py``)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from flows._cli import run_ranks

TESTS = Path(__file__).parent


@pytest.fixture
def out(tmp_path, monkeypatch):
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")]))
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    return tmp_path


def _ranks(out: Path, n: int) -> list[dict]:
    return [json.loads((out / f"rank-{r}.json").read_text()) for r in range(n)]


def _launcher(out: Path, n: int) -> subprocess.Popen:
    """A stage command that is a launcher of ``n`` waiting ranks, in a session of its own (as DVC runs it)."""
    code = (
        "import sys; from flows._cli import run_command, run_ranks; "
        f"sys.exit(run_command(lambda: run_ranks({n}, 'ranks_fake', [{str(out)!r}, 'wait']), 'x', after_stop=''))"
    )
    proc = subprocess.Popen([sys.executable, "-c", code], start_new_session=True)
    deadline = time.monotonic() + 60
    while not all((out / f"rank-{r}.json").exists() for r in range(n)):
        assert proc.poll() is None and time.monotonic() < deadline, "the ranks never started"
        time.sleep(0.05)
    return proc


def test_each_rank_gets_torchruns_environment_and_a_share_of_the_cores(out):
    assert run_ranks(3, "ranks_fake", [str(out), "ok"]) == 0
    ranks = _ranks(out, 3)
    envs = [r["env"] for r in ranks]
    assert [(e["RANK"], e["LOCAL_RANK"], e["WORLD_SIZE"]) for e in envs] == [
        (str(r), str(r), "3") for r in range(3)
    ]
    assert len({(e["MASTER_ADDR"], e["MASTER_PORT"]) for e in envs}) == 1 and envs[0]["MASTER_PORT"].isdigit()
    assert envs[0]["OMP_NUM_THREADS"] == str(max(1, (os.cpu_count() or 1) // 3))
    # the launcher holds the rendezvous store on its port from before any rank starts: no other program can
    # take the port in between, and every rank (rank 0 too) is a client
    assert all(r["port_held"] for r in ranks)
    assert {e["TORCHELASTIC_USE_AGENT_STORE"] for e in envs} == {"True"}


def test_a_failed_rank_stops_the_others_and_its_status_is_the_commands(out):
    started = time.monotonic()
    assert run_ranks(3, "ranks_fake", [str(out), "fail"]) == 3
    assert time.monotonic() - started < 20  # the others were told, not left in a collective
    ranks = _ranks(out, 3)
    assert ranks[0]["signals"] == ranks[2]["signals"] == [signal.SIGTERM]


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_a_signal_to_the_commands_process_group_reaches_each_rank_once(out, sig):
    launcher = _launcher(out, 2)
    os.killpg(launcher.pid, sig)  # as DVC stops a stage, and Ctrl-C reaches a terminal's foreground
    assert launcher.wait(timeout=30) == 128 + sig
    assert [r["signals"] for r in _ranks(out, 2)] == [[sig], [sig]]


def test_ranks_stop_themselves_once_when_their_launcher_is_killed(out):
    launcher = _launcher(out, 2)
    pids = [r["pid"] for r in _ranks(out, 2)]
    os.kill(launcher.pid, signal.SIGKILL)
    launcher.wait(timeout=10)
    _, alive = psutil.wait_procs([psutil.Process(p) for p in pids if psutil.pid_exists(p)], timeout=20)
    assert not alive, f"ranks left running: {alive}"
    assert [r["signals"] for r in _ranks(out, 2)] == [[signal.SIGTERM], [signal.SIGTERM]]


def test_a_signal_that_lands_while_the_launcher_polls_its_ranks_is_passed_on(out):
    """The launcher spends most of its time asleep, but a signal can land in its poll of the ranks: it is
    passed on all the same, not taken for the launcher's own end (leaving the ranks running unsignalled)."""
    code = f"""
import os, signal, subprocess, sys
from pathlib import Path
from flows._cli import run_command, run_ranks
out, real, sent = Path({str(out)!r}), subprocess.Popen.poll, []
def poll(self):
    if not sent and all((out / f"rank-{{r}}.json").exists() for r in range(2)):
        sent.append(signal.SIGINT)
        os.kill(os.getpid(), signal.SIGINT)  # the handler runs inside this poll
    return real(self)
subprocess.Popen.poll = poll
sys.exit(run_command(lambda: run_ranks(2, "ranks_fake", [str(out), "wait"]), "x", after_stop=""))
"""
    launcher = subprocess.run([sys.executable, "-c", code], start_new_session=True, timeout=60)
    assert launcher.returncode == 128 + signal.SIGINT
    assert [r["signals"] for r in _ranks(out, 2)] == [[signal.SIGINT], [signal.SIGINT]]
