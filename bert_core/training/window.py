"""The training metrics of one logging window: what the Trainer sums between two logged steps.

The sums (loss, gradient norm, the objective's statistics) and the number of steps they cover go into
each checkpoint, so a run resumed mid-window logs the rows an uninterrupted run logs. The timing and the
throughput counts (``t0``, ``timed_steps``, ``seqs``, ``tokens``, ``flops``) describe this process's
segment only, so a resumed run's first throughput figures are its own, and start after the segment's first
step (where the first window has more than that step): that step holds ``torch.compile``'s compilation and
the device's warm-up, about a minute for BERT-Base on a GPU, which would otherwise stand in a short phase's
throughput as if it were training.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from bert_core.training.evaluation import sum_into
from bert_core.training.flops import mfu

if TYPE_CHECKING:
    from bert_core.training.distributed import DistContext
    from bert_core.training.objective import Objective

#: The figures of a logged row that come from the clock: they differ between any two runs of one training.
CLOCK_METRICS = frozenset({"seq_per_s", "tokens_per_s", "step_time_s", "elapsed_s", "mfu"})


def _plain(t: Tensor) -> list[Any]:
    return [str(t.dtype).removeprefix("torch."), t.tolist()]


def _tensor(saved: list[Any], device: torch.device) -> Tensor:
    dtype, value = saved
    return torch.tensor(value, dtype=getattr(torch, dtype), device=device)


@dataclass
class MetricsWindow:
    device: torch.device
    t0: float = field(default_factory=time.perf_counter)
    steps: int = 0
    timed_steps: int = 0
    seqs: int = 0
    tokens: int = 0
    flops: float = 0.0
    lr: float = 0.0
    loss: Tensor | None = None  # the sum of the steps' mean losses
    grad_norm: Tensor | None = None
    stats: dict[str, Tensor] = field(default_factory=dict)  # the objective's, summed (Objective.summarize)

    def __post_init__(self) -> None:
        zero = torch.zeros((), device=self.device)
        self.loss = zero.clone() if self.loss is None else self.loss
        self.grad_norm = zero.clone() if self.grad_norm is None else self.grad_norm

    def add_micro(self, seqs: int, tokens: int, flops: float | None, stats: dict[str, Tensor]) -> None:
        self.seqs += seqs
        self.tokens += tokens
        self.flops += flops or 0.0
        sum_into(self.stats, stats, self.device)

    def add_step(self, loss: Tensor, grad_norm: Tensor, lr: float) -> None:
        self.steps += 1
        self.timed_steps += 1
        self.lr = lr
        self.loss = self.loss + loss
        self.grad_norm = self.grad_norm + grad_norm.detach().float()

    def restart_clock(self) -> None:
        """Time the window from now on: its throughput counts start again, its sums stay."""
        self.t0 = time.perf_counter()
        self.timed_steps = self.seqs = self.tokens = 0
        self.flops = 0.0

    def metrics(
        self, dist: DistContext, objective: Objective, peak_tflops: float | None, *, elapsed_s: float
    ) -> dict[str, float]:
        """The window's logged row, its sums reduced over the ranks (a collective under DDP): mean loss and
        gradient norm, the objective's own figures, the learning rate, throughput and MFU (with a known peak)."""
        seconds = max(time.perf_counter() - self.t0, 1e-9)
        counts = torch.tensor([self.seqs, self.tokens, self.flops], dtype=torch.float64, device=self.device)
        scalars = torch.stack([self.loss, self.grad_norm]).float() / max(self.steps, 1)
        dist.all_reduce(counts)
        dist.all_reduce(scalars)
        for k in sorted(self.stats):
            dist.all_reduce(self.stats[k])
        loss, gnorm = (scalars / dist.world_size).tolist()
        seqs, tokens, flops = counts.tolist()
        metrics = {"loss": loss, **objective.summarize(self.stats)}
        metrics.update(
            lr=self.lr,
            grad_norm=gnorm,
            seq_per_s=seqs / seconds,
            tokens_per_s=tokens / seconds,
            step_time_s=seconds / max(self.timed_steps, 1),
            elapsed_s=elapsed_s,
        )
        util = mfu(flops, seconds, peak_tflops, dist.world_size) if flops else None
        if util is not None:
            metrics["mfu"] = util
        return metrics

    def state(self) -> dict[str, Any]:
        """The sums and their step count, as a checkpoint stores them (JSON: dtype and values)."""
        stats = {k: _plain(v) for k, v in self.stats.items()}
        return {
            "steps": self.steps,
            "lr": self.lr,
            "loss": _plain(self.loss),
            "grad_norm": _plain(self.grad_norm),
            "stats": stats,
        }

    @classmethod
    def restored(cls, saved: dict[str, Any], device: torch.device) -> MetricsWindow:
        return cls(
            device,
            steps=int(saved["steps"]),
            lr=float(saved["lr"]),
            loss=_tensor(saved["loss"], device),
            grad_norm=_tensor(saved["grad_norm"], device),
            stats={k: _tensor(v, device) for k, v in saved["stats"].items()},
        )
