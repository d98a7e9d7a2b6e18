"""An own task: a classification or regression task on the user's CSV, TSV or JSON Lines files, declared
under ``finetune.tasks.<name>.define``: its params, its reader, its metrics, and the whole way through the
finetune and evaluate flows to a registered model that serves it.

Every test runs against its own SQLite MLflow store (the autouse fixture in conftest.py).
"""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest
import yaml

from bert_core.finetune.params import FinetuneParams
from bert_core.tasks import TaskDataError, get_task, own_task_json, own_task_spec, task_from_json
from bert_core.tasks.table import load_table

REVIEWS = {"kind": "classification", "text": "review", "label": "sentiment"}


def _write_csv(path: Path, header: list[str], rows: list[list[str]], delimiter: str = ",") -> Path:
    with open(path, "w", newline="", encoding="utf-8") as fh:
        writer = csv.writer(fh, delimiter=delimiter)
        writer.writerow(header)
        writer.writerows(rows)
    return path


def _own(tmp_path: Path, define: dict, **keys) -> FinetuneParams:
    train = _write_csv(tmp_path / "train.csv", ["review", "sentiment"], [["good", "pos"], ["bad", "neg"]])
    return FinetuneParams(
        tasks={"reviews": {"define": define, "train_file": str(train), "dev_file": str(train), **keys}}
    )


# ---------------------------------------------------------------------------------------------- params


def test_an_own_task_is_declared_with_its_files_and_its_classes_default_to_the_train_files(tmp_path):
    params = _own(tmp_path, REVIEWS)
    spec = params.task("reviews")
    assert spec.own and spec.kind == "classification" and spec.single_sentence
    assert spec.labels == ("neg", "pos") == spec.submission_labels  # sorted, as the train file has them
    assert spec.metric_keys == ("accuracy", "f1", "macro_f1", "matthews_corr")
    given = _own(tmp_path, {**REVIEWS, "labels": ["pos", "neg"], "metric": "f1"}).task("reviews")
    assert given.labels == ("pos", "neg") and given.main_metric == "f1"
    assert params.task("sst2") is get_task("sst2")
    assert set(params.own_tasks()) == {"reviews"} and params.own_tasks()["reviews"].main_metric == "accuracy"
    # the paper's tasks' settings and records are as they were: no define key at all
    assert "define" not in params.for_task("sst2").model_dump() and "define" not in params.run_params("sst2")
    assert params.run_params("reviews")["settings"]["define"]["text"] == "review"


@pytest.mark.parametrize(
    ("tasks", "message"),
    [
        (
            {"reviews": {"define": REVIEWS}},
            r"tasks\.reviews: an own task reads its own files or a Hub dataset; set train_file and dev_file, or "
            r"define\.hub",
        ),
        (
            {"sst2": {"define": REVIEWS, "train_file": "a", "dev_file": "b"}},
            r"sst2 is one of the paper's tasks",
        ),
        (
            {
                "r": {
                    "define": {**REVIEWS, "labels": ["a", "b", "c"], "metric": "f1"},
                    "train_file": "a",
                    "dev_file": "b",
                }
            },
            r"metric 'f1': a classification task with these labels is scored with one of \['accuracy', 'macro_f1'",
        ),
        (
            {
                "r": {
                    "define": {**REVIEWS, "kind": "regression", "labels": ["a", "b"]},
                    "train_file": "a",
                    "dev_file": "b",
                }
            },
            "a regression task has no labels",
        ),
        (
            {"r": {"define": {**REVIEWS, "labels": ["a", "a"]}, "train_file": "a", "dev_file": "b"}},
            "labels must be distinct",
        ),
        (
            {"r": {"define": {**REVIEWS, "labels": ["a"]}, "train_file": "a", "dev_file": "b"}},
            "two or more labels",
        ),
        (
            {"r": {"define": {"kind": "regression"}, "train_file": "a", "dev_file": "b"}},
            "needs the field of its text",
        ),
        (
            {
                "r": {
                    "define": {"kind": "token_classification", "labels": ["B-PER"]},
                    "train_file": "a",
                    "dev_file": "b",
                }
            },
            r"entity types \(PER, \.\.\.\), got \['B-PER'\]",
        ),
        (
            {
                "r": {
                    "define": {"kind": "token_classification", "text_pair": "x"},
                    "train_file": "a",
                    "dev_file": "b",
                }
            },
            "remove text_pair",
        ),
        ({"r": {"define": {**REVIEWS, "kind": "ner"}, "train_file": "a", "dev_file": "b"}}, "kind"),
        (
            {"my task": {"define": REVIEWS, "train_file": "a", "dev_file": "b"}},
            r"an own task's name is letters",
        ),
        ({"nope": {}}, r"unknown task\(s\) \['nope'\].*or an own task declared with tasks\.<name>\.define"),
    ],
)
def test_a_wrong_declaration_is_refused_naming_its_key(tasks, message):
    with pytest.raises(ValueError, match=message):
        FinetuneParams(tasks=tasks)


