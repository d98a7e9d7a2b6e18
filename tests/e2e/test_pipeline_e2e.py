"""The real pipeline end to end, driven like a user drives it from the Prefect UI.

A copy of the repository (git + DVC) is served by ``python -m flows.serve`` on a free loopback port; runs of
``bert-pipeline/local`` are created through the Prefect API (``run_deployment``, what the UI's Run button
does) with the ``tiny`` profile and ``BERT_DATA_ROOT`` at ../shared/data (offline). Checked: every stage ran
as a Prefect task with its artifact, every stage run is in MLflow under the pipeline run's id, the
fine-tuning runs carry their task metrics, the models are registered, the run is a DVC experiment; a rerun
with nothing changed runs nothing; changing one task's param reruns only that task and ``evaluate``.
"""

from __future__ import annotations

import re
import subprocess
import sys

import mlflow
import pytest
import yaml

from bert_core.tracking import FINETUNE_EXPERIMENT, PIPELINE_EXPERIMENT
from flows import _dvc
from flows.stages import INPUTS
from tests.dvc_status import up_to_date
from tests.e2e.conftest import copy_repository, serve_repository

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(3600)]

RUN_TIMEOUT_S = 1800


@pytest.fixture(scope="module")
def served(tmp_path_factory, shared_data_root):
    tmp = tmp_path_factory.mktemp("pipeline-e2e")
    root = copy_repository(tmp / "repo")
    with serve_repository(root, tmp, {"BERT_DATA_ROOT": str(shared_data_root)}) as served:
        yield served


def _run(served, parameters: dict) -> tuple:
    flow_run = served.trigger("bert-pipeline/local", parameters)
    run = served.wait(flow_run.id, RUN_TIMEOUT_S)
    assert run.state.type.value == "COMPLETED", f"{run.state.message}\n{served.log_tail(120)}"
    return run, str(run.id)


def _stage_runs(client, pipeline_run_id: str) -> list:
    exps = [e.experiment_id for e in client.search_experiments()]
    return client.search_runs(exps, f"tags.pipeline_run_id = '{pipeline_run_id}'", max_results=500)


