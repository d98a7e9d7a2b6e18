"""Progress lines for long loops: ``<what>: step k/N (p%), X examples/s, elapsed T, ETA T``.

One small reporter for every long step (fine-tuning, evaluation passes, feature building, prediction),
logged on the standard ``logging`` logger of the caller, so the lines reach the console and, in a flow
run, Prefect's logs (the flows route ``bert_core`` INFO records there). Rate-limited: a line is logged
only when at least ``interval_s`` seconds **and** ``min_fraction`` of the total have passed since the last
one (whichever is rarer), never one per batch; a loop shorter than ``interval_s`` logs nothing at all.

.. code-block:: python

    progress = Progress("sst2 dev eval", total=len(batches), noun="batch", logger=log)
    for batch in batches:
        ...
        progress.advance(1, examples=len(batch))
    progress.finish()  # a closing line, only when a progress line was logged

Defaults (``interval_s`` 20 s, ``min_fraction`` 5 %) can be changed per process with the environment
variables ``BERT_PROGRESS_INTERVAL_S`` (seconds) and ``BERT_PROGRESS_MIN_PERCENT`` (percent of the
total); ``0`` and ``0`` log at every update (for debugging).
"""

from __future__ import annotations

import logging
import math
import os
import time
from collections.abc import Callable

__all__ = ["Progress", "format_duration"]

DEFAULT_INTERVAL_S = 20.0
DEFAULT_MIN_FRACTION = 0.05
INTERVAL_ENV = "BERT_PROGRESS_INTERVAL_S"
MIN_PERCENT_ENV = "BERT_PROGRESS_MIN_PERCENT"

_log = logging.getLogger(__name__)


def format_duration(seconds: float) -> str:
    """``42s``, ``3m05s``, ``2h01m40s``; ``?`` when unknown (infinite or NaN)."""
    if not math.isfinite(seconds):
        return "?"
    seconds = max(0, round(seconds))
    h, rest = divmod(seconds, 3600)
    m, s = divmod(rest, 60)
    return f"{h}h{m:02d}m{s:02d}s" if h else f"{m}m{s:02d}s" if m else f"{s}s"


def _env_float(name: str, default: float, low: float, high: float = math.inf) -> float:
    raw = os.environ.get(name)
    if raw is None or not raw.strip():
        return default
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    if not low <= value <= high:  # NaN fails too
        raise ValueError(f"{name}={raw!r} is invalid: expected a number in [{low:g}, {high:g}] (or unset it)")
    return value


def _format_rate(rate: float) -> str:
    return f"{rate:.3g}" if rate < 100 else f"{rate:.0f}"


