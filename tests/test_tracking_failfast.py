"""Failing fast on tracking: a server that does not answer, and a SQLite store removed mid-run.

Library level (``bert_core.tracking.run``): the pre-flight check against real loopback sockets (one that
refuses, one that accepts and never answers, tiny HTTP servers answering 200/401/503), the bounds on
retries, and ``rm mlflow.db`` while a stage run is open. The stage-command view of the unreachable server
is ``tests/faults/test_unreachable_tracking.py``.
"""

from __future__ import annotations

import http.server
import os
import socket
import threading
import time
from collections.abc import Iterator

import pytest

from bert_core.tracking import run as tracking_run
from bert_core.tracking import stage_run
from bert_core.tracking.run import (
    HTTP_CLIENT_DEFAULTS,
    TrackingStoreRemoved,
    TrackingUnavailable,
    bound_http_retries,
    check_tracking_server,
    retry_tracking,
)

pytestmark = pytest.mark.faults


def closed_port() -> int:
    """A loopback port with nothing listening (bound a moment ago, then released)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture
def silent_server() -> Iterator[str]:
    """A socket that accepts connections (the kernel completes the handshake) and never answers."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(64)
    try:
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    finally:
        sock.close()


def answering_server(status: int) -> tuple[http.server.HTTPServer, str]:
    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = b'{"experiments": []}'
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args) -> None:
            pass

    server = http.server.HTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, f"http://127.0.0.1:{server.server_address[1]}"


@pytest.fixture
def sleeps(monkeypatch) -> list[float]:
    delays: list[float] = []
    monkeypatch.setattr(tracking_run, "_sleep", delays.append)
    return delays


def test_a_refusing_server_is_named_with_what_to_do():
    uri = f"http://127.0.0.1:{closed_port()}"
    started = time.monotonic()
    with pytest.raises(TrackingUnavailable) as exc:
        check_tracking_server(uri, pause_s=0.1)
    assert time.monotonic() - started < 30
    msg = str(exc.value)
    assert uri in msg and "MLFLOW_TRACKING_URI" in msg and "connection refused" in msg
    assert "mlflow server" in msg and "unset it to use the local SQLite store" in msg and len(msg) < 600


def test_a_server_that_accepts_and_never_answers_times_out(silent_server):
    started = time.monotonic()
    with pytest.raises(TrackingUnavailable, match="no answer within 1 s") as exc:
        check_tracking_server(silent_server, attempts=2, timeout_s=1, pause_s=0.1)
    assert time.monotonic() - started < 30
    assert silent_server in str(exc.value) and "2 attempt(s)" in str(exc.value)


def test_answers_200_pass_5xx_fail_and_401_names_the_credentials():
    servers = {status: answering_server(status) for status in (200, 401, 503)}
    try:
        check_tracking_server(servers[200][1])
        with pytest.raises(TrackingUnavailable, match="HTTP 503"):
            check_tracking_server(servers[503][1], attempts=2, pause_s=0.1)
        with pytest.raises(
            TrackingUnavailable, match=r"refused this client \(HTTP 401\).*MLFLOW_TRACKING_USERNAME"
        ):
            check_tracking_server(servers[401][1])
    finally:
        for server, _ in servers.values():
            server.shutdown()
            server.server_close()


def test_a_password_in_the_uri_is_not_shown():
    port = closed_port()
    with pytest.raises(TrackingUnavailable) as exc:
        check_tracking_server(f"http://alice:s3cret-pw@127.0.0.1:{port}", attempts=1)
    assert "s3cret-pw" not in str(exc.value) and f"http://alice:***@127.0.0.1:{port}" in str(exc.value)


def test_sqlite_and_other_stores_need_no_check():
    check_tracking_server("sqlite:////nonexistent/dir/mlflow.db")
    check_tracking_server("databricks")


def test_stage_run_fails_before_opening_a_run(monkeypatch):
    uri = f"http://127.0.0.1:{closed_port()}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    entered = False
    with pytest.raises(TrackingUnavailable, match=uri), stage_run("unit", {"a": 1}):
        entered = True
    assert not entered


def test_mlflow_http_retries_are_bounded_unless_the_user_set_them(monkeypatch):
    for name in HTTP_CLIENT_DEFAULTS:  # recorded by monkeypatch, so the test leaves the environment as it was
        monkeypatch.setenv(name, "x")
        monkeypatch.delenv(name)
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_TIMEOUT", "300")
    bound_http_retries()
    assert os.environ["MLFLOW_HTTP_REQUEST_MAX_RETRIES"] == "2"
    assert os.environ["MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR"] == "1"
    assert os.environ["MLFLOW_HTTP_REQUEST_TIMEOUT"] == "300"  # the user's value wins
    from mlflow.environment_variables import MLFLOW_HTTP_REQUEST_MAX_RETRIES

    assert MLFLOW_HTTP_REQUEST_MAX_RETRIES.get() == 2  # MLflow reads it at each request


