"""The Trainer's evaluation pass: statistics summed over batches and ranks, and an objective's ``eval_step``
over a held-out set summarised into ``eval_*`` metrics."""

from __future__ import annotations

import contextlib
import itertools
from collections.abc import Callable, Iterable
from typing import Any

import torch
from torch import Tensor, nn

from bert_core.device import to_device
from bert_core.training.distributed import DistContext
from bert_core.training.objective import Objective


def sum_into(acc: dict[str, Tensor], stats: dict[str, Tensor], device: torch.device) -> None:
    for k, v in stats.items():
        v = torch.as_tensor(v, device=device).detach()
        acc[k] = acc[k] + v if k in acc else v.clone()


@torch.no_grad()
def evaluate_objective(
    model: nn.Module,
    objective: Objective,
    data: Iterable[dict[str, Any]],
    *,
    device: torch.device,
    dist: DistContext,
    max_batches: int | None,
    autocast: Callable[[], contextlib.AbstractContextManager[Any]],
) -> dict[str, float]:
    """``objective.eval_step`` over at most ``max_batches`` batches of ``data``, its statistics summed over the
    batches and all ranks, then ``objective.summarize``d; keys prefixed ``eval_``."""
    sums: dict[str, Tensor] = {}
    for batch in itertools.islice(data, max_batches):
        with autocast():
            stats = objective.eval_step(model, to_device(batch, device))
        sum_into(sums, stats, device)
    for k in sorted(sums):
        dist.all_reduce(sums[k])
    return {f"eval_{k}": v for k, v in objective.summarize(sums).items()}