def test_define_is_per_task_and_classes_from_a_train_file_that_is_missing_are_refused(tmp_path):
    with pytest.raises(ValueError, match=r"defaults\.define: set it per task"):
        FinetuneParams(defaults={"define": REVIEWS})
    params = FinetuneParams(
        tasks={"reviews": {"define": REVIEWS, "train_file": "no/such.csv", "dev_file": "no/such.csv"}}
    )
    with pytest.raises(
        TaskDataError, match=r"finetune\.tasks\.reviews\.train_file: .*no/such\.csv does not exist"
    ):
        params.task("reviews")
    two = _write_csv(tmp_path / "two.csv", ["review", "sentiment"], [["a", "x"], ["b", "y"], ["c", "z"]])
    three = FinetuneParams(
        tasks={"r": {"define": {**REVIEWS, "metric": "f1"}, "train_file": str(two), "dev_file": str(two)}}
    )
    with pytest.raises(ValueError, match=r"finetune\.tasks\.r\.define: metric 'f1'"):
        three.task("r")


# ---------------------------------------------------------------------------------------------- reader


def _spec(**define) -> object:
    return own_task_spec("mine", **{"text_pair": None, "labels": ("neg", "pos"), **REVIEWS, **define})


def test_csv_tsv_and_json_lines_read_into_the_glue_rows(tmp_path):
    pair = _spec(text_pair="hypothesis", kind="regression", labels=(), label="score")
    rows = [["a man plays", "someone plays", "4.5"], ['he said "no", twice', "a, b", "0"]]
    for suffix, delimiter in ((".csv", ","), (".tsv", "\t")):
        path = _write_csv(tmp_path / f"p{suffix}", ["review", "hypothesis", "score"], rows, delimiter)
        got = load_table(pair, "train", path)
        assert [(r["text_a"], r["text_b"], r["label"]) for r in got] == [
            ("a man plays", "someone plays", 4.5),
            ('he said "no", twice', "a, b", 0.0),
        ]
        assert [r["id"] for r in got] == ["0", "1"] and got.source == str(path)
    jsonl = tmp_path / "c.jsonl"
    jsonl.write_text(
        '{"id": "x7", "review": "fine", "sentiment": "pos"}\n\n{"review": "meh", "sentiment": "neg"}\n',
        "utf-8",
    )
    got = load_table(_spec(), "dev", jsonl)
    assert [(r["id"], r["text_a"], r["text_b"], r["label"]) for r in got] == [
        ("x7", "fine", None, 1),
        ("1", "meh", None, 0),
    ]
    assert len(load_table(_spec(), "dev", jsonl, limit=1)) == 1
    numbers = tmp_path / "n.jsonl"
    numbers.write_text('{"review": "a", "sentiment": 1}\n{"review": "b", "sentiment": 0}\n', "utf-8")
    assert [r["label"] for r in load_table(_spec(labels=("0", "1")), "dev", numbers)] == [1, 0]
    from bert_core.tasks.table import labels_of

    assert labels_of("classification", numbers, "sentiment") == ["0", "1"]


@pytest.mark.parametrize(
    ("name", "text", "message"),
    [
        (
            "a.csv",
            "review,sentiment\ngood,pos\nbad,meh\n",
            r"a\.csv:3: label 'meh' is not one of the task's labels \['neg', 'pos'\]",
        ),
        (
            "b.csv",
            "text,sentiment\ngood,pos\n",
            r"b\.csv:2: no field 'review' \(the task's text a; the row has \['sentiment', 'text'\]\)",
        ),
        ("c.csv", "review,sentiment\ngood,pos,extra\n", r"c\.csv:2: 3 fields, the header has 2"),
        ("d.csv", "review,sentiment\ngood\n", r"d\.csv:2: 1 fields, the header has 2"),
        (
            "e.jsonl",
            '{"review": "x", "sentiment": "pos"}\n[1, 2]\n',
            r"e\.jsonl:2: a JSON list, not an object",
        ),
        ("f.jsonl", '{"review": "x", "sentiment": "pos"}\n{oops\n', r"f\.jsonl:2: not JSON"),
        ("g.csv", 'review,sentiment\n"  ",pos\n', r"g\.csv:2: field 'review' is '  ', not a text"),
        ("h.txt", "good\tpos\n", r"h\.txt: an own task reads \.csv, \.tsv, \.jsonl, \.json files"),
        ("i.csv", "review,sentiment\n", r"i\.csv: no rows"),
    ],
)
def test_a_bad_row_is_named_by_file_and_line(tmp_path, name, text, message):
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    with pytest.raises(TaskDataError, match=message):
        load_table(_spec(), "train", path)


def test_a_score_that_is_not_a_number_is_named(tmp_path):
    path = tmp_path / "s.jsonl"
    path.write_text('{"review": "x", "score": "high"}\n', "utf-8")
    with pytest.raises(TaskDataError, match=r"s\.jsonl:1: score 'high' is not a number"):
        load_table(_spec(kind="regression", labels=(), label="score"), "train", path)


