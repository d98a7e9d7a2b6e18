"""The one command-line runner of the stage flows (``python -m flows.<stage>``).

Builds the argument parser from the stage's options in :data:`flows.stages.STAGES` (so the default
paths are spelled once), validates the params before Prefect starts (fail fast), runs the flow and turns
the outcome into the exit code DVC sees:

- 0: done;
- 1: any error, with one line ``<stage> stage failed[ (<task>)]: <Type>: <message>`` on stderr;
- ``err.exit_code`` (128 + signal number) for a stage's own interrupt (``TrainingInterrupted``: training
  stopped by SIGTERM/SIGINT after writing a checkpoint), with ``<stage> stage interrupted: <message>``;
- 130 / 143 for a SIGINT (Ctrl-C) / SIGTERM anywhere else (loading data, starting Prefect ...), with
  ``<stage> stage interrupted[ (<task>)]: stopped by SIGINT before it finished; ...``. Both handlers are
  installed first thing, so a SIGINT that the parent left ignored (a shell's ``cmd &``) still stops it.

The Prefect API is settled before the flow starts (:func:`flows._prefect_api.prefect_api`): an unreachable
``PREFECT_API_URL`` fails within seconds, and the temporary server runs in its own session so that Ctrl-C
does not take it down before the flow run is marked Crashed. Under ``python -m flows.pipeline`` the stage gets
the pipeline's API in ``PREFECT_API_URL`` and starts no server. The command ends through
:func:`exit_command` (a normal exit without the interpreter's last garbage collections).
"""

from __future__ import annotations

import argparse
import gc
import logging
import os
import signal
import sys
import threading
from collections.abc import Callable
from typing import Any, NamedTuple, NoReturn

from flows.stages import Stage, get


def build_parser(stage: Stage, description: str | None = None) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=f"python -m {stage.flow_module}", description=description)
    for option in stage.options:
        kwargs: dict[str, Any] = {"help": option.help}
        if option.type is not str:
            kwargs["type"] = option.type
        if option.positional:
            parser.add_argument(option.dest, **kwargs)
        else:
            metavar = option.flag.lstrip("-").upper().replace("-", "_")  # as argparse names the flag
            parser.add_argument(
                option.flag, dest=option.dest, default=option.default, metavar=metavar, **kwargs
            )
    return parser


#: The console line of a stage: Prefect's own console format, so that a line looks the same whichever
#: handler prints it (and the pipeline's relay, :func:`flows._driver.relayed`, strips one stamp).
CONSOLE_FORMAT = "%(asctime)s.%(msecs)03d | %(levelname)-7s | %(name)s - %(message)s"
CONSOLE_DATEFMT = "%H:%M:%S"


def configure_logging() -> None:
    """INFO lines of ``bert_core`` on stderr (for stages that log outside Prefect, e.g. torchrun ranks),
    formatted as Prefect's console handler formats them: one time stamp, one level, the logger name."""
    logging.basicConfig(level=logging.INFO, format=CONSOLE_FORMAT, datefmt=CONSOLE_DATEFMT)
    logging.getLogger("httpx").setLevel(logging.WARNING)


#: The longest "stage failed" reason printed (characters); the full message stays in the Prefect log.
MAX_REASON_CHARS = 2000


def failure_line(prefix: str, err: BaseException, limit: int = MAX_REASON_CHARS) -> str:
    """``<prefix>: <Type>: <message>``, the message cut to ``limit`` characters (saying so).

    A safety net: errors quote at most short excerpts of their input, but one that does not (a library's
    message that embeds a whole file) must not become a megabyte-long line on the terminal or in DVC's log.
    """
    message = str(err)
    if len(message) > limit:
        message = f"{message[:limit]} ... [truncated: {len(message)} characters in all]"
    return f"{prefix}: {type(err).__name__}: {message}"


