"""The stage runner does not lose a signal whose exception Python swallows (``flows._cli.SignalRedelivery``)."""

from __future__ import annotations

import signal
import sqlite3
import sys
import time
import warnings
import weakref
from pathlib import Path

import pytest

from flows import _cli


@pytest.fixture
def stage_handlers(monkeypatch):
    """The stage runner's signal handlers and hook (``install_signal_handlers``, as ``run_stage`` and the
    pipeline install them); ``seen`` collects what reaches the previous hook."""
    seen: list = []
    monkeypatch.setattr(sys, "unraisablehook", seen.append)
    old = _cli.install_signal_handlers()
    try:
        yield seen
    finally:
        _cli.restore_signal_handlers(old)
    assert sys.unraisablehook == seen.append  # put back


def _swallowed(exc: BaseException) -> None:
    """Raise ``exc`` where Python cannot propagate it: in a weakref callback (as a signal handler does when
    the signal lands while Python runs one); Python reports it to ``sys.unraisablehook`` and goes on."""

    class Thing:
        pass

    thing = Thing()

    def callback(_ref: weakref.ref) -> None:
        raise exc

    ref = weakref.ref(thing, callback)
    del thing
    assert ref() is None


def test_a_sigterm_swallowed_by_a_weakref_callback_is_sent_again(stage_handlers):
    with pytest.raises(_cli.Interrupted) as info:
        _swallowed(_cli.Interrupted(signal.SIGTERM))  # the handler's exception, lost in the callback
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:  # the stage goes on working ...
            time.sleep(0.01)
    assert info.value.signum == signal.SIGTERM  # ... until the signal, sent again, stops it
    assert info.value.exit_code == 143
    assert stage_handlers == []  # no "Exception ignored" traceback before the one "interrupted" line


def test_other_swallowed_exceptions_only_reach_the_previous_hook(stage_handlers):
    _swallowed(ValueError("a finaliser's own error"))
    time.sleep(0.2)  # nothing is sent: no Interrupted here
    assert [type(u.exc_value) for u in stage_handlers] == [ValueError]


def _error_then_signal() -> None:
    """An error whose report is cut short by SIGTERM (the signal lands while the error line is built)."""

    class Slow(ValueError):
        def __str__(self) -> str:
            signal.raise_signal(signal.SIGTERM)
            return "never shown"

    raise Slow()


def _training_stopped() -> None:
    from bert_core.training.config import TrainingInterrupted

    raise TrainingInterrupted(signal.SIGTERM, 61, Path("ck/step-00000061"))


def _training_stopped_then_signal() -> None:
    """Training stopped on another rank's word and wrote its checkpoint; this rank's own SIGTERM lands
    while that stop unwinds (a rank of several whose launcher died)."""
    try:
        _training_stopped()
    finally:
        signal.raise_signal(signal.SIGTERM)


@pytest.mark.parametrize(
    "body, errors, code, line",
    [
        (lambda: None, (Exception,), 0, None),
        (lambda: 3, (Exception,), 3, None),
        (lambda: int("x"), (Exception,), 1, "predict failed (in.jsonl): ValueError: invalid literal"),
        (lambda: signal.raise_signal(signal.SIGINT), (Exception,), 130, "predict interrupted (in.jsonl): "),
        (lambda: signal.raise_signal(signal.SIGTERM), (), 143, "stopped by SIGTERM; nothing written"),
        (_error_then_signal, (Exception,), 143, "predict interrupted (in.jsonl): stopped by SIGTERM"),
        (
            _training_stopped,
            (Exception,),
            143,
            "interrupted (in.jsonl): training stopped by SIGTERM after step 61",
        ),
        (
            _training_stopped_then_signal,
            (Exception,),
            143,
            "training stopped by SIGTERM after step 61; checkpoint",
        ),
    ],
    ids=[
        "done",
        "own status",
        "error",
        "SIGINT",
        "SIGTERM",
        "signal while an error is reported",
        "training's own stop",
        "signal while training's stop unwinds",
    ],
)
def test_every_command_exits_by_one_rule_with_one_line(body, errors, code, line, capsys):
    """``run_command`` (stages, ``predict``, the pipeline): 0 or the body's status; 1 and one line for an
    error; 128 + N and one line for signal N, also when it lands while an error is being reported."""
    got = _cli.run_command(
        body, "predict", instance=lambda: " (in.jsonl)", after_stop="; nothing written", errors=errors
    )
    lines = capsys.readouterr().err.splitlines()
    assert got == code
    assert lines == [] if line is None else (len(lines) == 1 and line in lines[0]), lines
    assert signal.getsignal(signal.SIGTERM) is not _cli.raise_interrupted  # handlers restored


