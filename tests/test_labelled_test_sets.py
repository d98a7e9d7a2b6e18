"""A labelled test set: CoNLL-2003's (the paper reports test F1 beside dev) and an own task's ``test_file``
(or a Hub split ``test``). It is scored once, by the model the dev set selected, beside the same trivial
baselines, and reported as a row of its own next to the published test score.

Every test runs against its own SQLite MLflow store (the autouse fixture in conftest.py).
"""

from __future__ import annotations

import csv
import json
import re
from pathlib import Path

import pytest

from bert_core.evaluate import evaluate_results, summarize
from bert_core.finetune.params import FinetuneParams
from bert_core.finetune.results import FinetuneResult, TrialResult
from bert_core.tasks import TaskDataError, get_task, own_task_spec

REVIEWS = {"kind": "classification", "text": "review", "label": "sentiment"}
BASE = {"source": "models/pretrained", "num_hidden_layers": 12, "hidden_size": 768, "preset": "base"}


def _csv(path: Path, rows: list[list[str]]) -> Path:
    with open(path, "w", newline="", encoding="utf-8") as fh:
        csv.writer(fh).writerows([["review", "sentiment"], *rows])
    return path


def _sst2_as_csv(shared_data: Path, split: str, path: Path, n: int) -> Path:
    lines = (
        (shared_data / "glue" / "SST-2" / f"{split}.tsv").read_text(encoding="utf-8").splitlines()[1 : n + 1]
    )
    rows = [line.split("\t") for line in lines]
    return _csv(path, [[text, "pos" if label == "1" else "neg"] for text, label in rows])


def test_conll2003_and_an_own_task_with_a_test_file_or_hub_split_evaluate_a_test_split(tmp_path):
    conll = get_task("conll2003")
    assert conll.dev_splits == ("dev", "test") and conll.main_dev_split == "dev" and not conll.test_splits
    train = _csv(tmp_path / "train.csv", [["good", "pos"], ["bad", "neg"]])
    files = {"train_file": str(train), "dev_file": str(train)}
    without = FinetuneParams(tasks={"reviews": {"define": REVIEWS, **files}})
    assert without.task("reviews").dev_splits == ("dev",)
    params = FinetuneParams(tasks={"reviews": {"define": REVIEWS, **files, "test_file": str(train)}})
    spec = params.task("reviews")
    assert spec.dev_splits == ("dev", "test") and spec.splits == ("train", "dev", "test")
    hub = own_task_spec("imdb", kind="classification", text="text", labels=["neg", "pos"], hub="x/imdb")
    assert hub.dev_splits == ("dev",)
    hub = own_task_spec(
        "imdb",
        kind="classification",
        text="text",
        labels=["neg", "pos"],
        hub="x/imdb",
        hub_splits={"test": "test"},
    )
    assert hub.dev_splits == ("dev", "test") and hub.hub_splits["test"] == "test"
    # the paper's tasks' records are as they were: no test_file key unless one is set
    assert "test_file" not in params.for_task("sst2").model_dump()


@pytest.mark.parametrize(
    ("tasks", "message"),
    [
        ({"mnli": {"test_file": "x.tsv"}}, r"tasks\.mnli\.test_file: mnli has no single test split"),
        (
            {"squad_v1": {"dev_split": True, "test_file": "x.json"}},
            r"dev_split and train_file/dev_file/test_file exclude each other",
        ),
    ],
)
def test_a_test_file_where_a_task_cannot_take_one_is_refused_naming_its_key(tasks, message):
    with pytest.raises(ValueError, match=message):
        FinetuneParams(tasks=tasks)
    with pytest.raises(ValueError, match=r"defaults\.test_file: set it per task"):
        FinetuneParams(defaults={"test_file": "x.tsv"})


