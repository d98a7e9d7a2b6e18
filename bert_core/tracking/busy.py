"""A SQLite tracking store locked by another process: recognised, and named with what to do.

SQLite lets one process write at a time. MLflow's SQLite connections wait for a lock within each call (5 s
while the store is first opened in a process, then 20 s: ``PRAGMA busy_timeout``); a store that stays locked longer (another stage writing a long transaction, a
script or a DB browser holding one) would otherwise surface as ``OperationalError: database is locked``
after every retry of :func:`bert_core.tracking.run.retry_tracking`, naming neither the file nor the way out.
"""

from __future__ import annotations

from pathlib import Path

#: Attempts of a tracking call that finds the SQLite store locked; with SQLite's wait inside each attempt,
#: a store held that long fails a call after about 10 s (on opening it) to 40 s (``retry_tracking``).
STORE_BUSY_ATTEMPTS = 2


class TrackingStoreBusy(RuntimeError):
    """The SQLite tracking store stayed locked by another process for longer than a stage waits."""


def store_locked(err: BaseException | None) -> bool:
    """Whether ``err`` (or an exception it wraps) is SQLite's ``database is locked`` (``... table is locked``)."""
    seen: set[int] = set()
    while err is not None and id(err) not in seen:
        seen.add(id(err))
        text = str(err).lower()
        if "database is locked" in text or "database table is locked" in text:
            return True
        err = err.__cause__ or err.__context__
    return False


def store_busy_error(store: Path, waited_s: float) -> TrackingStoreBusy:
    """The error for the SQLite store ``store`` still locked after ``waited_s`` seconds."""
    return TrackingStoreBusy(
        f"the MLflow store {store} is locked: another process is writing it (SQLite lets one process write "
        f"at a time) and it was still locked after {waited_s:.0f} s. Wait for that process (another stage, "
        "a script or database browser holding a transaction) to finish and run again, or, to run stages at "
        "the same time, use a tracking server (docs/reliability.md)"
    )
