"""End-to-end fixtures: a repository copy, a real Prefect server serving it, runs triggered like the UI does.

Everything listens on 127.0.0.1 on a free port, with its own PREFECT_HOME and MLflow store under the test's
temporary directory. Every process a fixture starts is stopped by its finaliser (the serve process group,
then anything still running inside the repository copy), and every wait is bounded.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from bert_core.constants import REPO_ROOT

SERVE_TIMEOUT_S = 300
FINAL_STATES = {"COMPLETED", "FAILED", "CRASHED", "CANCELLED"}


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def copy_repository(dest: Path) -> Path:
    """Copy the working tree (tracked and untracked, not ignored) into a fresh git repository at ``dest``."""
    files = subprocess.run(
        ["git", "ls-files", "-co", "--exclude-standard", "-z"],
        cwd=REPO_ROOT,
        check=True,
        capture_output=True,
        timeout=60,
    ).stdout.split(b"\0")
    for raw in files:
        if not raw:
            continue
        rel = raw.decode()
        src = REPO_ROOT / rel
        if not src.is_file() or rel.startswith(("metrics/", "mlflow.db", ".prefect/")):
            continue
        target = dest / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(src.read_bytes())
    (dest / "dvc.lock").unlink(missing_ok=True)  # start from nothing: every stage runs once
    for cmd in (
        ["git", "init", "-q"],
        ["git", "config", "user.email", "e2e@example.com"],
        ["git", "config", "user.name", "e2e"],
        ["git", "add", "-A"],
        ["git", "commit", "-q", "-m", "e2e copy"],
    ):
        subprocess.run(cmd, cwd=dest, check=True, capture_output=True, timeout=120)
    return dest


def stop_group(proc: subprocess.Popen) -> None:
    """SIGTERM the process group of ``proc`` (started with ``start_new_session``), SIGKILL it after 30 s."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)


def kill_strays(root: Path) -> list[int]:
    """SIGKILL processes whose working directory is inside ``root`` (all started by this test)."""
    killed = []
    me = os.getpid()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == me:
            continue
        try:
            cwd = Path(os.readlink(entry / "cwd"))
        except OSError:
            continue
        if cwd == root or root in cwd.parents:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(int(entry.name), signal.SIGKILL)
                killed.append(int(entry.name))
    return killed


@dataclass
class Served:
    """A running ``python -m flows.serve`` for one repository."""

    root: Path
    api_url: str
    ui_url: str
    proc: subprocess.Popen[bytes]
    log_path: Path
    mlflow_uri: str
    env: dict[str, str]

    def log_tail(self, n: int = 60) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return ""

    def settings(self) -> Any:
        from prefect.settings import PREFECT_API_URL, temporary_settings

        return temporary_settings(updates={PREFECT_API_URL: self.api_url})

    def trigger(self, deployment: str, parameters: dict[str, Any]) -> Any:
        """Create a flow run of a deployment through the API exactly as the UI's Run button does."""
        from prefect.deployments import run_deployment

        with self.settings():
            return run_deployment(deployment, parameters=parameters, timeout=0)

    def wait(self, flow_run_id: Any, timeout_s: float) -> Any:
        """Poll the flow run until it reaches a final state (bounded); return the FlowRun."""
        from prefect.client.orchestration import get_client

        deadline = time.monotonic() + timeout_s
        with self.settings(), get_client(sync_client=True) as client:
            while True:
                run = client.read_flow_run(flow_run_id)
                if run.state is not None and run.state.type.value in FINAL_STATES:
                    return run
                if self.proc.poll() is not None:
                    raise AssertionError(f"the serve process died:\n{self.log_tail()}")
                if time.monotonic() > deadline:
                    raise AssertionError(
                        f"flow run {flow_run_id} not finished after {timeout_s}s:\n{self.log_tail()}"
                    )
                time.sleep(2)

    def task_states(self, flow_run_id: Any, expected: dict[str, str] | None = None) -> dict[str, str]:
        """Task run name -> state name. Task states reach the server as events, a moment after the flow
        run ends: with ``expected``, poll (bounded) until they match."""
        from prefect.client.orchestration import get_client
        from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId

        deadline = time.monotonic() + 60
        with self.settings(), get_client(sync_client=True) as client:
            while True:
                runs = client.read_task_runs(
                    flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[flow_run_id]))
                )
                states = {r.name: r.state.name for r in runs if r.state is not None}
                if expected is None or states == expected or time.monotonic() > deadline:
                    return states
                time.sleep(1)

    def artifacts(self, flow_run_id: Any) -> dict[str, str]:
        from prefect.client.orchestration import get_client
        from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterFlowRunId

        with self.settings(), get_client(sync_client=True) as client:
            arts = client.read_artifacts(
                artifact_filter=ArtifactFilter(flow_run_id=ArtifactFilterFlowRunId(any_=[flow_run_id]))
            )
        return {a.key: a.data for a in arts if a.key}


def _deployment_ready(api_url: str, name: str) -> bool:
    try:
        with urllib.request.urlopen(f"{api_url}/deployments/name/{name}", timeout=5) as resp:
            return resp.status == 200 and json.loads(resp.read()).get("paused") is False
    except (urllib.error.URLError, OSError, ValueError):
        return False


@contextlib.contextmanager
def serve_repository(root: Path, tmp: Path, extra_env: dict[str, str] | None = None) -> Iterator[Served]:
    """Start ``python -m flows.serve`` for ``root`` on a free loopback port; stop everything afterwards."""
    port = free_port()
    home = tmp / "prefect-home"
    mlflow_uri = f"sqlite:///{tmp / 'mlflow.db'}"
    env = {
        **os.environ,
        "PREFECT_HOME": str(home),
        "MLFLOW_TRACKING_URI": mlflow_uri,
        "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
        "DO_NOT_TRACK": "true",
        "MLFLOW_DISABLE_TELEMETRY": "true",
        "DVC_NO_ANALYTICS": "1",
        "HF_HUB_OFFLINE": "1",
        "HF_DATASETS_OFFLINE": "1",
        "PYTHONUNBUFFERED": "1",
        **(extra_env or {}),
    }
    env.pop("PREFECT_API_URL", None)
    log_path = tmp / "serve.log"
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "flows.serve",
                "--host",
                "127.0.0.1",
                "--port",
                str(port),
                "--home",
                str(home),
            ],
            cwd=root,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    api_url = f"http://127.0.0.1:{port}/api"
    served = Served(root, api_url, f"http://127.0.0.1:{port}", proc, log_path, mlflow_uri, env)
    try:
        deadline = time.monotonic() + SERVE_TIMEOUT_S
        while not _deployment_ready(api_url, "bert-pipeline/local"):
            if proc.poll() is not None:
                raise AssertionError(f"flows.serve exited with {proc.returncode}:\n{served.log_tail()}")
            if time.monotonic() > deadline:
                raise AssertionError(f"flows.serve not ready after {SERVE_TIMEOUT_S}s:\n{served.log_tail()}")
            time.sleep(1)
        yield served
    finally:
        stop_group(proc)
        time.sleep(1)
        kill_strays(root)


@pytest.fixture(scope="module")
def shared_data_root() -> Path:
    from tests.conftest import shared_data_root as find

    root = find()
    if root is None:
        pytest.skip("../shared/data is not present on this machine")
    return root
