"""The one command-line runner of the stage flows (``python -m flows.<stage>``).

Builds the argument parser from the stage's options in :data:`flows.stages.STAGES` (so the default
paths are spelled once), validates the params before Prefect starts (fail fast), runs the flow and turns
the outcome into the exit code DVC sees:

- 0: done;
- 1: any error, with one line ``<stage> stage failed[ (<task>)]: <Type>: <message>`` on stderr;
- ``err.exit_code`` (128 + signal number) for the stage's ``interrupted`` exceptions (pretraining stopped
  by SIGTERM/SIGINT after writing a checkpoint), with ``<stage> stage interrupted: <message>``.
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Callable
from typing import Any

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


def configure_logging() -> None:
    """INFO lines of ``bert_core`` on stderr (for stages that log outside Prefect, e.g. torchrun ranks)."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
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


def run_stage(
    name: str,
    flow: Callable[..., Any],
    argv: list[str] | None = None,
    *,
    doc: str | None = None,
    interrupted: tuple[type[BaseException], ...] = (),
    log_to_stderr: bool = False,
) -> int:
    """Parse ``argv``, validate the stage's params, call ``flow(**options)``; return the exit code.

    Args:
        name: The stage (a row of the stage table).
        flow: Called with one keyword argument per option (the flow function's parameters).
        argv: Command-line arguments (default ``sys.argv[1:]``).
        doc: The flow module's docstring; its first paragraph is the ``--help`` description.
        interrupted: Exceptions that mean "stopped by a signal, resumable"; their ``exit_code`` is returned.
        log_to_stderr: Configure logging to stderr first.
    """
    stage = get(name)
    parser = build_parser(stage, doc.split("\n\n")[0] if doc else None)
    kwargs = vars(parser.parse_args(argv))
    if log_to_stderr:
        configure_logging()
    instance = [str(kwargs[o.dest]) for o in stage.options if o.positional]
    where = f" ({', '.join(instance)})" if instance else ""
    try:
        stage.load_params(kwargs["params_file"])  # fail fast on bad params, before Prefect starts
        flow(**kwargs)
    except interrupted as err:
        print(f"{stage.name} stage interrupted: {err}", file=sys.stderr)
        return int(getattr(err, "exit_code", 1))
    except Exception as err:  # a clear one-line reason and a non-zero exit for DVC
        print(failure_line(f"{stage.name} stage failed{where}", err), file=sys.stderr)
        return 1
    return 0
