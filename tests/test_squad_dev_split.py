"""SQuAD without its train files: the dev split, own train/dev files, trivial baselines, and the labels.

``finetune.tasks.<task>.dev_split: true`` trains on the first articles of the official dev file and
evaluates on the last ones (v1.1: 24 / 24; v2.0: 17 / 18), labelled so in the summary, the report and
MLflow; it is refused when the official train data is present. The data roots here hold the real dev
files of ../shared/data (tests skip without them) and no train file, like shared/data itself.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
from pathlib import Path

import pytest

from bert_core.finetune.params import FinetuneParams
from bert_core.tasks import TaskDataError, get_task, load_task_split
from bert_core.tasks.datasource import resolve_task_source

# (task, dev file, train articles, eval articles, train questions, eval questions): the official files.
SPLITS = [
    ("squad_v1", "dev-v1.1.json", 24, 24, 5696, 4874),
    ("squad_v2", "dev-v2.0.json", 17, 18, 5448, 6425),
]


@pytest.fixture(scope="module")
def dev_root(shared_data, tmp_path_factory) -> Path:
    """A data root with the two official SQuAD dev files and no train file."""
    root = tmp_path_factory.mktemp("squad_root")
    (root / "squad").mkdir()
    for name in ("dev-v1.1.json", "dev-v2.0.json"):
        os.symlink(shared_data / "squad" / name, root / "squad" / name)
    return root


@pytest.mark.parametrize(("task", "file", "n_train", "n_eval", "q_train", "q_eval"), SPLITS)
def test_dev_split_halves_are_disjoint_complete_and_deterministic(
    dev_root, task, file, n_train, n_eval, q_train, q_eval
):
    doc = json.loads((dev_root / "squad" / file).read_text(encoding="utf-8"))["data"]
    titles = [a["title"] for a in doc]
    source = resolve_task_source(get_task(task), dev_split=True, data_root=dev_root)
    train, dev = source.load("train"), source.load("dev")
    assert (len(train), len(dev)) == (q_train, q_eval)
    assert list(dict.fromkeys(r["title"] for r in train)) == titles[:n_train]
    assert (
        list(dict.fromkeys(r["title"] for r in dev)) == titles[n_train:] and len(titles) == n_train + n_eval
    )
    ids_train, ids_dev = {r["id"] for r in train}, {r["id"] for r in dev}
    assert not ids_train & ids_dev
    assert ids_train | ids_dev == {r["id"] for r in load_task_split(task, "dev", data_root=dev_root)}
    again = resolve_task_source(get_task(task), dev_split=True, data_root=dev_root)
    assert [r["id"] for r in again.load("train")] == [r["id"] for r in train]  # same rows, same order
    assert [r["id"] for r in again.load("dev", limit=7)] == [r["id"] for r in dev][:7]
    info = source.describe(source.load("train", limit=10), dev)
    stem = file.removesuffix(".json")
    assert info["label"] == (
        f"dev split: articles {n_train + 1}-{n_train + n_eval} of {stem}, trained on 1-{n_train} "
        f"(first 10 of {q_train} questions)"
    )
    assert info["origin"] == "dev_split" and info["eval_source"].endswith(
        f"articles {n_train + 1}-{n_train + n_eval}"
    )


def test_a_dev_split_cut_by_eval_limit_is_labelled_as_its_own_rows(shared_data):
    source = resolve_task_source(get_task("sst2"), data_root=shared_data)
    train = source.load("train", limit=8)
    assert source.describe(train, source.load("dev"))["eval_set"] == ""  # all 872 rows: the official score
    assert source.describe(train, source.load("dev", limit=5000))["label"] == ""  # a limit that cuts nothing
    cut = source.describe(train, source.load("dev", limit=4))
    assert cut["eval_set"] == cut["label"] == "official dev split (first 4 rows only: a row limit)"


def test_dev_split_is_refused_where_official_train_data_exists(dev_root, tmp_path, monkeypatch):
    spec = get_task("squad_v1")
    monkeypatch.delenv("BERT_DATA_ROOT", raising=False)
    with pytest.raises(TaskDataError, match=r"finetune\.tasks\.squad_v1\.dev_split: true.*Hugging Face Hub"):
        resolve_task_source(spec, dev_split=True)  # no data root: the Hub, which has the train split
    root = tmp_path / "root"
    (root / "squad").mkdir(parents=True)
    shutil.copy(dev_root / "squad" / "dev-v1.1.json", root / "squad" / "dev-v1.1.json")
    (root / "squad" / "train-v1.1.json").write_text('{"version": "1.1", "data": []}')
    with pytest.raises(
        TaskDataError, match=r"dev_split: true, but the official train file .*train-v1\.1\.json"
    ):
        resolve_task_source(spec, dev_split=True, data_root=root)


def test_missing_train_file_suggests_the_dev_split(dev_root):
    source = resolve_task_source(get_task("squad_v1"), data_root=dev_root)
    with pytest.raises(
        TaskDataError, match=r"train-v1\.1\.json does not exist.*finetune\.tasks\.squad_v1\.dev_split"
    ):
        source.load("train")


def test_check_files_refuses_what_load_would_without_reading_a_row(dev_root, tmp_path, monkeypatch):
    """The command line's pre-check gives load's own message for a missing train or dev file, and passes the
    files a dev split, own files or the Hub stand in for."""
    squad = get_task("squad_v1")
    official = resolve_task_source(squad, data_root=dev_root)
    with pytest.raises(TaskDataError) as checked:
        official.check_files()
    with pytest.raises(TaskDataError) as loaded:
        official.load("train")
    assert str(checked.value) == str(loaded.value)  # with the dev-split suggestion
    resolve_task_source(squad, dev_split=True, data_root=dev_root).check_files()
    mine = tmp_path / "mine.json"
    mine.write_text('{"version": "1.1", "data": []}')
    resolve_task_source(squad, train_file=mine, data_root=dev_root).check_files()

    root = tmp_path / "root"
    (root / "glue" / "MNLI").mkdir(parents=True)
    for name in ("train.tsv", "dev_matched.tsv"):  # the second dev split missing; test files are optional
        (root / "glue" / "MNLI" / name).write_text("")
    with pytest.raises(TaskDataError, match=r"^mnli/dev_mismatched: .*dev_mismatched\.tsv does not exist"):
        resolve_task_source(get_task("mnli"), data_root=root).check_files()
    monkeypatch.delenv("BERT_DATA_ROOT", raising=False)
    resolve_task_source(get_task("mnli")).check_files()  # the Hub: nothing to check on disk


def test_dev_split_needs_the_official_dev_file(dev_root, tmp_path):
    root = tmp_path / "root"
    (root / "squad").mkdir(parents=True)
    doc = json.loads((dev_root / "squad" / "dev-v1.1.json").read_text(encoding="utf-8"))
    (root / "squad" / "dev-v1.1.json").write_text(json.dumps({"version": "1.1", "data": doc["data"][:30]}))
    source = resolve_task_source(get_task("squad_v1"), dev_split=True, data_root=root)
    with pytest.raises(
        TaskDataError, match=r"dev-v1\.1\.json: 30 articles, but finetune\.tasks\.squad_v1\.dev_split"
    ):
        source.load("train")
    with pytest.raises(
        TaskDataError, match=r"dev_split: the official dev file .*dev-v2\.0\.json does not exist"
    ):
        resolve_task_source(get_task("squad_v2"), dev_split=True, data_root=root)


def test_params_keep_data_keys_per_task_and_consistent():
    with pytest.raises(ValueError, match=r"tasks\.sst2\.dev_split: sst2 has no dev split"):
        FinetuneParams(tasks={"sst2": {"dev_split": True}})
    with pytest.raises(ValueError, match=r"defaults\.dev_split: set it per task"):
        FinetuneParams(defaults={"dev_split": True})
    with pytest.raises(
        ValueError, match=r"tasks\.squad_v1: dev_split and train_file/dev_file/test_file exclude"
    ):
        FinetuneParams(tasks={"squad_v1": {"dev_split": True, "train_file": "x.json"}})
    params = FinetuneParams(tasks={"squad_v1": {"dev_split": True}, "sst2": {}})
    assert params.for_task("squad_v1").dev_split and not params.for_task("sst2").dev_split
    with pytest.raises(ValueError, match=r"finetune\.tasks\.sst2\.dev_split: sst2 has no dev split"):
        resolve_task_source(get_task("sst2"), dev_split=True)


def test_own_files_replace_their_split_and_errors_name_the_key_and_path(dev_root, shared_data, tmp_path):
    spec = get_task("squad_v1")
    doc = json.loads((dev_root / "squad" / "dev-v1.1.json").read_text(encoding="utf-8"))
    mine = tmp_path / "mine.json"
    mine.write_text(json.dumps({"version": "1.1", "data": doc["data"][3:4]}))
    source = resolve_task_source(spec, train_file=mine, data_root=dev_root)
    train, dev = source.load("train"), source.load("dev", limit=5)
    assert {r["title"] for r in train} == {doc["data"][3]["title"]} and dev.source.endswith("dev-v1.1.json")
    info = source.describe(train, dev)  # the official dev file, cut to 5 questions
    assert info["eval_set"] == f"official dev split (first 5 of {len(source.load('dev'))} rows)"
    assert info["label"] == f"own files: train {mine}; {info['eval_set']}"
    relative = resolve_task_source(spec, dev_file="mine.json", data_root=dev_root, base_dir=tmp_path)
    assert relative.dev_file == mine  # relative paths: from the repository root (base_dir)

    with pytest.raises(
        TaskDataError, match=r"finetune\.tasks\.squad_v1\.train_file: .*nope\.json does not exist"
    ):
        resolve_task_source(spec, train_file=tmp_path / "nope.json", data_root=dev_root)
    bad = tmp_path / "bad.json"
    bad.write_text('{"version": "1.1", "data": [')
    with pytest.raises(
        TaskDataError, match=r"finetune\.tasks\.squad_v1\.dev_file: .*bad\.json:1: not valid JSON"
    ):
        resolve_task_source(spec, dev_file=bad, data_root=dev_root).load("dev")
    # any official format: an SST-2 TSV as the train file
    tsv = resolve_task_source(get_task("sst2"), train_file=shared_data / "glue" / "SST-2" / "dev.tsv")
    assert len(tsv.load("train", limit=3)) == 3


def test_baselines_overlap_sentence_and_all_empty():
    from bert_core.kinds.squad_baselines import overlap_sentence, squad_baselines

    context = "Paris is in France. The Seine flows through Paris in 1900. Rome is old."
    assert overlap_sentence("What flows through Paris?", context) == "The Seine flows through Paris in 1900."
    assert overlap_sentence("Anything else?", context) == "Paris is in France."  # ties: the earliest
    rows = [
        {
            "id": "a",
            "question": "What flows through Paris?",
            "context": context,
            "answers": {"text": ["The Seine"], "answer_start": [20]},
            "is_impossible": False,
        },
        {
            "id": "b",
            "question": "Who is king?",
            "context": context,
            "answers": {"text": [], "answer_start": []},
            "is_impossible": True,
        },
    ]
    v2 = squad_baselines(rows, version_2=True, metric_keys=("f1", "exact"))
    assert v2["all_empty"] == {"f1": 50.0, "exact": 50.0}
    assert v2["overlap_sentence"]["exact"] == 0.0 and 0 < v2["overlap_sentence"]["f1"] < 50
    v1 = squad_baselines(rows[:1], version_2=False, metric_keys=("f1", "exact_match"))
    # "seine flows through paris in 1900" against "seine": precision 1/6, recall 1
    assert set(v1) == {"overlap_sentence"} and v1["overlap_sentence"]["f1"] == pytest.approx(100 * 2 / 7)


def test_labels_and_baselines_survive_the_summary_and_reach_the_report_pieces():
    from bert_core.evaluate.datanotes import (
        axis_label,
        baseline_metrics,
        baseline_table,
        data_notes,
        task_label,
    )
    from bert_core.finetune.results import FinetuneResult, TrialResult
    from flows import stages
    from flows._stage import headline

    label = "dev split: articles 18-35 of dev-v2.0, trained on 1-17"
    trial = TrialResult("pretrained", 1e-3, 1, {"f1": 55.0, "exact": 52.0}, extra={"null_threshold": -1.25})
    result = FinetuneResult(
        "squad_v2",
        "span_qa",
        "f1",
        {"preset": "tiny"},
        [trial],
        data_split={"origin": "dev_split", "label": label},
        baselines={"overlap_sentence": {"f1": 10.0}, "all_empty": {"f1": 49.1}},
    )
    again = FinetuneResult.from_json(json.loads(json.dumps(result.to_json())))
    assert again.data_split == result.data_split and again.baselines == result.baselines
    assert again.metrics()["baseline.all_empty.f1"] == 49.1
    # the stage's DVC metrics file marks the score as a dev-split one, beside the score itself
    top = headline(again.metrics(), stages.get("finetune").headline, main="f1")
    assert top["score"] == 55.0 and top["dev_split"] == 1.0
    results = {"squad_v2": again}
    assert task_label(results, "squad_v2", "squad_v2") == f"squad_v2 ({label})"
    assert task_label(results, "sst2", "sst2") == "sst2"
    assert axis_label(results, "squad_v2") == "dev split" and axis_label(results, "sst2") == ""
    cut = FinetuneResult("cola", "classification", "mcc", {}, [], data_split={"eval_set": "first 4 rows"})
    assert axis_label({"cola": cut}, "cola") == "dev rows cut"
    notes = data_notes(results)
    assert notes[0].startswith(f"squad_v2: {label}.") and "not official dev scores" in notes[0]
    assert "null-answer threshold -1.250, tuned on the evaluated articles" in notes[1]
    title, _, rows = baseline_table(results)
    assert title.startswith("Trivial baselines")
    assert [r[1] for r in rows] == ["overlap_sentence", "all_empty"] and rows[1][-1] == "+5.9"
    assert baseline_metrics(results) == {
        "squad_v2.baseline.overlap_sentence.f1": 10.0,
        "squad_v2.baseline.all_empty.f1": 49.1,
        "squad_v2.best_baseline.f1": 49.1,
        "squad_v2.beats_baseline": 1.0,
        "baseline.tasks_compared": 1.0,
        "baseline.tasks_beating": 1.0,
        "squad_v2.dev_split": 1.0,
    }
    official = FinetuneResult(
        "sst2", "classification", "accuracy", {}, [TrialResult("pretrained", 1e-3, 1, {"accuracy": 80.0})]
    )
    assert data_notes({"sst2": official}) == [] and baseline_table({"sst2": official}) is None
    assert "dev_split" not in official.metrics()


# Numbers the official evaluate-v2.0.py (rajpurkar/SQuAD-explorer) prints for leaderboard prediction files
# on the real dev-v2.0.json, no na-prob file: (exact, f1, HasAns_f1, NoAns_f1).
OFFICIAL_V20 = {
    "bert_single_google.json": (78.74168280973637, 81.77528052374723, 80.18183293833508, 83.36417157275021),
    "nlnet_msra.json": (75.82750779078582, 78.77776770381462, 75.52773885752187, 82.01850294365012),
}


@pytest.mark.parametrize("name", list(OFFICIAL_V20))
def test_v20_scorer_matches_the_official_script_on_the_real_dev_set(shared_data, name):
    from bert_core.metrics import squad_metrics

    rows = load_task_split("squad_v2", "dev", data_root=shared_data)
    path = shared_data / "squad" / "leaderboard_predictions" / "v2.0" / name
    scores = squad_metrics(rows, json.loads(path.read_text(encoding="utf-8")), version="squad_v2")
    got = (scores["exact"], scores["f1"], scores["HasAns_f1"], scores["NoAns_f1"])
    assert got == pytest.approx(OFFICIAL_V20[name], abs=1e-9)


# ---------------------------------------------------------------------------------------- end to end
class _Tracker:
    def __init__(self) -> None:
        self.trials: list[tuple[str, dict, dict]] = []

    @contextlib.contextmanager
    def trial(self, name, params, tags):
        self.trials.append((name, dict(params), dict(tags)))
        yield self

    def log_metrics(self, metrics, step=None):
        pass


@pytest.mark.slow
def test_squad_v1_dev_split_is_labelled_in_summary_trials_and_report(tiny_model, dev_root, tmp_path):
    from bert_core.evaluate.report import evaluate_results
    from bert_core.finetune.run import finetune_task

    params = FinetuneParams(
        defaults=dict(
            train_limit=16,
            eval_limit=12,
            learning_rates=[1e-3],
            epochs=1,
            batch_size=8,
            max_seq_length=128,
            doc_stride=64,
        ),
        tasks={"squad_v1": {"dev_split": True}},
        data_checks=False,
    )
    tracker = _Tracker()
    out = tmp_path / "results" / "squad_v1"
    result = finetune_task(
        "squad_v1", params, tiny_model, out, model_out=tmp_path / "model", data_root=dev_root, tracker=tracker
    )
    label = "dev split: articles 25-48 of dev-v1.1 (first 12 of 4874 questions), trained on 1-24 (first 16 of 5696 questions)"
    summary = json.loads((out / "summary.json").read_text())
    assert summary["data_split"]["label"] == label and summary["data_split"]["origin"] == "dev_split"
    assert summary["data"]["dev"]["source"].endswith("dev-v1.1.json articles 25-48")
    assert set(summary["baselines"]) == {"overlap_sentence"}
    _, trial_params, trial_tags = tracker.trials[0]
    assert trial_params["dev_split"] is True
    assert trial_tags["data_split"] == "dev_split" and trial_tags["data_split_label"] == label
    metrics = result.metrics()
    assert metrics["baseline.overlap_sentence.f1"] == pytest.approx(
        summary["baselines"]["overlap_sentence"]["f1"]
    )

    flat, paths = evaluate_results(tmp_path / "results", tmp_path / "evaluate.json", tmp_path / "reports")
    report = paths["markdown"].read_text(encoding="utf-8")
    assert f"| squad_v1 ({label}) |" in re.sub(r" {2,}", " ", report)
    assert "not official dev scores" in report and "overlap_sentence" in report
    assert flat["squad_v1.dev_split"] == 1.0 and "squad_v1.baseline.overlap_sentence.f1" in flat


@pytest.mark.slow
def test_squad_v2_dev_split_end_to_end_through_the_flows(tiny_model, dev_root, tmp_path, monkeypatch):
    """SQuAD v2.0 on real articles (dev split): the flow records the label in MLflow, the v2.0 scorer's
    keys and the tuned threshold, and the report says where the threshold was tuned."""
    from mlflow import MlflowClient

    from bert_core.metrics import squad_metrics
    from bert_core.tracking import FINETUNE_EXPERIMENT
    from flows.evaluate import evaluate_flow
    from flows.finetune import finetune_flow

    monkeypatch.setenv("BERT_DATA_ROOT", str(dev_root))
    params = tmp_path / "finetune.yaml"
    params.write_text(
        f"""finetune:
  model: {{source: {tiny_model}}}
  defaults: {{train_limit: 48, eval_limit: 40, learning_rates: [1.0e-3], epochs: 1, batch_size: 8,
              max_seq_length: 128, doc_stride: 64}}
  tasks:
    squad_v2: {{dev_split: true}}
