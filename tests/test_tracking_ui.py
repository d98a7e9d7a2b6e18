"""What the MLflow UI shows of the pipeline's runs: the model-training view, dataset inputs, one headline
metric per task. The browser check is tests/e2e/test_browser.py."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest
from mlflow import MlflowClient

from bert_core.tracking import FINETUNE_EXPERIMENT, PIPELINE_EXPERIMENT, stage_run
from bert_core.tracking.run import EXPERIMENT_KIND, EXPERIMENT_KIND_TAG
from bert_core.tracking.ui import (
    HEADLINE_METRIC,
    SAVED_VIEW_TAG_PREFIX,
    TASK_RUNS_VIEW,
    experiment_url,
    log_dataset,
    log_headline_metric,
    log_pretrain_data,
    log_task_data,
    save_runs_view,
)


def _inputs(run_id: str) -> dict[str, dict]:
    """Dataset inputs of a run: name -> {digest, context, tags, profile}."""
    run = MlflowClient().get_run(run_id)
    out = {}
    for inp in run.inputs.dataset_inputs:
        tags = {t.key: t.value for t in inp.tags}
        out[inp.dataset.name] = {
            "digest": inp.dataset.digest,
            "context": tags.get("mlflow.data.context"),
            "tags": tags,
            "profile": json.loads(inp.dataset.profile or "{}"),
        }
    return out


def test_every_experiment_is_a_model_training_experiment():
    for experiment in (PIPELINE_EXPERIMENT, FINETUNE_EXPERIMENT):
        with stage_run("x", {"a": 1}, experiment=experiment):
            pass
        tags = MlflowClient().get_experiment_by_name(experiment).tags
        assert tags[EXPERIMENT_KIND_TAG] == EXPERIMENT_KIND == "custom_model_development"


def test_a_kind_chosen_in_the_ui_is_kept():
    client = MlflowClient()
    with stage_run("x", None, experiment="chosen"):
        pass
    exp = client.get_experiment_by_name("chosen")
    client.set_experiment_tag(exp.experiment_id, EXPERIMENT_KIND_TAG, "finetuning")
    with stage_run("x", None, experiment="chosen"):
        pass
    assert client.get_experiment_by_name("chosen").tags[EXPERIMENT_KIND_TAG] == "finetuning"


def test_stages_that_start_together_tag_the_experiment_without_a_warning(monkeypatch, caplog):
    """Two stages find the new experiment untagged; the second's insert then fails on SQLite's unique key
    (``UNIQUE constraint failed: experiment_tags.key, ...``): the tag is there, nothing to report."""
    import mlflow
    from mlflow.exceptions import MlflowException

    from bert_core.tracking.run import tag_experiment_kind

    client = MlflowClient()
    untagged = mlflow.get_experiment(client.create_experiment("together"))
    client.set_experiment_tag(untagged.experiment_id, EXPERIMENT_KIND_TAG, EXPERIMENT_KIND)  # the other stage

    def late(self, *args):
        raise MlflowException("(sqlite3.IntegrityError) UNIQUE constraint failed: experiment_tags.key")

    monkeypatch.setattr(MlflowClient, "set_experiment_tag", late)
    with caplog.at_level("WARNING", logger="bert_core"):
        tag_experiment_kind(untagged)
    assert not [r for r in caplog.records if r.levelname == "WARNING"]
    assert client.get_experiment(untagged.experiment_id).tags[EXPERIMENT_KIND_TAG] == EXPERIMENT_KIND


def test_task_data_become_dataset_inputs(tmp_path):
    from bert_core.finetune.trial import SplitData, TrialData

    rows = [{"sentence": "good", "label": 1}, {"sentence": "bad", "label": 0}]
    data = TrialData(
        train=SplitData(rows, [], str(tmp_path / "train.tsv")),
        dev={"dev": SplitData(rows[:1], [], "hf://nyu-mll/glue/sst2:validation")},
    )
    with stage_run("finetune", None, experiment=FINETUNE_EXPERIMENT) as run:
        log_task_data("sst2", data)
        assert log_headline_metric("accuracy", {"dev.accuracy": 91.5}) == 91.5
    inputs = _inputs(run.run_id)
    assert inputs["sst2-train"]["context"] == "training" and inputs["sst2-dev"]["context"] == "evaluation"
    assert inputs["sst2-train"]["tags"]["task"] == "sst2" and inputs["sst2-train"]["tags"]["split"] == "train"
    assert inputs["sst2-train"]["profile"] == {"num_rows": 2} and inputs["sst2-dev"]["tags"]["rows"] == "1"
    assert inputs["sst2-train"]["digest"] != inputs["sst2-dev"]["digest"]
    got = MlflowClient().get_run(run.run_id).data
    assert got.metrics[HEADLINE_METRIC] == 91.5 and got.tags["main_metric"] == "accuracy"
    assert "test.main" not in got.metrics
    with stage_run("finetune", None, experiment=FINETUNE_EXPERIMENT) as run:  # a labelled test set too
        assert log_headline_metric("f1", {"dev.f1": 90.0, "test.f1": 86.5, "test.precision": 85.0}) == 90.0
    assert MlflowClient().get_run(run.run_id).data.metrics["test.main"] == 86.5


def test_pretrain_data_digest_is_the_index(tmp_path):
    for split in ("train", "heldout"):
        (tmp_path / "seq128" / split).mkdir(parents=True)
        (tmp_path / "seq128" / split / "index.json").write_text(
            json.dumps({"num_instances": 7, "split": split})
        )
    with stage_run("pretrain", None) as run:
        log_pretrain_data(tmp_path, ["seq128", "seq512"])  # seq512 absent: warned, not raised
    inputs = _inputs(run.run_id)
    assert set(inputs) == {"pretrain-seq128-train", "pretrain-seq128-heldout"}
    assert inputs["pretrain-seq128-train"]["profile"] == {"num_rows": 7}


def test_dataset_logging_never_fails_the_run(monkeypatch):
    import mlflow

    def broken(*_, **__):
        raise RuntimeError("server down")

    monkeypatch.setattr(mlflow, "log_input", broken)
    monkeypatch.setattr("bert_core.tracking.run.time.sleep", lambda s: None)
    with stage_run("x", None):
        assert log_dataset("d", source="", digest="0", rows=1, context="training") is False


def test_finetune_flow_logs_datasets_headline_and_card(tiny_model, shared_data, tmp_path, monkeypatch):
    from huggingface_hub import ModelCard

    from flows.finetune import finetune_flow

    monkeypatch.setenv("BERT_DATA_ROOT", str(shared_data))
    monkeypatch.setenv("BERT_PIPELINE_RUN_ID", "pipe-card-test")
    params = tmp_path / "finetune.yaml"
    params.write_text(f"""finetune:
  model: {{source: {tiny_model}}}
  defaults: {{train_limit: 16, eval_limit: 8, test_limit: 4, learning_rates: [1.0e-3], epochs: 1,
              batch_size: 8, max_seq_length: 32, random_init_baseline: false, predict_test: false}}
  small_task_seeds: [1]
  data_checks: false
