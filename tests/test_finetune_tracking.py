"""MLflow side of fine-tuning: model sources from the registry, the champion alias, the stage flows.

Every test runs against its own SQLite MLflow store (the autouse fixture in conftest.py).
"""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path

import pytest

from bert_core.tracking import FINGERPRINT_TAG, fingerprint, register, resolve_model_source


def _run_id() -> str:
    import mlflow

    mlflow.set_experiment("test")
    with mlflow.start_run() as run:
        return run.info.run_id


def test_alias_moves_only_on_improvement(tmp_path):
    from mlflow import MlflowClient

    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    client = MlflowClient()
    outcomes = []
    for value in (50.0, 40.0, 50.0, 60.0, float("nan")):
        reg = register(
            model,
            name="bert-sst2",
            run_id=_run_id(),
            metric_key="dev.accuracy",
            value=value,
            alias="champion",
            tags={"task": "sst2"},
        )
        outcomes.append((reg.version, reg.alias_moved))
        champion = client.get_model_version_by_alias("bert-sst2", "champion")
        assert str(champion.version) == [v for v, moved in outcomes if moved][-1]
    assert outcomes == [("1", True), ("2", False), ("3", False), ("4", True), ("5", False)]
    v2 = client.get_model_version("bert-sst2", "2")
    assert v2.tags["dev.accuracy"] == "40.0" and v2.tags["selection_metric"] == "dev.accuracy"
    assert v2.tags["task"] == "sst2"


def test_the_alias_compares_scores_on_the_same_rows_only(tmp_path):
    """A score on 4 dev rows never displaces one on the whole dev split; one on the whole split displaces a
    partial one; scores on the same rows compare as usual."""
    from mlflow import MlflowClient

    from bert_core.tracking.registry import EVAL_SET_TAG, WHOLE_DEV

    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    four = "official dev split (first 4 rows only: a row limit)"

    def moves(name: str, value: float, eval_set: str) -> bool:
        return register(
            model,
            name=name,
            run_id=_run_id(),
            metric_key="dev.accuracy",
            value=value,
            alias="champion",
            eval_set=eval_set,
        ).alias_moved

    assert [moves("bert-sst2", v, e) for v, e in ((50, ""), (90, four), (95, four), (49, ""), (52, ""))] == [
        True,
        False,
        False,
        False,
        True,
    ]
    assert [moves("bert-cola", v, e) for v, e in ((80, four), (90, four), (10, ""), (99, four))] == [
        True,
        True,
        True,
        False,
    ]
    client = MlflowClient()
    assert str(client.get_model_version_by_alias("bert-cola", "champion").version) == "3"
    assert client.get_model_version("bert-cola", "3").tags[EVAL_SET_TAG] == WHOLE_DEV
    assert client.get_model_version("bert-cola", "4").tags[EVAL_SET_TAG] == four


def test_resolve_local_and_registry_sources(tiny_model, tmp_path):
    import mlflow
    from mlflow import MlflowClient

    local = resolve_model_source(str(tiny_model), tmp_path / "dl")
    assert local.path == tiny_model and local.info["sha"] == fingerprint(tiny_model)
    assert "model_version" not in local.info
    with pytest.raises(FileNotFoundError, match="dvc repro pretrain"):
        resolve_model_source(str(tmp_path / "missing"), tmp_path / "dl")

    client = MlflowClient()
    client.create_registered_model("bert-pretrained")
    mlflow.set_experiment("pretrain")
    for _ in range(2):
        with mlflow.start_run() as run:
            mlflow.log_artifacts(str(tiny_model), "model")
        mv = client.create_model_version(
            "bert-pretrained",
            source=f"runs:/{run.info.run_id}/model",
            run_id=run.info.run_id,
            tags={FINGERPRINT_TAG: fingerprint(tiny_model)},
        )
    client.set_registered_model_alias("bert-pretrained", "champion", "1")
    for uri, version in (
        ("models:/bert-pretrained@champion", "1"),
        ("models:/bert-pretrained/1", "1"),
        ("models:/bert-pretrained@latest", "2"),
        ("models:/bert-pretrained/latest", "2"),
    ):
        resolved = resolve_model_source(uri, tmp_path / f"dl{version}{len(uri)}")
        assert (resolved.path / "config.json").is_file() and (resolved.path / "vocab.txt").is_file()
        assert resolved.info["model"] == "bert-pretrained" and resolved.info["model_version"] == version
        assert resolved.info["sha"] == fingerprint(tiny_model)
    # a local copy of a registered model is recognised by its fingerprint tag
    assert resolve_model_source(str(tiny_model), tmp_path / "dl").info["model_version"] == str(mv.version)
    with pytest.raises(ValueError, match="not found in the MLflow registry"):
        resolve_model_source("models:/bert-pretrained@nope", tmp_path / "dl")
    with pytest.raises(ValueError, match="not a registry URI"):
        resolve_model_source("models:/a/b/c", tmp_path / "dl")


