"""The stage runner does not lose a signal whose exception Python swallows (``flows._cli.SignalRedelivery``)."""

from __future__ import annotations

import signal
import sys
import time
import weakref

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


@pytest.mark.parametrize(
    "body, errors, code, line",
    [
        (lambda: None, (Exception,), 0, None),
        (lambda: 3, (Exception,), 3, None),
        (lambda: int("x"), (Exception,), 1, "predict failed (in.jsonl): ValueError: invalid literal"),
        (lambda: signal.raise_signal(signal.SIGINT), (Exception,), 130, "predict interrupted (in.jsonl): "),
        (lambda: signal.raise_signal(signal.SIGTERM), (), 143, "stopped by SIGTERM; nothing written"),
        (_error_then_signal, (Exception,), 143, "predict interrupted (in.jsonl): stopped by SIGTERM"),
    ],
    ids=["done", "own status", "error", "SIGINT", "SIGTERM", "signal while an error is reported"],
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
