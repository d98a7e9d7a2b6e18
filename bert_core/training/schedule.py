"""Learning-rate schedule: linear warmup, then linear decay to zero (BERT paper, appendix A.2).

The schedule is a function of *progress*, measured either in optimizer steps (``max_steps`` mode) or
in seconds of training (wall-clock budget mode: "train for 10 minutes"). In budget mode the number of
steps is unknown in advance, so progress is ``elapsed / budget``: the warmup covers the first
``warmup_ratio`` of the budget and the rate reaches zero when the budget runs out (as in Cramming,
Geiping & Goldstein 2023).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class LinearWarmupDecay:
    """Linear warmup from 0 to ``peak_lr`` over ``warmup`` units, then linear decay to 0 at ``total``.

    Units are steps or seconds; the caller passes progress in the same unit.

    Attributes:
        peak_lr: the rate at the end of warmup.
        total: length of the run (steps or seconds), > 0.
        warmup: warmup length in the same unit, 0 <= warmup < total.
        by_time: True when units are seconds (budget mode); only used for messages and state.
    """

    peak_lr: float
    total: float
    warmup: float
    by_time: bool = False

    def __post_init__(self) -> None:
        unit = "seconds" if self.by_time else "steps"
        if self.peak_lr <= 0:
            raise ValueError(f"learning rate must be > 0, got {self.peak_lr}")
        if self.total <= 0:
            raise ValueError(f"schedule length must be > 0 {unit}, got {self.total}")
        if not 0 <= self.warmup < self.total:
            raise ValueError(
                f"warmup ({self.warmup:g} {unit}) must be >= 0 and shorter than the run ({self.total:g} {unit})"
            )

    def factor(self, progress: float) -> float:
        """Multiplier of ``peak_lr`` at ``progress`` (clamped to [0, 1])."""
        if self.warmup > 0 and progress < self.warmup:
            return max(progress, 0.0) / self.warmup
        return min(max((self.total - progress) / (self.total - self.warmup), 0.0), 1.0)

    def lr_for_step(self, step: int, elapsed_s: float) -> float:
        """Rate for the update of optimizer step ``step`` (0-based).

        In step mode the first update uses ``(step + 1) / warmup`` (never a wasted zero-rate step) and
        the last update a small positive rate. In budget mode the progress is ``elapsed_s``.
        """
        progress = elapsed_s if self.by_time else step + (1 if step < self.warmup else 0)
        return self.peak_lr * self.factor(progress)
