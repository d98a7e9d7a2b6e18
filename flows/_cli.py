"""The one command-line runner of the stage flows (``python -m flows.<stage>``): the parser from the stage
table, the params checked before Prefect starts, and the exit code DVC sees: 0 done; 1 any error, with one
line ``<stage> stage failed[ (<task>)]: <Type>: <message>``; 128 + signal number for SIGINT / SIGTERM
(or a stage's own interrupt that wrote a checkpoint), with one ``<stage> stage interrupted`` line. The
pipeline, ``predict``, ``ui`` and ``serve`` exit by the same rule (:func:`run_command`). A stage on several
processes of one machine (``pretrain.processes``) starts its DDP ranks here (:func:`run_ranks`).
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from typing import Any, NamedTuple, NoReturn

from flows.stages import Stage, get, producer


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


def configure_logging(level: int = logging.INFO) -> None:
    """``level`` and above of ``bert_core`` on stderr (for stages that log outside Prefect, e.g. torchrun
    ranks), formatted as Prefect's console handler formats them: one time stamp, one level, the logger
    name."""
    logging.basicConfig(level=level, format=CONSOLE_FORMAT, datefmt=CONSOLE_DATEFMT)
    logging.getLogger("httpx").setLevel(logging.WARNING)


def _without_traceback(record: logging.LogRecord) -> bool:
    """Drop the traceback from a console record of an error the project raises on purpose (a class of
    ``bert_core`` or ``flows``: refused input, a missing store ...), whose message says all; a bug's stays."""
    err = record.exc_info[1] if record.exc_info else None
    if err is not None and type(err).__module__.startswith(("bert_core.", "flows.")):
        record.exc_info, record.exc_text = None, None
    return True


def quiet_refusals() -> None:
    """Prefect's console lines name a refused input without the traceback Prefect logs for every flow
    failure (the one-line ``... failed: <Type>: <message>`` follows); the Prefect UI's log keeps it (its
    handler formats the record first)."""
    from prefect.logging.handlers import PrefectConsoleHandler

    for handler in logging.getLogger().handlers:
        if isinstance(handler, PrefectConsoleHandler) and _without_traceback not in handler.filters:
            handler.addFilter(_without_traceback)


#: The longest "stage failed" reason printed (characters); the full message stays in the Prefect log.
MAX_REASON_CHARS = 2000


def failure_line(prefix: str, err: BaseException, limit: int = MAX_REASON_CHARS) -> str:
    """``<prefix>: <Type>: <message>``, the message cut to ``limit`` characters (saying so): a library's
    message that embeds a whole file never becomes a megabyte-long line in DVC's log. A ``KeyError``'s
    message is its text, not the key's repr (which quotes it)."""
    message = str(err.args[0]) if isinstance(err, KeyError) and len(err.args) == 1 else str(err)
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
    """SIGINT and SIGTERM -> :class:`Interrupted` (SIGINT even when inherited as ignored) and a
    :class:`SignalRedelivery` hook; returns what was replaced (nothing off the main thread)."""
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

    A signal handler's exception raised inside a weakref callback or a finaliser is printed and dropped, and
    the stage would run on as if never signalled. This hook sends the same signal again from a short-lived
    thread, so the handler runs once more outside the callback; other exceptions go to the previous hook.
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


def exit_command(code: int) -> NoReturn:
    """End a command with exit status ``code``: a normal exit (threads joined, ``atexit`` handlers run),
    but with the live objects frozen out of the garbage collector first: the last collections over the heap
    Prefect, MLflow and torch leave cost 1.4-2.5 CPU-seconds per stage, for nothing."""
    gc.freeze()
    sys.exit(code)


