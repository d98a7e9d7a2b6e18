"""The progress line of a training loop: ``<what>: step k/N (p%), loss L, T tokens/s, S seq/s, elapsed E,
ETA P, run ETA R``, rate-limited like every other progress line (:class:`bert_core.progress.Progress`).

It is fed the train-window metrics the :class:`~bert_core.training.loop.Trainer` hands its ``on_metrics``
callback (``window``: loss, seq/s, tokens/s, seconds per step, the training clock), so the line costs no
extra host sync; the Trainer's own per-window ``step N train: ...`` line is DEBUG (a 250-character line
every few seconds, without an ETA, was no way to follow a run).

ETA: the phase's, from its steps left at the rate since the reporter started (a resumed run's steps do
not count toward the rate), or from its time budget when that ends it sooner. The run's adds the phases
still to come (``later``): each its own steps at this phase's seconds per step scaled by its tokens per
step, or its time budget when that is nearer (an estimate: a longer sequence costs more than its share
of tokens in attention).
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from bert_core.progress import Progress, format_duration

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class LaterPhase:
    """A phase still to run after the current one, for the run's ETA.

    Attributes:
        steps: Its optimizer steps (``None``: it runs on a time budget only).
        budget_s: Its time budget in seconds (``None``: none).
        cost: Its tokens per optimizer step over the current phase's (its seconds per step at this rate).
    """

    steps: int | None
    budget_s: float | None
    cost: float = 1.0

    def seconds(self, seconds_per_step: float) -> float:
        by_steps = self.steps * seconds_per_step * self.cost if self.steps is not None else math.inf
        return min(by_steps, self.budget_s if self.budget_s is not None else math.inf)


class TrainProgress(Progress):
    """A :class:`~bert_core.progress.Progress` over optimizer steps that knows the loss, the token rate, a
    time budget and the phases after this one (see the module docstring).

    Args:
        what: The start of each line (``"pretrain phase seq128"``).
        total: The phase's optimizer steps (``None``: a time budget only).
        log_every: The Trainer's steps per train window (``TrainConfig.log_every``).
        budget_s: The phase's time budget in seconds, on the Trainer's clock (``None``: none).
        later: The phases after this one (for the run's ETA; empty: this is the last).
        interval_s, min_fraction, logger, clock: As :class:`~bert_core.progress.Progress`.
    """

    def __init__(
        self,
        what: str,
        total: int | None,
        *,
        log_every: int = 1,
        budget_s: float | None = None,
        later: Sequence[LaterPhase] = (),
        interval_s: float | None = None,
        min_fraction: float | None = None,
        logger: logging.Logger | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        super().__init__(
            what,
            total,
            noun="step",
            unit="seq",
            interval_s=interval_s,
            min_fraction=min_fraction,
            detail=self._detail,
            logger=logger or log,
            clock=clock,
        )
        self.log_every, self.budget_s, self.later = max(int(log_every), 1), budget_s, tuple(later)
        self.loss, self.tokens_per_s, self.trained_s = math.nan, math.nan, 0.0
        self._last_step: int | None = None

    def _detail(self, _: int) -> str:
        return f"loss {self.loss:.4g}, {self.tokens_per_s:,.0f} tokens/s"

    def window(self, step: int, metrics: dict[str, float]) -> None:
        """One train window ended at optimizer step ``step``; ``metrics``: the Trainer's for it (``loss``,
        ``seq_per_s``, ``tokens_per_s``, ``step_time_s``, ``elapsed_s``: the training clock).

        The first window starts the reporter at the window's first step, back-dated by its duration (a
        resumed run's earlier steps count toward the percentage, not toward the rate).
        """
        step_s = float(metrics.get("step_time_s", 0.0))
        if self._last_step is None:
            # the Trainer logs every log_every steps (and at the end): the window began at the multiple before
            self._last_step = max(step - (step % self.log_every or self.log_every), 0)
            self.reset(self._last_step)
            self.start = self._last_t = self.start - step_s * (step - self._last_step)
        steps, self._last_step = step - self._last_step, step
        self.loss = float(metrics.get("loss", math.nan))
        self.tokens_per_s = float(metrics.get("tokens_per_s", math.nan))
        self.trained_s = float(metrics.get("elapsed_s", self.trained_s))
        sequences = float(metrics.get("seq_per_s", 0.0)) * step_s * steps
        self.update(step, examples=self.examples + round(sequences))

    def phase_eta_s(self, now: float) -> float:
        """Seconds until the phase ends: its steps left at the rate so far, or its budget, the nearer."""
        elapsed = max(now - self.start, 0.0)
        rate = (self.done - self.initial) / elapsed if elapsed > 0 else 0.0
        by_steps = math.inf
        if self.total is not None:
            left = max(self.total - self.done, 0)
            by_steps = left / rate if rate > 0 else (0.0 if left == 0 else math.inf)
        by_budget = max(self.budget_s - self.trained_s, 0.0) if self.budget_s is not None else math.inf
        return min(by_steps, by_budget)

    def seconds_per_step(self, now: float) -> float:
        steps = self.done - self.initial
        return max(now - self.start, 0.0) / steps if steps > 0 else math.inf

    def line(self, now: float | None = None, *, done: bool = False) -> str:
        now = self.clock() if now is None else now
        text = super().line(now, done=done)
        if done:
            return text
        text = text.rsplit(", ETA ", 1)[0]  # the base class's ETA counts steps only: replaced
        phase = self.phase_eta_s(now)
        text += f", ETA {format_duration(phase)}"
        if self.later:
            per_step = self.seconds_per_step(now)
            text += f", run ETA {format_duration(phase + sum(p.seconds(per_step) for p in self.later))}"
        return text
