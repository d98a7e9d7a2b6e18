"""Trivial baselines of every kind: fitted on the training rows only, scored on the evaluated rows."""

from __future__ import annotations

import pytest

from bert_core.kinds import get_kind
from bert_core.kinds.baselines import entity_lexicon, lexicon_tags
from bert_core.tasks import get_task


def _sentence(i: int, text: str, label: int, text_b: str | None = None) -> dict:
    return {"id": str(i), "text_a": text, "text_b": text_b, "label": label}


# Training rows: 3 of label 1 ("good" words), 1 of label 0; the evaluated rows: 1 of label 1, 3 of label 0.
SST2_TRAIN = [
    _sentence(0, "a good film", 1),
    _sentence(1, "good acting and a good story", 1),
    _sentence(2, "truly good", 1),
    _sentence(3, "a bad film", 0),
]
SST2_DEV = [
    _sentence(10, "good", 1),
    _sentence(11, "bad", 0),
    _sentence(12, "bad bad", 0),
    _sentence(13, "a bad story", 0),
]


def test_sequence_majority_is_the_training_majority_scored_on_the_evaluated_rows():
    spec = get_task("sst2")
    out = get_kind(spec).baselines(spec, SST2_DEV, train_rows=SST2_TRAIN)
    # majority of the training rows is 1; on the evaluated rows 1 of 4 is 1: accuracy 25 (not the dev's own
    # majority, which would score 75)
    assert out["majority"] == {"accuracy": 25.0}
    assert set(out) == {"majority", "tfidf_logreg"} and 0.0 <= out["tfidf_logreg"]["accuracy"] <= 100.0
    # the words of the evaluated rows were never seen in training: the baselines do not read their labels
    relabelled = [dict(r, label=1 - r["label"]) for r in SST2_DEV]
    flipped = get_kind(spec).baselines(spec, relabelled, train_rows=SST2_TRAIN)
    assert flipped["majority"] == {"accuracy": 75.0}
    assert flipped["tfidf_logreg"]["accuracy"] == pytest.approx(100.0 - out["tfidf_logreg"]["accuracy"])


def test_sequence_bag_of_words_learns_from_words_and_pairs_use_both_texts():
    spec = get_task("sst2")
    train = [_sentence(i, w, int(w == "good")) for i, w in enumerate(["good", "bad"] * 20)]
    out = get_kind(spec).baselines(spec, SST2_DEV[:2], train_rows=train)
    assert out["tfidf_logreg"] == {"accuracy": 100.0}
    rte = get_task("rte")  # entailment (0) when the hypothesis repeats "sun", else not (1)
    pairs = [_sentence(i, "the sky", int(w != "sun"), text_b=w) for i, w in enumerate(["sun", "rain"] * 20)]
    scored = get_kind(rte).baselines(rte, pairs[:2], train_rows=pairs)
    assert scored["tfidf_logreg"] == {"accuracy": 100.0} and scored["majority"] == {"accuracy": 50.0}


def test_stsb_mean_scores_zero_correlation_and_ridge_is_scored_with_pearson_spearman():
    spec = get_task("stsb")
    train = [_sentence(i, "a man", 5.0 * (i % 2), text_b="a man" if i % 2 else "a cat") for i in range(10)]
    dev = [
        _sentence(10, "a dog", 0.0, text_b="a cat"),
        _sentence(11, "a man", 4.0, text_b="a man"),
        _sentence(12, "a man", 5.0, text_b="a man"),
    ]
    out = get_kind(spec).baselines(spec, dev, train_rows=train)
    assert out["mean"] == {"pearson": 0.0, "spearman": 0.0}
    assert set(out["tfidf_ridge"]) == {"pearson", "spearman"} and out["tfidf_ridge"]["pearson"] > 0


def test_pairs_get_a_word_overlap_baseline_that_sees_what_the_sides_share():
    rte = get_task("rte")  # entailment (0) when the hypothesis repeats the premise, else not (1)
    words = ["sun", "rain", "snow", "wind", "fog", "hail", "dust", "heat"]
    train = [
        _sentence(i, f"the {w} came", int(i % 2 == 1), text_b=f"the {w} came" if i % 2 == 0 else "a cat sat")
        for i, w in enumerate(words * 5)
    ]
    dev = [  # words never seen in training: only the overlap tells the label
        _sentence(100, "blue ocean waves", 0, text_b="blue ocean waves"),
        _sentence(101, "blue ocean waves", 1, text_b="green hills far"),
    ]
    out = get_kind(rte).baselines(rte, dev, train_rows=train)
    assert out["word_overlap"] == {"accuracy": 100.0} and out["tfidf_logreg"]["accuracy"] < 100.0
    stsb = get_task("stsb")  # the score grows with the words the sides share
    base = "one two three four"
    scored = [
        _sentence(i, base, float(k), text_b=" ".join(base.split()[:k] + ["x", "y", "z", "w"][k:]))
        for i, k in enumerate([0, 1, 2, 3, 4] * 4)
    ]
    out = get_kind(stsb).baselines(stsb, scored[:5], train_rows=scored)
    assert out["word_overlap"]["spearman"] == pytest.approx(100.0)
    sst2 = get_task("sst2")  # a single sentence has nothing to overlap with
    assert "word_overlap" not in get_kind(sst2).baselines(sst2, SST2_DEV, train_rows=SST2_TRAIN)