def _params_file(tmp_path: Path, model: Path) -> Path:
    path = tmp_path / "finetune.yaml"
    path.write_text(
        f"""finetune:
  model: {{source: {model}}}
  defaults: {{train_limit: 24, eval_limit: 16, test_limit: 8, learning_rates: [1.0e-3], epochs: 1,
              batch_size: 8, max_seq_length: 64}}
  small_task_seeds: [1]
  data_checks: true
  tasks:
    sst2: {{random_init_baseline: true}}
"""
    )
    return path


def test_finetune_and_evaluate_flows_record_everything(tiny_model, shared_data, tmp_path, monkeypatch):
    from mlflow import MlflowClient

    from bert_core.tracking import FINETUNE_EXPERIMENT
    from flows.evaluate import evaluate_flow
    from flows.finetune import finetune_flow

    monkeypatch.setenv("BERT_DATA_ROOT", str(shared_data))
    params = _params_file(tmp_path, tiny_model)
    results = tmp_path / "results" / "finetune"
    metrics = finetune_flow.fn(
        "sst2",
        str(params),
        out_dir=str(results / "sst2"),
        model_out=str(tmp_path / "models" / "sst2"),
        metrics_path=str(tmp_path / "metrics" / "sst2.json"),
        plots_dir=str(tmp_path / "plots" / "sst2"),
    )
    # the DVC metrics file: the headline, task score first; the details file beside it: every statistic
    headline = json.loads((tmp_path / "metrics" / "sst2.json").read_text())
    assert next(iter(headline)) == "score" and len(headline) <= 20 and headline["main_metric"] == "accuracy"
    assert headline["score"] == pytest.approx(metrics["dev.accuracy"])
    assert headline["gap_random_init"] == pytest.approx(metrics["gap.dev.accuracy"])
    details = json.loads((tmp_path / "metrics" / "details" / "sst2.json").read_text())
    assert details == pytest.approx(metrics) and "best_baseline.accuracy" in details
    with open(tmp_path / "plots" / "sst2" / "train.csv", encoding="utf-8") as fh:
        train_curve = list(csv.DictReader(fh))
    with open(tmp_path / "plots" / "sst2" / "dev.csv", encoding="utf-8") as fh:
        dev_curve = list(csv.DictReader(fh))
    assert train_curve and set(train_curve[0]) == {"step", "epoch", "loss", "learning_rate"}
    assert all(math.isfinite(float(row["loss"])) for row in train_curve)
    assert dev_curve and list(dev_curve[0])[-1] == "accuracy"  # the main metric last: DVC's default y
    assert float(dev_curve[-1]["accuracy"]) == pytest.approx(metrics["dev.accuracy"])
    assert {"dev.accuracy", "random_init.dev.accuracy", "gap.dev.accuracy"} <= set(metrics)

    client = MlflowClient()
    exp = client.get_experiment_by_name(FINETUNE_EXPERIMENT)
    runs = client.search_runs([exp.experiment_id])
    parents = [r for r in runs if "mlflow.parentRunId" not in r.data.tags]
    trials = [r for r in runs if "mlflow.parentRunId" in r.data.tags]
    assert len(parents) == 1 and len(trials) == 2
    parent = parents[0]
    assert parent.data.tags["task"] == "sst2" and parent.data.tags["git_commit"]
    assert parent.data.tags["pretrained_sha"] == fingerprint(tiny_model)
    assert parent.data.metrics["dev.accuracy"] == pytest.approx(metrics["dev.accuracy"])
    assert "checks.task-sst2-train.failed" in parent.data.metrics
    for trial in trials:  # the same metric keys in every trial run, tagged for comparison
        assert trial.data.tags["mlflow.parentRunId"] == parent.info.run_id
        assert {"dev.accuracy", "train.loss", "train.examples_per_second"} <= set(trial.data.metrics)
        # the one comparable column, as on the task's run: trials sort by dev.main too
        assert trial.data.metrics["dev.main"] == trial.data.metrics["dev.accuracy"]
        assert trial.data.tags["main_metric"] == "accuracy"
        assert trial.data.tags["task"] == "sst2" and trial.data.tags["init"] in ("pretrained", "random")
        assert trial.data.tags["pipeline_run_id"] == parent.data.tags["pipeline_run_id"]
        assert trial.data.tags["pretrained_sha"] == parent.data.tags["pretrained_sha"]  # the run's own tags
    champion = client.get_model_version_by_alias("bert-sst2", "champion")
    assert champion.run_id == parent.info.run_id
    assert float(champion.tags["dev.accuracy"]) == pytest.approx(metrics["dev.accuracy"])
    assert champion.tags["pretrained_sha"] == fingerprint(tiny_model) and champion.tags["selected_trial"]

    eval_params = tmp_path / "evaluate.yaml"
    eval_params.write_text(f"evaluate: {{results_dir: {results}, report_dir: {tmp_path / 'reports'}}}\n")
    summary = evaluate_flow.fn(
        str(eval_params), str(params), metrics_path=str(tmp_path / "metrics" / "evaluate.json")
    )
    assert summary["sst2.accuracy"] == pytest.approx(metrics["dev.accuracy"])
    assert summary["gap.sst2.accuracy"] == pytest.approx(metrics["gap.dev.accuracy"])
    assert next(iter(json.loads((tmp_path / "metrics" / "evaluate.json").read_text()))) == "sst2.accuracy"
    assert (tmp_path / "reports" / "evaluate.html").is_file() and (
        tmp_path / "reports" / "evaluate" / "scores.png"
    ).is_file()