def test_a_test_file_that_is_missing_or_malformed_is_named_by_its_key_and_line(tmp_path):
    train = _csv(tmp_path / "train.csv", [["good", "pos"], ["bad", "neg"]])
    files = {"train_file": str(train), "dev_file": str(train)}
    missing = FinetuneParams(
        tasks={"reviews": {"define": REVIEWS, **files, "test_file": str(tmp_path / "none.csv")}}
    )
    with pytest.raises(
        TaskDataError, match=r"finetune\.tasks\.reviews\.test_file: .*none\.csv does not exist"
    ):
        missing.for_task("reviews").data_source(missing.task("reviews"))
    bad = _csv(tmp_path / "test.csv", [["fine", "pos"], ["meh", "neutral"]])
    params = FinetuneParams(tasks={"reviews": {"define": REVIEWS, **files, "test_file": str(bad)}})
    source = params.for_task("reviews").data_source(params.task("reviews"))
    assert [r["label"] for r in source.load("dev")] == [1, 0]
    with pytest.raises(
        TaskDataError, match=r"finetune\.tasks\.reviews\.test_file: .*test\.csv:3: label 'neutral'"
    ):
        source.load("test")
    # a paper's task's test_file replaces its test split only
    conll = FinetuneParams(tasks={"conll2003": {"test_file": str(tmp_path / "test.conll")}})
    (tmp_path / "test.conll").write_text("EU NNP B-NP B-ORG\nrejects VBZ B-VP O\n", encoding="utf-8")
    source = conll.for_task("conll2003").data_source(get_task("conll2003"))
    assert source.origin == "own_files" and source.train_file is None and source.dev_file is None
    rows = source.load("test")
    assert rows.source.endswith("test.conll") and len(rows) == 1
    assert source.describe()["label"] == f"own files: test {tmp_path / 'test.conll'}"


def test_an_own_tasks_test_set_is_scored_once_by_the_selected_model_beside_its_baselines(
    tiny_model, shared_data, tmp_path
):
    """The dev file given again as the test file: the selected model and the baselines score the test split
    exactly as they scored dev, and evaluate reports it as the row ``reviews_test``."""
    from bert_core.finetune.run import finetune_task

    train = _sst2_as_csv(shared_data, "train", tmp_path / "train.csv", 48)
    dev = _sst2_as_csv(shared_data, "dev", tmp_path / "dev.csv", 40)
    params = FinetuneParams(
        defaults=dict(train_limit=48, eval_limit=24, learning_rates=[1e-3, 3e-4], epochs=1, batch_size=8),
        data_checks=False,
        tasks={
            "reviews": {
                "define": REVIEWS,
                "train_file": str(train),
                "dev_file": str(dev),
                "test_file": str(dev),
            }
        },
    )
    out = tmp_path / "results" / "reviews"
    result = finetune_task("reviews", params, tiny_model, out, model_out=tmp_path / "model")
    best = result.selected
    assert best.other_splits == {"test": best.dev}  # scored once, by the model dev selected
    assert result.split_baselines == {"test": result.baselines} and "tfidf_logreg" in result.baselines
    metrics = result.metrics()
    assert metrics["test.accuracy"] == metrics["dev.accuracy"]
    assert metrics["test.baseline.majority.accuracy"] == metrics["baseline.majority.accuracy"]
    assert result.data_split["test_set"] == "first 24 rows"  # eval_limit cut it, and it says so
    summary = json.loads((out / "summary.json").read_text())
    assert summary["outputs"]["test.predictions"].endswith("reviews/test_predictions.tsv")
    assert (out / "test_predictions.tsv").read_text() == (out / "dev_predictions.tsv").read_text()
    assert (
        summary["split_baselines"]["test"] == summary["baselines"] and summary["data"]["test"]["rows"] == 24
    )
    evaluation = summarize(tmp_path / "results", tasks=["reviews"], own_tasks=params.own_tasks())
    rows = {r.name: r for r in evaluation.rows}
    assert rows["reviews_test"].split == "test" and rows["reviews_test"].ours == rows["reviews"].ours
    flat = evaluation.metrics()
    assert flat["reviews_test.best_baseline.accuracy"] == flat["reviews.best_baseline.accuracy"]


def _trial(dev: dict, **kw) -> TrialResult:
    return TrialResult(
        "pretrained", 1e-4, 1, dev, train_examples=320, train_seconds=2.0, steps=10, epochs=1.0, **kw
    )