def run_command(
    body: Callable[[], int | None],
    name: str,
    *,
    after_stop: str,
    instance: Callable[[], str] = lambda: "",
    errors: tuple[type[Exception], ...] = (Exception,),
) -> int:
    """Run a command's ``body`` under the stop-signal handlers and return its exit status, with one line on
    stderr for anything but success (``name``: ``predict``, ``finetune stage``; ``instance()``: `` (sst2)``):

    - ``body``'s own status (``None``: 0);
    - 1 for an error of ``errors``: ``<name> failed<instance>: <Type>: <message>`` (others are raised);
    - 128 + N for signal N: ``<name> interrupted<instance>: stopped by <SIGNAL><after_stop>``, also when the
      signal arrives while an error is being reported;
    - an interrupt's own ``exit_code`` (training that stopped itself after writing a checkpoint), also when a
      signal lands while it unwinds: ``<name> interrupted<instance>: <message>``.
    """
    old_handlers = install_signal_handlers()
    try:
        try:
            return body() or 0
        except errors as err:
            print(failure_line(f"{name} failed{instance()}", err), file=sys.stderr)
            return 1
    except BaseException as err:  # SIGINT/SIGTERM, also one arriving while an error above is handled
        if (own := _own_stop(err)) is not None:
            print(f"{name} interrupted{instance()}: {own}", file=sys.stderr)
            return own.exit_code
        signum = signal_of(err)
        if signum is None:
            raise
        from bert_core.tracking.busy import release_interrupted_writes
        from bert_core.tracking.run import sqlite_store_path, tracking_uri

        # else MLflow's own end_run at exit may wait on the lock of a store call the signal cut short
        release_interrupted_writes(err, sqlite_store_path(tracking_uri()))
        stopped = f"stopped by {signal.Signals(signum).name}{after_stop}"
        print(f"{name} interrupted{instance()}: {stopped}", file=sys.stderr)
        return 128 + signum
    finally:
        restore_signal_handlers(old_handlers)


def _own_stop(err: BaseException) -> Any:
    """The interrupt ``err`` carries that stopped on its own after writing a checkpoint (training's, with an
    ``exit_code``), also when a signal arrived while it unwound (a rank of several gets the stop from another
    rank first, and its own signal later): ``None`` when there is none."""
    seen: BaseException | None = err
    while seen is not None:
        stop = isinstance(seen, KeyboardInterrupt) and not isinstance(seen, Interrupted)
        if stop and isinstance(getattr(seen, "exit_code", None), int):
            return seen
        seen = seen.__context__
    return None


def _uses_prefect() -> bool:
    """Rank 0 (or no torchrun) reports to Prefect; the other ranks only train."""
    return int(os.environ.get("RANK", "0")) == 0


def is_rank() -> bool:
    """This process is one rank of several, started by ``torchrun`` or :func:`run_ranks`."""
    return "LOCAL_RANK" in os.environ


