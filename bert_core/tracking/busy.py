"""A SQLite tracking store locked by another process: recognised, and named with what to do.

SQLite lets one process write at a time. MLflow's SQLite connections wait for a lock within each call (5 s
while the store is first opened in a process, then 20 s: ``PRAGMA busy_timeout``); a store that stays locked longer (another stage writing a long transaction, a
script or a DB browser holding one) would otherwise surface as ``OperationalError: database is locked``
after every retry of :func:`bert_core.tracking.run.retry_tracking`, naming neither the file nor the way out.
"""

from __future__ import annotations

import contextlib
import gc
import traceback
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


def release_interrupted_writes(err: BaseException, store: Path | None) -> None:
    """Let go of the SQLite transaction and statements of the store call that a signal interrupted.

    A signal (Ctrl-C, SIGTERM) that lands inside an MLflow call on the SQLite ``store`` can leave behind a
    session with an open write transaction, a query's running statement (SQLite's shared lock), or a
    connection SQLAlchemy closed on the signal, which SQLite keeps open, transaction and lock included,
    until its running statement is finalised. The interrupted frames, kept by the exception's traceback,
    hold them, some in reference cycles. Until they go, every later write of this process (the run's
    ``FAILED`` mark, MLflow's own ``end_run`` at exit) waits out SQLite's 20-s busy timeout and fails.

    So: the finished frames of ``err`` and of the exceptions it chains are cleared (the traceback's lines
    stay), the cycles collected, and every cursor still open on ``store``, or on a connection already
    closed, is closed. Cursors on other databases are left alone.
    """
    seen: set[int] = set()
    pending: list[BaseException | None] = [err]
    while pending:
        current = pending.pop()
        if current is None or id(current) in seen:
            continue
        seen.add(id(current))
        traceback.clear_frames(current.__traceback__)
        pending += [current.__cause__, current.__context__]
    gc.collect()
    if store is None:
        return
    import sqlite3

    store = store.resolve()
    files: dict[int, bool] = {}  # connection id -> on the store (or closed)
    for obj in gc.get_objects():
        if not issubclass(type(obj), sqlite3.Cursor):  # not isinstance: obj.__class__ warns on some objects
            continue
        con = obj.connection
        if id(con) not in files:
            try:
                names = [row[2] for row in con.execute("PRAGMA database_list")]
                files[id(con)] = any(name and Path(name).resolve() == store for name in names)
            except sqlite3.ProgrammingError:  # closed (or another thread's): its statements only hold locks
                files[id(con)] = True
            except sqlite3.Error:
                files[id(con)] = False
        if files[id(con)]:
            with contextlib.suppress(sqlite3.Error):
                obj.close()
