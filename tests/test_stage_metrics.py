"""The DVC metrics file of each stage holds its headline figures (a terminal-wide ``dvc metrics show`` row,
task scores first); the details file beside it and MLflow get every statistic (flows._stage)."""

from __future__ import annotations

import json

import mlflow
import pytest

from bert_core.params import flatten
from flows import stages
from flows._stage import MAX_HEADLINE, details_file, headline, stage

# Statistics shaped like each stage's, with as many phases, sources, baselines and splits as the pipeline
# has (the corpus, vocab and pretrain_data flows are run for real in their own tests).
_PHASE_SPLIT = {
    "instances": 10,
    "tokens": 900,
    "mean_length": 90.0,
    "padding_share": 0.1,
    "random_next": 5,
    "check_sample": {"failed_critical": 0, "checked": 100},
    "corpus_tokens": 1000,
}
STATS = {
    "corpus": {
        "documents": 150,
        "documents_train": 140,
        "documents_heldout": 10,
        "sentences": 900,
        "words": 9000,
        "bytes": 50000,
        "input_files": 3,
        "input_bytes": 60000,
        "records_read": 160,
        "duplicates": 2,
        "documents_dropped": {"short": 5, "empty": 3},
        "documents_dropped_total": 8,
        "utf8_replacements": 0,
        "files_with_utf8_errors": 0,
        "gutenberg_boilerplate_removed": 1,
        "capped": 0,
        "units_stopped_early": 0,
        "sources": {s: {"documents": 75, "bytes": 25000} for s in ("wikipedia", "bookcorpus")},
        "shards_train": 4,
        "shards_heldout": 1,
        "elapsed_s": 1.2,
        "input_mb_per_s": 0.05,
        "checks_failed": 0,
    },
    "pretrain_data": {
        **{phase: {split: _PHASE_SPLIT for split in ("train", "heldout")} for phase in ("seq128", "seq512")},
        "elapsed_s": 9.8,
        "instances_per_s": 4.0,
        "tokens_per_s": 360.0,
        "workers": 2,
    },
    "pretrain": {
        "heldout": {
            "mlm_loss": 3.1,
            "mlm_acc": 0.42,
            "nsp_acc": 0.8,
            "baseline_mlm_acc": 0.05,
            "baseline_mlm_ppl": 900.0,
            "baseline_nsp_acc": 0.5,
            "loss": 3.6,
        },
        "phases": {
            p: {
                "steps": 100,
                "seconds": 60.0,
                "stop_reason": "max_steps",
                "train_loss": 3.2,
                "train_mlm_acc": 0.4,
                "train_nsp_acc": 0.8,
                "train_seq_per_s": 50.0,
                "train_tokens_per_s": 6400.0,
                "train_mfu": 0.3,
                "mlm_loss": 3.1,
                "mlm_acc": 0.42,
            }
            for p in ("seq128", "seq512")
        },
        "steps": 200,
        "parameters_m": 4.4,
        "train_seconds": 120.0,
        "registry": {"registered_model": "bert-pretrained", "version": 3, "alias": "candidate"},
    },
    "finetune": {
        "dev.accuracy": 84.0,
        "dev.f1": 83.0,
        "dev_mismatched.accuracy": 84.5,
        "dev_mismatched.f1": 84.0,
        "dev.accuracy_mean": 83.5,
        "dev.accuracy_std": 0.4,
        "seeds": 5.0,
        "selected.learning_rate": 3e-5,
        "selected.seed": 2.0,
        "dev.eval_loss": 0.5,
        "random_init.dev.accuracy": 61.0,
        "random_init.dev.f1": 60.0,
        "gap.dev.accuracy": 23.0,
        "reference.dev.accuracy": 84.2,
        "reference.dev.f1": 84.0,
        "train.examples": 392702.0,
        "train.examples_per_second": 800.0,
        "train.seconds": 9000.0,
        "trials": 20.0,
        **{
            f"baseline.{b}.{m}": 35.0
            for b in ("majority", "bow", "hypothesis_only")
            for m in ("accuracy", "f1")
        },
        "best_baseline.accuracy": 52.0,
        "main_metric": "accuracy",
    },
}


