"""Fixtures of the fault suite: real processes, real servers on loopback, throw-away copies of the repo.

Everything started here runs in its own process group and is killed (SIGKILL to the group) by a finalizer,
whatever the test outcome; every server binds to 127.0.0.1 on a free port; every wait has a deadline.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from bert_core.constants import REPO_ROOT
from tests.conftest import shared_data_root

PY = sys.executable
VENV_BIN = Path(PY).parent
SHARED_DATA = shared_data_root()  # ../shared/data or $BERT_SHARED_DATA; None when not on this machine

# What a throw-away copy of the project needs to run its pipeline.
PROJECT_PATHS = ("bert_core", "flows", "params", "dvc.yaml", "pyproject.toml")


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait_http(url: str, *, timeout_s: float, proc: subprocess.Popen | None = None, log: Path | None = None):
    """Poll ``url`` until it answers 200; fail with the server's log tail when it dies or times out."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        with (
            contextlib.suppress(urllib.error.URLError, OSError, ValueError),
            urllib.request.urlopen(url, timeout=2) as resp,
        ):
            if resp.status == 200:
                return
        if proc is not None and proc.poll() is not None:
            break
        time.sleep(0.5)
    tail = log.read_text(errors="replace")[-3000:] if log is not None and log.exists() else ""
    state = f"exited with {proc.returncode}" if proc is not None and proc.poll() is not None else "timed out"
    raise RuntimeError(f"{url} did not come up ({state}). Log tail:\n{tail}")


def kill_group(proc: subprocess.Popen, sig: int = signal.SIGKILL, wait_s: float = 30.0) -> None:
    """Send ``sig`` to the process group of ``proc`` (it was started with ``start_new_session``)."""
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, sig)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=wait_s)
    # Children that outlived the leader (same group) get the signal too.
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)


class Processes:
    """Starts processes in their own groups and kills every one of them at teardown."""

    def __init__(self) -> None:
        self.started: list[subprocess.Popen] = []

    def start(self, cmd: list[str], *, log: Path | None = None, **kwargs) -> subprocess.Popen:
        if log is not None:
            log.parent.mkdir(parents=True, exist_ok=True)
            with open(log, "ab") as fh:
                proc = subprocess.Popen(
                    cmd,
                    stdin=subprocess.DEVNULL,
                    stdout=fh,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                    **kwargs,
                )
        else:
            proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, start_new_session=True, **kwargs)
        self.started.append(proc)
        return proc

    def kill_all(self) -> None:
        for proc in reversed(self.started):
            kill_group(proc)


@pytest.fixture
def procs() -> Iterator[Processes]:
    p = Processes()
    try:
        yield p
    finally:
        p.kill_all()


@pytest.fixture(scope="session")
def session_procs() -> Iterator[Processes]:
    p = Processes()
    try:
        yield p
    finally:
        p.kill_all()


def base_env(**extra: str) -> dict[str, str]:
    """Environment of a stage subprocess: this venv first on PATH, offline, no telemetry, one thread."""
    env = dict(os.environ)
    env.update(
        PATH=f"{VENV_BIN}{os.pathsep}{env.get('PATH', '')}",
        PYTHONUNBUFFERED="1",
        HF_HUB_OFFLINE="1",
        HF_DATASETS_OFFLINE="1",
        DO_NOT_TRACK="true",
        MLFLOW_DISABLE_TELEMETRY="true",
        PREFECT_SERVER_ANALYTICS_ENABLED="false",
        GX_ANALYTICS_ENABLED="false",
        DVC_NO_ANALYTICS="1",
        OMP_NUM_THREADS="1",
        MKL_NUM_THREADS="1",
        TOKENIZERS_PARALLELISM="false",
    )
    # The code under test is this checkout's, also from a second worktree of an editable install.
    env["PYTHONPATH"] = str(REPO_ROOT)
    env.update(extra)
    return env


class PrefectServer:
    """The Prefect server the project itself starts (``flows.serve.start_server``), on a free loopback port."""

    def __init__(self, home: Path) -> None:
        from flows.serve import DEFAULT_HOST, prefect_env

        self.home = home
        self.port = free_port()
        self.env = prefect_env(home, DEFAULT_HOST, self.port, base=base_env())
        self.api_url = self.env["PREFECT_API_URL"]
        self.proc: subprocess.Popen | None = None

    def start(self) -> None:
        from flows.serve import start_server

        self.proc = start_server(self.env, self.home / "server.log", timeout_s=300)

    def stop(self) -> None:
        import psutil

        from flows.serve import stop_process

        if self.proc is None:
            return
        try:
            children = psutil.Process(self.proc.pid).children(recursive=True)
        except psutil.Error:
            children = []
        stop_process(self.proc)
        for child in children:  # e.g. the uvicorn worker, should it outlive its parent
            with contextlib.suppress(psutil.Error):
                child.kill()


@pytest.fixture(scope="session")
def prefect_server(tmp_path_factory) -> Iterator[PrefectServer]:
    """A real Prefect server (its own home and SQLite) started the way ``make serve`` starts it.

    Stage flows report to it; without it every ``python -m flows.<stage>`` would start (and migrate) its
    own temporary server.
    """
    server = PrefectServer(tmp_path_factory.mktemp("prefect-home"))
    try:
        server.start()
        yield server
    finally:
        server.stop()