def test_unlabelled_rows_give_no_baselines():
    spec = get_task("sst2")
    test_rows = [dict(r, label=None) for r in SST2_DEV]
    assert get_kind(spec).baselines(spec, test_rows, train_rows=SST2_TRAIN) == {}


def test_conll_lexicon_longest_match_first_and_ambiguous_phrases_skipped():
    train = [
        {"tokens": ["New", "York", "City", "is", "big"], "tags": ["B-LOC", "I-LOC", "I-LOC", "O", "O"]},
        {"tokens": ["New", "York", "won"], "tags": ["B-ORG", "I-ORG", "O"]},  # IOB2
        {"tokens": ["York", "wins"], "tags": ["I-ORG", "O"]},  # IOB1: I- opens a chunk after O
        {"tokens": ["Washington", "said"], "tags": ["I-PER", "O"]},
        {"tokens": ["in", "Washington"], "tags": ["O", "I-LOC"]},  # Washington: PER and LOC, ambiguous
    ]
    lexicon = entity_lexicon(train)
    assert lexicon == {("New", "York", "City"): "LOC", ("New", "York"): "ORG", ("York",): "ORG"}
    tokens = ["New", "York", "City", "and", "New", "York", "and", "Washington", "York"]
    assert lexicon_tags(tokens, lexicon) == [
        "B-LOC",
        "I-LOC",
        "I-LOC",
        "O",
        "B-ORG",
        "I-ORG",
        "O",
        "O",
        "B-ORG",
    ]

    spec = get_task("conll2003")
    dev = [{"tokens": tokens, "tags": ["B-LOC", "I-LOC", "I-LOC", "O", "B-LOC", "I-LOC", "O", "B-PER", "O"]}]
    out = get_kind(spec).baselines(spec, dev, train_rows=train)
    # predicted chunks: LOC(0-2) right, ORG(4-5) wrong, ORG(8) wrong; gold: LOC, LOC, PER
    assert out["lexicon"]["precision"] == pytest.approx(100 / 3)
    assert out["lexicon"]["recall"] == pytest.approx(100 / 3)
    assert out["majority"]["f1"] == 0.0 and out["majority"]["accuracy"] == pytest.approx(100 * 3 / 9)
    assert set(out["lexicon"]) == {"precision", "recall", "f1", "accuracy"}  # no counts, no per-type dict


def test_swag_majority_label_from_training_rows_and_ending_ranker():
    spec = get_task("swag")

    def row(i: int, label: int) -> dict:
        endings = ["walks away slowly"] * 4
        endings[label] = "smiles at the camera"
        return {"id": str(i), "context": "A woman sits.", "start": "She", "endings": endings, "label": label}

    train = [row(i, 2) for i in range(6)] + [row(6, 0)]
    dev = [row(10, 2), row(11, 1), row(12, 3), row(13, 1)]
    out = get_kind(spec).baselines(spec, dev, train_rows=train)
    assert out["majority"] == {"accuracy": 25.0}  # always ending 2: right on 1 of 4
    assert out["tfidf_ending"] == {"accuracy": 100.0}  # the gold ending's words are learnt


def test_baselines_are_deterministic():
    pairs = [_sentence(i, "a man", 5.0 * (i % 3 == 0), text_b=f"a {i % 7}") for i in range(120)]
    ner = [{"tokens": ["Paris", "and", "New", "York"], "tags": ["B-LOC", "O", "B-ORG", "I-ORG"]}] * 3
    cases = (
        ("sst2", SST2_DEV, SST2_TRAIN * 40),  # 160 rows: the cross-validated path
        ("stsb", pairs[:10], pairs),
        ("conll2003", ner, ner),
    )
    for task, dev, train in cases:
        spec = get_task(task)
        first = get_kind(spec).baselines(spec, dev, train_rows=train)
        assert first and get_kind(spec).baselines(spec, dev, train_rows=list(train)) == first, task


def test_squad_baselines_ignore_training_rows():
    spec = get_task("squad_v1")
    dev = [
        {
            "id": "q1",
            "question": "Where is the cat?",
            "context": "The cat is on the mat. Dogs run.",
            "answers": {"text": ["on the mat"], "answer_start": [11]},
        }
    ]
    assert get_kind(spec).baselines(spec, dev, train_rows=[]) == get_kind(spec).baselines(
        spec, dev, train_rows=dev * 3
    )