def test_ner_files_read_as_conll_columns_or_json_lines_in_iob2(tmp_path):
    from bert_core.tasks.table import labels_of

    conll = tmp_path / "ner.conll"
    conll.write_text(
        "-DOCSTART- -X- O O\n\nEU NNP I-ORG\nrejects VBZ O\nGerman\tI-MISC\n\nPeter I-PER\nBlackburn I-PER\n",
        "utf-8",
    )
    assert labels_of("token_classification", conll, "tags") == ["MISC", "ORG", "PER"]
    spec = own_task_spec("ents", kind="token_classification", labels=["PER", "ORG", "MISC"])
    assert spec.labels == ("O", "B-PER", "I-PER", "B-ORG", "I-ORG", "B-MISC", "I-MISC")
    assert spec.metric_keys == ("f1", "precision", "recall")
    rows = load_table(spec, "train", conll)
    assert [(r["tokens"], r["tags"]) for r in rows] == [
        (["EU", "rejects", "German"], ["B-ORG", "O", "B-MISC"]),
        (["Peter", "Blackburn"], ["B-PER", "I-PER"]),
    ]
    jsonl = tmp_path / "ner.jsonl"
    jsonl.write_text('{"words": ["Peter", "runs"], "ner": ["B-PER", "O"]}\n', "utf-8")
    named = own_task_spec("ents", kind="token_classification", text="words", label="ner", labels=["PER"])
    got = [(r["tokens"], r["tags"]) for r in load_table(named, "dev", jsonl)]
    assert got == [(["Peter", "runs"], ["B-PER", "O"])]
    assert labels_of("token_classification", jsonl, "ner", "words") == ["PER"]
    assert task_from_json({"task": "ents", "own_task": own_task_json(named)}) == named
    declared = {"define": {"kind": "token_classification", "text": "words", "label": "ner"}}
    params = FinetuneParams(tasks={"ents": {**declared, "train_file": str(jsonl), "dev_file": str(jsonl)}})
    assert params.task("ents") == named  # the entity types read from the train file's tag lists


@pytest.mark.parametrize(
    ("name", "text", "message"),
    [
        (
            "a.conll",
            "Peter B-PER\nin O\n\nParis B-LOC\n",
            r"a\.conll:4: tag 'B-LOC' in the sentence starting here is not one of the task's \(O, B-/I- of \['PER'\]\)",
        ),
        ("b.conll", "Peter\n", r"b\.conll:1: one column 'Peter'"),
        ("c.jsonl", '{"tokens": ["a", "b"], "tags": ["O"]}\n', r"c\.jsonl:1: 2 words but 1 tags"),
        (
            "d.jsonl",
            '{"tokens": "a b", "tags": ["O"]}\n',
            r"d\.jsonl:1: fields 'tokens' and 'tags' must be non-empty lists of strings",
        ),
        ("e.conll", "\n\n", r"e\.conll: no sentences"),
    ],
)
def test_a_bad_ner_row_is_named_by_file_and_line(tmp_path, name, text, message):
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    with pytest.raises(TaskDataError, match=message):
        load_table(own_task_spec("ents", kind="token_classification", labels=["PER"]), "train", path)


def test_ner_types_from_a_file_with_a_tag_that_is_not_iob_are_refused(tmp_path):
    from bert_core.tasks.table import labels_of

    path = tmp_path / "x.conll"
    path.write_text("Peter PERSON\n", "utf-8")
    with pytest.raises(TaskDataError, match=r"x\.conll:1: tag 'PERSON' is not O, B-<type> or I-<type>"):
        labels_of("token_classification", path, "tags")


# ---------------------------------------------------------------------------------------------- metrics


def test_own_metrics_are_sklearns_and_the_glue_tasks_are_scored_as_before():
    from sklearn.metrics import f1_score, matthews_corrcoef

    from bert_core.metrics import glue_metrics, label_metrics, spec_metrics

    refs, preds = [0, 1, 2, 2, 1, 0, 2], [0, 2, 2, 1, 1, 0, 2]
    three = own_task_spec(
        "t", kind="classification", text="x", text_pair=None, label="y", labels="abc", metric="macro_f1"
    )
    got = spec_metrics(three, preds, refs)
    assert list(got) == ["macro_f1", "accuracy", "matthews_corr"]
    assert got["macro_f1"] == pytest.approx(100 * f1_score(refs, preds, average="macro"))
    assert got["matthews_corr"] == pytest.approx(100 * matthews_corrcoef(refs, preds))
    assert glue_metrics("stsb", [1.0, 2.0, 3.5], [1.0, 2.5, 3.0]) == label_metrics(
        "stsb", [1.0, 2.0, 3.5], [1.0, 2.5, 3.0], ("pearson", "spearman"), regression=True
    )
    assert list(glue_metrics("mrpc", [1, 0, 1], [1, 1, 1])) == ["f1", "accuracy"]


# ---------------------------------------------------------------------------------------------- end to end


def _sst2_as_csv(shared_data: Path, split: str, path: Path, n: int) -> Path:
    with open(shared_data / "glue" / "SST-2" / f"{split}.tsv", encoding="utf-8", newline="") as fh:
        rows = list(csv.DictReader(fh, delimiter="\t", quoting=csv.QUOTE_NONE))[:n]
    return _write_csv(
        path, ["review", "sentiment"], [[r["sentence"], ("neg", "pos")[int(r["label"])]] for r in rows]
    )


