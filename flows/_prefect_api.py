"""The Prefect API a command-line flow run reports to, settled before the flow starts.

:func:`prefect_api` is entered by every command line that runs a flow (the stage CLIs through
:func:`flows._cli.run_stage`, ``python -m flows.pipeline``):

- ``PREFECT_API_URL`` set (environment or Prefect profile): a pre-flight ``<url>/health`` check with a
  few bounded attempts (about 10 s in all). A URL that does not answer is a :class:`PrefectApiUnreachable`
  naming the URL and what to do, instead of minutes of the Prefect client's silent retries. The check
  sends what Prefect's own client sends (``PREFECT_API_AUTH_STRING`` as basic auth, else
  ``PREFECT_API_KEY`` as a bearer token, credentials in the URL, the TLS settings), so a server behind an
  authenticating proxy passes it; credentials it refuses (401/403) are named as such. No message shows
  a password, an auth string or a key.
- else the server of ``make serve`` when one serves this repository (``.prefect/serve.lock``);
- else a temporary local server, started here **in its own session** (process group), so that a Ctrl-C in
  the terminal (SIGINT to the foreground process group) reaches the stage but not the server: the flow
  run can still be marked Crashed and the process exits at once with 130, instead of retrying a dead API
  for minutes. It is Prefect's own temporary server (``SubprocessASGIServer``: uvicorn on a free loopback
  port, no UI), stopped when the block ends; on Linux it also gets SIGTERM when this process dies (even by
  SIGKILL), so it never outlives the run.
"""

from __future__ import annotations

import base64
import contextlib
import os
import signal
import ssl
import subprocess
import sys
import time
import urllib.parse
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from flows._served import free_port, served_api_url

HEALTH_ATTEMPTS = 3
HEALTH_TIMEOUT_S = 3.0
HEALTH_PAUSE_S = 1.0
ADVICE = (
    "Start the server (`make serve`), fix PREFECT_API_URL, or unset it to report to a temporary local server."
)


class PrefectApiUnreachable(RuntimeError):
    """``PREFECT_API_URL`` does not answer, or refuses the credentials; the message names the URL (its
    password masked) and what to do."""


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


def _client_settings() -> dict[str, Any]:
    """Headers and TLS verification as Prefect's client builds them (``PrefectClient.__init__``).

    ``PREFECT_API_AUTH_STRING`` wins over ``PREFECT_API_KEY``, as there. Credentials in the URL need
    nothing here: httpx sends them as basic auth, for this probe as for Prefect's client.
    """
    from prefect.settings import (
        PREFECT_API_AUTH_STRING,
        PREFECT_API_KEY,
        PREFECT_API_SSL_CERT_FILE,
        PREFECT_API_TLS_INSECURE_SKIP_VERIFY,
    )

    headers = {}
    if auth_string := PREFECT_API_AUTH_STRING.value():
        headers["Authorization"] = "Basic " + base64.b64encode(auth_string.encode("utf-8")).decode("ascii")
    elif api_key := PREFECT_API_KEY.value():
        headers["Authorization"] = f"Bearer {api_key}"
    if PREFECT_API_TLS_INSECURE_SKIP_VERIFY.value():
        verify: ssl.SSLContext | bool = False
    else:
        import certifi

        verify = ssl.create_default_context(cafile=PREFECT_API_SSL_CERT_FILE.value() or certifi.where())
    return {"headers": headers, "verify": verify}


def _health(url: str, timeout_s: float) -> tuple[str | None, int | None]:
    """``(None, None)`` when ``<url>/health`` answers 200, else a short reason and the HTTP status."""
    import httpx

    try:
        resp = httpx.get(f"{url.rstrip('/')}/health", timeout=timeout_s, **_client_settings())
    except httpx.HTTPError as err:
        return (str(err) or type(err).__name__)[:200], None
    except (OSError, ValueError, ssl.SSLError) as err:
        return f"{type(err).__name__}: {str(err)[:200]}", None
    return (None, None) if resp.status_code == 200 else (f"HTTP {resp.status_code}", resp.status_code)


def check_api(
    url: str,
    *,
    attempts: int = HEALTH_ATTEMPTS,
    timeout_s: float = HEALTH_TIMEOUT_S,
    pause_s: float = HEALTH_PAUSE_S,
    advice: str = ADVICE,
) -> None:
    """Raise :class:`PrefectApiUnreachable` unless ``<url>/health`` answers within ``attempts`` tries;
    its message ends with ``advice`` (what to do). Refused credentials (HTTP 401/403) fail at once: a
    retry would send the same ones."""
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

            return subprocess.Popen(
                args=[
                    sys.executable,
                    "-m",
                    "uvicorn",
                    "--app-dir",
                    str(prefect.__module_path__.parent),
                    "--factory",
                    "prefect.server.api.server:create_app",
                    "--host",
                    "127.0.0.1",
                    "--port",
                    str(self.port),
                    "--log-level",
                    "error",
                    "--lifespan",
                    "on",
                ],
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
    """Settle the Prefect API for the flow runs of this block; yields its URL (``None``: Prefect decides).

    Raises:
        PrefectApiUnreachable: ``PREFECT_API_URL`` is set and does not answer.
    """
    from prefect.settings import PREFECT_API_URL, get_current_settings, temporary_settings

    if url := PREFECT_API_URL.value():
        check_api(url)
        yield url
        return
    if not get_current_settings().server.ephemeral.enabled:  # Prefect gives its own error
        yield None
        return
    from bert_core.constants import REPO_ROOT

    home = home or Path(os.environ.get("PREFECT_HOME") or REPO_ROOT / ".prefect")
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
    for module, name in (
        ("prefect.logging.handlers", "APILogWorker"),
        ("prefect.events.worker", "EventsWorker"),
    ):
        with contextlib.suppress(Exception):
            worker = getattr(sys.modules[module], name) if module in sys.modules else None
            if worker is not None:
                worker.drain_all(timeout=timeout_s, at_exit=False)
