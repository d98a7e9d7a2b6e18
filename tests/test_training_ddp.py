"""DDP on CPU: ``torchrun`` with 2 gloo processes follows the same loss curve as one process with the
same global batch (micro 4 x 2 ranks vs micro 4 x 2 accumulation steps), and ends at the same weights."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

WORKER = Path(__file__).with_name("training_fakes.py")


def _train(
    tmp: Path, name: str, *, nproc: int, accum: int, overlap: bool = False, every_s: float | None = None
) -> tuple[list[float], dict, dict]:
    args = [
        str(WORKER),
        "--ckpt",
        str(tmp / f"{name}-ck"),
        "--out",
        str(tmp / name),
        "--micro",
        "4",
        "--accum",
        str(accum),
        "--dropout",
        "0.0",
        "--max-steps",
        "8",
        *(["--overlap-checks"] if overlap else []),
        *(["--checkpoint-every-s", str(every_s)] if every_s else []),
    ]
    if nproc > 1:
        cmd = [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            f"--nproc-per-node={nproc}",
            *args,
            "--ddp",
        ]
    else:
        cmd = [sys.executable, *args]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads((tmp / name / "result.json").read_text())
    ckpt_state = json.loads(sorted((tmp / f"{name}-ck").glob("step-*/state.json"))[-1].read_text())
    return summary["losses"], ckpt_state, load_file(tmp / name / "model.safetensors")


@pytest.mark.timeout(600)
@pytest.mark.parametrize("overlap", [False, True], ids=["checks-at-once", "checks-overlapped"])
def test_two_gloo_processes_match_one_process_with_the_same_global_batch(tmp_path, overlap):
    """Overlapped, the ranks read each step's flags (bad step, stop, rank 0's clock) one step late. The DDP
    run checkpoints by rank 0's clock (after every step here): every rank checkpoints at the same steps, or
    the collectives of a save would wait for a rank that never comes."""
    single_losses, single_state, single_w = _train(tmp_path, "single", nproc=1, accum=2)
    ddp_losses, ddp_state, ddp_w = _train(tmp_path, "ddp", nproc=2, accum=1, overlap=overlap, every_s=1e-9)
    kept = sorted(p.name for p in (tmp_path / "ddp-ck").glob("step-*"))
    assert kept == ["step-00000007", "step-00000008"]  # a checkpoint a step, the last two kept
    assert len(ddp_losses) == len(single_losses) == 8
    torch.testing.assert_close(torch.tensor(ddp_losses), torch.tensor(single_losses), rtol=1e-5, atol=1e-6)
    assert ddp_state["world_size"] == 2 and single_state["world_size"] == 1
    # held-out metrics are sums over both ranks' shards: the same numbers
    for k, v in single_state["eval_metrics"].items():
        assert ddp_state["eval_metrics"][k] == pytest.approx(v, rel=1e-5), k
    for name, w in single_w.items():
        torch.testing.assert_close(ddp_w[name], w, rtol=1e-4, atol=1e-5, msg=name)