def _stsb_as_jsonl(shared_data: Path, split: str, path: Path, n: int) -> Path:
    with open(shared_data / "glue" / "STS-B" / f"{split}.tsv", encoding="utf-8", newline="") as fh:
        rows = list(csv.DictReader(fh, delimiter="\t", quoting=csv.QUOTE_NONE))[:n]
    lines = [
        json.dumps({"a": r["sentence1"], "b": r["sentence2"], "similarity": float(r["score"])}) for r in rows
    ]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def test_own_tasks_are_fine_tuned_registered_evaluated_and_served(
    tiny_model, shared_data, tmp_path, monkeypatch
):
    """A sentiment task in CSV and a similarity task (sentence pairs, scores) in JSON Lines go through the
    finetune flow (data checks, baselines, MLflow, the registry) and the evaluate flow, and the registered
    versions predict with the task's own labels, loaded from the registry alone."""
    import mlflow.pyfunc
    from mlflow import MlflowClient

    from flows.evaluate import evaluate_flow
    from flows.finetune import finetune_flow

    monkeypatch.delenv("BERT_DATA_ROOT", raising=False)  # own files only: nothing from a data root or the Hub
    data = tmp_path / "data"
    data.mkdir()

    def conll_sentences(name: str, n: int) -> list[str]:
        blocks = (shared_data / "conll2003" / name).read_text(encoding="utf-8").split("\n\n")
        return [b.strip() for b in blocks if b.strip() and not b.startswith("-DOCSTART-")][:n]

    (data / "ner_train.conll").write_text("\n\n".join(conll_sentences("eng.train", 120)) + "\n", "utf-8")
    with open(data / "ner_dev.jsonl", "w", encoding="utf-8") as fh:
        for block in conll_sentences("eng.testa", 24):
            cols = [line.split() for line in block.splitlines()]
            fh.write(json.dumps({"tokens": [c[0] for c in cols], "tags": [c[-1] for c in cols]}) + "\n")
    files = {
        "reviews": (
            _sst2_as_csv(shared_data, "train", data / "train.csv", 48),
            _sst2_as_csv(shared_data, "dev", data / "dev.csv", 24),
        ),
        "similar": (
            _stsb_as_jsonl(shared_data, "train", data / "train.jsonl", 48),
            _stsb_as_jsonl(shared_data, "dev", data / "dev.jsonl", 24),
        ),
    }
    params = tmp_path / "finetune.yaml"
    params.write_text(
        f"""finetune:
  model: {{source: {tiny_model}}}
  defaults: {{learning_rates: [1.0e-3], epochs: 1, batch_size: 8, max_seq_length: 64}}
  data_checks: true
  tasks:
    reviews:
      define: {{kind: classification, text: review, label: sentiment, labels: [neg, pos], metric: f1}}
      train_file: {files["reviews"][0]}
      dev_file: {files["reviews"][1]}
      random_init_baseline: true
    similar:
      define: {{kind: regression, text: a, text_pair: b, label: similarity}}
      train_file: {files["similar"][0]}
      dev_file: {files["similar"][1]}
    entities:
      define: {{kind: token_classification}}
      train_file: {data / "ner_train.conll"}
      dev_file: {data / "ner_dev.jsonl"}
      test_file: {data / "ner_dev.jsonl"}
""",
        encoding="utf-8",
    )
    results = tmp_path / "results" / "finetune"
    scores = {}
    for task in ("reviews", "similar", "entities"):
        scores[task] = finetune_flow.fn(
            task,
            str(params),
            out_dir=str(results / task),
            model_out=str(tmp_path / "models" / task),
            metrics_path=str(tmp_path / "metrics" / f"{task}.json"),
            plots_dir=str(tmp_path / "plots" / task),
        )
    assert {"dev.f1", "dev.accuracy", "dev.macro_f1", "random_init.dev.f1", "baseline.majority.f1"} <= set(
        scores["reviews"]
    )
    assert {"dev.spearman", "dev.pearson", "baseline.mean.spearman", "baseline.word_overlap.spearman"} <= set(
        scores["similar"]
    )
    assert {"dev.f1", "dev.precision", "dev.recall", "baseline.lexicon.f1"} <= set(scores["entities"])
    assert scores["entities"]["test.f1"] == scores["entities"]["dev.f1"]  # its test file: the dev rows again
    headline = json.loads((tmp_path / "metrics" / "reviews.json").read_text())
    assert headline["main_metric"] == "f1" and headline["score"] == pytest.approx(scores["reviews"]["dev.f1"])
    predictions = (results / "reviews" / "dev_predictions.tsv").read_text().splitlines()
    assert predictions[0] == "index\tprediction" and {line.split("\t")[1] for line in predictions[1:]} <= {
        "neg",
        "pos",
    }
    assert len(predictions) == 25
    summary = json.loads((results / "similar" / "summary.json").read_text())
    assert summary["data_split"]["origin"] == "own_files" and summary["main_metric"] == "spearman"

    client = MlflowClient()
    for task, record in (
        ("reviews", {"text": "a gripping film"}),
        ("similar", {"text": "a dog runs", "text_pair": "a dog is running"}),
        ("entities", {"text": "Peter Blackburn visited Paris"}),
    ):
        champion = client.get_model_version_by_alias(f"bert-{task}", "champion")
        assert champion.tags["task"] == task
        model = mlflow.pyfunc.load_model(f"models:/bert-{task}@champion")
        out = model.predict([record])
        if task == "reviews":
            assert out["label"][0] in ("neg", "pos") and len(out["probabilities"][0]) == 2
        elif task == "similar":
            assert list(out.columns) == ["score"]
        else:
            assert out["words"][0] == ["Peter", "Blackburn", "visited", "Paris"]
            assert set(out["tags"][0]) <= {
                "O",
                *(f"{p}-{t}" for p in "BI" for t in ("LOC", "MISC", "ORG", "PER")),
            }
        # the model's task JSON holds the definition: it is served without the params that declared it
        task_json = json.loads((tmp_path / "models" / task / "task.json").read_text())
        assert task_from_json(task_json) == FinetuneParams.model_validate(
            yaml.safe_load(params.read_text())["finetune"]
        ).task(task)

    eval_params = tmp_path / "evaluate.yaml"
    eval_params.write_text(f"evaluate: {{results_dir: {results}, report_dir: {tmp_path / 'reports'}}}\n")
    summary = evaluate_flow.fn(
        str(eval_params), str(params), metrics_path=str(tmp_path / "metrics" / "evaluate.json")
    )
    assert summary["reviews.f1"] == pytest.approx(scores["reviews"]["dev.f1"])
    assert summary["similar.spearman"] == pytest.approx(scores["similar"]["dev.spearman"])
    report = (tmp_path / "reports" / "evaluate.md").read_text()
    assert all(task in report for task in ("reviews", "similar", "entities"))
    assert summary["entities.f1"] == pytest.approx(scores["entities"]["dev.f1"])
    # the evaluate headline shows each own task's declared main metric, its test row too
    top = json.loads((tmp_path / "metrics" / "evaluate.json").read_text())
    assert {"reviews.f1", "similar.spearman", "entities.f1", "entities_test.f1"} <= set(top)

    # a summary whose main metric is not the declared one (the params changed after fine-tuning) is named
    changed = tmp_path / "changed.yaml"
    changed.write_text(params.read_text().replace("metric: f1", "metric: macro_f1"), encoding="utf-8")
    with pytest.raises(
        ValueError,
        match=r"records main_metric 'f1' for task 'reviews', but finetune\.tasks\.reviews\.define says 'macro_f1'",
    ):
        evaluate_flow.fn(str(eval_params), str(changed), metrics_path=str(tmp_path / "metrics" / "e2.json"))