def test_conll2003s_test_row_stands_beside_the_papers_test_score_and_its_baselines(tmp_path):
    result = FinetuneResult(
        "conll2003",
        "token_classification",
        "f1",
        BASE,
        [_trial({"f1": 94.0, "precision": 94.5, "recall": 93.5}, other_splits={"test": {"f1": 60.0}})],
        data_split={"origin": "official", "test_set": "first 1000 of 3453 rows"},
        baselines={"lexicon": {"f1": 71.2}},
        split_baselines={"test": {"lexicon": {"f1": 64.1}, "majority": {"f1": 0.0}}},
    )
    path = tmp_path / "results" / "conll2003" / "summary.json"
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps(result.to_json()))
    assert FinetuneResult.load(path).split_baselines == result.split_baselines
    evaluation = summarize(tmp_path / "results", reference_size="base")
    dev, test = evaluation.rows
    assert (dev.name, dev.split, dev.reference, dev.reference_split) == ("conll2003", "dev", 96.4, "dev")
    assert (test.name, test.split, test.reference, test.reference_split) == (
        "conll2003_test",
        "test",
        92.4,
        "test",
    )
    from bert_core.evaluate.datanotes import axis_label

    assert axis_label(evaluation.results, "conll2003", "test") == "test rows cut"  # the plot's axis says so
    assert axis_label(evaluation.results, "conll2003") == ""  # the whole official dev split
    metrics, paths = evaluate_results(
        tmp_path / "results", tmp_path / "m.json", tmp_path / "reports", reference_size="base"
    )
    assert metrics["conll2003_test.f1"] == 60.0 and metrics["conll2003_test.best_baseline.f1"] == 64.1
    assert metrics["conll2003_test.beats_baseline"] == 0.0 and metrics["conll2003.beats_baseline"] == 1.0
    assert metrics["baseline.tasks_compared"] == 1.0  # a task counts once, by its main dev split
    md = re.sub(r" {2,}", " ", paths["markdown"].read_text())
    test_row = (
        "| conll2003_test (first 1000 of 3453 rows) | test | f1 | 60.0 ≤ baseline | – | – | 92.4 (test) |"
    )
    assert test_row + " 64.1 (lexicon) |" in md  # the test rows' own cut, not the dev split's label
    assert "| conll2003 | dev | f1 | 94.0 | – | – | 96.4 (dev) | 71.2 (lexicon) |" in md
    assert "conll2003: test scored on the first 1000 of 3453 rows, set by `eval_limit`" in md
    assert "| conll2003_test | lexicon |" in md  # the baselines table has the test rows too
    value = md.split("## Value of pretraining")[1].split("\n## ")[0]
    assert "| conll2003 |" in value and "conll2003_test" not in value  # it compares dev scores only


def test_the_model_card_has_a_section_and_a_model_index_result_for_the_test_split():
    from bert_core.evaluate.references import reference_for
    from bert_core.modelcard import parse_front_matter
    from bert_core.serving.finetuned import finetuned_card_for

    metrics = {
        "dev.f1": 94.0,
        "dev.precision": 94.5,
        "test.f1": 90.1,
        "test.precision": 90.3,
        "test.baseline.lexicon.f1": 64.1,
    }
    card = finetuned_card_for(
        get_task("conll2003"),
        metrics,
        {"preset": "base", "source": "models/pretrained"},
        params={"epochs": 3},
        git_commit="abc123",
        lock_path=None,
        reference=reference_for("base"),
        baselines={"lexicon": {"f1": 71.2}},
        split_baselines={"test": {"lexicon": {"f1": 64.1}}},
    )
    meta, body = parse_front_matter(card)
    dev, test = meta["model-index"][0]["results"]
    assert dev["dataset"]["split"] == "dev" and test["dataset"]["split"] == "test"
    assert [(m["name"], m["value"]) for m in test["metrics"]] == [("test f1", 90.1), ("test precision", 90.3)]
    section = re.sub(r" {2,}", " ", body.split("## Scores on test")[1].split("\n## ")[0])
    assert "| f1 (main) | 90.10 | 64.10 (lexicon) | 92.40 |" in section
    assert "published (BERT-Base (Devlin et al. 2019), test)" in section
    sst2 = finetuned_card_for(
        get_task("sst2"),
        {"dev.accuracy": 82.5},
        {"preset": "base"},
        params=None,
        git_commit="abc123",
        lock_path=None,
    )
    assert "## Scores on" not in sst2 and len(parse_front_matter(sst2)[0]["model-index"][0]["results"]) == 1


def test_the_test_row_is_among_the_evaluate_stages_headline_scores():
    from bert_core.evaluate.references import headline_metric
    from bert_core.evaluate.report import score_keys

    assert headline_metric("conll2003_test", "") == "f1" and headline_metric("squad_v1", "") == "f1"
    assert headline_metric("mine_test", "accuracy") == "accuracy"  # an own task's row: the summary's own
    assert headline_metric("rte_custom", "macro_f1") == "macro_f1"  # an own task named like a paper's one
    keys = score_keys({"conll2003.f1": 94.0, "conll2003_test.f1": 90.1, "conll2003_test.precision": 90.3})
    assert keys == ["conll2003.f1", "conll2003_test.f1"]
    own = {
        "mine.accuracy": 80.0,
        "mine.macro_f1": 70.0,
        "mine_test.accuracy": 79.0,
        "mine_test.macro_f1": 69.0,
    }
    assert score_keys(own) == []  # an own task's main metric is its declaration's
    assert score_keys(own, {"mine": "macro_f1"}) == ["mine.macro_f1", "mine_test.macro_f1"]
