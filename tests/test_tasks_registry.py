"""The task registry: names, kinds, labels, splits, metrics and GLUE submission files."""

from __future__ import annotations

import pytest

from bert_core.metrics import GLUE_METRIC_KEYS
from bert_core.tasks import CONLL_TAGS, GLUE_TASKS, TASKS, get_task, glue_submission_text, iob1_to_iob2

EXPECTED_KINDS = {
    "cola": "classification",
    "sst2": "classification",
    "mrpc": "classification",
    "stsb": "regression",
    "qqp": "classification",
    "mnli": "classification",
    "qnli": "classification",
    "rte": "classification",
    "wnli": "classification",
    "squad_v1": "span_qa",
    "squad_v2": "span_qa",
    "swag": "multiple_choice",
    "conll2003": "token_classification",
}


def test_every_task_is_registered_with_its_kind():
    assert {name: spec.kind for name, spec in TASKS.items()} == EXPECTED_KINDS
    assert set(GLUE_TASKS) <= set(TASKS)


def test_get_task_accepts_common_spellings_and_lists_valid_names():
    assert get_task("SST-2").name == "sst2"
    assert get_task("sts-b").name == "stsb"
    assert get_task("squad").name == "squad_v1"
    with pytest.raises(KeyError, match="unknown task 'boolq'; valid tasks: cola, sst2"):
        get_task("boolq")


def test_labels_follow_the_hub_classlabel_order():
    # nyu-mll/glue ClassLabel names; HF conll2003 ner_tags names.
    assert get_task("mnli").labels == ("entailment", "neutral", "contradiction")
    assert get_task("qnli").labels == get_task("rte").labels == ("entailment", "not_entailment")
    assert get_task("wnli").labels == ("not_entailment", "entailment")
    assert get_task("cola").labels == ("unacceptable", "acceptable")
    assert get_task("conll2003").labels == CONLL_TAGS
    assert get_task("stsb").labels == ()


def test_splits_metrics_and_lengths():
    mnli = get_task("mnli")
    assert mnli.dev_splits == ("dev_matched", "dev_mismatched") and mnli.main_dev_split == "dev_matched"
    for spec in TASKS.values():
        assert set(spec.dev_splits) | set(spec.test_splits) <= set(spec.splits)
        assert spec.max_seq_length in (128, 384)
        if spec.name in GLUE_METRIC_KEYS:
            assert set(spec.metric_keys) == set(GLUE_METRIC_KEYS[spec.name])
    assert get_task("squad_v1").max_seq_length == 384


def test_main_metric_is_the_papers_headline():
    """BERT paper Table 1 (and §4.2-4.4): the headline metric of every task, the first of its metric keys."""
    assert {name: spec.main_metric for name, spec in TASKS.items()} == {
        "cola": "matthews_corr",
        "sst2": "accuracy",
        "mrpc": "f1",
        "stsb": "spearman",
        "qqp": "f1",
        "qnli": "accuracy",
        "rte": "accuracy",
        "wnli": "accuracy",
        "mnli": "accuracy",
        "squad_v1": "f1",
        "squad_v2": "f1",
        "swag": "accuracy",
        "conll2003": "f1",
    }
    assert all(spec.main_metric == spec.metric_keys[0] for spec in TASKS.values())


def test_glue_submission_files_cover_the_leaderboard():
    files = sorted(f for name in GLUE_TASKS for f in get_task(name).submission_files.values())
    assert files == sorted(
        [
            "CoLA.tsv",
            "SST-2.tsv",
            "MRPC.tsv",
            "STS-B.tsv",
            "QQP.tsv",
            "MNLI-m.tsv",
            "MNLI-mm.tsv",
            "AX.tsv",
            "QNLI.tsv",
            "RTE.tsv",
            "WNLI.tsv",
        ]
    )


def test_submission_text_uses_official_label_strings():
    assert glue_submission_text(get_task("mnli"), ["0", "1"], [2, 0]) == (
        "index\tprediction\n0\tcontradiction\n1\tentailment\n"
    )
    assert glue_submission_text(get_task("cola"), ["0"], [1]) == "index\tprediction\n0\t1\n"
    assert (
        glue_submission_text(get_task("stsb"), ["0", "1"], [5.7, 2.25])
        == "index\tprediction\n0\t5.000\n1\t2.250\n"
    )
    with pytest.raises(ValueError, match="2 ids but 1 predictions"):
        glue_submission_text(get_task("rte"), ["0", "1"], [0])


def test_label_index_names_valid_labels():
    assert get_task("rte").label_index("not_entailment") == 1
    with pytest.raises(KeyError, match="valid labels"):
        get_task("rte").label_index("neutral")


def test_iob1_to_iob2():
    assert iob1_to_iob2(["I-PER", "I-PER", "B-PER", "O", "I-LOC", "I-ORG"]) == [
        "B-PER",
        "I-PER",
        "B-PER",
        "O",
        "B-LOC",
        "B-ORG",
    ]
    iob2 = ["B-PER", "I-PER", "O", "B-LOC"]
    assert iob1_to_iob2(iob2) == iob2
