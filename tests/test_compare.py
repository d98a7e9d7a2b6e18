"""flows.compare: per-task tables of two pipeline runs or two pretrained model versions (temp MLflow store)."""

from __future__ import annotations

import json
import shutil

import mlflow
import pytest
from mlflow.tracking import MlflowClient

from bert_core.tracking import FINETUNE_EXPERIMENT, tracking_uri
from flows import compare


def _log(
    pipeline: str,
    task: str,
    metrics: dict[str, float],
    model: str = "bert-pretrained/1",
    params: dict[str, str] | None = None,
    **tags: str,
) -> str:
    mlflow.set_tracking_uri(tracking_uri())
    mlflow.set_experiment(FINETUNE_EXPERIMENT)
    all_tags = {
        "task": task,
        "pipeline_run_id": pipeline,
        "pretrained_model_version": model,
        "stage": "finetune",
    }
    with mlflow.start_run(tags={**all_tags, **tags}) as run:
        mlflow.log_metrics(metrics)
        mlflow.log_params(params or {})
    return run.info.run_id


@pytest.fixture(scope="module")
def _templates(tmp_path_factory):
    """Migrated MLflow stores built once (creating one costs seconds): empty, and with the runs below."""
    root = tmp_path_factory.mktemp("mlflow-templates")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{root}/empty.db")
        MlflowClient(tracking_uri()).search_experiments()
        shutil.copy(root / "empty.db", root / "runs.db")
        mp.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{root}/runs.db")
        # Two pipeline runs: p1 (model v1) then p2 (model v2); p2 reran sst2 and has a nested trial.
        lr = "settings.learning_rates"
        _log(
            "p1-aaaa",
            "sst2",
            {"dev.accuracy": 80.0, "train.seconds": 10},
            params={lr: "[2e-05]", "seeds": "1"},
        )
        _log("p1-aaaa", "mrpc", {"dev.f1": 70.0, "dev.accuracy": 65.0})
        _log("p2-bbbb", "sst2", {"dev.accuracy": 81.0}, model="bert-pretrained/2")
        latest = {lr: "[3e-05]", "seeds": "1"}  # the latest counts
        _log("p2-bbbb", "sst2", {"dev.accuracy": 83.5}, model="bert-pretrained/2", params=latest)
        _log("p2-bbbb", "squad", {"dev.f1": 50.0, "dev.exact_match": 40.0}, model="bert-pretrained/2")
        test_set = {"dev.f1": 90.0, "test.f1": 86.0, "test.main": 86.0, "test.baseline.lexicon.f1": 45.0}
        _log("p2-bbbb", "conll2003", test_set, model="bert-pretrained/2")
        runs = mlflow.search_runs(experiment_names=[FINETUNE_EXPERIMENT], output_format="list")
        _log(
            "p2-bbbb",
            "squad",
            {"dev.f1": 1.0},
            model="bert-pretrained/2",
            **{"mlflow.parentRunId": runs[0].info.run_id},
        )
        MlflowClient(tracking_uri()).create_registered_model("bert-pretrained")
    return root


def _use(template, tmp_path, monkeypatch, name):
    shutil.copy(template / name, tmp_path / name)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / name}")


@pytest.fixture
def store(_templates, tmp_path, monkeypatch):
    _use(_templates, tmp_path, monkeypatch, "runs.db")
    return MlflowClient(tracking_uri())


def _rows(a: str, b: str) -> dict[tuple[str, str], dict]:
    client = compare._client()
    _, runs = compare.finetune_runs(client)
    sa, sb = compare.select(client, a, runs), compare.select(client, b, runs)
    return {(r["task"], r["metric"]): r for r in compare.comparison_rows(sa, sb)}


def test_pipeline_runs_side_by_side(store):
    rows = _rows("p1-aaaa", "p2-bbbb")
    assert rows[("sst2", "dev.accuracy")] == {
        "task": "sst2",
        "metric": "dev.accuracy",
        "a": 80.0,
        "b": 83.5,
        "delta": 3.5,
    }
    assert rows[("mrpc", "dev.f1")]["b"] is None and rows[("mrpc", "dev.f1")]["delta"] is None
    assert rows[("squad", "dev.f1")]["b"] == 50.0  # the top-level run, not the nested trial
    assert ("sst2", "train.seconds") not in rows  # default metric filter: dev*, test.* ...
    assert rows[("conll2003", "test.f1")]["b"] == 86.0  # ... a labelled test set's scores
    assert ("conll2003", "test.baseline.lexicon.f1") not in rows  # not its baselines'


