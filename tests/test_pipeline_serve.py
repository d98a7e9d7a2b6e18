"""flows.serve without a server: which deployments it builds, the one-server-per-repo lock, the port check."""

from __future__ import annotations

import http.server
import sys
import threading

import pytest

from flows import serve


def test_deployments_cover_the_pipeline_and_every_stage_flow():
    deployments = serve.build_deployments()
    names = [f"{d.flow_name}/{d.name}" for d in deployments]
    assert names[0] == "bert-pipeline/local"
    stage_modules = serve.stage_modules()
    assert {"corpus", "vocab"} <= set(stage_modules)
    served_modules = {d.entrypoint.rsplit(".", 1)[0] for d in deployments[1:]}
    unserved = sorted(f"flows.{m}" for m in stage_modules if f"flows.{m}" not in served_modules)
    assert not unserved, f"stage modules without a module-level Prefect flow to serve: {unserved}"
    assert all(d.entrypoint.startswith("flows.") for d in deployments)  # module entrypoints: any cwd works
    from prefect.utilities.callables import parameter_schema

    from flows.pipeline import pipeline_flow

    form = parameter_schema(pipeline_flow).properties  # what the UI renders as the run form
    assert {"profile", "preset", "tasks", "pretrain_steps", "learning_rates", "seeds"} <= set(form)


def test_stage_modules_come_from_dvc_yaml(tmp_path):
    (tmp_path / "dvc.yaml").write_text(
        "stages:\n  a: {cmd: python -m flows.alpha}\n  b:\n    foreach: [x, y]\n    do: {cmd: python -m flows.beta ${item}}\n"
        "  c: {cmd: python -m flows.pipeline}\n  d: {cmd: python -m flows.alpha --again}\n"
    )
    assert serve.stage_modules(tmp_path) == ["alpha", "beta"]
    assert serve.stage_modules(tmp_path / "nowhere") == []


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
    assert serve.served_api_url(tmp_path) is None
    with serve.serve_lock(tmp_path, health_server):
        assert serve.served_api_url(tmp_path) == health_server  # a CLI run reports to this server
        with pytest.raises(serve.ServeError, match="already being served"), serve.serve_lock(tmp_path, "x"):
            pass
    assert serve.served_api_url(tmp_path) is None  # released: nothing serves the repository


def test_a_port_taken_by_something_else_is_refused(health_server):
    port = int(health_server.rsplit(":", 1)[1].split("/")[0])
    assert serve.is_healthy(health_server) and serve.port_in_use("127.0.0.1", port)
    env = serve.prefect_env(serve.REPO_ROOT / ".prefect", "127.0.0.1", port, base={})
    assert env["PREFECT_API_URL"] == health_server and env["PREFECT_SERVER_ANALYTICS_ENABLED"] == "false"
    with pytest.raises(serve.ServeError, match="in use"):
        serve.start_server(env, serve.REPO_ROOT / ".prefect" / "never.log", timeout_s=1)


def _lazy_fn(x: int = 1) -> int:
    return x


def test_a_module_that_builds_its_flow_lazily_is_served(tmp_path, monkeypatch):
    import types

    from prefect import flow

    module = types.ModuleType("flows.lazy")
    module.PREFECT_FLOW = lambda: flow(name="lazy")(_lazy_fn)
    (tmp_path / "dvc.yaml").write_text("stages:\n  a: {cmd: python -m flows.lazy}\n")
    monkeypatch.setitem(sys.modules, "flows.lazy", module)
    (built,) = serve.stage_flows(tmp_path)
    assert built.name == "lazy"
    module.PREFECT_FLOW = None
    assert serve.stage_flows(tmp_path) == []  # skipped with a warning
