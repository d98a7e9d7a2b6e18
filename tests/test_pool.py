"""flows.pool without a server: the deployments it registers, the pull step, the settings and their errors.

The real path (server, pool, worker in another checkout, a UI-triggered run, MLflow) is
``tests/e2e/test_pool_e2e.py``.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import types

import pytest

from bert_core.constants import REPO_ROOT
from flows import pool


def _dead_url() -> str:
    with socket.socket() as sock:  # a port nothing listens on (closed again at once)
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    return f"http://127.0.0.1:{port}/api"


def test_the_pool_name_is_a_setting(monkeypatch):
    monkeypatch.delenv(pool.POOL_ENV, raising=False)
    assert pool.pool_name() == pool.DEFAULT_POOL == "bert-cpu"
    monkeypatch.setenv(pool.POOL_ENV, "team-gpu")
    assert pool.pool_name() == "team-gpu"
    assert pool.pool_name("gpu") == "gpu"  # POOL=gpu wins over the environment
    with pytest.raises(pool.PoolError, match="work pool name 'a/b'"):
        pool.pool_name("a/b")


def test_deployments_are_the_pipeline_pretrain_and_finetune_on_the_pool():
    from prefect import Flow
    from prefect.flows import load_flow_from_entrypoint

    deployments = pool.build_deployments("gpu")
    assert [f"{d.flow_name}/{d.name}" for d in deployments] == [
        "bert-pipeline/gpu",
        "pretrain/gpu",
        "finetune/gpu",
    ]
    for deployment in deployments:
        assert deployment.work_pool_name == "gpu"
        assert deployment.storage.to_pull_step() == [pool.PULL_STEP]
        # What the worker's flow-run process does: import the module entrypoint (no code is shipped).
        loaded = load_flow_from_entrypoint(deployment.entrypoint, use_placeholder_flow=False)
        assert isinstance(loaded, Flow) and loaded.name == deployment.flow_name
    form = deployments[0]._parameter_openapi_schema.properties  # the UI's run form
    assert {"profile", "tasks", "targets"} <= set(form)
    step = next(iter(pool.PULL_STEP))
    assert step == f"{pool.enter_checkout.__module__}.{pool.enter_checkout.__name__}"


@pytest.mark.slow  # a fresh interpreter importing torch
def test_importing_the_pretrain_flow_module_still_skips_prefect():
    code = "import sys, flows.pretrain; assert 'prefect' not in sys.modules; print('ok')"
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO_ROOT, capture_output=True, text=True, timeout=120
    )
    assert out.stdout.strip() == "ok", out.stderr
    import flows.pretrain

    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        flows.pretrain.nope  # noqa: B018


def test_the_pull_step_moves_the_run_into_the_checkout(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # the worker starts flow runs in a temporary directory
    assert pool.enter_checkout() == {"directory": str(REPO_ROOT)}
    assert os.getcwd() == str(REPO_ROOT)
    monkeypatch.setattr(pool, "REPO_ROOT", tmp_path)
    with pytest.raises(pool.PoolError, match=r"no dvc.yaml.*make worker POOL="):
        pool.enter_checkout()


def test_an_unreachable_prefect_api_is_a_one_line_error(monkeypatch, capsys):
    url = _dead_url()
    monkeypatch.setenv("PREFECT_API_URL", url)
    monkeypatch.setattr(pool.os, "execve", lambda *a: pytest.fail("the worker must not start"))
    assert pool.main(["worker", "--pool", "gpu"]) == 1
    err = capsys.readouterr().err.strip()
    assert (
        err.startswith(f"error: the Prefect API at PREFECT_API_URL={url} does not answer") and "\n" not in err
    )


def test_without_any_prefect_server_it_says_what_to_set(monkeypatch, tmp_path):
    monkeypatch.delenv("PREFECT_API_URL", raising=False)
    monkeypatch.setenv("PREFECT_HOME", str(tmp_path))  # no `make serve` lock here
    with pytest.raises(pool.PoolError, match="set PREFECT_API_URL to the team's server"):
        pool.resolve_api()


def test_the_worker_environment_puts_this_checkout_first_and_checks_its_settings(tmp_path, monkeypatch):
    base = {"PYTHONPATH": f"/elsewhere{os.pathsep}{REPO_ROOT}", "BERT_DATA_ROOT": str(tmp_path)}
    env = pool.worker_env("http://ui-host:4200/api", base)
    assert env["PYTHONPATH"].split(os.pathsep) == [str(REPO_ROOT), "/elsewhere"]
    assert env["PREFECT_API_URL"] == "http://ui-host:4200/api" and env["BERT_DATA_ROOT"] == str(tmp_path)
    assert env["DO_NOT_TRACK"] == "true"
    with pytest.raises(pool.PoolError, match="BERT_DATA_ROOT='/no/such/dir' is not a directory"):
        pool.worker_env("http://x/api", {"BERT_DATA_ROOT": "/no/such/dir"})
    monkeypatch.setattr("bert_core.tracking.run._sleep", lambda s: None)
    dead = _dead_url().removesuffix("/api")
    with pytest.raises(pool.PoolError, match=r"MLflow tracking server .* does not answer"):
        pool.worker_env("http://x/api", {"MLFLOW_TRACKING_URI": dead})


def test_the_worker_command_is_prefect_worker_start_on_a_process_pool():
    command = pool.worker_command("gpu", 1)
    assert command[1:] == [
        "-m",
        "prefect",
        "worker",
        "start",
        "--pool",
        "gpu",
        "--type",
        "process",
        "--limit",
        "1",
        "--install-policy",
        "never",
    ]
    assert pool.worker_command("gpu", 2, "box-1")[-2:] == ["--name", "box-1"]


class _Client:
    def __init__(self, existing=None):
        self.existing, self.created = existing, []

    def read_work_pool(self, name):
        from prefect.exceptions import ObjectNotFound

        if self.existing is None:
            raise ObjectNotFound(None)
        return self.existing

    def create_work_pool(self, work_pool):
        self.created.append(work_pool)


def test_the_pool_is_created_once_and_must_be_a_process_pool():
    client = _Client()
    assert pool.ensure_pool(client, "gpu") is True
    (created,) = client.created
    assert (
        created.name == "gpu"
        and created.type == "process"
        and "job_configuration" in created.base_job_template
    )
    assert pool.ensure_pool(_Client(types.SimpleNamespace(type="process")), "gpu") is False
    with pytest.raises(pool.PoolError, match="exists with type 'docker'"):
        pool.ensure_pool(_Client(types.SimpleNamespace(type="docker")), "gpu")


@pytest.mark.skipif(shutil.which("make") is None, reason="make is not installed")
def test_make_worker_and_deploy_take_the_pool():
    def dry(*args: str) -> str:
        out = subprocess.run(["make", "-n", *args], cwd=REPO_ROOT, capture_output=True, text=True, timeout=60)
        assert out.returncode == 0, out.stderr
        return out.stdout

    assert "-m flows.pool worker --pool gpu --limit 1" in dry("worker", "POOL=gpu")
    assert "-m flows.pool deploy --pool gpu" in dry("deploy", "POOL=gpu")
    lines = [line.rstrip() for line in dry("deploy").splitlines()]
    assert any(
        line.endswith("-m flows.pool deploy") for line in lines
    )  # no POOL: $BERT_WORK_POOL, else bert-cpu
