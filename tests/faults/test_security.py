"""Security: servers on loopback unless asked otherwise; no secret in params, tags, metrics, artifacts or logs;
credentials only from the environment.
"""

from __future__ import annotations

import json
import re
import subprocess
import urllib.request
from pathlib import Path

import pytest
import yaml

from .conftest import FAKE_SECRETS, REPO_ROOT

pytestmark = pytest.mark.faults

LOOPBACK_V4 = "0100007F"  # 127.0.0.1 as /proc/net/tcp writes it
# A params key whose last part names a credential (``window_tokens`` is not one).
SECRET_KEY = re.compile(
    r"(^|_)(password|passwd|secret|secret_key|api_?key|access_key|(auth|access|api|hf|hub)_token|credentials?)$",
    re.I,
)


def _listening(port: int) -> list[str]:
    """Local addresses (hex, as in /proc/net/tcp{,6}) listening on ``port``."""
    found = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        path = Path(table)
        if not path.exists():
            continue
        for line in path.read_text().splitlines()[1:]:
            fields = line.split()
            addr, hexport = fields[1].split(":")
            if fields[3] == "0A" and int(hexport, 16) == port:  # 0A = LISTEN
                found.append(addr)
    return found


def test_the_prefect_server_the_project_starts_listens_on_loopback_only(prefect_server):
    """``make serve`` -> ``flows.serve`` -> ``start_server``: the session's server was started by that code."""
    from flows import serve

    assert serve.DEFAULT_HOST == "127.0.0.1"
    addrs = _listening(prefect_server.port)
    assert addrs, f"nothing listens on {prefect_server.port}"
    assert set(addrs) == {LOOPBACK_V4}, addrs
    assert prefect_server.env["PREFECT_SERVER_API_HOST"] == "127.0.0.1"


def test_flows_serve_binds_where_the_user_asks(monkeypatch, tmp_path):
    """Loopback by default; another interface only when the user passes it (--host or PREFECT_SERVE_HOST)."""
    from flows import serve

    started: list[list[str]] = []

    class Stop(Exception):
        pass

    def fake_popen(argv, **_):
        started.append(list(argv))
        raise Stop

    monkeypatch.setattr(serve.subprocess, "Popen", fake_popen)
    monkeypatch.setattr(serve, "port_in_use", lambda *_: False)
    for host in ("127.0.0.1", "0.0.0.0"):
        env = serve.prefect_env(tmp_path, host, 4999, base={})
        with pytest.raises(Stop):
            serve.start_server(env, tmp_path / "server.log")
        assert started[-1][started[-1].index("--host") + 1] == host
        assert env["PREFECT_SERVER_API_HOST"] == host


def test_every_server_command_in_the_makefile_binds_loopback():
    dry = subprocess.run(
        ["make", "-n", "serve", "ui"], cwd=REPO_ROOT, capture_output=True, text=True, timeout=60
    )
    assert dry.returncode == 0, dry.stderr
    commands = [
        line
        for line in dry.stdout.splitlines()
        if re.search(r"flows\.(serve|ui)\b|mlflow (ui|server)|prefect server start", line)
    ]
    assert len(commands) >= 2, dry.stdout  # make serve and make ui
    for line in commands:
        assert re.search(r"--host[ =]127\.0\.0\.1\b", line), line
    makefile = (REPO_ROOT / "Makefile").read_text()
    assert "0.0.0.0" not in makefile


def test_no_code_binds_all_interfaces_by_default():
    offenders = []
    for path in [*(REPO_ROOT / "flows").glob("*.py"), *(REPO_ROOT / "bert_core").rglob("*.py")]:
        for i, line in enumerate(path.read_text().splitlines(), 1):
            if "0.0.0.0" in line and not line.lstrip().startswith("#"):
                offenders.append(f"{path.relative_to(REPO_ROOT)}:{i}: {line.strip()}")
    assert not offenders, offenders


