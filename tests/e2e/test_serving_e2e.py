"""``mlflow models serve`` on a registered version of every kind answers ``POST /invocations`` as the model
does in process, and refuses bad requests with a clear 4xx without going down.

One real serving process per kind (``--env-manager local``, 127.0.0.1, a free port), over tiny random
models registered in a temporary MLflow store (tests/serving_models.py). Every wait is bounded; every
process is stopped by the fixture's finaliser.
"""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parents[1]))
from serving_models import REQUESTS, SERVED, alias, register_all

from tests.e2e.conftest import free_port

pytestmark = pytest.mark.e2e
START_TIMEOUT_S = 150
REPO = Path(__file__).resolve().parents[2]


def _post(port: int, body: bytes, content_type: str = "application/json") -> tuple[int, dict | str]:
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}/invocations",
        data=body,
        headers={"Content-Type": content_type},
        method="POST",
    )
    try:
        with urllib.request.urlopen(request, timeout=60) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as err:
        text = err.read().decode("utf-8", "replace")
        try:
            return err.code, json.loads(text)
        except ValueError:
            return err.code, text


def _records(port: int, records: list[dict], params: dict | None = None) -> tuple[int, dict | str]:
    payload = {"dataframe_records": records, **({"params": params} if params else {})}
    return _post(port, json.dumps(payload).encode())


def _alive(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/ping", timeout=5) as resp:
            return resp.status == 200
    except (urllib.error.URLError, OSError):
        return False


@pytest.fixture(scope="module")
def servers(tmp_path_factory) -> tuple[str, dict[str, int]]:
    """(tracking URI, name -> port of a running ``mlflow models serve -m models:/<name>@<alias>``)."""
    import mlflow

    root = tmp_path_factory.mktemp("served")
    uri = f"sqlite:///{root}/mlflow.db"
    previous = mlflow.get_tracking_uri()
    mlflow.set_tracking_uri(uri)
    try:
        register_all(root)
    finally:
        mlflow.set_tracking_uri(previous)
    env = {
        **os.environ,
        "MLFLOW_TRACKING_URI": uri,
        "HF_HUB_OFFLINE": "1",
        "PYTHONPATH": str(REPO),
        "MLFLOW_DISABLE_TELEMETRY": "true",
        "DO_NOT_TRACK": "true",
    }
    procs, ports = {}, {}
    try:
        for name in SERVED:
            ports[name] = free_port()
            cmd = [
                sys.executable,
                "-m",
                "mlflow",
                "models",
                "serve",
                "-m",
                f"models:/{name}@{alias(name)}",
                "--env-manager",
                "local",
                "-h",
                "127.0.0.1",
                "-p",
                str(ports[name]),
                "-w",
                "1",
            ]
            log = open(root / f"{name}.log", "wb")  # noqa: SIM115 (closed with the process)
            procs[name] = (
                subprocess.Popen(
                    cmd, env=env, cwd=root, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
                ),
                log,
            )
        deadline = time.monotonic() + START_TIMEOUT_S
        waiting = set(SERVED)
        while waiting and time.monotonic() < deadline:
            for name in list(waiting):
                if procs[name][0].poll() is not None:
                    pytest.fail(
                        f"{name}: mlflow models serve exited: {(root / f'{name}.log').read_text()[-3000:]}"
                    )
                if _alive(ports[name]):
                    waiting.discard(name)
            time.sleep(0.5)
        if waiting:
            pytest.fail(f"not serving after {START_TIMEOUT_S}s: {sorted(waiting)}")
        yield uri, ports
    finally:
        for proc, _log in procs.values():
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
        for proc, log in procs.values():
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=20)
            log.close()


def _close(a, b) -> bool:
    if isinstance(a, float) or isinstance(b, float):
        return math.isclose(a, b, rel_tol=1e-5, abs_tol=1e-6)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_close(x, y) for x, y in zip(a, b))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_close(a[k], b[k]) for k in a)
    return a == b


@pytest.fixture
def served(servers, monkeypatch) -> dict[str, int]:
    """The ports, with this test pointed at the store the served models are registered in."""
    import mlflow

    monkeypatch.setenv("MLFLOW_TRACKING_URI", servers[0])
    mlflow.set_tracking_uri(servers[0])
    return servers[1]


@pytest.mark.parametrize("name", list(SERVED))
def test_served_answers_equal_in_process_predictions(served, name):
    import mlflow

    model = mlflow.pyfunc.load_model(f"models:/{name}@{alias(name)}")
    task = SERVED[name]
    requests = [REQUESTS[task]] + ([REQUESTS["conll2003_words"]] if task == "conll2003" else [])
    params = {"top_k": 3} if task == "fill_mask" else None
    for records in requests:
        status, body = _records(served[name], records, params)
        assert status == 200, body
        expected = json.loads(model.predict(records, params=params).to_json(orient="records"))
        assert _close(body["predictions"], expected), (body, expected)


def _error(body: dict | str) -> str:
    return body.get("message", "") if isinstance(body, dict) else body


@pytest.mark.parametrize(
    ("name", "body", "status", "message"),
    [
        ("bert-sst2", {"dataframe_records": [{"sentence": "wrong column"}]}, 400, "text"),
        ("bert-sst2", {"dataframe_records": [{"text": "  "}]}, 400, "record 0: field 'text' is empty"),
        ("bert-sst2", {"dataframe_records": [{"text": ""}]}, 400, "record 0: field 'text' is empty"),
        (
            "bert-squad_v2",
            {"dataframe_records": [{"question": "Why?", "context": "word " * 20_000}]},
            400,
            "more than this model accepts",
        ),
        (
            "bert-swag",
            {"dataframe_records": [{"context": "c", "endings": ["only one"]}]},
            400,
            "at least 2 endings",
        ),
        (
            "bert-conll2003",
            {"dataframe_records": [{"sentence": "x"}]},
            400,
            "columns text (string, optional)",
        ),
        ("bert-pretrained", {"dataframe_records": [{"text": "no mask"}]}, 400, "has no [MASK]"),
        ("bert-sst2", {"records": [{"text": "unknown payload key"}]}, 400, ""),
    ],
)
def test_bad_requests_get_a_clear_4xx_and_the_server_stays_up(served, name, body, status, message):
    port = served[name]
    got, answer = _post(port, json.dumps(body).encode())
    assert got == status, answer
    assert message in _error(answer) and len(_error(answer)) < 3000  # bounded: no 100 kB echo
    assert _alive(port)
    ok, _ = _records(port, _good(name))
    assert ok == 200


def test_non_utf8_and_non_json_bodies_get_a_4xx(served):
    port = served["bert-sst2"]
    for body in (
        b'{"dataframe_records": [{"text": "caf\xe9 \xff\xfe"}]}',
        b"\xff\xfe\x00garbage",
        b"{not json",
    ):
        status, answer = _post(port, body)
        assert 400 <= status < 500, (body, status, answer)
    status, _ = _post(port, "text\ncaf\xe9\n".encode("latin-1"), content_type="text/csv")
    assert 400 <= status < 500
    status, _ = _post(port, b"{}", content_type="application/json; charset=latin-1")
    assert 400 <= status < 500
    assert _alive(port) and _records(port, _good("bert-sst2"))[0] == 200


def _good(name: str) -> list[dict]:
    return REQUESTS[SERVED[name]][:1]
