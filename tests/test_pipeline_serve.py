"""flows.serve without a server: which deployments it builds, the one-server-per-repo lock, the port check."""

from __future__ import annotations

import http.server
import signal
import sys
import threading

import pytest

from bert_core.constants import REPO_ROOT
from flows import _served, serve, stages


def test_deployments_cover_the_pipeline_and_every_stage_flow():
    deployments = serve.build_deployments()
    names = [f"{d.flow_name}/{d.name}" for d in deployments]
    assert names[0] == "bert-pipeline/local"
    stage_modules = [s.module_name for s in stages.STAGES]
    assert {"corpus", "vocab"} <= set(stage_modules)
    served_modules = {d.entrypoint.rsplit(".", 1)[0] for d in deployments[1:]}
    unserved = sorted(f"flows.{m}" for m in stage_modules if f"flows.{m}" not in served_modules)
    assert not unserved, f"stage modules without a module-level Prefect flow to serve: {unserved}"
    assert all(d.entrypoint.startswith("flows.") for d in deployments)  # module entrypoints: any cwd works
    from prefect.utilities.callables import parameter_schema

    from flows.pipeline import pipeline_flow

    form = parameter_schema(pipeline_flow).properties  # what the UI renders as the run form
    assert {"profile", "preset", "tasks", "pretrain_steps", "learning_rates", "seeds"} <= set(form)


def test_the_stage_flows_are_served_in_pipeline_order():
    order = ["corpus", "vocab", "pretrain_data", "pretrain", "finetune", "evaluate"]
    assert [s.module_name for s in stages.STAGES] == order
    flows = serve.stage_flows()
    assert len(flows) == len(order)
    names = [d.flow_name for d in serve.build_deployments()]
    assert names == ["bert-pipeline", *(f.name for f in flows), "predict"]


class _Health(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200 if self.path == "/api/health" else 404)
        self.end_headers()
        self.wfile.write(b"true")

    def log_message(self, *args):
        pass


@pytest.fixture
def health_server():
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Health)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/api"
    finally:
        server.shutdown()
        server.server_close()


def test_one_serve_per_repository_and_cli_runs_find_it(tmp_path, health_server):
    assert _served.served_api_url(tmp_path) is None
    with serve.serve_lock(tmp_path, health_server):
        assert _served.served_api_url(tmp_path) == health_server  # a CLI run reports to this server
        with pytest.raises(serve.ServeError, match="already being served"), serve.serve_lock(tmp_path, "x"):
            pass
    assert _served.served_api_url(tmp_path) is None  # released: nothing serves the repository


def test_a_port_taken_by_something_else_is_refused(health_server):
    port = int(health_server.rsplit(":", 1)[1].split("/")[0])
    assert serve.is_healthy(health_server) and serve.port_in_use("127.0.0.1", port)
    env = serve.prefect_env(REPO_ROOT / ".prefect", "127.0.0.1", port, base={})
    assert env["PREFECT_API_URL"] == health_server and env["PREFECT_SERVER_ANALYTICS_ENABLED"] == "false"
    with pytest.raises(serve.ServeError, match="in use"):
        serve.start_server(env, REPO_ROOT / ".prefect" / "never.log", timeout_s=1)


def _lazy_fn(x: int = 1) -> int:
    return x


def test_a_module_that_builds_its_flow_lazily_is_served(monkeypatch):
    import dataclasses
    import types

    from prefect import flow

    module = types.ModuleType("flows.lazy")
    module.build = lambda: flow(name="lazy")(_lazy_fn)
    monkeypatch.setitem(sys.modules, "flows.lazy", module)
    table = [dataclasses.replace(stages.get("corpus"), name="lazy", flow="flows.lazy:build")]
    (built,) = serve.stage_flows(table)
    assert built.name == "lazy"
    module.build = None
    assert serve.stage_flows(table) == []  # skipped with a warning
    missing = dataclasses.replace(table[0], flow="flows.no_such_module:flow")
    assert serve.stage_flows([missing]) == []


def test_a_signal_a_library_turned_into_its_own_error_still_stops_serve_as_interrupted(monkeypatch, tmp_path):
    for key, value in serve.prefect_env(tmp_path, "127.0.0.1", 4299).items():
        monkeypatch.setenv(key, value)  # what main exports, restored after the test
    received: list[int] = []
    monkeypatch.setattr(serve, "RECEIVED", received)
    monkeypatch.setattr(serve, "is_healthy", lambda url: True)  # a server runs already: none is started

    def build_deployments():  # a library was importing when SIGTERM arrived, and raised its own error
        raise ValueError("schema error")

    monkeypatch.setattr(serve, "build_deployments", build_deployments)
    with pytest.raises(ValueError, match="schema error"):  # no signal: the error is the error
        serve.main(["--home", str(tmp_path), "--port", "4299"])
    received.append(signal.SIGTERM)
    assert serve.main(["--home", str(tmp_path), "--port", "4299"]) == 128 + signal.SIGTERM