def test_retry_tracking_stops_when_its_time_budget_is_spent(sleeps):
    calls = []

    def always_down():
        calls.append(1)
        raise ConnectionError("down")

    with pytest.raises(ConnectionError):
        retry_tracking(always_down, budget_s=1.5)()
    assert sleeps == [0.5, 1.0] and len(calls) == 3  # the next pause (2 s) would pass the budget


@pytest.mark.parametrize("how", ["removed", "replaced by another file"])
def test_a_store_removed_mid_run_is_named_at_once(how, tmp_path, monkeypatch, sleeps):
    db = tmp_path / "store" / "mlflow.db"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{db}")
    with pytest.raises(TrackingStoreRemoved) as exc, stage_run("unit", {"a": 1}) as run:
        run.log_metrics({"x": 1.0})
        db.unlink()
        if how != "removed":
            db.write_bytes(b"")
        started = time.monotonic()
        try:
            run.log_metrics({"x": 2.0})
        finally:
            elapsed = time.monotonic() - started
    assert elapsed < 10 and sleeps == []  # no retry cycle
    assert str(exc.value).startswith(f"the MLflow store {db} was {how} while the stage ran")
    assert "re-run the stage" in str(exc.value)
    if how == "removed":  # the next stage run in the same process starts cleanly on a new store
        with stage_run("unit", {"a": 1}) as again:
            again.log_metrics({"x": 3.0})
        assert db.exists()


def test_a_failure_on_a_present_store_is_still_retried(sleeps):
    failures = iter([ConnectionError("blip")])

    def flaky():
        for err in failures:
            raise err
        return "ok"

    with stage_run("unit", None):
        assert retry_tracking(flaky)() == "ok"
    assert sleeps == [0.5]


def _locked_error() -> Exception:
    """What MLflow raises on a locked SQLite store: an MlflowException caused by sqlite3's OperationalError."""
    import sqlite3

    from mlflow.exceptions import MlflowException

    try:
        try:
            raise sqlite3.OperationalError("database is locked")
        except sqlite3.OperationalError as inner:
            raise MlflowException(
                "(sqlite3.OperationalError) database is locked\n[SQL: INSERT ...]"
            ) from inner
    except MlflowException as err:
        return err


def test_a_locked_sqlite_store_is_named_with_what_to_do_after_one_retry(tmp_path, monkeypatch, sleeps):
    from bert_core.tracking import TrackingStoreBusy

    db = tmp_path / "mlflow.db"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{db}")
    calls = []

    def locked():
        calls.append(1)
        raise _locked_error()

    with pytest.raises(TrackingStoreBusy) as exc:
        retry_tracking(locked)()
    assert len(calls) == 2 and sleeps == [0.5]  # MLflow waits 20 s per attempt itself: about 40 s in all
    msg = str(exc.value)
    assert msg.startswith(f"the MLflow store {db} is locked: another process is writing it")
    assert "Wait for that process" in msg and "use a tracking server (docs/reliability.md)" in msg
    assert "database is locked" in str(exc.value.__cause__)


def test_a_lock_that_clears_is_just_a_retry(tmp_path, monkeypatch, sleeps):
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path}/mlflow.db")
    failures = iter([_locked_error()])

    def once_locked():
        for err in failures:
            raise err
        return "ok"

    assert retry_tracking(once_locked)() == "ok" and sleeps == [0.5]


def test_locked_on_a_tracking_server_is_an_ordinary_failure(monkeypatch, sleeps):
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://127.0.0.1:5000")

    def locked():
        raise _locked_error()

    with pytest.raises(Exception, match="database is locked"):  # the server's store: its message, retried
        retry_tracking(locked, budget_s=1.5)()
    assert sleeps == [0.5, 1.0]


def test_reading_commands_fail_fast_too(monkeypatch, sleeps, capsys):
    """Comparing runs and loading a registered model: the same check first, instead of MLflow's own
    retries (four minutes against a port where nothing listens)."""
    from bert_core.serving import trusted
    from flows import compare

    uri = f"http://127.0.0.1:{closed_port()}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    assert compare.main(["latest~1", "latest"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: the MLflow tracking server {uri} (MLFLOW_TRACKING_URI) does not answer")
    with pytest.raises(
        trusted.ModelLoadError, match=rf"^the MLflow tracking server {uri} .* does not answer"
    ):
        trusted.load_model("models:/bert-sst2@champion")


def test_a_reading_command_never_creates_a_store_at_a_mistyped_path(monkeypatch, tmp_path, capsys):
    from flows import compare

    store = tmp_path / "typo" / "mlflow.db"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{store}")
    assert compare.main(["latest~1", "latest"]) == 2
    assert f"no MLflow tracking store at {store}: nothing has been tracked there" in capsys.readouterr().err
    assert not (tmp_path / "typo").exists()
    check_tracking_server(f"sqlite:///{store}")  # a stage creates its store
