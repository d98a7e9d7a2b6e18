"""Learning-rate schedule: linear warmup, then linear decay to zero (BERT paper, appendix A.2).

The schedule is a function of the run's *progress* in [0, 1], measured in optimizer steps
(``step / max_steps``), in wall-clock time (``elapsed / budget``: "train for 10 minutes"), or both, in
which case the run stops at whichever limit comes first and the schedule follows whichever is further
along. In budget mode the number of steps is unknown in advance, so the warmup is a share of the run
and the rate reaches zero exactly when the budget runs out (as in Cramming, Geiping & Goldstein 2023).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class LinearWarmupDecay:
    """Linear warmup from 0 to ``peak_lr`` over the first ``warmup`` share of the run, then linear decay
    to 0 at its end.

    Attributes:
        peak_lr: the rate at the end of warmup.
        max_steps: run length in optimizer steps, or None.
        budget_s: run length in seconds, or None (at least one of the two).
        warmup: warmup share of the run, 0 <= warmup < 1.
    """

    peak_lr: float
    max_steps: int | None = None
    budget_s: float | None = None
    warmup: float = 0.0

    def __post_init__(self) -> None:
        if self.peak_lr <= 0:
            raise ValueError(f"learning rate must be > 0, got {self.peak_lr}")
        if self.max_steps is None and self.budget_s is None:
            raise ValueError("the schedule needs max_steps, a time budget, or both")
        if self.max_steps is not None and self.max_steps < 1:
            raise ValueError(f"max_steps must be >= 1, got {self.max_steps}")
        if self.budget_s is not None and self.budget_s <= 0:
            raise ValueError(f"the time budget must be > 0 seconds, got {self.budget_s}")
        if not 0 <= self.warmup < 1:
            raise ValueError(
                f"the warmup must be >= 0 and shorter than the run, got a share of {self.warmup:g}"
            )

    @classmethod
    def from_warmup_steps(cls, peak_lr: float, max_steps: int, warmup_steps: int) -> LinearWarmupDecay:
        """Step mode with the warmup given in steps."""
        if not 0 <= warmup_steps < max_steps:
            raise ValueError(
                f"warmup_steps ({warmup_steps}) must be >= 0 and less than max_steps ({max_steps})"
            )
        return cls(peak_lr, max_steps=max_steps, warmup=warmup_steps / max_steps)

    def factor(self, progress: float) -> float:
        """Multiplier of ``peak_lr`` at ``progress`` (a share of the run, clamped to [0, 1])."""
        p = min(max(progress, 0.0), 1.0)
        if p < self.warmup:
            return p / self.warmup
        return (1.0 - p) / (1.0 - self.warmup)

    def progress(self, step: int, elapsed_s: float) -> float:
        """Share of the run done when optimizer step ``step`` (0-based) is applied.

        In steps, a warmup update counts itself done (the first update is never a wasted zero-rate
        step) and the last update still gets a small positive rate.
        """
        parts = []
        if self.max_steps is not None:
            warming = step + 1 <= self.warmup * self.max_steps
            parts.append((step + 1 if warming else step) / self.max_steps)
        if self.budget_s is not None:
            parts.append(elapsed_s / self.budget_s)
        return max(parts)

    def lr_for_step(self, step: int, elapsed_s: float = 0.0) -> float:
        """Rate for the update of optimizer step ``step`` after ``elapsed_s`` seconds of training."""
        return self.peak_lr * self.factor(self.progress(step, elapsed_s))