def test_a_trial_run_gets_its_metrics_and_the_tags_set_after_training(monkeypatch, caplog):
    from mlflow import MlflowClient

    from bert_core.tracking.trials import MlflowTrialTracker

    parent = _run_id()
    tracker = MlflowTrialTracker(parent, tags={"task": "rte"}, main_metric="accuracy")
    with tracker.trial("rte-pretrained-lr2e-05-seed1", {"lr": 2e-5}, {"init": "pretrained"}) as recorder:
        recorder.log_metrics({"dev.accuracy": 60.0}, step=9)
        recorder.set_tags({"trial_resumed_from_step": "4"})
        with monkeypatch.context() as m:  # a tracking server failing here costs a warning, not the trial
            m.setattr(MlflowClient, "set_tag", lambda *a, **k: (_ for _ in ()).throw(OSError("down")))
            recorder.set_tags({"other": "x"})
    assert "tag other not set: down" in caplog.text
    (run,) = MlflowClient().search_runs(
        [MlflowClient().get_run(parent).info.experiment_id], f"tags.mlflow.parentRunId = '{parent}'"
    )
    assert run.data.tags["trial_resumed_from_step"] == "4" and run.data.tags["init"] == "pretrained"
    assert run.data.metrics["dev.accuracy"] == 60.0 and run.info.status == "FINISHED"
