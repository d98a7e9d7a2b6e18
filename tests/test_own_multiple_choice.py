"""An own multiple-choice task with any number of choices (ARC, CommonsenseQA, COPA ...): a question or
context, its choices in one list field (JSON Lines, the Hub) or one column each (CSV), the answer as a
position's name (``A``-``E``) or index. It is fine-tuned, checked, baselined and served as SWAG is.

Every test runs against its own SQLite MLflow store (the autouse fixture in conftest.py).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bert_core.finetune.params import FinetuneParams
from bert_core.tasks import TaskDataError, own_task_json, own_task_spec, task_from_json

FIVE = {
    "kind": "multiple_choice",
    "text": "question",
    "choices": "options",
    "label": "answerKey",
    "labels": ["A", "B", "C", "D", "E"],
}
QUESTIONS = [
    ("Where do you keep milk cold?", ["oven", "fridge", "drawer", "garden", "car"], "B"),
    ("What do bees make?", ["honey", "milk", "silk", "wax paper", "bread"], "A"),
    ("What is frozen water?", ["steam", "fog", "ice", "rain", "dew"], "C"),
    ("Which animal barks?", ["cat", "cow", "bird", "dog", "fish"], "D"),
    ("What do you read?", ["spoon", "chair", "shoe", "lamp", "book"], "E"),
    ("Where does the sun rise?", ["east", "west", "north", "south", "below"], "A"),
]


def _jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def _questions(path: Path, times: int = 1) -> Path:
    rows = [{"question": q, "options": o, "answerKey": a} for q, o, a in QUESTIONS * times]
    return _jsonl(path, rows)


def _params(tmp_path: Path, define: dict, train: Path, dev: Path | None = None, **defaults) -> FinetuneParams:
    files = {"train_file": str(train), "dev_file": str(dev or train)}
    return FinetuneParams(defaults=defaults, data_checks=True, tasks={"quiz": {"define": define, **files}})


def test_choices_in_a_list_field_or_one_column_each_with_named_or_counted_positions(tmp_path):
    params = _params(tmp_path, FIVE, _questions(tmp_path / "q.jsonl"))
    spec = params.task("quiz")
    assert spec.kind == "multiple_choice" and spec.labels == ("A", "B", "C", "D", "E")
    rows = list(params.for_task("quiz").data_source(spec).load("train"))
    assert rows[0] == {
        "id": "0",
        "context": "Where do you keep milk cold?",
        "start": "",
        "endings": ["oven", "fridge", "drawer", "garden", "car"],
        "label": 1,
    }
    # no labels: the positions are counted from a train row's choices, the answers their indices
    counted = {k: v for k, v in FIVE.items() if k != "labels"}
    indexed = _jsonl(tmp_path / "i.jsonl", [{"question": "q", "options": ["a", "b", "c"], "answerKey": 2}])
    assert _params(tmp_path, counted, indexed).task("quiz").labels == ("0", "1", "2")
    # one column each (CSV): the positions default to the columns' order
    csv = tmp_path / "copa.csv"
    csv.write_text("premise,choice1,choice2,label\nThe man fell.,He slipped.,He sang.,0\n", encoding="utf-8")
    copa = {"kind": "multiple_choice", "text": "premise", "choices": ["choice1", "choice2"]}
    spec = _params(tmp_path, copa, csv).task("quiz")
    assert spec.labels == ("0", "1")
    source = FinetuneParams(
        tasks={"quiz": {"define": copa, "train_file": str(csv), "dev_file": str(csv)}}
    ).for_task("quiz")
    assert source.data_source(spec).load("dev")[0]["endings"] == ["He slipped.", "He sang."]
    # the served spec is the params' one
    assert task_from_json({"task": "quiz", "own_task": own_task_json(spec)}) == spec


@pytest.mark.parametrize(
    ("define", "message"),
    [
        ({"kind": "classification", "text": "t", "choices": "c"}, "choices are multiple choice's"),
        (
            {"kind": "multiple_choice", "choices": "c", "labels": ["A", "B"]},
            "needs the field of its question",
        ),
        ({"kind": "multiple_choice", "labels": ["A", "B"]}, "SWAG's format numbers its four endings"),
        (
            {"kind": "multiple_choice", "text": "q", "choices": ["a", "b", "c"], "labels": ["A", "B"]},
            "labels name the positions of the 3 choices",
        ),
        ({"kind": "multiple_choice", "text": "q", "choices": ["a"]}, "two or more distinct fields"),
    ],
)
def test_a_wrong_multiple_choice_declaration_is_refused_naming_what_to_change(define, message):
    with pytest.raises(ValueError, match=message):
        FinetuneParams(tasks={"quiz": {"define": define, "train_file": "t.jsonl", "dev_file": "d.jsonl"}})


@pytest.mark.parametrize(
    ("row", "message"),
    [
        (
            {"question": "q", "options": ["a", "b", "c", "d"], "answerKey": "A"},
            r":2: 4 choices, the task has 5",
        ),
        (
            {"question": "q", "options": ["a", "b", "c", "d", "e"], "answerKey": "F"},
            r":2: label 'F' is not one",
        ),
        (
            {"question": "q", "options": "a b c d e", "answerKey": "A"},
            r":2: the choices 'a b c d e' are not a list",
        ),
        (
            {"question": "", "options": ["a", "b", "c", "d", "e"], "answerKey": "A"},
            r":2: field 'question' is ''",
        ),
    ],
)
def test_a_bad_multiple_choice_row_is_named_by_file_and_line(tmp_path, row, message):
    first = {"question": "q", "options": ["a", "b", "c", "d", "e"], "answerKey": "A"}
    path = _jsonl(tmp_path / "bad.jsonl", [first, row])
    params = _params(tmp_path, FIVE, path)
    with pytest.raises(TaskDataError, match=message):
        params.for_task("quiz").data_source(params.task("quiz")).load("train")
    with pytest.raises(TaskDataError, match=r"c\.csv:2: no field 'choice2' \(one of the task's choices"):
        csv = tmp_path / "c.csv"
        csv.write_text("premise,choice1,label\nx,y,0\n", encoding="utf-8")
        spec = own_task_spec("quiz", kind="multiple_choice", text="premise", choices=["choice1", "choice2"])
        from bert_core.tasks.loader import read_local

        read_local(spec, "train", csv)


def test_a_five_choice_task_is_fine_tuned_checked_baselined_and_served(tiny_model, tmp_path):
    import mlflow

    from bert_core.finetune.run import finetune_task
    from bert_core.serving.predictor import Predictor

    train = _questions(tmp_path / "train.jsonl", times=4)
    params = _params(
        tmp_path,
        FIVE,
        train,
        _questions(tmp_path / "dev.jsonl"),
        learning_rates=[1e-3],
        epochs=1,
        batch_size=4,
    )
    out = tmp_path / "out"
    result = finetune_task("quiz", params, tiny_model, out, model_out=tmp_path / "model")
    assert set(result.selected.dev) == {"accuracy"} and {"majority", "tfidf_ending"} <= set(result.baselines)
    assert len((out / "dev_predictions.csv").read_text().splitlines()) == 1 + len(QUESTIONS)
    model = tmp_path / "model"
    predictor = Predictor(model, model / "task.json", device="cpu")  # the task JSON alone, no params
    record = {"context": "Which animal barks?", "endings": ["cat", "cow", "bird", "dog", "fish"]}
    (answer,) = predictor.predict_records([record])
    assert 0 <= answer["choice"] < 5 and len(answer["probabilities"]) == 5
    assert answer["label"] == "ABCDE"[answer["choice"]]  # the position's name, as the files spell answers
    assert [c for c, _, _ in predictor.component.serving_outputs(predictor.spec)] == [
        "choice",
        "label",
        "probabilities",
    ]
    (example,) = predictor.component.serving_example(predictor.spec)  # the signature's input example
    assert len(example["endings"]) == 5
    (served,) = predictor.predict_records([example])
    assert len(served["probabilities"]) == 5
    assert mlflow.active_run() is None


def test_a_hub_multiple_choice_dataset_reads_its_answers_class_names_and_test_split(monkeypatch):
    """A Hub set with the choices in a list column and the answer a ClassLabel (its names are the positions),
    its labelled test split declared in hub_splits."""
    import datasets
    from datasets import ClassLabel, Dataset, Features, Sequence, Value

    features = Features(
        {
            "question": Value("string"),
            "options": Sequence(Value("string")),
            "answerKey": ClassLabel(names=list("ABCDE")),
        }
    )
    quiz = Dataset.from_dict(
        {
            "question": [q for q, _, _ in QUESTIONS],
            "options": [o for _, o, _ in QUESTIONS],
            "answerKey": ["ABCDE".index(a) for _, _, a in QUESTIONS],
        },
        features,
    )
    every_split = lambda path, config=None, split=None, revision=None: quiz  # noqa: E731
    monkeypatch.setattr(datasets, "load_dataset", every_split)
    define = {k: v for k, v in FIVE.items() if k != "labels"}  # the positions: the ClassLabel's names
    define |= {"hub": "someone/quiz", "hub_splits": {"dev": "validation", "test": "test"}}
    params = FinetuneParams(tasks={"quiz": {"define": define}})
    spec = params.task("quiz")
    assert spec.labels == ("A", "B", "C", "D", "E") and spec.dev_splits == ("dev", "test")
    rows = list(params.for_task("quiz").data_source(spec).load("test"))
    assert rows[3]["endings"][rows[3]["label"]] == "dog" and rows[0]["label"] == 1