def test_the_readmes_own_task_example_is_valid_params():
    import re

    import yaml

    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text(encoding="utf-8")
    section = readme[readme.index("**Your own task**") :]
    block = re.search(r"```yaml\n(.*?)```", section, re.S).group(1)
    params = FinetuneParams.model_validate(yaml.safe_load(block))
    assert set(params.own_tasks()) == {"reviews", "chemicals", "imdb", "science"}
    assert params.task("science").labels == ("A", "B", "C", "D", "E")  # named positions: no file is read
    assert (
        params.own_tasks()["reviews"].main_metric == "f1"
        and params.own_tasks()["chemicals"].main_metric == "f1"
    )


@pytest.mark.parametrize(
    ("paper", "define", "files"),
    [
        (
            "sst2",
            {"kind": "classification", "text": "sentence", "labels": ["0", "1"]},
            ("glue/SST-2/train.tsv", "glue/SST-2/dev.tsv"),
        ),
        (
            "conll2003",
            {"kind": "token_classification", "labels": ["PER", "ORG", "LOC", "MISC"]},
            ("conll2003/eng.train", "conll2003/eng.testa", "conll2003/eng.testb"),
        ),
        (
            "squad_v2",
            {"kind": "span_qa", "no_answers": True},
            ("squad/train-v2.0.json", "squad/dev-v2.0.json"),
        ),
        ("swag", {"kind": "multiple_choice"}, ("swag/train.csv", "swag/val.csv")),
        (  # the same CSV read by its columns: the choices one column each
            "swag",
            {
                "kind": "multiple_choice",
                "text": "sent1",
                "text_pair": "sent2",
                "choices": ["ending0", "ending1", "ending2", "ending3"],
            },
            ("swag/train.csv", "swag/val.csv"),
        ),
    ],
)
def test_an_own_task_on_a_papers_task_rows_is_fine_tuned_exactly_as_that_task(
    paper, define, files, tiny_model, shared_data, tmp_path, monkeypatch
):
    """The same rows as an own task (the official files, declared with define) and as the paper's task give
    the same trials and dev scores: an own task goes down the paper's tasks' path."""
    from bert_core.finetune.run import finetune_task

    root = shared_data
    if paper in ("squad_v2", "swag"):  # not in the shared data: the fixtures', laid out as a data root
        root = Path(__file__).parent / "fixtures" / "tasks"
    monkeypatch.setenv("BERT_DATA_ROOT", str(root))
    base = dict(
        train_limit=24, eval_limit=16, learning_rates=[1e-3], epochs=1, batch_size=8, max_seq_length=64
    )
    named = dict(zip(("train_file", "dev_file", "test_file"), (str(root / f) for f in files)))
    params = FinetuneParams(
        defaults=base, data_checks=False, tasks={paper: {}, "mine": {"define": define, **named}}
    )
    theirs = finetune_task(paper, params, tiny_model, tmp_path / paper, model_out=tmp_path / "m1")
    ours = finetune_task("mine", params, tiny_model, tmp_path / "mine", model_out=tmp_path / "m2")
    # the same scores on the paper's metrics (an own classification also reports F1, macro F1, Matthews)
    assert {k: ours.selected.dev[k] for k in theirs.selected.dev} == theirs.selected.dev
    assert {b: {k: m[k] for k in theirs.baselines[b]} for b, m in ours.baselines.items()} == theirs.baselines
    # and on a labelled test set (CoNLL-2003's), scored once by the selected model
    assert ours.selected.other_splits == theirs.selected.other_splits
    assert ours.split_baselines == theirs.split_baselines
    assert (tmp_path / "m1" / "model.safetensors").read_bytes() == (
        tmp_path / "m2" / "model.safetensors"
    ).read_bytes()


