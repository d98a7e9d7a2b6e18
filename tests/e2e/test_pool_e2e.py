"""The GPU-machine path on loopback: a work pool, a worker in another checkout, a run triggered from the UI.

Two copies of the repository stand for two machines. The "UI machine" runs ``python -m flows.serve``
(what ``make serve`` runs: the Prefect server and UI) and ``python -m flows.pool deploy`` (``make deploy``),
which creates the process work pool and registers ``bert-pipeline``, ``pretrain`` and ``finetune`` on it.
The "GPU machine" runs ``python -m flows.pool worker`` (``make worker``) in its own checkout, with
``PREFECT_API_URL`` at the UI machine's server, the shared MLflow store and ``BERT_DATA_ROOT``.

A ``finetune/<pool>`` run is created through the Prefect API as the UI's Run button does, with a tiny
random BERT (hidden 32, 2 layers) on 64 RTE rows: the worker picks it up and completes it, the outputs land
in the worker's checkout (not the UI machine's), and the MLflow store holds the run, tagged with the flow
run's id, with its dev metrics and the registered model. Every process started here is stopped afterwards.
"""

from __future__ import annotations

import contextlib
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import mlflow
import pytest

from bert_core.tracking import FINETUNE_EXPERIMENT
from tests.e2e.conftest import FINAL_STATES, copy_repository, kill_strays, serve_repository, stop_group

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(900)]

POOL = "e2e-gpu"
TASK = "rte"
RUN_TIMEOUT_S = 420

PARAMS = """\
finetune:
  defaults: {batch_size: 16, eval_batch_size: 64, epochs: 1, learning_rates: [1.0e-3], seeds: [1],
             max_seq_length: 64, train_limit: 64, eval_limit: 64, predict_test: false}
  small_task_seeds: [1]
  tasks: {rte: {}}
  data_checks: false
  device: cpu
"""


def tiny_model(dest: Path, vocab: Path) -> Path:
    """A tiny random BERT in Hugging Face format with the real uncased vocab (what the pretrain stage writes)."""
    import torch

    from bert_core.config import BertConfig
    from bert_core.model import BertForPreTraining

    config = BertConfig(
        vocab_size=30522,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=512,
    )
    torch.manual_seed(0)
    BertForPreTraining(config).save_pretrained(dest)
    shutil.copy(vocab, dest / "vocab.txt")
    return dest


@contextlib.contextmanager
def run_worker(root: Path, env: dict[str, str], log_path: Path) -> Iterator[subprocess.Popen[bytes]]:
    """``python -m flows.pool worker`` in checkout ``root``; stopped (its process group, then strays) after."""
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "flows.pool", "worker", "--pool", POOL],
            cwd=root,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        yield proc
    finally:
        stop_group(proc)
        kill_strays(root)


def _tail(path: Path, n: int = 80) -> str:
    return "\n".join(path.read_text(errors="replace").splitlines()[-n:]) if path.is_file() else ""