def _dvc_cli(served, *args: str) -> str:
    proc = subprocess.run(
        [sys.executable, "-m", "dvc", *args], cwd=served.root, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout


@pytest.fixture(scope="module")
def first(served):
    """Run 1: the whole pipeline from nothing, as DVC experiment e2e-1."""
    return _run(served, {"profile": "tiny", "experiment_name": "e2e-1"})


def test_first_run_produces_everything(served, first):
    run, run_id = first
    stages = [s.name for s in _dvc.stage_infos(served.root)]
    assert {"corpus", "vocab", "pretrain_data", "evaluate"} <= set(stages)
    tasks = sorted(s.split("@", 1)[1] for s in stages if s.startswith("finetune@"))
    assert tasks == ["mrpc", "sst2"]  # the tiny profile's tasks

    # Prefect: one task run per stage, all completed, each stage's metrics as an artifact, and a summary.
    assert served.task_states(run.id, dict.fromkeys(stages, "Completed")) == dict.fromkeys(
        stages, "Completed"
    )
    artifacts = served.artifacts(run.id)
    for stage in stages:
        assert re.search(rf"\| {re.escape(stage)} +\| ran ", artifacts["pipeline-summary"])
    assert "pipeline-vocab" in artifacts and "pipeline-finetune-sst2" in artifacts
    assert "dvc exp apply e2e-1" in artifacts["pipeline-summary"]

    # MLflow: every stage run of this pipeline run is findable by its id, finished, tagged.
    client = mlflow.MlflowClient(served.mlflow_uri)
    runs = [r for r in _stage_runs(client, run_id) if "mlflow.parentRunId" not in r.data.tags]
    by_stage: dict[str, list] = {}
    for r in runs:
        by_stage.setdefault(r.data.tags["stage"], []).append(r)
    expected = {s.split("@")[0] for s in stages if s != INPUTS}  # inputs records files: no MLflow run
    assert set(by_stage) == expected
    assert all(r.info.status == "FINISHED" for r in runs)
    assert {r.data.tags["dvc_experiment"] for r in runs} == {"e2e-1"}
    assert {r.data.tags["data_root"] for r in runs} == {"local"}
    assert all(r.data.tags.get("git_commit") for r in runs)
    pipeline_exp = client.get_experiment_by_name(PIPELINE_EXPERIMENT).experiment_id
    assert {r.info.experiment_id for r in by_stage["corpus"] + by_stage["vocab"]} == {pipeline_exp}

    # Fine-tuning: one run per task in the fine-tuning experiment, dev metrics, the pretrained model's version.
    finetune_exp = client.get_experiment_by_name(FINETUNE_EXPERIMENT).experiment_id
    fine = {r.data.tags["task"]: r for r in by_stage["finetune"]}
    assert sorted(fine) == tasks
    for task, r in fine.items():
        assert r.info.experiment_id == finetune_exp
        assert any(k.startswith("dev.") for k in r.data.metrics), (task, r.data.metrics)

    # Registry: the pretrained model and one model per task, each with a version.
    registered = {m.name for m in client.search_registered_models()}
    assert {"bert-pretrained", *(f"bert-{t}" for t in tasks)} <= registered
    for name in ("bert-pretrained", *(f"bert-{t}" for t in tasks)):
        assert client.search_model_versions(f"name = '{name}'"), name

    # Outputs and DVC: the evaluation report, stage metrics, and the experiment with its params.
    assert (served.root / "reports" / "evaluate.md").is_file()
    assert (served.root / "metrics" / "evaluate.json").is_file()
    assert "e2e-1" in _dvc_cli(served, "exp", "show", "--json")


def test_rerun_with_nothing_changed_runs_nothing_but_the_inputs_record(served, first):
    run, run_id = _run(served, {"profile": "tiny", "experiment_name": "e2e-2"})
    stages = [s.name for s in _dvc.stage_infos(served.root)]
    expected = {s: "Completed" if s == INPUTS else "Cached" for s in stages}
    assert served.task_states(run.id, expected) == expected
    assert _stage_runs(mlflow.MlflowClient(served.mlflow_uri), run_id) == []


def test_one_task_param_reruns_that_task_and_evaluate(served, first, capsys):
    override = "params/finetune.yaml:finetune.tasks.mrpc.train_limit=150"
    run, run_id = _run(served, {"profile": "tiny", "experiment_name": "e2e-3", "extra_overrides": [override]})
    stages = [s.name for s in _dvc.stage_infos(served.root)]
    ran = {INPUTS, "finetune@mrpc", "evaluate"}
    expected = {s: "Completed" if s in ran else "Cached" for s in stages}
    assert served.task_states(run.id, expected) == expected

    # The comparison command lines the two pipeline runs up per task.
    from flows import compare

    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("MLFLOW_TRACKING_URI", served.mlflow_uri)
        assert compare.main([first[1], run_id]) == 0
    out = capsys.readouterr().out
    assert f"A = pipeline run {first[1]}" in out and f"B = pipeline run {run_id}" in out
    assert "mrpc" in out and "dev." in out

    # The experiment is reproducible: applying run 1's experiment restores its params and outputs.
    _dvc_cli(served, "exp", "apply", "e2e-1")
    params = yaml.safe_load((served.root / "params" / "finetune.yaml").read_text())["finetune"]
    assert params["tasks"]["mrpc"]["train_limit"] == 200
    assert up_to_date(_dvc_cli(served, "status"))


def test_finetune_runs_name_their_pretrained_model_version(served, first):
    """Comparing two pretrained models needs each fine-tuning run tagged with the model version it used."""
    client = mlflow.MlflowClient(served.mlflow_uri)
    runs = [r for r in _stage_runs(client, first[1]) if r.data.tags.get("stage") == "finetune"]
    versions = {str(v.version) for v in client.search_model_versions("name = 'bert-pretrained'")}
    top = [r for r in runs if "mlflow.parentRunId" not in r.data.tags]
    assert top
    for r in top:
        assert r.data.tags.get("pretrained_model") == "bert-pretrained", r.data.tags
        assert r.data.tags.get("pretrained_model_version") in versions, r.data.tags