def test_the_run_forms_task_choices_hold_the_own_tasks_the_params_declare(tmp_path, monkeypatch):
    import flows.pipeline as pipeline
    from bert_core.tasks import TASKS

    (tmp_path / "params").mkdir()
    params = tmp_path / "params" / "finetune.yaml"
    params.write_text(
        "finetune:\n  tasks:\n    sst2: {}\n"
        "    reviews: {define: {kind: classification, text: t}, train_file: a.csv, dev_file: b.csv}\n",
        encoding="utf-8",
    )
    monkeypatch.setattr(pipeline, "REPO_ROOT", tmp_path)
    assert pipeline._task_names() == (*TASKS, "reviews")
    params.write_text("finetune:\n  tasks: {nope: {}}\n", encoding="utf-8")  # invalid: the stage will say so
    assert pipeline._task_names() == tuple(TASKS)


# ---------------------------------------------------------------------------------------------- the Hub


def _fake_hub(monkeypatch, datasets_by_split: dict) -> list:
    """``datasets.load_dataset`` answering from ``datasets_by_split`` (no network); returns the calls."""
    import datasets

    calls = []

    def load_dataset(path, config=None, split=None, revision=None):
        calls.append((path, config, split) + ((revision,) if revision else ()))
        name, _, cut = split.partition("[")
        ds = datasets_by_split[(path, config, name)]
        return ds.select(range(min(len(ds), int(cut.strip(":]"))))) if cut else ds

    monkeypatch.setattr(datasets, "load_dataset", load_dataset)
    return calls


def test_an_own_task_reads_a_hub_dataset_by_its_class_names_even_with_a_data_root(
    tiny_model, shared_data, tmp_path, monkeypatch
):
    """A Hub classification (labels a ClassLabel, no validation split: ``dev`` is its ``test``) and a Hub NER
    set (tags a sequence of ClassLabel) are read by their names, with BERT_DATA_ROOT set, and fine-tuned."""
    from datasets import ClassLabel, Dataset, Features, Sequence, Value

    from bert_core.finetune.run import finetune_task

    texts = ["a fine film", "dull and long", "great acting", "a waste of time", "loved it", "boring"]
    imdb = Features({"text": Value("string"), "label": ClassLabel(names=["neg", "pos"])})
    tags = ["O", "B-PER", "I-PER", "B-LOC", "I-LOC"]
    ner = Features({"tokens": Sequence(Value("string")), "ner_tags": Sequence(ClassLabel(names=tags))})
    sentences = {"tokens": [["Peter", "Blackburn", "in", "Paris"], ["Rome"]], "ner_tags": [[1, 2, 0, 3], [3]]}
    calls = _fake_hub(
        monkeypatch,
        {
            ("someone/imdb", None, "train"): Dataset.from_dict(
                {"text": texts, "label": [1, 0, 1, 0, 1, 0]}, imdb
            ),
            ("someone/imdb", None, "test"): Dataset.from_dict(
                {"text": texts[:4], "label": [1, 0, 1, 0]}, imdb
            ),
            ("someone/ner", "en", "train"): Dataset.from_dict(sentences, ner),
            ("someone/ner", "en", "validation"): Dataset.from_dict(sentences, ner),
        },
    )
    monkeypatch.setenv("BERT_DATA_ROOT", str(shared_data))  # an own Hub task does not look there
    params = FinetuneParams(
        defaults=dict(learning_rates=[1e-3], epochs=1, batch_size=4, max_seq_length=32),
        data_checks=True,
        tasks={
            "reviews": {
                "define": {
                    "kind": "classification",
                    "hub": "someone/imdb",
                    "text": "text",
                    "hub_splits": {"dev": "test"},
                }
            },
            "places": {
                "define": {
                    "kind": "token_classification",
                    "hub": "someone/ner",
                    "hub_config": "en",
                    "label": "ner_tags",
                }
            },
        },
    )
    reviews, places = params.task("reviews"), params.task("places")
    assert reviews.labels == ("neg", "pos") and places.labels == tuple(tags)  # the ClassLabel's order
    assert task_from_json({"task": "reviews", "own_task": own_task_json(reviews)}) == reviews
    result = finetune_task("reviews", params, tiny_model, tmp_path / "r", model_out=tmp_path / "mr")
    assert result.data_split["train_source"] == "hf://someone/imdb:train"
    assert (
        result.data_split["eval_source"] == "hf://someone/imdb:test" and result.data_split["eval_rows"] == 4
    )
    assert {"dev.accuracy", "dev.f1"} <= set(result.metrics())
    lines = (tmp_path / "r" / "dev_predictions.tsv").read_text().splitlines()[1:]
    assert {line.split("\t")[1] for line in lines} <= {"neg", "pos"}
    result = finetune_task("places", params, tiny_model, tmp_path / "p", model_out=tmp_path / "mp")
    assert {"dev.f1", "dev.precision", "dev.recall"} <= set(result.metrics())
    assert ("someone/ner", "en", "validation") in calls