"""
    )
    results = tmp_path / "results" / "finetune"
    metrics = finetune_flow.fn(
        "squad_v2",
        str(params),
        out_dir=str(results / "squad_v2"),
        model_out=str(tmp_path / "models" / "squad_v2"),
        metrics_path=str(tmp_path / "metrics" / "squad_v2.json"),
        plots_dir=str(tmp_path / "plots" / "squad_v2"),
    )
    assert {"dev.f1", "dev.exact", "dev.HasAns_f1", "dev.NoAns_f1", "dev.null_threshold"} <= set(metrics)
    assert {"baseline.all_empty.f1", "baseline.overlap_sentence.f1"} <= set(metrics)
    rows = resolve_task_source(get_task("squad_v2"), dev_split=True, data_root=dev_root).load("dev", limit=40)
    preds = json.loads((results / "squad_v2" / "dev" / "predictions.json").read_text())
    assert squad_metrics(rows, preds, version="squad_v2")["f1"] == pytest.approx(metrics["dev.f1"])
    share_empty = 100 * sum(r["is_impossible"] for r in rows) / len(rows)
    assert metrics["baseline.all_empty.f1"] == pytest.approx(share_empty)

    client = MlflowClient()
    runs = client.search_runs([client.get_experiment_by_name(FINETUNE_EXPERIMENT).experiment_id])
    parent = next(r for r in runs if "mlflow.parentRunId" not in r.data.tags)
    label = parent.data.tags["data_split_label"]
    assert parent.data.tags["data_split"] == "dev_split" and label.startswith(
        "dev split: articles 18-35 of dev-v2.0"
    )
    assert parent.data.params["settings.dev_split"] == "True"  # the flattened settings
    card = (tmp_path / "models" / "squad_v2" / "README.md").read_text(encoding="utf-8")
    assert f"## Dev scores ({label})" in card

    eval_params = tmp_path / "evaluate.yaml"
    eval_params.write_text(f"evaluate: {{results_dir: {results}, report_dir: {tmp_path / 'reports'}}}\n")
    evaluate_flow.fn(str(eval_params), str(params), metrics_path=str(tmp_path / "metrics" / "evaluate.json"))
    report = (tmp_path / "reports" / "evaluate.md").read_text(encoding="utf-8")
    assert f"squad_v2 ({label})" in report and "all_empty" in report
    assert "null-answer threshold" in report and "tuned on the evaluated articles" in report
