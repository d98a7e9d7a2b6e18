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
