"""The Prefect API a command-line flow run reports to, settled before the flow starts.

``PREFECT_API_URL`` (checked: one that does not answer fails within seconds), else the server of
``make serve``, else a temporary local server in its own session. docs/reliability.md has the behaviour.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
import urllib.parse
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from flows._served import free_port, served_api_url

ADVICE = (
    "Start the server (`make serve`), fix PREFECT_API_URL, or unset it to report to a temporary local server."
)


class PrefectApiUnreachable(RuntimeError):
    """``PREFECT_API_URL`` does not answer or refuses the credentials; the message masks the password."""


def mask_url(url: str) -> str:
    """``url`` with the password of its userinfo masked (``http://user:secret@host`` -> ``http://user:***@host``)."""
    try:
        parts = urllib.parse.urlsplit(url)
        password = parts.password
    except ValueError:
        return url
    if password is None:
        return url
    host = parts.netloc.rsplit("@", 1)[-1]
    return urllib.parse.urlunsplit(parts._replace(netloc=f"{parts.username}:***@{host}"))


def _secrets(url: str) -> list[str]:
    """The secrets a message about ``url`` must never show: its password, the auth string, the key."""
    from prefect.settings import PREFECT_API_AUTH_STRING, PREFECT_API_KEY

    found = [PREFECT_API_AUTH_STRING.value(), PREFECT_API_KEY.value()]
    with contextlib.suppress(ValueError):
        parts = urllib.parse.urlsplit(url)
        found += [parts.password, urllib.parse.unquote(parts.password or "")]
    return sorted({s for s in found if s}, key=len, reverse=True)  # longest first: no partial leftovers


def _masked(text: str, secrets: list[str]) -> str:
    for secret in secrets:
        text = text.replace(secret, "***")
    return text


def _health(url: str, timeout_s: float) -> tuple[str | None, int | None]:
    """``(None, None)`` when ``<url>/health`` answers 200, else a short reason and the HTTP status; asked
    through Prefect's own client, so the credentials and TLS settings are those its flow runs will use."""
    from prefect.client.orchestration import get_client
    from prefect.settings import PREFECT_API_URL, PREFECT_CLIENT_MAX_RETRIES, temporary_settings

    try:
        with (
            temporary_settings(updates={PREFECT_API_URL: url, PREFECT_CLIENT_MAX_RETRIES: 0}),
            get_client(sync_client=True, httpx_settings={"timeout": timeout_s}) as client,
        ):
            err = client.api_healthcheck()
    except Exception as failed:  # a URL or TLS setting the client refuses
        err = failed
    if err is None:
        return None, None
    status = getattr(getattr(err, "response", None), "status_code", None)
    return (f"HTTP {status}" if status else (str(err) or type(err).__name__)[:200]), status


def check_api(
    url: str,
    *,
    attempts: int = 3,
    timeout_s: float = 3.0,
    pause_s: float = 1.0,
    advice: str = ADVICE,
) -> None:
    """Raise :class:`PrefectApiUnreachable` ending with ``advice`` unless ``<url>/health`` answers within
    ``attempts`` tries; refused credentials (HTTP 401/403) fail at once."""
    started = time.monotonic()
    secrets = _secrets(url)
    shown = _masked(mask_url(url), secrets)
    reason = "no answer"
    for attempt in range(attempts):
        why, status = _health(url, timeout_s)
        if why is None:
            return
        reason = _masked(why, secrets)
        if status in (401, 403):
            raise PrefectApiUnreachable(
                f"the Prefect server at {shown} refused the credentials (HTTP {status}): set "
                "PREFECT_API_AUTH_STRING (basic auth, 'user:password') / PREFECT_API_KEY (bearer token), "
                "or put them in PREFECT_API_URL (http://user:password@host/api)"
            )
        if attempt + 1 < attempts:
            time.sleep(pause_s)
    raise PrefectApiUnreachable(
        f"the Prefect API at PREFECT_API_URL={shown} does not answer ({shown.rstrip('/')}/health: {reason}; "
        f"{attempts} attempts in {time.monotonic() - started:.0f}s). {advice}"
    )


def set_parent_death_signal() -> None:  # pragma: no cover - runs in the child between fork and exec
    """Linux: SIGTERM to this child when the process that started it dies (even by SIGKILL)."""
    with contextlib.suppress(Exception):
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


def _temporary_server_class() -> type:
    from prefect.server.api.server import SubprocessASGIServer
    from prefect.settings import get_current_settings

    class SessionASGIServer(SubprocessASGIServer):
        """Prefect's temporary server, started in a new session: a terminal's Ctrl-C does not reach it."""

        def _run_uvicorn_command(self) -> subprocess.Popen[Any]:
            import prefect

            command = [sys.executable, "-m", "uvicorn", "--app-dir", str(prefect.__module_path__.parent)]
            command += ["--factory", "prefect.server.api.server:create_app", "--host", "127.0.0.1"]
            command += ["--port", str(self.port), "--log-level", "error", "--lifespan", "on"]
            return subprocess.Popen(
                args=command,
                env={
                    **os.environ,
                    "PREFECT_UI_ENABLED": "0",
                    "PREFECT__SERVER_EPHEMERAL": "1",
                    "PREFECT__SERVER_FINAL": "1",
                    **get_current_settings().to_environment_variables(exclude_unset=True),
                },
                stdin=subprocess.DEVNULL,
                start_new_session=True,
                preexec_fn=set_parent_death_signal if sys.platform.startswith("linux") else None,
            )

    return SessionASGIServer


@contextlib.contextmanager
def prefect_api(home: Path | None = None, *, announce: bool = True) -> Iterator[str | None]:
    """Settle the Prefect API for the flow runs of this block; yields its URL (``None``: Prefect decides)."""
    from prefect.settings import PREFECT_API_URL, get_current_settings, temporary_settings

    if url := PREFECT_API_URL.value():
        check_api(url)
        yield url
        return
    if not get_current_settings().server.ephemeral.enabled:  # Prefect gives its own error
        yield None
        return
    server = None
    if url := served_api_url(home):
        if announce:
            print(f"reporting to the Prefect server of `make serve` at {url}", file=sys.stderr)
    else:
        server = _temporary_server_class()(port=free_port())
        server.start()
        url = server.api_url
    previous = os.environ.get("PREFECT_API_URL")
    os.environ["PREFECT_API_URL"] = url  # for the subprocesses (DVC and its stages)
    try:
        with temporary_settings(updates={PREFECT_API_URL: url}):
            yield url
    finally:
        if previous is None:
            os.environ.pop("PREFECT_API_URL", None)
        else:
            os.environ["PREFECT_API_URL"] = previous
        if server is not None:
            _drain_workers()  # logs and events still queued go out before their server stops
            server.stop()


def _drain_workers(timeout_s: float = 5.0) -> None:
    for worker in ("prefect.logging.handlers.APILogWorker", "prefect.events.worker.EventsWorker"):
        module, _, name = worker.rpartition(".")
        if module in sys.modules:
            with contextlib.suppress(Exception):
                getattr(sys.modules[module], name).drain_all(timeout=timeout_s, at_exit=False)