def test_a_hub_row_that_does_not_fit_is_named_by_dataset_split_and_row(monkeypatch):
    from datasets import Dataset

    from bert_core.tasks.table import load_table_hub

    _fake_hub(
        monkeypatch,
        {("x/y", None, "train"): Dataset.from_dict({"text": ["ok", "also"], "label": ["a", "c"]})},
    )
    spec = own_task_spec("t", kind="classification", text="text", labels=["a", "b"], hub="x/y")
    with pytest.raises(
        TaskDataError, match=r"hf://x/y:train:2: label 'c' is not one of the task's labels \['a', 'b'\]"
    ):
        load_table_hub(spec, "train")
    no_hub = own_task_spec("t", kind="classification", text="text", labels=["a", "b"])
    with pytest.raises(
        TaskDataError, match=r"set finetune\.tasks\.t\.train_file and dev_file, or define\.hub"
    ):
        load_table_hub(no_hub, "train")


def test_a_hub_revision_pins_an_own_tasks_dataset_and_needs_one(monkeypatch):
    """``tasks.<task>.hub_revision``: its classes and rows are read at that revision; refused under
    ``defaults`` and for a task of own files."""
    from datasets import ClassLabel, Dataset, Features, Value

    imdb = Features({"text": Value("string"), "label": ClassLabel(names=["neg", "pos"])})
    rows = Dataset.from_dict({"text": ["good", "bad"], "label": [1, 0]}, imdb)
    calls = _fake_hub(monkeypatch, {("x/imdb", None, "train"): rows, ("x/imdb", None, "validation"): rows})
    define = {"kind": "classification", "hub": "x/imdb", "text": "text"}
    params = FinetuneParams(tasks={"imdb": {"define": define, "hub_revision": "v3"}})
    spec = params.task("imdb")
    assert spec.labels == ("neg", "pos") and spec.hub_revision == "v3"
    dev = params.for_task("imdb").data_source(spec).load("dev")
    assert calls == [("x/imdb", None, "train", "v3"), ("x/imdb", None, "validation", "v3")]
    assert dev.source == "hf://x/imdb@v3:validation" and [r["label"] for r in dev] == [1, 0]
    with pytest.raises(ValueError, match=r"defaults\.hub_revision: set it per task"):
        FinetuneParams(defaults={"hub_revision": "v3"})
    with pytest.raises(ValueError, match=r"tasks\.r\.hub_revision: r reads its own files, not a Hub dataset"):
        FinetuneParams(
            tasks={"r": {"define": REVIEWS, "train_file": "a", "dev_file": "b", "hub_revision": "v"}}
        )


def test_a_file_that_is_not_utf8_is_named_by_its_line_when_read_and_when_its_labels_are(tmp_path):
    from bert_core.tasks.table import labels_of

    path = tmp_path / "latin1.csv"
    path.write_bytes("review,sentiment\ngood,pos\ncaf\xe9,neg\n".encode("latin-1"))
    for read in (
        lambda: load_table(_spec(), "train", path),
        lambda: labels_of("classification", path, "sentiment"),
    ):
        with pytest.raises(TaskDataError, match=r"latin1\.csv:3: not UTF-8 \(byte b'\\xe9' at offset"):
            read()


def test_own_span_qa_reads_squads_format_and_refuses_unanswerable_questions_unless_declared(tmp_path):
    from bert_core.tasks.loader import read_local  # own QA is read by SQuAD's reader

    doc = {
        "version": "v2.0",
        "data": [
            {
                "title": "T",
                "paragraphs": [
                    {
                        "context": "Paris is in France.",
                        "qas": [
                            {
                                "id": "q1",
                                "question": "Where?",
                                "answers": [{"text": "France", "answer_start": 12}],
                            },
                            {"id": "q2", "question": "Why?", "answers": [], "is_impossible": True},
                        ],
                    }
                ],
            }
        ],
    }
    path = tmp_path / "qa.json"
    path.write_text(json.dumps(doc), encoding="utf-8")
    with_null = own_task_spec("qa", kind="span_qa", no_answers=True)
    assert with_null.max_seq_length == 384 and with_null.metric_keys == ("f1", "exact")
    assert own_task_spec("qa", kind="span_qa").metric_keys == ("f1", "exact_match")
    assert [r["is_impossible"] for r in read_local(with_null, "dev", path)] == [False, True]
    assert task_from_json({"task": "qa", "own_task": own_task_json(with_null)}) == with_null
    doc["version"] = "1.1"
    path.write_text(json.dumps(doc), encoding="utf-8")
    with pytest.raises(
        TaskDataError, match=r"question 'q2' is marked is_impossible.*set define\.no_answers: true"
    ):
        read_local(own_task_spec("qa", kind="span_qa"), "dev", path)
    with pytest.raises(ValueError, match="a multiple_choice task has no labels"):
        FinetuneParams(
            tasks={
                "mc": {
                    "define": {"kind": "multiple_choice", "labels": ["x"]},
                    "train_file": "a",
                    "dev_file": "b",
                }
            }
        )
    mc = own_task_spec("mc", kind="multiple_choice")
    assert (
        mc.labels == ("0", "1", "2", "3")
        and task_from_json({"task": "mc", "own_task": own_task_json(mc)}) == mc
    )
    with pytest.raises(ValueError, match="a span_qa task has no labels"):
        FinetuneParams(
            tasks={
                "qa": {
                    "define": {"kind": "span_qa", "labels": ["x", "y"]},
                    "train_file": "a",
                    "dev_file": "b",
                }
            }
        )
    with pytest.raises(ValueError, match="no_answers is span QA's"):
        FinetuneParams(
            tasks={"r": {"define": {**REVIEWS, "no_answers": True}, "train_file": "a", "dev_file": "b"}}
        )
    # no classes to read: the task is declared without its train file being opened
    assert (
        FinetuneParams(tasks={"qa": {"define": {"kind": "span_qa"}, "train_file": "a", "dev_file": "b"}})
        .task("qa")
        .kind
        == "span_qa"
    )