""")
    model_dir = tmp_path / "models" / "sst2"
    metrics = finetune_flow.fn(
        "sst2",
        str(params),
        out_dir=str(tmp_path / "results"),
        model_out=str(model_dir),
        metrics_path=str(tmp_path / "m.json"),
        plots_dir=str(tmp_path / "plots"),
    )
    client = MlflowClient()
    exp = client.get_experiment_by_name(FINETUNE_EXPERIMENT)
    assert exp.tags[EXPERIMENT_KIND_TAG] == EXPERIMENT_KIND
    [parent] = [r for r in client.search_runs([exp.experiment_id]) if "mlflow.parentRunId" not in r.data.tags]
    assert parent.data.metrics[HEADLINE_METRIC] == pytest.approx(metrics["dev.accuracy"])
    assert parent.data.metrics["dev.accuracy"] == pytest.approx(metrics["dev.accuracy"])  # the old key stays
    assert parent.data.tags["main_metric"] == "accuracy"
    inputs = _inputs(parent.info.run_id)
    assert (
        inputs["sst2-train"]["profile"] == {"num_rows": 16} and inputs["sst2-dev"]["context"] == "evaluation"
    )

    local = (model_dir / "README.md").read_text()
    assert "pipe-card-test" not in local and parent.info.run_id not in local  # the DVC output: run-free
    card = ModelCard(local)
    assert card.data.language == "en" and card.data.eval_results[0].metric_value == pytest.approx(
        round(metrics["dev.accuracy"], 4)
    )
    version = client.get_model_version_by_alias("bert-sst2", "champion")
    registered = Path(
        client.download_artifacts(version.run_id, "model/artifacts/hf_model/README.md", str(tmp_path / "dl"))
    )
    text = registered.read_text()
    assert "pipe-card-test" in text and parent.info.run_id in text
    assert ModelCard(text).data.base_model


def test_corpus_manifest_is_the_vocab_stage_input(tmp_path):
    from bert_core.tracking.ui import log_corpus_data

    (tmp_path / "manifest.json").write_text(json.dumps({"splits": {"train": {"documents": 12}}}))
    with stage_run("vocab", None) as run:
        log_corpus_data(tmp_path)
    assert _inputs(run.run_id)["corpus-train"]["profile"] == {"num_rows": 12}


def test_make_ui_lists_the_pipeline_experiments_with_model_training_links():
    import os

    from flows import ui

    with stage_run("finetune", {"task": "sst2"}, experiment=FINETUNE_EXPERIMENT, run_name="finetune-sst2"):
        pass
    with stage_run("corpus", None, experiment=PIPELINE_EXPERIMENT):
        pass
    MlflowClient().create_experiment("someone-elses")  # not the pipeline's: no link
    found = ui.pipeline_experiments(os.environ["MLFLOW_TRACKING_URI"])
    assert [name for name, _, _ in found] == [FINETUNE_EXPERIMENT, PIPELINE_EXPERIMENT]
    assert [view for _, _, view in found] == [TASK_RUNS_VIEW.view_id, None]
    lines = ui.links("http://127.0.0.1:5000", found)
    assert lines[0].endswith("http://127.0.0.1:5000/#/experiments?workflowType=machine_learning")
    finetune, pipeline = found
    assert lines[1].endswith(
        f"/#/experiments/{finetune.experiment_id}/runs?workflowType=machine_learning"
        f"&viewStateShareKey={TASK_RUNS_VIEW.view_id}"
    )
    # No sort in the links: any sort but start time lists the trials flat, and MLflow ignores a saved view
    # when the URL has one.
    assert lines[2].endswith(f"/#/experiments/{pipeline.experiment_id}/runs?workflowType=machine_learning")
    assert "orderByKey" not in "".join(lines)
    assert "make pipeline" in ui.links("http://h:1", [])[1]


def test_the_task_runs_view_is_an_mlflow_saved_view():
    client = MlflowClient()
    with stage_run("finetune", {"task": "sst2"}, experiment=FINETUNE_EXPERIMENT):
        pass
    experiment = client.get_experiment_by_name(FINETUNE_EXPERIMENT)
    assert save_runs_view(client, experiment)
    key = SAVED_VIEW_TAG_PREFIX + TASK_RUNS_VIEW.view_id
    envelope = json.loads(client.get_experiment(experiment.experiment_id).tags[key])
    # The envelope MLflow's Views menu lists: a name, times in ms, the state as a JSON string.
    assert envelope["name"] == TASK_RUNS_VIEW.name and isinstance(envelope["createdAt"], int)
    state = json.loads(envelope["state"])
    assert state["orderByKey"] == "attributes.start_time" and state["orderByAsc"] is False  # trials nested
    assert state["searchFilter"] == ""
    assert state["selectedColumns"][0] == f"metrics.`{HEADLINE_METRIC}`" == state["columnOrder"][0]

    # Unchanged: not written again (the first save time stays); changed in the UI: reset to the pipeline's.
    experiment = client.get_experiment(experiment.experiment_id)
    assert save_runs_view(client, experiment)
    assert json.loads(client.get_experiment(experiment.experiment_id).tags[key]) == envelope
    client.set_experiment_tag(
        experiment.experiment_id, key, json.dumps({**envelope, "state": "{}", "createdAt": 7})
    )
    assert save_runs_view(client, client.get_experiment(experiment.experiment_id))
    again = json.loads(client.get_experiment(experiment.experiment_id).tags[key])
    assert again["state"] == envelope["state"] and again["createdAt"] == 7


def test_a_view_that_cannot_be_saved_costs_only_the_columns(caplog):
    class ReadOnly:
        def set_experiment_tag(self, *args):
            raise PermissionError("read-only tracking server")

    experiment = SimpleNamespace(experiment_id="1", name=FINETUNE_EXPERIMENT, tags={})
    with caplog.at_level("WARNING", logger="bert_core.stage"):
        assert not save_runs_view(ReadOnly(), experiment)
    assert "could not save the runs-table view bert-task-runs" in caplog.text
    assert "viewStateShareKey" not in experiment_url("http://h:1", "1", None)


def test_corpus_sources_are_the_corpus_stage_inputs(tmp_path):
    from types import SimpleNamespace

    from bert_core.constants import REPO_ROOT
    from bert_core.corpus import CorpusParams
    from bert_core.params import load_params
    from bert_core.tracking.ui import log_corpus_sources

    params = load_params(REPO_ROOT / "params" / "corpus.yaml", "corpus", CorpusParams)
    stats = SimpleNamespace(per_source={"gutenberg": {"documents": 3, "bytes": 900}})
    with stage_run("corpus", {"a": 1}) as run:
        log_corpus_sources(params, stats, tmp_path)
    got = _inputs(run.run_id)
    assert set(got) == {f"corpus-{s.name}" for s in params.local_sources}
    book = got["corpus-gutenberg"]
    assert book["context"] == "source" and book["profile"] == {"num_rows": 3}
    assert book["tags"]["kind"] == "text" and book["tags"]["bytes"] == "900"
    assert book["tags"]["source"] == str(tmp_path / "corpus/gutenberg/*.txt")
    with stage_run("corpus", {"a": 1}) as run:  # the Hub sources when there is no data root
        log_corpus_sources(params, SimpleNamespace(per_source={}), None)
    hub = _inputs(run.run_id)
    assert set(hub) == {f"corpus-{s.name}" for s in params.sources}
    assert hub["corpus-wikitext103"]["tags"]["source"].startswith("hf://Salesforce/wikitext/")