def test_params_and_profiles_hold_no_credentials():
    """Credentials come from the environment (MLFLOW_TRACKING_USERNAME/PASSWORD, AWS_*, HF_TOKEN), never params."""
    from bert_core.params import flatten

    files = [*(REPO_ROOT / "params").glob("*.yaml"), *(REPO_ROOT / "params" / "profiles").glob("*.yaml")]
    assert files
    for path in files:
        for key, value in flatten(yaml.safe_load(path.read_text()) or {}).items():
            assert not SECRET_KEY.search(key.rsplit(".", 1)[-1]), f"{path}: key {key} looks like a credential"
            if isinstance(value, str):
                assert not re.search(r"://[^/\s:@]+:[^/\s@]+@", value), (
                    f"{path}: {key} embeds a password in a URI"
                )


# ------------------------------------------------------------------------------- secrets in a real run


def _scan(text: str, where: str) -> list[str]:
    return [f"{where}: {name}" for name, value in FAKE_SECRETS.items() if value in text]


def _mlflow_texts(tracking_uri: str) -> list[tuple[str, str]]:
    """Everything MLflow holds about the runs (params, tags, metric names, models) as (where, text)."""
    from mlflow import MlflowClient

    client = MlflowClient(tracking_uri)
    out = []
    experiments = client.search_experiments()
    for exp in experiments:
        out.append((f"experiment {exp.name}", json.dumps(exp.tags)))
        for run in client.search_runs([exp.experiment_id], max_results=1000):
            where = f"run {run.info.run_name} ({run.info.run_id})"
            out.append((f"{where} params", json.dumps(run.data.params)))
            out.append((f"{where} tags", json.dumps(run.data.tags)))
            out.append((f"{where} metric names", json.dumps(sorted(run.data.metrics))))
    for model in client.search_registered_models():
        out.append((f"model {model.name}", json.dumps(model.tags) + (model.description or "")))
        for mv in client.search_model_versions(f"name = '{model.name}'"):
            out.append((f"model {model.name} v{mv.version}", json.dumps(mv.tags) + (mv.description or "")))
    assert experiments, "the pipeline logged nothing to MLflow"
    return out


def _prefect_logs(api_url: str) -> list[tuple[str, str]]:
    out = []
    for offset in range(0, 100_000, 200):
        req = urllib.request.Request(
            f"{api_url}/logs/filter",
            data=json.dumps({"limit": 200, "offset": offset}).encode(),
            headers={"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(req, timeout=30) as resp:
            logs = json.loads(resp.read())
        out += [(f"prefect log of flow run {log.get('flow_run_id')}", log["message"]) for log in logs]
        if len(logs) < 200:
            break
    req = urllib.request.Request(
        f"{api_url}/flow_runs/filter", data=b'{"limit": 200}', headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(req, timeout=30) as resp:
        for run in json.loads(resp.read()):
            out.append((f"prefect flow run {run['name']} parameters", json.dumps(run["parameters"])))
    return out


def test_no_secret_from_the_environment_reaches_params_tags_artifacts_outputs_or_logs(tiny_pipeline):
    """The reference pipeline ran every stage with fake credentials in its environment (FAKE_SECRETS)."""
    pipe = tiny_pipeline
    pipe.build(until="pretrain")
    found: list[str] = []
    for record in pipe.stages:
        found += _scan(record.stdout, f"output of stage {record.name}")
    for where, text in _mlflow_texts(pipe.env()["MLFLOW_TRACKING_URI"]):
        found += _scan(text, where)
    for where, text in _prefect_logs(pipe.prefect_api):
        found += _scan(text, where)
    # Artifacts, DVC outputs, metrics, plots, params and the lock file: every file of the workspace.
    skip = {".git", "__pycache__"}
    for path in pipe.root.rglob("*"):
        if path.is_file() and not skip & set(path.relative_to(pipe.root).parts):
            data = path.read_bytes()
            found += [
                f"{path.relative_to(pipe.root)}: {n}" for n, v in FAKE_SECRETS.items() if v.encode() in data
            ]
    assert not found, found
