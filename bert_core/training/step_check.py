"""The training loop's one read-back per step: is the step finite, should training stop, what time is it.

Every step the loop must learn three things before it applies the update: whether the loss or the gradient
norm is non-finite on any rank (the update must not be applied), whether any rank received a stop signal,
and the training clock (rank 0's, so that every rank computes the same learning rate). The flags are made
on the device; reading them back is a wait for the device.

Read **at once** (CPU, LAMB, fp16 loss scaling), the host waits for each step's last kernel before it
queues the update, and the device then idles while the host queues the next step.

**Overlapped** (a GPU with the fused AdamW, no loss scaler), the update is queued without waiting: the
fused AdamW skips it on the device when the flag says the step was bad (its ``found_inf`` argument, as loss
scaling uses it), and the flags are copied back to pinned memory without blocking. The host reads step N's
flags while the device runs step N+1's forward and backward, so the host queues a whole step ahead and the
device never waits for it. A bad step N is reported before step N+1's update: the state is then the one
after step N-1, as when read at once. Stop signals and the clock of several ranks travel with the flags,
one step late (one more step is trained before a stop); a single process reads both on the host at once.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import torch
from torch import Tensor

from bert_core.device import HostCopy
from bert_core.training.distributed import DistContext


@dataclass
class StepFlags:
    """What one read-back tells the loop.

    Attributes:
        step: the optimizer step ``bad``, ``loss`` and ``grad_norm`` belong to (1-based).
        bad: that step's loss or gradient norm was non-finite on some rank.
        loss, grad_norm: that step's values (device tensors; read only to report a bad step).
        stop: a stop signal arrived on some rank.
        elapsed: the training clock to use for the coming update and the budget.
    """

    step: int
    bad: bool
    loss: Tensor
    grad_norm: Tensor
    stop: bool
    elapsed: float


class StepCheck:
    """Makes each step's flags on the device and reads them back, at once or one step late (module docstring).

    Args:
        dist: the process's ranks.
        clock: this process's training clock (seconds).
        stopped: whether this process received a stop signal.
        scaled: fp16 loss scaling is on: an infinite gradient norm is then the scaler's business.
        overlap: read the flags one step late and skip a bad update on the device.
    """

    def __init__(
        self,
        dist: DistContext,
        clock: Callable[[], float],
        stopped: Callable[[], bool],
        *,
        scaled: bool,
        overlap: bool,
    ) -> None:
        self.dist, self.clock, self.stopped, self.scaled, self.overlap = dist, clock, stopped, scaled, overlap
        self.found_inf: Tensor | None = None  # the last measured step's flag, for the fused AdamW
        # Overlapped: the step not read yet, with its flags on their way back (bad; with several ranks stop
        # and clock too).
        self._pending: tuple[int, Tensor, Tensor, HostCopy] | None = None

    @classmethod
    def for_run(
        cls,
        overlap: bool | None,
        dist: DistContext,
        clock: Callable[[], float],
        stopped: Callable[[], bool],
        optimizer: torch.optim.Optimizer,
        scaler: torch.amp.GradScaler,
    ) -> StepCheck:
        """The check of a run: ``overlap`` as ``TrainConfig.overlap_checks`` says (None: on a GPU where it
        can). Overlapping needs an update the device can skip: the fused AdamW (``found_inf``), no scaler."""
        able = bool(optimizer.defaults.get("fused")) and not scaler.is_enabled()
        if overlap is None:
            overlap = able and dist.device.type == "cuda"
        elif overlap and not able:
            raise ValueError(
                f"overlap_checks needs the fused AdamW and no fp16 loss scaling; this run has "
                f"{type(optimizer).__name__} (fused: {optimizer.defaults.get('fused')}) and the loss "
                f"scaler {'on' if scaler.is_enabled() else 'off'}"
            )
        return cls(dist, clock, stopped, scaled=scaler.is_enabled(), overlap=overlap)

    @contextlib.contextmanager
    def skipping_bad(self, optimizer: torch.optim.Optimizer) -> Iterator[None]:
        """Overlapped: the optimizer step inside skips the update on the device when the last measured
        step was bad (the fused AdamW's ``found_inf``, which GradScaler sets the same way)."""
        if not self.overlap:
            yield
            return
        optimizer.found_inf = self.found_inf  # type: ignore[attr-defined]
        try:
            yield
        finally:
            del optimizer.found_inf  # type: ignore[attr-defined]

    def measure(self, step: int, loss: Tensor, grad_norm: Tensor) -> StepFlags | None:
        """Make step ``step``'s flags. At once: return them. Overlapped: start copying them back and return
        the previous step's (``None`` at the first step)."""
        check = loss if self.scaled else loss + grad_norm.float()
        bad = (~torch.isfinite(check)).float()
        flags = bad.double().reshape(1)
        if self.dist.distributed:
            flags = torch.zeros(3, dtype=torch.float64, device=bad.device)
            flags[0] = bad
            flags[1].fill_(float(self.stopped()))  # fills with a kernel argument: no copy from the host
            flags[2].fill_(self.clock() if self.dist.is_main else 0.0)
            self.dist.all_reduce(flags, op="max")
        if not self.overlap:
            return self._flags(step, flags.tolist(), loss, grad_norm)
        previous = self.settle()
        self.found_inf = flags[0].float()
        self._pending = (step, loss, grad_norm, HostCopy.start(flags))
        return previous

    def settle(self) -> StepFlags | None:
        """The flags not read yet, waiting for the device to make them (``None`` when none are pending)."""
        if self._pending is None:
            return None
        step, loss, grad_norm, flags = self._pending
        self._pending = None
        # waits for that step alone: the step queued after it runs on
        return self._flags(step, flags.wait().tolist(), loss, grad_norm)

    def _flags(self, step: int, values: list[float], loss: Tensor, grad_norm: Tensor) -> StepFlags:
        if self.dist.distributed:
            bad, stop_any, elapsed = values
            return StepFlags(step, bad > 0, loss, grad_norm, stop_any > 0, elapsed)
        return StepFlags(step, values[0] > 0, loss, grad_norm, self.stopped(), self.clock())