@pytest.mark.parametrize("name", sorted(STATS))
def test_each_stages_headline_is_a_handful_of_flat_keys_and_the_details_hold_the_rest(name):
    spec = stages.get(name)
    details = STATS[name]
    top = headline(details, spec.headline, main="accuracy" if name == "finetune" else None)
    assert 5 <= len(top) <= MAX_HEADLINE, sorted(top)
    flat = flatten(details)
    assert all(not isinstance(v, dict) and v in flat.values() for v in top.values())
    assert len(flat) > len(top)  # the rest is in the details only


def test_a_finetune_headline_starts_with_the_task_score_and_has_the_baselines_best():
    top = headline(STATS["finetune"], stages.get("finetune").headline, main="accuracy")
    assert list(top)[:4] == ["score", "score_mean", "score_std", "seeds"]
    assert top["score"] == 84.0 and top["score_mismatched"] == 84.5 and top["main_metric"] == "accuracy"
    assert top["best_baseline"] == 52.0 and top["gap_random_init"] == 23.0
    assert not any(k.startswith("baseline.") for k in top)


def test_every_task_gets_the_same_columns_whatever_its_main_metric():
    f1 = {k.replace("accuracy", "f1"): v for k, v in STATS["finetune"].items() if "f1" not in k}
    spec = stages.get("finetune")
    by_accuracy = headline(STATS["finetune"], spec.headline, main="accuracy")
    assert set(headline(f1 | {"main_metric": "f1"}, spec.headline, main="f1")) == set(by_accuracy)


def test_an_alias_takes_the_first_match_once():
    assert headline({"a": {"x": 1, "y": 2}, "b": 3}, ["first=a.*", "a.*", "b"]) == {
        "first": 1,
        "a.y": 2,
        "b": 3,
    }


def test_headline_keeps_pattern_order_and_caps_with_a_warning(caplog):
    metrics = {"b": 1, "a": {f"k{i:02d}": i for i in range(30)}}
    top = headline(metrics, ["b", "a.*"])
    assert list(top)[:2] == ["b", "a.k00"] and len(top) == MAX_HEADLINE
    assert "a.k29" in caplog.text and "narrow" in caplog.text


def test_the_details_file_lies_in_a_details_folder_beside_the_metrics_file(tmp_path):
    assert details_file("metrics/corpus.json").as_posix() == "metrics/details/corpus.json"
    for spec in stages.STAGES:
        assert [details_file(m).as_posix() for m in spec.metrics] == list(spec.details)


def test_the_runner_writes_the_headline_to_the_metrics_file_and_every_statistic_beside_it(tmp_path):
    out, metrics = tmp_path / "out", tmp_path / "m" / "corpus.json"
    details = STATS["corpus"]
    with stage("corpus", {"x": 1}, out, metrics_path=metrics, dirs=(out,)) as s:
        s.done(headline(details, stages.get("corpus").headline), details=details)
    on_disk = json.loads(metrics.read_text())
    assert on_disk == s.metrics and len(on_disk) <= MAX_HEADLINE
    assert list(on_disk) == list(s.metrics) and next(iter(on_disk)) == "documents"  # in the headline order
    assert json.loads((tmp_path / "m" / "details" / "corpus.json").read_text()) == details
    run = mlflow.search_runs(experiment_names=["bert-pipeline"]).iloc[0]
    assert run["metrics.sources.wikipedia.documents"] == 75  # MLflow keeps every statistic


def test_a_metrics_artifact_is_made_only_inside_a_prefect_run_under_a_valid_key(monkeypatch):
    import prefect.artifacts
    from prefect.context import FlowRunContext

    from flows._stage import metrics_artifact

    made = []
    monkeypatch.setattr(prefect.artifacts, "create_markdown_artifact", lambda **kw: made.append(kw))
    metrics_artifact("pipeline-finetune@sst2", "finetune@sst2", {"dev": {"accuracy": 81.5}})
    assert made == []  # outside a flow or task run (a stage function called directly)
    monkeypatch.setattr(FlowRunContext, "get", classmethod(lambda cls: object()))
    metrics_artifact("Pipeline-finetune@SST2 (dev)", "finetune@sst2", {"dev": {"accuracy": 81.5}})
    assert made[0]["key"] == "pipeline-finetune-sst2-dev"  # lowercase letters, digits and single dashes
    assert "dev.accuracy" in made[0]["markdown"] and made[0]["description"] == "Metrics of finetune@sst2"