def test_an_error_outside_the_commands_errors_is_raised_not_reported(capsys):
    with pytest.raises(KeyError):
        _cli.run_command(lambda: {}["x"], "pipeline", after_stop="", errors=(ValueError,))
    assert capsys.readouterr().err == ""


def _store_write_cut_by_a_signal(db, signum: int) -> None:
    """A tracking write stopped half-way by ``signum``, as MLflow's store call is when the signal lands in
    a query after its writes: SQLAlchemy closes the connection it invalidates on the signal, but SQLite keeps
    it open, with the write transaction and the store's lock, until the running statement is finalised; the
    cursor that holds it is a local of the interrupted frame, which the exception's traceback keeps."""
    con = sqlite3.connect(db, isolation_level=None, timeout=0)
    con.execute("CREATE TABLE IF NOT EXISTS t (a)")
    con.execute("BEGIN IMMEDIATE")
    con.executemany("INSERT INTO t VALUES (?)", [(1,), (2,)])
    cursor = con.execute("SELECT a FROM t")
    cursor.fetchone()
    con.close()
    signal.raise_signal(signum)


def _store_is_free(db) -> bool:
    """Whether a write could commit now (SQLite's exclusive lock: no other transaction, no running query)."""
    con = sqlite3.connect(db, isolation_level=None, timeout=0)
    try:
        con.execute("BEGIN EXCLUSIVE")
        con.execute("ROLLBACK")
        return True
    except sqlite3.OperationalError:
        return False
    finally:
        con.close()


def test_a_signal_inside_a_store_write_still_marks_the_run_failed_at_once():
    """The run's FAILED mark needs the store's write lock, which the interrupted write held: without its
    release the mark waited out SQLite's 20-s busy timeout, failed, and left the run RUNNING."""
    from mlflow import MlflowClient

    from bert_core.tracking import run as tracking_run

    with pytest.raises(KeyboardInterrupt), tracking_run.stage_run("demo", {"a": 1}) as run:
        _store_write_cut_by_a_signal(
            tracking_run.sqlite_store_path(tracking_run.tracking_uri()), signal.SIGINT
        )
    assert MlflowClient().get_run(run.run_id).info.status == "FAILED"


def test_a_command_stopped_inside_a_store_write_leaves_the_store_free(tmp_path, monkeypatch):
    """Where the exception outlives the command (Prefect's engine keeps a crashed run's), the write it cut
    kept the store locked, and MLflow's own ``end_run`` at exit waited on it until DVC killed the stage."""
    db = tmp_path / "mlflow.db"
    sqlite3.connect(db).close()
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{db}")
    kept: list[BaseException] = []

    def body() -> None:
        try:
            _store_write_cut_by_a_signal(db, signal.SIGTERM)
        except BaseException as err:
            kept.append(err)
            raise

    assert _cli.run_command(body, "corpus stage", after_stop="") == 143
    assert kept and _store_is_free(db)


def test_the_release_closes_the_queries_left_running_on_the_store_and_no_others(tmp_path):
    """A query cut short keeps SQLite's shared lock, which stops every commit, for as long as its cursor
    lives; SQLAlchemy's result object kept it beyond the interrupted frames. Other databases' are kept."""
    from bert_core.tracking.busy import release_interrupted_writes

    cursors = {}
    for name in ("mlflow", "other"):
        con = sqlite3.connect(tmp_path / f"{name}.db", isolation_level=None)
        con.executescript("CREATE TABLE t (a); INSERT INTO t VALUES (1); INSERT INTO t VALUES (2);")
        cursors[name] = con.execute("SELECT a FROM t")
        assert cursors[name].fetchone() == (1,)
    assert not _store_is_free(tmp_path / "mlflow.db")

    import torch.distributed  # noqa: F401  (its deprecated aliases warn when asked for their class)

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the scan of every live object prints nothing on the user's stop
        release_interrupted_writes(KeyboardInterrupt(), tmp_path / "mlflow.db")
    assert _store_is_free(tmp_path / "mlflow.db")
    assert cursors["other"].fetchone() == (2,)  # still open