def run_ranks(processes: int, module: str, argv: list[str], *, grace_s: float = 30.0) -> int:
    """``python -m module argv`` as ``processes`` DDP ranks on this machine (the environment ``torchrun
    --standalone`` gives its ranks); their exit status: 0, the first failed rank's, or 128 + N after stop
    signal N.

    Each rank runs in a session of its own, so that a stop signal reaches it once: one to this process, or to
    its process group (as DVC and Ctrl-C send it), is passed to every rank, which writes a checkpoint and
    stops (rank 0 saying so). A rank that fails leaves the others waiting in a collective: they get SIGTERM,
    and SIGKILL ``grace_s`` later. Should this process die first, each rank stops itself as after SIGTERM
    (:func:`stop_with_launcher`).

    This process holds the ranks' rendezvous store, as torchrun's agent does, on a port it binds once: a
    port picked free and handed to rank 0 to bind could be taken by another program in between.
    """
    from torch.distributed import TCPStore

    log = logging.getLogger("bert_core.flows")
    store = TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    env = {
        # each rank its share of the cores (torch's default is all of them, in every rank)
        "OMP_NUM_THREADS": str(max(1, (os.cpu_count() or 1) // processes)),
        **os.environ,
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(store.port),
        "TORCHELASTIC_USE_AGENT_STORE": "True",  # every rank a client of ``store``
        "WORLD_SIZE": str(processes),
        "LOCAL_WORLD_SIZE": str(processes),
        LAUNCHER_PID: str(os.getpid()),
    }
    cmd = [sys.executable, "-m", module, *argv]
    log.info("%d processes (DDP, ranks 0-%d): %s", processes, processes - 1, " ".join(cmd[1:]))
    ranks = [
        subprocess.Popen(
            cmd,
            env={**env, "RANK": str(rank), "LOCAL_RANK": str(rank)},
            start_new_session=True,
        )
        for rank in range(processes)
    ]
    stopped_by: int | None = None
    failed: int | None = None  # the first failed rank's status
    failed_at = 0.0
    while True:
        try:  # the polls too: a signal that lands in one is passed on like any other
            if None not in (codes := [r.poll() for r in ranks]):
                break
            if failed is None and stopped_by is None and (bad := [c for c in codes if c]):
                failed, failed_at = _status(bad[0]), time.monotonic()
                _signal_all(ranks, signal.SIGTERM)
            elif failed is not None and time.monotonic() - failed_at > grace_s:
                _signal_all(ranks, signal.SIGKILL)
            time.sleep(0.1)
        except BaseException as err:
            signum = signal_of(err)
            if signum is None:
                _signal_all(ranks, signal.SIGKILL)
                raise
            stopped_by = stopped_by or signum
            _signal_all(ranks, signum)
    if stopped_by is not None:
        return 128 + stopped_by
    if failed is None and (bad := [c for c in codes if c]):  # failed as the others ended
        failed = _status(bad[0])
    return failed or 0


def _status(returncode: int) -> int:
    """A process's exit status as a shell gives it: a process killed by signal N (``-N``) is 128 + N."""
    return returncode if returncode >= 0 else 128 - returncode


def _signal_all(ranks: list[subprocess.Popen], signum: int) -> None:
    for rank in ranks:
        if rank.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                rank.send_signal(signum)


#: Set in each rank :func:`run_ranks` starts: the launcher's process id.
LAUNCHER_PID = "BERT_LAUNCHER_PID"


def stop_with_launcher() -> None:
    """In a rank that :func:`run_ranks` started: SIGTERM to itself, once, when the launcher is gone (killed
    without passing a signal on; the rank then belongs to another parent), so it checkpoints and stops."""
    launcher = int(os.environ.get(LAUNCHER_PID, "0"))

    def watch() -> None:
        while os.getppid() == launcher:
            time.sleep(0.2)
        os.kill(os.getpid(), signal.SIGTERM)

    if launcher:
        threading.Thread(target=watch, name="launcher-watch", daemon=True).start()


def check_inputs(stage: Stage, options: dict[str, Any]) -> None:
    """Refuse, before Prefect starts, an input that is an earlier stage's output and is not there (``--corpus``
    before the corpus stage ran, or mistyped), naming the stage that writes it."""
    for option in stage.options:
        if option.default in stage.data_deps and not os.path.exists(path := options[option.dest]):
            writer = producer(option.default)
            raise FileNotFoundError(
                f"{option.flag} {path} does not exist: it is the {writer} stage's output; run `dvc repro "
                f"{writer}` first, or give {option.flag} the path of one"
            )


def run_stage(
    name: str,
    flow: Callable[..., Any],
    argv: list[str] | None = None,
    *,
    doc: str | None = None,
    other_ranks: Callable[..., Any] | None = None,
    processes: Callable[[Any], int] | None = None,
    check: Callable[..., Any] | None = None,
    log_to_stderr: bool = False,
) -> int:
    """Parse ``argv``, validate the stage's params, call ``flow(**options)`` under the settled Prefect API;
    return the exit code. ``doc``'s first paragraph is the ``--help`` text. Under ``torchrun``, ranks other
    than 0 run ``other_ranks`` instead (no Prefect, no tracking), and ``flow`` is then a zero-argument
    function that builds the flow, so that they never import Prefect. Outside ``torchrun``, where
    ``processes(params)`` is more than 1, the command starts itself that many times (:func:`run_ranks`).
    ``check(params, **options)`` refuses what the flow would refuse first, before Prefect starts."""
    stage, where = get(name), [""]

    def body() -> int | None:
        kwargs = vars(build_parser(stage, doc.split("\n\n")[0] if doc else None).parse_args(argv))
        if log_to_stderr:  # under torchrun, rank 0 speaks for all: the others say only what goes wrong
            configure_logging(logging.INFO if _uses_prefect() else logging.WARNING)
        instance = [str(kwargs[o.dest]) for o in stage.options if o.positional]
        if not _uses_prefect():  # a DDP rank but the first: its lines name it
            instance.append(f"rank {os.environ['RANK']}")
        stop_with_launcher()
        where[0] = f" ({', '.join(instance)})" if instance else ""
        params = stage.load_params(kwargs["params_file"])  # fail fast on bad params, before Prefect starts
        check_inputs(stage, kwargs)
        if check is not None:
            check(params, **kwargs)
        if processes is not None and not is_rank() and (n := processes(params)) > 1:
            return run_ranks(n, stage.flow_module, sys.argv[1:] if argv is None else argv)
        if not _uses_prefect() and other_ranks is not None:
            other_ranks(**kwargs)
        else:
            from flows._prefect_api import prefect_api

            quiet_refusals()
            with prefect_api(announce=False):
                (flow() if other_ranks is not None else flow)(**kwargs)
        return None

    return run_command(
        body,
        f"{stage.name} stage",
        instance=lambda: where[0],
        after_stop=" before it finished; run it again (`dvc repro` reruns it)",
    )
