"""The pretrain_data stage as a DVC/Prefect/MLflow stage: its dvc.yaml entry and the thin flow."""

from __future__ import annotations

import json

import yaml

from bert_core.constants import REPO_ROOT as REPO
from bert_core.pretrain_data.params import PretrainDataParams
from bert_core.pretrain_data.testing import make_synthetic_inputs


def test_dvc_stage_lists_every_output_affecting_param():
    stage = yaml.safe_load((REPO / "dvc.yaml").read_text())["stages"]["pretrain_data"]
    assert stage["cmd"] == "exec python -m flows.pretrain_data"
    # code deps are derived from the stage's imports (tests/test_stages.py checks them all)
    assert {"data/corpus", "data/vocab", "bert_core/pretrain_data/build.py"} <= set(stage["deps"])
    assert stage["outs"] == [
        {"data/pretrain_data": {"persist": True}},
        {"metrics/details/pretrain_data.json": {"cache": False, "persist": True}},
    ]
    listed = {k.split(".", 1)[1] for k in stage["params"][0]["params/pretrain_data.yaml"]}
    # every field that changes the output bytes is listed; the worker count and check sample are not
    assert listed == set(PretrainDataParams.model_fields) - {"num_workers", "check_sample"}
    assert list(stage["metrics"][0]) == ["metrics/pretrain_data.json"]


def test_flow_builds_checks_and_records_the_stage(tmp_path):
    import mlflow

    from flows.pretrain_data import pretrain_data_flow

    corpus, vocab = make_synthetic_inputs(tmp_path / "in", n_train=300, n_heldout=60)
    params = {
        "pretrain_data": {
            "phases": ["seq128"],
            "dupe_factor": 2,
            "num_workers": 1,
            "min_window_docs": 16,
            "check_sample": 5000,
        }
    }
    (tmp_path / "p.yaml").write_text(yaml.safe_dump(params))
    metrics_path = tmp_path / "m" / "pretrain_data.json"
    m = pretrain_data_flow.fn(
        str(tmp_path / "p.yaml"),
        str(corpus),
        str(vocab),
        str(tmp_path / "out"),
        metrics_path=str(metrics_path),
    )
    assert json.loads((metrics_path.parent / "details" / metrics_path.name).read_text()) == json.loads(
        json.dumps(m)
    )
    headline = json.loads(metrics_path.read_text())  # the DVC metrics file: a handful of flat figures
    assert headline["seq128.train.instances"] == m["seq128"]["train"]["instances"] and len(headline) <= 20
    assert (
        m["seq128"]["train"]["instances"] > 0 and m["seq128"]["train"]["check_sample"]["failed_critical"] == 0
    )
    runs = mlflow.search_runs(experiment_names=["bert-pipeline"])
    run = runs[runs["tags.stage"] == "pretrain_data"].iloc[0]
    assert run["status"] == "FINISHED" and run["params.dupe_factor"] == "2"
    assert run["metrics.seq128.train.instances"] == m["seq128"]["train"]["instances"]
    artifacts = {a.path for a in mlflow.MlflowClient().list_artifacts(run["run_id"])}
    assert {"data_checks", "index"} <= artifacts