class Interrupted(KeyboardInterrupt):
    """SIGTERM (or SIGINT) arrived outside the training loop's own handler; ``exit_code`` = 128 + signal."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum
        self.exit_code = 128 + signum


#: The stop signals this process received, in order (for a command whose framework swallows the exception,
#: as ``prefect.serve`` does: its exit status still comes from the first).
RECEIVED: list[int] = []


def raise_interrupted(signum: int, _frame: Any) -> None:
    """The signal handler of every command: record ``signum`` and raise :class:`Interrupted`."""
    RECEIVED.append(signum)
    raise Interrupted(signum)


class SavedHandlers(NamedTuple):
    """What :func:`install_signal_handlers` replaced, for :func:`restore_signal_handlers`."""

    signals: dict[int, Any]
    unraisablehook: Callable[[Any], Any] | None


def install_signal_handlers() -> SavedHandlers:
    """SIGINT and SIGTERM -> :class:`Interrupted` (a ``KeyboardInterrupt``; SIGINT even when inherited as
    ignored), recorded in :data:`RECEIVED`, and a :class:`SignalRedelivery` ``sys.unraisablehook`` so that
    neither is lost inside a callback.

    Returns what was replaced (nothing off the main thread, where handlers cannot be set).
    """
    if threading.current_thread() is not threading.main_thread():
        return SavedHandlers({}, None)
    hook, sys.unraisablehook = sys.unraisablehook, SignalRedelivery(sys.unraisablehook)
    signals = {
        signal.SIGINT: signal.signal(signal.SIGINT, raise_interrupted),
        signal.SIGTERM: signal.signal(signal.SIGTERM, raise_interrupted),
    }
    return SavedHandlers(signals, hook)


def restore_signal_handlers(old: SavedHandlers) -> None:
    for signum, handler in old.signals.items():
        signal.signal(signum, handler)
    if old.unraisablehook is not None:
        sys.unraisablehook = old.unraisablehook


class SignalRedelivery:
    """A ``sys.unraisablehook`` that sends a swallowed signal again.

    A signal handler's exception raised while Python runs a weakref callback or a finaliser is printed as
    "Exception ignored in ..." and dropped: the stage would run on to the end as if it had never been
    signalled (seen on CI: SIGTERM inside a ``WeakValueDictionary`` callback, Prefect's handler's
    ``TerminationSignal`` lost). For such an exception this hook sends the same signal to the process again
    from a short-lived thread, so its handler runs once more at the main thread's next bytecode boundary,
    outside the callback. The swallowed signal is not reported (it is no error, and its traceback would
    precede the stage's one "interrupted" line); other unraisable exceptions go to the previous hook unchanged.
    """

    def __init__(self, previous: Callable[[Any], Any]) -> None:
        self.previous = previous

    def __call__(self, unraisable: Any) -> None:
        err = unraisable.exc_value
        signum = signal_of(err) if isinstance(err, BaseException) else None
        if signum is not None:
            resend = threading.Timer(0.01, os.kill, args=(os.getpid(), signum))
            resend.daemon = True
            resend.start()
            return
        self.previous(unraisable)


def signal_of(err: BaseException) -> int | None:
    """The signal an exception stands for: KeyboardInterrupt (SIGINT), Prefect's TerminationSignal ..."""
    if isinstance(err, Interrupted):
        return err.signum
    if isinstance(err, KeyboardInterrupt):
        return int(signal.SIGINT)
    if type(err).__name__ == "TerminationSignal":  # prefect.exceptions, raised by its SIGTERM handler
        return int(getattr(err, "signal", signal.SIGTERM))
    return None


def interrupted_message(signum: int) -> str:
    return (
        f"stopped by {signal.Signals(signum).name} before it finished; run it again (`dvc repro` reruns it)"
    )


def exit_command(code: int) -> NoReturn:
    """End a command-line process (``python -m flows.<stage>``, the pipeline) with exit status ``code``.

    Everything of a normal exit still happens (non-daemon threads joined, ``atexit`` handlers: Prefect's log
    and event workers drained, MLflow's, logging's), but the objects alive now are frozen out of the garbage
    collector first (:func:`gc.freeze`): the interpreter's last collections over the heap that Prefect,
    MLflow, Great Expectations and torch leave (millions of objects) cost 1.4-2.5 CPU-seconds per stage,
    for nothing, since the process is ending. Objects are still freed by reference counting, so files and
    connections close as before.
    """
    gc.freeze()
    sys.exit(code)


def _uses_prefect() -> bool:
    """Rank 0 (or no torchrun) reports to Prefect; the other ranks only train."""
    return int(os.environ.get("RANK", "0")) == 0


def run_stage(
    name: str,
    flow: Callable[..., Any],
    argv: list[str] | None = None,
    *,
    doc: str | None = None,
    other_ranks: Callable[..., Any] | None = None,
    log_to_stderr: bool = False,
) -> int:
    """Parse ``argv``, validate the stage's params, call ``flow(**options)``; return the exit code.

    Args:
        name: The stage (a row of the stage table).
        flow: The stage's Prefect flow, called with one keyword argument per option.
        argv: Command-line arguments (default ``sys.argv[1:]``).
        doc: The flow module's docstring; its first paragraph is the ``--help`` description.
        other_ranks: Under ``torchrun``, what ranks other than 0 run instead of ``flow`` (they only train:
            no Prefect, no tracking); ``flow`` is then a zero-argument function that builds the flow, so
            that those ranks never import Prefect.
        log_to_stderr: Configure logging to stderr first.

    An exception that carries ``signum`` and ``exit_code`` (``TrainingInterrupted``: stopped by a signal,
    a checkpoint written) is an interrupt like a Ctrl-C anywhere else: Prefect marks the run Crashed, and
    the exit code is the exception's.
    """
    old_handlers = install_signal_handlers()
    stage, where = get(name), ""
    try:
        try:
            kwargs = vars(build_parser(stage, doc.split("\n\n")[0] if doc else None).parse_args(argv))
            if log_to_stderr:
                configure_logging()
            instance = [str(kwargs[o.dest]) for o in stage.options if o.positional]
            where = f" ({', '.join(instance)})" if instance else ""
            stage.load_params(kwargs["params_file"])  # fail fast on bad params, before Prefect starts
            if not _uses_prefect() and other_ranks is not None:
                other_ranks(**kwargs)
            else:
                from flows._prefect_api import prefect_api

                with prefect_api(announce=False):
                    (flow() if other_ranks is not None else flow)(**kwargs)
        except Exception as err:  # a clear one-line reason and a non-zero exit for DVC
            print(failure_line(f"{stage.name} stage failed{where}", err), file=sys.stderr)
            return 1
    except BaseException as err:  # SIGINT/SIGTERM, also one arriving while an error above is handled
        if not isinstance(err, Interrupted) and isinstance(getattr(err, "exit_code", None), int):
            print(f"{stage.name} stage interrupted: {err}", file=sys.stderr)  # the stage's own message
            return err.exit_code
        signum = signal_of(err)
        if signum is None:
            raise
        print(f"{stage.name} stage interrupted{where}: {interrupted_message(signum)}", file=sys.stderr)
        return 128 + signum
    finally:
        restore_signal_handlers(old_handlers)
    return 0
