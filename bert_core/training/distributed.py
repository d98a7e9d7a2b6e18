"""Process-group setup for single-process, multi-GPU and multi-node training under ``torchrun``.

``torchrun --nproc-per-node=N [--nnodes=M --rdzv-endpoint=HOST:PORT] -m flows.pretrain`` sets
``RANK``, ``LOCAL_RANK``, ``WORLD_SIZE``, ``MASTER_ADDR`` and ``MASTER_PORT``; ``setup_distributed``
reads them and joins the group with NCCL on GPUs and gloo on CPUs. Without them it returns a
single-process context and every collective below is a no-op.
"""

from __future__ import annotations

import datetime
import logging
import os
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist

log = logging.getLogger(__name__)


def resolve_device(device: str = "auto", local_rank: int = 0) -> torch.device:
    """``"auto"`` -> ``cuda:<local_rank>`` when CUDA is available, else CPU; otherwise ``torch.device(device)``."""
    if device == "auto":
        return torch.device(f"cuda:{local_rank}") if torch.cuda.is_available() else torch.device("cpu")
    if device == "cuda":
        if not torch.cuda.is_available():
            raise ValueError("device 'cuda' was requested but no CUDA device is visible; use 'auto' or 'cpu'")
        return torch.device(f"cuda:{local_rank}")
    return torch.device(device)


@dataclass(frozen=True)
class DistContext:
    """Where this process sits in the job.

    Attributes:
        rank: global rank (0 for a single process).
        world_size: number of processes.
        local_rank: rank on this node (selects the GPU).
        device: the device this process trains on.
        backend: "nccl", "gloo" or None (single process).
    """

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))
    backend: str | None = None

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.world_size > 1

    def all_reduce(self, tensor: torch.Tensor, op: str = "sum") -> torch.Tensor:
        """In-place all-reduce of ``tensor`` ("sum" or "max"); returns it. No-op for one process."""
        if self.distributed:
            reduce_op = {"sum": dist.ReduceOp.SUM, "max": dist.ReduceOp.MAX}[op]
            dist.all_reduce(tensor, op=reduce_op)
        return tensor

    def gather_objects(self, obj: Any) -> list[Any]:
        """Every rank's ``obj`` in rank order (on every rank). ``[obj]`` for one process."""
        if not self.distributed:
            return [obj]
        out: list[Any] = [None] * self.world_size
        dist.all_gather_object(out, obj)
        return out

    def broadcast_object(self, obj: Any) -> Any:
        """Rank 0's ``obj`` on every rank."""
        if not self.distributed:
            return obj
        box = [obj]
        dist.broadcast_object_list(box, src=0)
        return box[0]

    def barrier(self) -> None:
        if self.distributed:
            dist.barrier()


def setup_distributed(device: str = "auto", timeout_s: float = 1800.0) -> DistContext:
    """Join the process group described by torchrun's environment, or return a single-process context.

    Args:
        device: "auto", "cpu" or "cuda"; with "auto", GPUs are used when present.
        timeout_s: collective timeout.

    Returns:
        The ``DistContext`` of this process.
    """
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    dev = resolve_device(device, local_rank)
    if world_size <= 1:
        return DistContext(device=dev)
    backend = "nccl" if dev.type == "cuda" else "gloo"
    if dev.type == "cuda":
        torch.cuda.set_device(dev)
    if not dist.is_initialized():
        dist.init_process_group(
            backend=backend,
            rank=rank,
            world_size=world_size,
            timeout=datetime.timedelta(seconds=timeout_s),
        )
    log.info("joined process group: rank %d/%d on %s (%s)", rank, world_size, dev, backend)
    return DistContext(rank=rank, world_size=world_size, local_rank=local_rank, device=dev, backend=backend)


def teardown_distributed() -> None:
    """Leave the process group if one was joined."""
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()
