"""Metric sinks: where the training loop sends its metrics, without ever waiting on a server.

The loop calls a sink as ``sink(step, metrics)``. ``RetryingSink`` queues the record and returns at
once; a daemon thread sends queued records through a backend (``send(records)``), and when the
backend fails (an MLflow server that is down, a network blip) it logs the problem once, keeps
everything buffered, retries with exponential backoff and flushes the backlog when the backend is
back. Records keep the timestamp of the moment they were logged. ``close()`` waits a bounded time
for the backlog and writes whatever could not be sent to a JSON-lines spill file, so a long run is
never killed by tracking and no metric is silently lost.

Why not MLflow's own asynchronous logging (``log_batch(..., synchronous=False)``): it sends from a thread
too, but a batch whose HTTP retries run out (about four minutes with MLflow's default backoff) is logged as
an error and dropped, and its exit handler waits for the requests still retrying. A tracking server down
for longer than that would lose metrics, or hold the process at exit. What this sink adds is exactly what
that lacks: records kept for as long as the server is down, and a close bounded in time that spills the
rest; the sending itself is one ``log_batch`` call.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger(__name__)

MetricsCallback = Callable[[int, dict[str, float]], None]


@dataclass(frozen=True)
class MetricRecord:
    """One logging event: ``metrics`` at optimizer step ``step``, logged at ``timestamp_ms``."""

    step: int
    metrics: dict[str, float]
    timestamp_ms: int


Backend = Callable[[Sequence[MetricRecord]], None]


class RetryingSink:
    """Non-blocking metric sink with retry, backoff and buffering (see module docstring).

    Args:
        send: backend called from the worker thread with a batch of records; raises on failure.
        name: used in log messages.
        base_delay_s: first retry delay; doubles per failure up to ``max_delay_s``.
        max_delay_s: cap of the retry delay.
        max_batch: records per backend call.
        spill_path: JSON-lines file for records still unsent at ``close()``; None logs them only.
    """

    def __init__(
        self,
        send: Backend,
        *,
        name: str = "tracking",
        base_delay_s: float = 1.0,
        max_delay_s: float = 60.0,
        max_batch: int = 50,
        spill_path: Path | None = None,
    ) -> None:
        self._send = send
        self.name = name
        self._base, self._max = base_delay_s, max_delay_s
        self._max_batch = max_batch
        self._spill_path = spill_path
        self._pending: deque[MetricRecord] = deque()
        self._cond = threading.Condition()
        self._closing = False
        self._in_flight: list[MetricRecord] = []
        self.failures = 0  # consecutive failed attempts
        self.sent = 0
        self._thread = threading.Thread(target=self._run, name=f"{name}-sink", daemon=True)
        self._thread.start()

    def __call__(self, step: int, metrics: dict[str, float]) -> None:
        record = MetricRecord(int(step), {k: float(v) for k, v in metrics.items()}, int(time.time() * 1000))
        with self._cond:
            self._pending.append(record)
            self._cond.notify()

    @property
    def pending(self) -> int:
        """Records queued or being sent."""
        with self._cond:
            return len(self._pending) + len(self._in_flight)

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._pending and not self._closing:
                    self._cond.wait()
                if not self._pending and self._closing:
                    return
                batch = [self._pending.popleft() for _ in range(min(self._max_batch, len(self._pending)))]
                self._in_flight = batch
            try:
                self._send(batch)
            except Exception as exc:  # any backend failure: keep the records, back off, retry
                with self._cond:
                    self._pending.extendleft(reversed(batch))
                    self._in_flight = []
                    self.failures += 1
                    delay = min(self._base * 2 ** (self.failures - 1), self._max)
                    if self.failures == 1:
                        log.warning(
                            "%s: sending metrics failed (%s: %s); buffering %d record(s) and retrying with backoff",
                            self.name,
                            type(exc).__name__,
                            exc,
                            len(self._pending),
                        )
                    else:
                        log.debug("%s: retry %d failed: %s", self.name, self.failures, exc)
                    if self._closing:
                        return  # close() gave up waiting; it spills the rest
                    self._cond.wait(timeout=delay)
                continue
            with self._cond:
                self._in_flight = []
                self.sent += len(batch)
                if self.failures:
                    log.warning(
                        "%s: backend reachable again after %d failed attempt(s); flushing %d buffered record(s)",
                        self.name,
                        self.failures,
                        len(self._pending),
                    )
                    self.failures = 0
                self._cond.notify_all()

    def flush(self, timeout_s: float = 30.0) -> bool:
        """Wait until every queued record is sent; False if ``timeout_s`` passed first."""
        deadline = time.monotonic() + timeout_s
        with self._cond:
            self._cond.notify_all()
            while self._pending or self._in_flight:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._cond.wait(timeout=min(left, 0.1))
        return True

    def close(self, timeout_s: float = 30.0) -> int:
        """Flush for at most ``timeout_s``, stop the worker and spill what is left.

        Returns:
            The number of records that could not be sent (written to the spill file if one is set).
        """
        self.flush(timeout_s)
        with self._cond:
            self._closing = True
            self._cond.notify_all()
        self._thread.join(timeout=2.0)
        with self._cond:
            # A worker still stuck in a backend call may yet deliver its batch: spill it too (a
            # duplicate in the spill file is better than a lost record).
            left = list(self._in_flight) + list(self._pending)
            self._pending.clear()
        if left:
            if self._spill_path is not None:
                self._spill_path.parent.mkdir(parents=True, exist_ok=True)
                with open(self._spill_path, "a", encoding="utf-8") as fh:
                    for r in left:
                        fh.write(
                            json.dumps({"step": r.step, "timestamp_ms": r.timestamp_ms, **r.metrics}) + "\n"
                        )
            log.error(
                "%s: %d metric record(s) could not be sent; %s",
                self.name,
                len(left),
                f"written to {self._spill_path}"
                if self._spill_path
                else "they are in the run's local history",
            )
        return len(left)


def mlflow_backend(run_id: str) -> Backend:
    """A backend that logs records to MLflow run ``run_id`` with ``MlflowClient.log_batch``."""
    from mlflow.entities import Metric
    from mlflow.tracking import MlflowClient

    client = MlflowClient()

    def send(records: Sequence[MetricRecord]) -> None:
        metrics = [
            Metric(key=k, value=v, timestamp=r.timestamp_ms, step=r.step)
            for r in records
            for k, v in r.metrics.items()
        ]
        for i in range(0, len(metrics), 1000):  # MLflow's per-request limit
            client.log_batch(run_id, metrics=metrics[i : i + 1000], synchronous=True)

    return send


def mlflow_sink(run_id: str, *, spill_path: Path | None = None, **kwargs) -> RetryingSink:
    """A ``RetryingSink`` that logs to MLflow run ``run_id`` (see ``RetryingSink`` for ``kwargs``)."""
    return RetryingSink(mlflow_backend(run_id), name="mlflow", spill_path=spill_path, **kwargs)


def fan_out(*callbacks: MetricsCallback | None) -> MetricsCallback:
    """One callback that forwards ``(step, metrics)`` to each non-None callback."""
    active = [c for c in callbacks if c is not None]

    def call(step: int, metrics: dict[str, float]) -> None:
        for c in active:
            c(step, metrics)

    return call