def test_an_own_tasks_labels_are_read_once_while_its_train_file_is_unchanged(tmp_path, monkeypatch):
    """The command line's pre-check and the flow both ask for the spec: the train file is read for its
    labels once, and again only after it changed."""
    import os

    from bert_core.tasks import table

    params = _own(tmp_path, {**REVIEWS, "text": "review"})
    reads = []
    real = table.records
    monkeypatch.setattr(table, "records", lambda path, *a: reads.append(path) or real(path, *a))
    assert params.task("reviews").labels == params.task("reviews").labels == ("neg", "pos")
    assert len(reads) == 1
    train = tmp_path / "train.csv"
    _write_csv(train, ["review", "sentiment"], [["good", "pos"], ["bad", "neg"], ["so so", "mixed"]])
    os.utime(train, ns=(1, 1))  # another stamp, whatever the clock's resolution
    assert params.task("reviews").labels == ("mixed", "neg", "pos") and len(reads) == 2


def _as_lines(rows, path: Path, *, answer_list: bool = False) -> Path:
    """``rows`` as JSON Lines in the Hub's columns (``answers`` as a list of objects with ``answer_list``)."""
    with path.open("w", encoding="utf-8") as f:
        for row in rows:
            answers = row["answers"]
            if answer_list:
                answers = [
                    {"text": t, "answer_start": s} for t, s in zip(answers["text"], answers["answer_start"])
                ]
            line = {k: row[k] for k in ("id", "title", "context", "question")} | {"answers": answers}
            f.write(json.dumps(line) + "\n")
    return path


@pytest.mark.parametrize("answer_list", [False, True])
def test_own_span_qa_reads_json_lines_in_the_hubs_columns_as_the_official_file(tmp_path, answer_list):
    """SQuAD v1.1's dev file (the real one when the shared data is here), written as JSON Lines of one
    question a line, reads to the same rows as the official JSON: every question, id and answer offset."""
    from bert_core.tasks.loader import read_local
    from tests.conftest import shared_data_root

    root = shared_data_root()
    official = (
        root / "squad" / "dev-v1.1.json" if root and (root / "squad" / "dev-v1.1.json").is_file() else None
    )
    if official is None:
        official = tmp_path / "dev.json"
        context = "Paris is in France. Lyon is too."
        qas = [
            {"id": "q1", "question": "Where?", "answers": [{"text": "France", "answer_start": 12}] * 2},
            {"id": "q2", "question": "And Lyon?", "answers": [{"text": "too", "answer_start": 28}]},
        ]
        official.write_text(
            json.dumps({"data": [{"title": "T", "paragraphs": [{"context": context, "qas": qas}]}]})
        )
    spec = own_task_spec("qa", kind="span_qa")
    rows = read_local(spec, "dev", official)
    lines = _as_lines(rows, tmp_path / "dev.jsonl", answer_list=answer_list)
    assert list(read_local(spec, "dev", lines)) == list(rows)
    first = read_local(spec, "dev", lines, limit=1)
    assert list(first) == list(rows)[:1] and first.available == len(rows)


def test_own_span_qa_json_lines_errors_name_file_and_line(tmp_path):
    from bert_core.tasks.loader import read_local

    good = {"id": "a", "context": "Paris is in France.", "question": "Where?"}
    good |= {"answers": {"text": ["France"], "answer_start": [12]}}
    path = tmp_path / "qa.jsonl"
    spec = own_task_spec("qa", kind="span_qa")
    for second, match in [
        ("{not json", r"qa\.jsonl:2: not valid JSON"),
        (
            json.dumps({k: v for k, v in good.items() if k != "question"} | {"id": "b"}),
            r"qa\.jsonl:2: .*'question'",
        ),
        (json.dumps(good), r"qa\.jsonl:2: duplicate question id 'a' \(first at line 1\)"),
        (
            json.dumps(good | {"id": "b", "answers": {"text": ["France"], "answer_start": [3]}}),
            r"is not at answer_start=3",
        ),
        (
            json.dumps(good | {"id": "b", "answers": {"text": [], "answer_start": []}}),
            r"qa\.jsonl:2: question 'b' is marked is_impossible.*no_answers",
        ),
    ]:
        path.write_text(json.dumps(good) + "\n" + second + "\n", encoding="utf-8")
        with pytest.raises(TaskDataError, match=match):
            read_local(spec, "dev", path)
    with_null = own_task_spec("qa", kind="span_qa", no_answers=True)
    path.write_text(json.dumps(good) + "\n\n" + json.dumps(good | {"id": "b", "answers": []}) + "\n")
    assert [r["is_impossible"] for r in read_local(with_null, "dev", path)] == [False, True]