class Progress:
    """Reports how far a loop of known (or unknown) length has come; see the module docstring.

    Args:
        what: What runs, the start of each line (e.g. ``"sst2 pretrained lr=0.0001 seed=1 train"``).
        total: Units (steps, batches, rows ...) the loop will do; ``None``: unknown (no percentage, no ETA).
        noun: The unit counted against ``total`` (``step``, ``batch``, ``example``, ``rows``).
        unit: What the throughput counts (``examples``, ``rows``).
        interval_s: Least seconds between two lines (default ``BERT_PROGRESS_INTERVAL_S`` or 20).
        min_fraction: Least share of ``total`` between two lines (default ``BERT_PROGRESS_MIN_PERCENT`` / 100
            or 0.05); ignored when ``total`` is unknown.
        initial: Units already done before this reporter started (a resumed run): they count toward the
            percentage, not toward the rate.
        detail: Called with the units done; its text goes after the percentage (e.g. the epoch).
        logger: Where the lines go (default this module's logger).
        level: Their level (default INFO).
        clock: Monotonic seconds (tests pass a fake one).
    """

    def __init__(
        self,
        what: str,
        total: int | None,
        *,
        noun: str = "step",
        unit: str = "examples",
        interval_s: float | None = None,
        min_fraction: float | None = None,
        initial: int = 0,
        detail: Callable[[int], str] | None = None,
        logger: logging.Logger | None = None,
        level: int = logging.INFO,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if interval_s is None:
            interval_s = _env_float(INTERVAL_ENV, DEFAULT_INTERVAL_S, 0.0)
        if min_fraction is None:
            min_fraction = _env_float(MIN_PERCENT_ENV, 100 * DEFAULT_MIN_FRACTION, 0.0, 100.0) / 100
        if interval_s < 0 or not 0 <= min_fraction <= 1:
            raise ValueError(
                f"interval_s must be >= 0 and min_fraction in [0, 1], got {interval_s}, {min_fraction}"
            )
        self.what, self.total, self.noun, self.unit = what, total, noun, unit
        self.interval_s, self.min_fraction = float(interval_s), float(min_fraction)
        self.detail, self.logger, self.level, self.clock = detail, logger or _log, level, clock
        self.reset(initial)

    # ------------------------------------------------------------------ counting
    def reset(self, initial: int = 0) -> None:
        """Start again from now with ``initial`` units done (the Trainer calls it when training starts,
        with the step it resumed from)."""
        self.initial = self.done = self._last_done = int(initial)
        self.examples = self.lines = 0
        self.start = self._last_t = self.clock()

    def advance(self, n: int = 1, *, examples: int | None = None) -> None:
        """``n`` more units done, ``examples`` more examples seen (default ``n``); log a line when due."""
        self.update(self.done + n, examples=self.examples + (n if examples is None else examples))

    def update(self, done: int, *, examples: int | None = None) -> None:
        """``done`` units done in all, ``examples`` seen since the start (default: units since the start)."""
        self.done = int(done)
        self.examples = self.done - self.initial if examples is None else int(examples)
        if not self.logger.isEnabledFor(self.level):
            return
        now = self.clock()
        if now - self._last_t < self.interval_s:
            return
        if self.total and self.done - self._last_done < self.min_fraction * self.total:
            return
        self._last_t, self._last_done = now, self.done
        self.lines += 1
        self.logger.log(self.level, "%s", self.line(now))

    def finish(self, note: str = "", *, done: int | None = None, examples: int | None = None) -> None:
        """A closing ``<what>: done ...`` line (with the final counts when given), logged once and only when
        at least one progress line was: a loop too short to report stays silent."""
        self.done = self.done if done is None else int(done)
        self.examples = self.examples if examples is None else int(examples)
        if self.lines:
            self.logger.log(self.level, "%s", self.line(done=True) + (f"; {note}" if note else ""))
            self.lines = 0

    # ------------------------------------------------------------------ the line
    @property
    def elapsed_s(self) -> float:
        return max(self.clock() - self.start, 0.0)

    def line(self, now: float | None = None, *, done: bool = False) -> str:
        """``<what>: <noun> k/N (p%)[, <detail>], X <unit>/s, elapsed T, ETA T`` (``done`` instead of the ETA
        on the closing line)."""
        now = self.clock() if now is None else now
        elapsed = max(now - self.start, 0.0)
        count = f"{self.noun} {self.done}" + (f"/{self.total}" if self.total is not None else "")
        if self.total:
            count += f" ({100.0 * self.done / self.total:.1f}%)"
        parts = [count]
        if self.detail is not None:
            parts.append(self.detail(self.done))
        rate = self.examples / elapsed if elapsed > 0 else math.nan
        if math.isfinite(rate):
            parts.append(f"{_format_rate(rate)} {self.unit}/s")
        parts.append(f"elapsed {format_duration(elapsed)}")
        if done:
            return f"{self.what}: done, " + ", ".join(parts)
        if self.total is not None:
            units_per_s = (self.done - self.initial) / elapsed if elapsed > 0 else 0.0
            remaining = max(self.total - self.done, 0)
            eta = remaining / units_per_s if units_per_s > 0 else (0.0 if remaining == 0 else math.inf)
            parts.append(f"ETA {format_duration(eta)}")
        return f"{self.what}: " + ", ".join(parts)