def migrated_prefect_home(server: PrefectServer, dest: Path) -> Path:
    """A fresh PREFECT_HOME holding a copy of ``server``'s database (SQLite backup API: consistent while it
    runs), so that a temporary server started there skips the minute of migrations of an empty database."""
    import sqlite3

    dest.mkdir(parents=True, exist_ok=True)
    src = sqlite3.connect(server.home / "prefect.db")
    dst = sqlite3.connect(dest / "prefect.db")
    try:
        src.backup(dst)
    finally:
        dst.close()
        src.close()
    memo = server.home / "memo_store.toml"
    if memo.is_file():
        shutil.copy2(memo, dest / memo.name)
    return dest


@pytest.fixture(scope="session")
def prefect_api(prefect_server) -> str:
    return prefect_server.api_url


def stage_env(prefect_api: str | None, tracking_uri: str, **extra: str) -> dict[str, str]:
    """Environment of a stage run: local data root, its own MLflow store, the session's Prefect server."""
    env = base_env(MLFLOW_TRACKING_URI=tracking_uri, **extra)
    if SHARED_DATA is not None:
        env.setdefault("BERT_DATA_ROOT", str(SHARED_DATA))
    if prefect_api:
        env["PREFECT_API_URL"] = prefect_api
    return env


def run_cmd(
    cmd: list[str], *, cwd: Path, env: dict[str, str], timeout: float = 300
) -> subprocess.CompletedProcess:
    """Run to completion in its own process group; on timeout the whole group is killed."""
    proc = subprocess.Popen(
        cmd,
        cwd=cwd,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        kill_group(proc)
        out, err = proc.communicate()
        raise AssertionError(
            f"{' '.join(cmd)} did not finish within {timeout:.0f}s\nstdout:\n{out[-3000:]}\nstderr:\n{err[-3000:]}"
        ) from None
    finally:
        kill_group(proc, wait_s=5)
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err)


def copy_project(dest: Path, paths: tuple[str, ...] = PROJECT_PATHS) -> Path:
    """Copy the project's code and params (the working tree, as the other tests see it) to ``dest``."""
    dest.mkdir(parents=True, exist_ok=True)
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", ".ruff_cache")
    for rel in paths:
        src = REPO_ROOT / rel
        if src.is_dir():
            shutil.copytree(src, dest / rel, ignore=ignore)
        elif src.is_file():
            shutil.copy2(src, dest / rel)
    return dest


def git_dvc_init(root: Path) -> None:
    """Make ``root`` a git + DVC repository with everything committed."""
    env = base_env(
        GIT_AUTHOR_NAME="faults",
        GIT_AUTHOR_EMAIL="faults@example.com",
        GIT_COMMITTER_NAME="faults",
        GIT_COMMITTER_EMAIL="faults@example.com",
    )
    (root / ".gitignore").write_text(
        "__pycache__/\n*.pyc\nmlflow.db\nmlruns/\nmlartifacts/\n.prefect/\n/data/\n/models/\n/outputs/\n"
    )
    for cmd in (
        ["git", "init", "-q"],
        [PY, "-m", "dvc", "init", "-q"],
        [PY, "-m", "dvc", "config", "core.autostage", "true"],
        [PY, "-m", "dvc", "config", "core.analytics", "false"],
        ["git", "add", "-A"],
        ["git", "commit", "-q", "-m", "project copy for the fault suite"],
    ):
        res = subprocess.run(cmd, cwd=root, env=env, capture_output=True, text=True, timeout=120)
        assert res.returncode == 0, f"{cmd}: {res.stderr[-2000:]}"


def git_commit_all(root: Path, message: str) -> None:
    env = base_env(
        GIT_AUTHOR_NAME="faults",
        GIT_AUTHOR_EMAIL="faults@example.com",
        GIT_COMMITTER_NAME="faults",
        GIT_COMMITTER_EMAIL="faults@example.com",
    )
    for cmd in (["git", "add", "-A"], ["git", "commit", "-q", "--allow-empty", "-m", message]):
        res = subprocess.run(cmd, cwd=root, env=env, capture_output=True, text=True, timeout=60)
        assert res.returncode == 0, f"{cmd}: {res.stderr[-2000:]}"


def temp_leftovers(root: Path) -> list[Path]:
    """Leftovers of interrupted atomic writes (``.<name>.tmp-*``) anywhere under ``root``."""
    return [p for p in root.rglob(".*.tmp-*")]


# Fake credentials put into the environment of every pipeline stage the suite runs: none may show up in
# params, tags, metrics, artifacts, outputs or logs (tests/faults/test_security.py).
FAKE_SECRETS = {
    "AWS_SECRET_ACCESS_KEY": "fake-aws-secret-7f3a9c1e",
    "MLFLOW_TRACKING_PASSWORD": "fake-mlflow-password-52b8d0",
    "HF_TOKEN": "hf_fakeTokenForTheFaultSuite9d2e",
    "DATABASE_PASSWORD": "fake-db-password-a41c77",
}


@pytest.fixture(scope="session")
def tiny_pipeline(tmp_path_factory, prefect_api):
    """The project's pipeline in a throw-away repository (tiny params); build stages with ``.build()``."""
    from .pipeline_repo import TinyPipeline

    if SHARED_DATA is None:
        pytest.skip("../shared/data is not present on this machine")

    return TinyPipeline.create(tmp_path_factory.mktemp("pipeline") / "repo", prefect_api)
