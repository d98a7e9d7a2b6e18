"""``make ui`` (``python -m flows.ui``) stopped by a signal: the commands' one line, 128 + N, the UI server
gone with it. A stand-in for ``mlflow ui`` (shadowing ``mlflow`` on ``PYTHONPATH``) keeps each case to
about a second; the real server: tests/e2e/test_ui_e2e.py."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from bert_core.constants import REPO_ROOT
from flows import ui
from flows._served import free_port

#: ``python -m mlflow ui ... --port P``: writes its pid, then answers ``/health`` (``serve``), never
#: answers (``deaf``) or exits with status 3 (``exit``); a signal ends it quietly.
STAND_IN = """
import http.server
import os
import pathlib
import signal
import sys
import time

for signum in (signal.SIGINT, signal.SIGTERM):
    signal.signal(signum, lambda *_: sys.exit(0))
pathlib.Path(os.environ["UI_STAND_IN_PID"]).write_text(str(os.getpid()))
mode = os.environ["UI_STAND_IN"]
if mode == "exit":
    sys.exit(3)
if mode == "deaf":
    time.sleep(600)


class Health(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200)
        self.end_headers()

    def log_message(self, *args):
        pass


port = int(sys.argv[sys.argv.index("--port") + 1])
http.server.HTTPServer(("127.0.0.1", port), Health).serve_forever()
"""


def _stand_in(tmp_path: Path) -> tuple[Path, Path]:
    """The folder to put first on ``PYTHONPATH`` and the file the stand-in writes its pid to."""
    package = tmp_path / "stand_in" / "mlflow"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "__main__.py").write_text(STAND_IN)
    return package.parent, tmp_path / "server.pid"


def _start_ui(tmp_path: Path, mode: str) -> tuple[subprocess.Popen[str], Path]:
    path, pid_file = _stand_in(tmp_path)
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(path), str(REPO_ROOT)]),
        "UI_STAND_IN": mode,
        "UI_STAND_IN_PID": str(pid_file),
    }
    cmd = [
        sys.executable,
        "-m",
        "flows.ui",
        "--backend-store-uri",
        "sqlite:///x.db",
        "--port",
        str(free_port()),
    ]
    proc = subprocess.Popen(
        cmd, env=env, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    return proc, pid_file


def _wait_for(ready, proc: subprocess.Popen[str], timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not ready():
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, "the stand-in UI server never started"
        time.sleep(0.05)


@pytest.mark.parametrize(
    ("signum", "answered"),
    [(signal.SIGTERM, True), (signal.SIGINT, False)],
    ids=["SIGTERM once the links are out", "SIGINT before the server answers"],
)
def test_a_signal_stops_the_ui_server_and_exits_128_plus_n(tmp_path, signum, answered):
    proc, pid_file = _start_ui(tmp_path, "serve" if answered else "deaf")
    first_line: list[str] = []
    try:
        _wait_for(lambda: pid_file.exists() and pid_file.read_text(), proc)
        if answered:  # the links (here: the line saying the experiments could not be listed)
            _wait_for(lambda: first_line.append(proc.stdout.readline()) or first_line[-1], proc)
        server = int(pid_file.read_text())
        proc.send_signal(signum)  # to flows.ui alone: the server has it from flows.ui
        out, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    name = signal.Signals(signum).name
    assert proc.returncode == 128 + signum, err
    assert err.splitlines() == [f"ui interrupted: stopped by {name}; the MLflow UI server was stopped"]
    assert not psutil.pid_exists(server)
    if answered:
        assert first_line[0].startswith("MLflow UI: http://127.0.0.1:"), first_line
    else:
        assert out == ""  # no links for a server that never answered


def test_a_ui_server_that_exits_by_itself_gives_its_exit_status(tmp_path):
    proc, _ = _start_ui(tmp_path, "exit")
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 3, err
    assert out == "" and "interrupted" not in err


def test_a_ui_server_that_ignores_the_signal_is_killed_after_the_grace_period():
    from flows._served import stop_process

    stubborn = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print(flush=True); time.sleep(60)"
    proc = subprocess.Popen([sys.executable, "-c", stubborn], stdout=subprocess.PIPE)
    try:
        proc.stdout.readline()  # its handler is in place
        started = time.monotonic()
        stop_process(proc, 0.5, signal.SIGTERM)
        assert proc.returncode == -signal.SIGKILL
        assert time.monotonic() - started < 10
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()
        proc.stdout.close()


def test_a_ui_server_that_never_answers_is_stopped_after_the_start_timeout(tmp_path, monkeypatch, capsys):
    path, pid_file = _stand_in(tmp_path)
    monkeypatch.setenv("PYTHONPATH", str(path))  # the server's; this process keeps its mlflow
    monkeypatch.setenv("UI_STAND_IN", "deaf")
    monkeypatch.setenv("UI_STAND_IN_PID", str(pid_file))
    monkeypatch.setattr(ui, "START_TIMEOUT_S", 1.0)
    monkeypatch.setattr(ui, "_lines", lambda url, store: [f"links of {url}"])
    port = free_port()
    assert ui.main(["--backend-store-uri", f"sqlite:///{tmp_path}/x.db", "--port", str(port)]) == 1
    out, err = capsys.readouterr()
    assert out == ""
    assert err.splitlines() == [
        f"ui failed: TimeoutError: mlflow ui did not answer on http://127.0.0.1:{port} within 1 s"
    ]
    assert not psutil.pid_exists(int(pid_file.read_text()))
