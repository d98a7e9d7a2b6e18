"""Hub loading converts each Hub schema to the canonical rows (``datasets.load_dataset`` faked: no network)."""

from __future__ import annotations

import datasets
import pytest
from datasets import ClassLabel, Dataset, Features, Sequence, Value

from bert_core.tasks import CONLL_TAGS, load_task_split

GLUE_MRPC = Dataset.from_dict(
    {"sentence1": ["a b", "c d"], "sentence2": ["a b c", "e"], "label": [1, 0], "idx": [0, 1]},
    features=Features(
        {
            "sentence1": Value("string"),
            "sentence2": Value("string"),
            "label": ClassLabel(names=["not_equivalent", "equivalent"]),
            "idx": Value("int32"),
        }
    ),
)
GLUE_AX = Dataset.from_dict(
    {"premise": ["p"], "hypothesis": ["h"], "label": [-1], "idx": [0]},
    features=Features(
        {
            "premise": Value("string"),
            "hypothesis": Value("string"),
            "label": ClassLabel(names=["entailment", "neutral", "contradiction"]),
            "idx": Value("int32"),
        }
    ),
)
STSB = Dataset.from_dict({"sentence1": ["x"], "sentence2": ["y"], "label": [3.8], "idx": [7]})
SQUAD_V2 = Dataset.from_dict(
    {
        "id": ["q1", "q2"],
        "title": ["T", "T"],
        "context": ["Paris is in France.", "Paris is in France."],
        "question": ["Where is Paris?", "Where is Rome?"],
        "answers": [{"text": ["France"], "answer_start": [12]}, {"text": [], "answer_start": []}],
    }
)
CONLL = Dataset.from_dict(
    {"id": ["0"], "tokens": [["EU", "rejects", "German"]], "ner_tags": [[3, 0, 7]]},
    features=Features(
        {
            "id": Value("string"),
            "tokens": Sequence(Value("string")),
            "ner_tags": Sequence(ClassLabel(names=list(CONLL_TAGS))),
        }
    ),
)
SWAG = Dataset.from_dict(
    {
        "video-id": ["v"],
        "fold-ind": ["1"],
        "startphrase": ["A b"],
        "sent1": ["A."],
        "sent2": ["B"],
        "gold-source": ["gold"],
        "ending0": ["e0"],
        "ending1": ["e1"],
        "ending2": ["e2"],
        "ending3": ["e3"],
        "label": [-1],
    }
)

HUB = {
    ("nyu-mll/glue", "mrpc", "validation"): GLUE_MRPC,
    ("nyu-mll/glue", "ax", "test"): GLUE_AX,
    ("nyu-mll/glue", "stsb", "train"): STSB,
    ("rajpurkar/squad_v2", None, "validation"): SQUAD_V2,
    ("lhoestq/conll2003", None, "train"): CONLL,
    ("allenai/swag", "regular", "test"): SWAG,
}


@pytest.fixture
def fake_hub(monkeypatch):
    calls = []

    def load_dataset(path, name=None, split=None, revision=None):
        calls.append((path, name, split) + ((revision,) if revision else ()))
        base, _, limit = split.partition("[:")
        ds = HUB[(path, name, base)]
        return ds.select(range(min(len(ds), int(limit.rstrip("]"))))) if limit else ds

    monkeypatch.delenv("BERT_DATA_ROOT", raising=False)
    monkeypatch.setattr(datasets, "load_dataset", load_dataset)
    return calls


def test_glue_from_hub(fake_hub):
    rows = load_task_split("mrpc", "dev")
    assert list(rows) == [
        {"id": "0", "text_a": "a b", "text_b": "a b c", "label": 1},
        {"id": "1", "text_a": "c d", "text_b": "e", "label": 0},
    ]
    assert rows.source == "hf://nyu-mll/glue/mrpc:validation"
    assert load_task_split("mrpc", "dev", limit=1)[0]["id"] == "0"
    assert fake_hub[-1] == ("nyu-mll/glue", "mrpc", "validation[:1]")
    assert load_task_split("stsb", "train")[0] == {"id": "7", "text_a": "x", "text_b": "y", "label": 3.8}


def test_a_pinned_revision_is_the_one_loaded_and_logged(fake_hub):
    """``finetune.tasks.<task>.hub_revision`` reaches ``datasets.load_dataset`` and the rows' source."""
    from bert_core.finetune.params import FinetuneParams

    params = FinetuneParams(tasks={"mrpc": {"hub_revision": "v2"}, "sst2": {}})
    rows = params.for_task("mrpc").data_source(params.task("mrpc")).load("dev", limit=1)
    assert fake_hub[-1] == ("nyu-mll/glue", "mrpc", "validation[:1]", "v2")
    assert rows.source == "hf://nyu-mll/glue/mrpc@v2:validation"
    assert params.task("sst2").hub_revision is None  # unpinned: the newest
    assert "hub_revision" not in params.for_task("sst2").model_dump()  # trial fingerprints unchanged


def test_mnli_diagnostic_comes_from_the_ax_config(fake_hub):
    rows = load_task_split("mnli", "diagnostic")
    assert rows[0] == {"id": "0", "text_a": "p", "text_b": "h", "label": None}
    assert fake_hub[-1] == ("nyu-mll/glue", "ax", "test")


def test_squad_v2_from_hub(fake_hub):
    rows = load_task_split("squad_v2", "dev")
    assert rows[0]["answers"] == {"text": ["France"], "answer_start": [12]} and not rows[0]["is_impossible"]
    assert rows[1]["is_impossible"] and rows[1]["answers"] == {"text": [], "answer_start": []}


def test_conll_from_hub_maps_classlabels_to_iob2_tags(fake_hub):
    assert list(load_task_split("conll2003", "train")) == [
        {"id": "0", "tokens": ["EU", "rejects", "German"], "tags": ["B-ORG", "O", "B-MISC"]}
    ]


def test_swag_test_labels_become_none(fake_hub):
    row = load_task_split("swag", "test")[0]
    assert row == {
        "id": "0",
        "context": "A.",
        "start": "B",
        "endings": ["e0", "e1", "e2", "e3"],
        "label": None,
    }
