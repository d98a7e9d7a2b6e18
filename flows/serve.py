"""Serve the pipeline, each stage and batch prediction from a local Prefect server: ``make serve``.

What it serves, and how it starts and stops: docs/work-pools.md ("One machine") and docs/reliability.md.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from flows import TELEMETRY_OFF, stages
from flows._cli import RECEIVED, Interrupted, configure_logging, raise_interrupted, run_command
from flows._prefect_api import set_parent_death_signal
from flows._served import ServeError, is_healthy, prefect_home, serve_lock, stop_process

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 4200
DEPLOYMENT_NAME = "local"
#: How long the runner may take to pause the deployments when it stops.
PAUSE_TIMEOUT_S = 5.0

log = logging.getLogger("flows.serve")


def api_url(host: str, port: int) -> str:
    return f"http://{host}:{port}/api"


def prefect_env(home: Path, host: str, port: int, base: dict[str, str] | None = None) -> dict[str, str]:
    """Environment for the server, the runner and the flow runs: local home, loopback API, no telemetry."""
    env = dict(os.environ if base is None else base)
    env.update(TELEMETRY_OFF)
    env["PREFECT_HOME"] = str(home)
    env["PREFECT_API_URL"] = api_url(host, port)
    env["PREFECT_SERVER_API_HOST"] = host
    env["PREFECT_SERVER_API_PORT"] = str(port)
    env.setdefault("PYTHONUNBUFFERED", "1")
    return env


def port_in_use(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.settimeout(1.0)
        return sock.connect_ex((host, port)) == 0


def start_server(env: dict[str, str], log_path: Path, *, timeout_s: float = 180.0) -> subprocess.Popen[bytes]:
    """Start ``prefect server start`` and wait until it is healthy, else :class:`ServeError` (naming its log)."""
    host, port = env["PREFECT_SERVER_API_HOST"], int(env["PREFECT_SERVER_API_PORT"])
    if port_in_use(host, port):
        raise ServeError(
            f"port {port} on {host} is in use by something that is not a Prefect server; use --port"
        )
    log_path.parent.mkdir(parents=True, exist_ok=True)
    logfile = open(log_path, "ab")  # noqa: SIM115 - the child keeps writing to it
    command = [sys.executable, "-m", "prefect", "server", "start", "--analytics-off"]
    proc = subprocess.Popen(
        [*command, "--host", host, "--port", str(port)],
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=logfile,
        stderr=subprocess.STDOUT,
        # Its own session: a Ctrl-C or SIGTERM to the terminal's process group stops the runner first,
        # which then pauses its deployments on a live server; the server still dies with this process.
        start_new_session=True,
        preexec_fn=set_parent_death_signal if sys.platform.startswith("linux") else None,
    )
    logfile.close()
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if is_healthy(env["PREFECT_API_URL"]):
            return proc
        if proc.poll() is not None:
            raise ServeError(f"the Prefect server exited with code {proc.returncode}; see {log_path}")
        time.sleep(0.5)
    stop_process(proc)
    raise ServeError(f"the Prefect server did not answer within {timeout_s:.0f}s; see {log_path}")


def stage_flows(table: Iterable[stages.Stage] = stages.STAGES) -> list[Any]:
    """The Prefect flows of the stage table (``Stage.flow``: a flow, or a function that builds one); a stage
    whose flow fails to import or build, or is no Prefect flow, is skipped with a warning."""
    from prefect import Flow

    found = []
    for stage in table:
        try:
            obj = stages.resolve(stage.flow)
            built = obj if isinstance(obj, Flow) or not callable(obj) else obj()
            if not isinstance(built, Flow):
                raise TypeError(f"{built!r} is not a Prefect flow (nor a function returning one)")
        except Exception as err:
            log.warning("not serving %s: %s failed (%s: %s)", stage.name, stage.flow, type(err).__name__, err)
            continue
        found.append(built)
    return found


# Prefect flows served besides the pipeline and the stages: ("module:attribute", description).
EXTRA_FLOWS = (
    ("flows.predict:predict_flow", "Batch prediction of a JSON Lines file with a registered model."),
)


def build_deployments() -> list[Any]:
    """The pipeline's deployment, one per stage flow, then :data:`EXTRA_FLOWS` (module entrypoints: any cwd)."""
    from prefect.deployments.runner import EntrypointType

    from flows.pipeline import pipeline_flow

    pipeline = "The whole pipeline through DVC (dvc exp run): what reruns is DVC's decision."
    served = [(pipeline_flow, pipeline, ["bert", "pipeline"])]
    for flow in stage_flows():
        through_dvc = f"run bert-pipeline/{DEPLOYMENT_NAME} with targets=[{flow.name!r}]"
        outside = f"Stage flow {flow.name} on its own, outside DVC. To run it through DVC, {through_dvc}."
        served.append((flow, outside, ["bert", "stage"]))
    served += [(stages.resolve(path), description, ["bert"]) for path, description in EXTRA_FLOWS]
    return [
        flow.to_deployment(
            name=DEPLOYMENT_NAME,
            description=description,
            tags=tags,
            entrypoint_type=EntrypointType.MODULE_PATH,
        )
        for flow, description, tags in served
    ]