@pytest.fixture(scope="module")
def team(tmp_path_factory, shared_data_root):
    tmp = tmp_path_factory.mktemp("pool-e2e")
    ui_repo = copy_repository(tmp / "ui-machine")
    gpu_repo = copy_repository(tmp / "gpu-machine")
    (gpu_repo / "params" / "e2e-pool.yaml").write_text(PARAMS)
    model = tiny_model(
        tmp / "tiny-model", shared_data_root / "checkpoints" / "bert-base-uncased" / "vocab.txt"
    )
    with serve_repository(ui_repo, tmp) as served:
        deploy = subprocess.run(
            [sys.executable, "-m", "flows.pool", "deploy", "--pool", POOL],
            cwd=ui_repo,
            env=served.env,  # no PREFECT_API_URL: it finds the server of `make serve` in this checkout
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert deploy.returncode == 0, deploy.stdout + deploy.stderr
        worker_env = {
            **served.env,
            "PREFECT_HOME": str(tmp / "gpu-prefect-home"),
            "PREFECT_API_URL": served.api_url,
            "BERT_DATA_ROOT": str(shared_data_root),
        }
        log_path = tmp / "worker.log"
        with run_worker(gpu_repo, worker_env, log_path) as worker:
            yield {
                "served": served,
                "deploy": deploy.stdout,
                "worker": worker,
                "worker_log": log_path,
                "ui_repo": ui_repo,
                "gpu_repo": gpu_repo,
                "model": model,
            }


def _wait(team, flow_run_id) -> object:
    from prefect.client.orchestration import get_client

    served, worker = team["served"], team["worker"]
    deadline = time.monotonic() + RUN_TIMEOUT_S
    with served.settings(), get_client(sync_client=True) as client:
        while True:
            run = client.read_flow_run(flow_run_id)
            if run.state is not None and run.state.type.value in FINAL_STATES:
                return run
            if worker.poll() is not None:
                raise AssertionError(
                    f"the worker exited with {worker.returncode}:\n{_tail(team['worker_log'])}"
                )
            if time.monotonic() > deadline:
                raise AssertionError(f"not finished after {RUN_TIMEOUT_S}s:\n{_tail(team['worker_log'])}")
            time.sleep(2)


def test_deploy_registers_the_three_flows_on_the_pool(team):
    from prefect.client.orchestration import get_client

    from flows.pool import PULL_STEP

    served = team["served"]
    with served.settings(), get_client(sync_client=True) as client:
        assert client.read_work_pool(POOL).type == "process"
        for name in ("bert-pipeline", "pretrain", "finetune"):
            deployment = client.read_deployment_by_name(f"{name}/{POOL}")
            assert deployment.work_pool_name == POOL
            assert deployment.pull_steps == [PULL_STEP]
            assert f"deployed {name}/{POOL}" in team["deploy"]
        form = client.read_deployment_by_name(f"finetune/{POOL}").parameter_openapi_schema["properties"]
        assert {"task", "params_file", "model_source"} <= set(form)  # the UI's run form


def test_a_run_triggered_from_the_ui_is_completed_by_the_worker(team):
    served, gpu_repo, ui_repo = team["served"], team["gpu_repo"], team["ui_repo"]
    parameters = {"task": TASK, "params_file": "params/e2e-pool.yaml", "model_source": str(team["model"])}
    flow_run = served.trigger(f"finetune/{POOL}", parameters)
    run = _wait(team, flow_run.id)
    assert run.state.type.value == "COMPLETED", f"{run.state.message}\n{_tail(team['worker_log'])}"
    assert run.work_pool_name == POOL

    log = team["worker_log"].read_text(errors="replace")
    assert f"worker for work pool {POOL!r}" in log and str(gpu_repo) in log
    # The worker's checkout did the work; the UI machine's checkout got nothing.
    assert (gpu_repo / "results" / "finetune" / TASK / "summary.json").is_file()
    assert (gpu_repo / "metrics" / "finetune" / f"{TASK}.json").is_file()
    assert not (ui_repo / "results" / "finetune").exists()

    # MLflow: the run of this flow run, finished, with dev metrics; the model registered.
    client = mlflow.MlflowClient(served.mlflow_uri)
    experiment = client.get_experiment_by_name(FINETUNE_EXPERIMENT)
    runs = client.search_runs(
        [experiment.experiment_id],
        f"tags.prefect_flow_run_id = '{run.id}' and tags.task = '{TASK}'",
    )
    top = [r for r in runs if "mlflow.parentRunId" not in r.data.tags]
    assert len(top) == 1, [r.info.run_name for r in runs]
    assert top[0].info.status == "FINISHED"
    assert "dev.accuracy" in top[0].data.metrics, top[0].data.metrics
    assert client.search_model_versions(f"name = 'bert-{TASK}'")