def test_the_settings_that_differ_are_shown_before_the_scores(store, capsys):
    client = compare._client()
    _, runs = compare.finetune_runs(client)
    a, b = compare.select(client, "p1-aaaa", runs), compare.select(client, "p2-bbbb", runs)
    assert compare.setting_changes(a, b) == [  # sst2 only: the one task both sides ran
        {
            "task": "sst2",
            "setting": "pretrained_model_version",
            "a": "bert-pretrained/1",
            "b": "bert-pretrained/2",
        },
        {"task": "sst2", "setting": "settings.learning_rates", "a": "[2e-05]", "b": "[3e-05]"},
    ]
    assert compare.main(["p1-aaaa", "p2-bbbb"]) == 0
    out = capsys.readouterr().out
    assert (
        out.index("Settings that differ") < out.index("settings.learning_rates") < out.index("dev.accuracy")
    )
    assert compare.main(["p2-bbbb", "latest"]) == 0
    assert "Settings that differ (tasks both sides ran): none" in capsys.readouterr().out
    assert compare.main(["p1-aaaa", "p2-bbbb", "--format", "json"]) == 0
    assert len(json.loads(capsys.readouterr().out)["changes"]) == 2


def test_latest_prefix_and_model_versions(store):
    assert _rows("latest~1", "latest") == _rows("p1", "p2")
    by_model = _rows("bert-pretrained/1", "models:/bert-pretrained/2")
    assert by_model[("sst2", "dev.accuracy")]["delta"] == pytest.approx(3.5)
    store.create_model_version("bert-pretrained", "file:///tmp/none", run_id=None)
    store.create_model_version("bert-pretrained", "file:///tmp/none", run_id=None)
    store.set_registered_model_alias("bert-pretrained", "champion", "2")
    assert _rows("bert-pretrained/1", "bert-pretrained@champion") == by_model


def test_latest_skips_runs_that_fine_tuned_nothing(store):
    failed = _log("adhoc-cccc", "sst2", {})  # e.g. `python -m flows.finetune` on a missing model, twice
    MlflowClient(tracking_uri()).set_terminated(failed, "FAILED")
    _log("adhoc-dddd", "sst2", {"train.seconds": 1.0})  # finished, but no dev score
    assert _rows("latest~1", "latest") == _rows("p1", "p2")


def test_errors_name_what_exists(store):
    client = compare._client()
    _, runs = compare.finetune_runs(client)
    with pytest.raises(compare.CompareError, match="p2-bbbb"):
        compare.select(client, "nope", runs)
    with pytest.raises(compare.CompareError, match="only 2 pipeline run"):
        compare.select(client, "latest~2", runs)
    with pytest.raises(compare.CompareError, match="ambiguous"):
        compare.select(client, "p", runs)
    with pytest.raises(compare.CompareError, match="alias"):
        compare.select(client, "bert-pretrained@nothing", runs)


def test_cli_formats(store, capsys):
    assert compare.main(["p1-aaaa", "p2-bbbb"]) == 0
    out = capsys.readouterr().out
    assert "A = pipeline run p1-aaaa" in out and "+3.5" in out and "compare-runs?runs=" in out
    assert compare.main(["p1-aaaa", "p2-bbbb", "--format", "json", "--metric", "dev.f1"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert {(r["task"], r["metric"]) for r in data["rows"]} == {
        ("conll2003", "dev.f1"),
        ("mrpc", "dev.f1"),
        ("squad", "dev.f1"),
    }
    assert compare.main(["p1-aaaa", "zzz"]) == 2
    assert "matches no pipeline run" in capsys.readouterr().err


def test_empty_store_says_what_to_do(_templates, tmp_path, monkeypatch):
    _use(_templates, tmp_path, monkeypatch, "empty.db")
    with pytest.raises(compare.CompareError, match="run the pipeline first"):
        compare.compare("a", "b")