def bounded_pause(pause: Any, api: str, timeout_s: float = PAUSE_TIMEOUT_S) -> Any:
    """Prefect's ``Runner._pause_schedules``, skipped when the server at ``api`` is gone and bounded by
    ``timeout_s``: against a dead server the client retries for about a minute, logging tracebacks."""

    async def paused(runner: Any) -> None:
        if not await asyncio.to_thread(is_healthy, api):
            log.warning("the Prefect server at %s is gone: the deployments were not paused", api)
            return
        try:
            await asyncio.wait_for(pause(runner), timeout_s)
        except Exception as err:  # the timeout (TimeoutError) or the client: stopping anyway, say so
            log.warning("the deployments were not paused (%s: %s)", type(err).__name__, str(err)[:200])

    return paused


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m flows.serve", description=__doc__.split("\n\n")[0])
    parser.add_argument("--host", default=os.environ.get("PREFECT_SERVE_HOST", DEFAULT_HOST))
    parser.add_argument("--port", type=int, default=int(os.environ.get("PREFECT_SERVE_PORT", DEFAULT_PORT)))
    parser.add_argument(
        "--home", type=Path, default=None, help="PREFECT_HOME (default: $PREFECT_HOME or .prefect)"
    )
    args = parser.parse_args(argv)
    configure_logging()  # the stages' console format
    home = (args.home or prefect_home()).resolve()
    env = prefect_env(home, args.host, args.port)
    os.environ.update(env)  # before Prefect is imported: its settings come from the environment
    # The commands' one stop rule (run_command): its handlers are installed first, so a SIGINT that the
    # parent left ignored (`make serve &`) still stops it; exit 128 + N with one `serve interrupted` line.
    return run_command(
        lambda: _serve(env, home),
        "serve",
        after_stop="; no longer serving the flows",
        errors=(ServeError,),
    )


def _serve(env: dict[str, str], home: Path) -> None:
    """Serve the deployments until a stop signal, starting the server (host and port from ``env``, as
    :func:`prefect_env` set them) unless one answers already."""
    host, port, server = env["PREFECT_SERVER_API_HOST"], env["PREFECT_SERVER_API_PORT"], None
    try:
        with serve_lock(home, env["PREFECT_API_URL"]):
            if is_healthy(env["PREFECT_API_URL"]):
                log.info("using the Prefect server already running at %s", env["PREFECT_API_URL"])
            else:
                log.info("starting a Prefect server on %s:%s (home %s)", host, port, home)
                server = start_server(env, home / "server.log")
            deployments = build_deployments()
            log.info(
                "Prefect UI: http://%s:%s  (deployments: %s)",
                host,
                port,
                ", ".join(f"{d.flow_name}/{d.name}" for d in deployments),
            )
            from prefect import serve
            from prefect.runner import Runner

            # Prefect's runner replaces the SIGTERM handler with its own, which hangs in Prefect 3.8
            # ("coroutine 'Runner.astop' was never awaited"): SIGTERM stops it the way Ctrl-C does.
            Runner.handle_sigterm = lambda self, *a, **k: raise_interrupted(signal.SIGTERM, None)  # type: ignore[method-assign]
            Runner._pause_schedules = bounded_pause(Runner._pause_schedules, env["PREFECT_API_URL"])  # type: ignore[method-assign]
            serve(*deployments, limit=1)
    except Exception:
        if not RECEIVED:
            raise
        # the signal arrived while a library ran and came out as its own error (pydantic, importing fastapi)
    finally:
        if server is not None:
            log.info("stopping the Prefect server this command started")
            stop_process(server)
    if RECEIVED:  # prefect.serve swallows the interrupt: the stop comes from the first signal received
        raise Interrupted(RECEIVED[0])


if __name__ == "__main__":
    sys.exit(main())
