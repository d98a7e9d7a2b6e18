"""Which Prefect server serves this repository (the ``flows.serve`` lock file, the health check), and how a
command stops a server it started."""

from __future__ import annotations

import contextlib
import fcntl
import os
import signal
import socket
import subprocess
from pathlib import Path
from typing import Any

import httpx
from filelock import FileLock, Timeout

from bert_core.constants import REPO_ROOT


class ServeError(RuntimeError):
    """The server could not be started or reached; the message says what to do."""


def prefect_home() -> Path:
    """``$PREFECT_HOME``, else the repository's ``.prefect`` (where ``make serve`` keeps its server)."""
    return Path(os.environ.get("PREFECT_HOME") or REPO_ROOT / ".prefect")


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port on ``host`` that was free a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def is_healthy(url: str, timeout: float = 2.0) -> bool:
    """``True`` when ``<url>/health`` answers 200 (a Prefect API, or an MLflow server's root)."""
    try:
        return httpx.get(f"{url}/health", timeout=timeout).status_code == 200
    except (httpx.HTTPError, httpx.InvalidURL, OSError, ValueError):
        return False


def stop_process(proc: subprocess.Popen[Any], grace_s: float = 20.0, signum: int = signal.SIGTERM) -> None:
    """Stop a server this command started: ``signum``, then SIGKILL after ``grace_s`` or at a second signal
    (a Ctrl-C while it stops)."""
    if proc.poll() is not None:
        return
    proc.send_signal(signum)
    try:
        proc.wait(timeout=grace_s)
    except (subprocess.TimeoutExpired, KeyboardInterrupt):
        proc.kill()
        proc.wait(timeout=10)


@contextlib.contextmanager
def serve_lock(home: Path, api: str):
    """One ``flows.serve`` per repository (a second runner would defeat ``limit=1``).

    An ``flock`` (released by the kernel when the holder dies); the file names the holder and its API URL.
    """
    home.mkdir(parents=True, exist_ok=True)
    path = home / "serve.lock"

    def claim(fd: int) -> None:
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"flows.serve pid {os.getpid()} api {api}\n".encode(), 0)

    lock = FileLock(path, mode=0o644, blocking=False, fallback_to_soft=False, on_acquired=claim)
    try:
        lock.acquire()
    except Timeout:
        holder = path.read_text(encoding="utf-8", errors="replace").strip()
        raise ServeError(f"this repository is already being served ({holder}); stop that one first") from None
    try:
        yield
    finally:
        lock.release()


def served_api_url(home: Path | None = None) -> str | None:
    """The API URL of the ``flows.serve`` now serving the repository whose PREFECT_HOME is ``home``, if any."""
    path = (home or prefect_home()) / "serve.lock"
    if not path.is_file():
        return None
    # A shared ``flock`` probe, which filelock does not offer (its read-write lock is a SQLite file, not
    # this flock): probes from several command lines at once must not see each other as the server.
    fd = os.open(path, os.O_RDONLY)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:  # held: a flows.serve is running
            words = path.read_text(encoding="utf-8", errors="replace").split()
            url = words[words.index("api") + 1] if "api" in words[:-1] else None
            return url if url and is_healthy(url) else None
        fcntl.flock(fd, fcntl.LOCK_UN)
        return None
    finally:
        os.close(fd)
