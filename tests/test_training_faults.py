"""Faults with real processes: SIGKILL at an arbitrary point (also mid-checkpoint) and an external SIGTERM.

Each case runs ``tests/training_fakes.py`` as a subprocess (CPU, deterministic algorithms, one
thread), kills it, starts it again on the same checkpoint directory, and requires the final weights to
be *identical* to an uninterrupted run. The SIGKILL case runs by default; the mid-checkpoint kill and the
external SIGTERM are in the fault suite (``-m faults``); the in-process SIGTERM/SIGINT cases are in
``test_training_loop.py``.
"""

from __future__ import annotations

import json
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from training_fakes import run

from bert_core.training import checkpoint as ckpt

WORKER = Path(__file__).with_name("training_fakes.py")


def _worker(tmp: Path, name: str, *extra: str, timeout: float = 120) -> subprocess.CompletedProcess:
    cmd = [sys.executable, str(WORKER), "--ckpt", str(tmp / "ck"), "--out", str(tmp / name), *extra]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> dict[str, torch.Tensor]:
    """Final weights of an uninterrupted run (same settings as the worker)."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        model, _ = run(tmp_path_factory.mktemp("ref"), max_steps=8)
    finally:
        torch.set_num_threads(n)
    return {k: v.clone() for k, v in model.state_dict().items()}


def _assert_same_as(reference: dict[str, torch.Tensor], out: Path) -> None:
    final = load_file(out / "model.safetensors")
    for name, tensor in final.items():
        assert torch.equal(tensor, reference[name]), f"{name} differs from the uninterrupted run"


def test_sigkill_at_an_arbitrary_micro_step_then_restart_gives_identical_weights(tmp_path, reference):
    kill_at = random.randint(2, 15)  # 8 steps x 2 micro-batches; checkpoints every 2 steps
    killed = _worker(tmp_path, "killed", "--signal-at-micro", str(kill_at), "--signal", "SIGKILL")
    assert killed.returncode == -signal.SIGKILL, (kill_at, killed.stderr[-2000:])
    assert not (tmp_path / "killed").exists()
    done = _worker(tmp_path, "resumed")
    assert done.returncode == 0, done.stderr[-2000:]
    summary = json.loads((tmp_path / "resumed" / "result.json").read_text())
    expected_resume = 2 * ((kill_at - 1) // 4) or None  # last checkpoint before the kill
    assert summary["resumed_from_step"] == expected_resume, kill_at
    _assert_same_as(reference, tmp_path / "resumed")


@pytest.mark.faults
def test_sigkill_while_writing_a_checkpoint_keeps_the_previous_one(tmp_path, reference):
    killed = _worker(tmp_path, "killed", "--kill-in-save", "2")  # dies inside the save of step 4
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-2000:]
    names = sorted(p.name for p in (tmp_path / "ck").iterdir())
    assert names[-1] == "step-00000002" and any(".tmp-" in n for n in names), names
    done = _worker(tmp_path, "resumed")
    assert done.returncode == 0, done.stderr[-2000:]
    assert json.loads((tmp_path / "resumed" / "result.json").read_text())["resumed_from_step"] == 2
    assert not [p for p in (tmp_path / "ck").iterdir() if ".tmp-" in p.name]
    _assert_same_as(reference, tmp_path / "resumed")


@pytest.mark.faults
def test_external_sigterm_saves_a_checkpoint_and_exits_cleanly(tmp_path, reference):
    cmd = [
        sys.executable,
        str(WORKER),
        "--ckpt",
        str(tmp_path / "ck"),
        "--out",
        str(tmp_path / "x"),
        "--sleep-per-micro",
        "0.15",
    ]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60
    while not ckpt.list_checkpoints(tmp_path / "ck"):  # training is under way
        assert proc.poll() is None and time.monotonic() < deadline, proc.stderr.read() if proc.stderr else ""
        time.sleep(0.05)
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 128 + signal.SIGTERM, err[-2000:]
    assert "interrupted: training stopped by SIGTERM after step" in out
    assert "Traceback" not in err
    stopped_at = int(out.split("after step ")[1].split(";")[0])
    assert ckpt.list_checkpoints(tmp_path / "ck")[-1].name == f"step-{stopped_at:08d}"
    done = _worker(tmp_path, "resumed")
    assert done.returncode == 0, done.stderr[-2000:]
    _assert_same_as(reference, tmp_path / "resumed")
