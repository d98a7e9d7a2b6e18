"""Post-processing on hand-made logits: SQuAD n-best search, windows, null threshold; NER tags; SWAG."""

from __future__ import annotations

import math

import numpy as np
import pytest

from bert_core.kinds.multiple_choice import multiple_choice_predictions
from bert_core.kinds.sequence import classification_predictions
from bert_core.kinds.squad_post import squad_predictions, tune_null_threshold
from bert_core.kinds.token_classification import ner_word_tags

# context: "alpha beta gamma delta epsilon"; one token per word.
CONTEXT = "alpha beta gamma delta epsilon"
WORD_OFFSETS = [(0, 5), (6, 10), (11, 16), (17, 22), (23, 30)]


def _feature(example_index: int, words: range, *, max_context: set[int] | None = None) -> dict:
    """[CLS] q [SEP] <context words> [SEP]: positions 0..2 are not context."""
    offsets = [None, None, None] + [WORD_OFFSETS[w] for w in words] + [None]
    mc = [False] * 3 + [max_context is None or w in max_context for w in words] + [False]
    return {
        "input_ids": [0] * len(offsets),
        "example_index": example_index,
        "offsets": offsets,
        "max_context": mc,
    }


def _logits(n: int, peaks: dict[int, float]) -> np.ndarray:
    out = np.full(n, -10.0)
    for pos, value in peaks.items():
        out[pos] = value
    return out


EX = [{"id": "q1", "context": CONTEXT}]


def test_best_span_and_nbest():
    feat = _feature(0, range(5))  # positions 3..7 = words 0..4
    start = _logits(9, {4: 5.0, 5: 3.0})  # beta, gamma
    end = _logits(9, {5: 4.0, 6: 2.0})  # gamma, delta
    out = squad_predictions(EX, [feat], [start], [end], n_best_size=3, max_answer_length=10)
    assert out.predictions == {"q1": "beta gamma"}
    texts = [c["text"] for c in out.nbest["q1"]]
    assert texts[:3] == ["beta gamma", "beta gamma delta", "gamma"]
    probs = [c["probability"] for c in out.nbest["q1"]]
    assert math.isclose(sum(probs), 1.0) and probs == sorted(probs, reverse=True)


def test_max_answer_length_end_before_start_and_non_context():
    feat = _feature(0, range(5))
    start = _logits(9, {3: 9.0, 0: 20.0, 1: 15.0})  # CLS and question tokens must be ignored
    end = _logits(9, {7: 9.0, 4: 1.0, 2: 30.0})
    # "alpha .. epsilon" is 5 tokens: too long for max_answer_length=3 -> next best "alpha beta"
    out = squad_predictions(EX, [feat], [start], [end], n_best_size=20, max_answer_length=3)
    assert out.predictions["q1"] == "alpha beta"
    out = squad_predictions(EX, [feat], [start], [end], n_best_size=20, max_answer_length=5)
    assert out.predictions["q1"] == "alpha beta gamma delta epsilon"
    # end before start is never chosen even with the best end logit
    start = _logits(9, {6: 9.0})
    end = _logits(9, {4: 9.0, 6: 1.0})
    assert squad_predictions(EX, [feat], [start], [end]).predictions["q1"] == "delta"


def test_windows_pick_best_and_respect_max_context():
    # Two windows over the same context: words 0..2 and words 2..4; "gamma" has its max context in window 0.
    w0 = _feature(0, range(0, 3), max_context={0, 1, 2})
    w1 = _feature(0, range(2, 5), max_context={3, 4})
    s0, e0 = _logits(7, {3: 1.0}), _logits(7, {3: 1.0})  # alpha: score 2
    s1, e1 = (
        _logits(7, {3: 8.0, 4: 3.0}),
        _logits(7, {4: 3.0}),
    )  # gamma(not max ctx)->delta 11; delta->delta 6
    out = squad_predictions(EX, [w0, w1], [s0, s1], [e0, e1], n_best_size=5)
    assert out.predictions["q1"] == "delta"  # the span starting at gamma in window 1 is excluded
    w1_all = _feature(0, range(2, 5))
    out = squad_predictions(EX, [w0, w1_all], [s0, s1], [e0, e1], n_best_size=5)
    assert out.predictions["q1"] == "gamma delta"


def test_v2_null_score_and_threshold():
    feat_a = _feature(0, range(5))
    feat_b = _feature(0, range(5))
    start_a, end_a = _logits(9, {0: 2.0, 4: 3.0}), _logits(9, {0: 2.0, 4: 3.0})  # null 4, beta 6
    start_b, end_b = _logits(9, {0: 1.0}), _logits(9, {0: 0.5})  # null 1.5 (the minimum)
    out = squad_predictions(
        EX, [feat_a, feat_b], [start_a, start_b], [end_a, end_b], version_2=True, null_threshold=0.0
    )
    assert out.best_non_null["q1"] == "beta"
    assert out.null_odds["q1"] == pytest.approx(1.5 - 6.0)
    assert out.predictions["q1"] == "beta"  # odds -4.5 <= 0
    assert out.with_threshold(-5.0).predictions["q1"] == ""
    assert any(c["text"] == "" for c in out.nbest["q1"])
    # no valid span at all: always "no answer"
    none = squad_predictions(EX, [_feature(0, range(0))], [np.zeros(4)], [np.zeros(4)], version_2=True)
    assert none.predictions["q1"] == "" and none.null_odds["q1"] == math.inf


def test_tune_null_threshold_hand_case():
    odds = {"a": -3.0, "b": -1.0, "c": 0.5, "d": 2.0, "e": 2.0}
    has = {"a": True, "b": False, "c": True, "d": False, "e": True}
    f1 = {"a": 1.0, "c": 0.5, "e": 1.0}
    # thresholds: <-3: 2/5 (b,d abstain right); -3: +1 -> 3; -1: -1 -> 2; 0.5: +0.5 -> 2.5; 2.0: -1+1 -> 2.5
    threshold, score = tune_null_threshold(odds, f1, has)
    assert threshold == -3.0 and score == pytest.approx(60.0)
    # everything unanswerable: abstaining everywhere is best, the threshold lies below every odds value
    threshold, score = tune_null_threshold({"x": 0.0, "y": 1.0}, {}, {"x": False, "y": False})
    assert threshold < 0.0 and score == 100.0


def test_tune_null_threshold_agrees_with_official_best_f1():
    from bert_core.metrics.squad import SquadGold, squad_v2_evaluate

    rng = np.random.default_rng(0)
    gold, preds, odds = [], {}, {}
    for i in range(200):
        answerable = rng.random() < 0.6
        qid = f"q{i}"
        gold.append(SquadGold(qid, ("red apple pie",) if answerable else ()))
        preds[qid] = str(rng.choice(["red apple pie", "apple", "blue sky"], p=[0.6, 0.2, 0.2]))
        odds[qid] = float(rng.normal() - (1.0 if answerable else 0.0))  # a model that knows a bit
    official = squad_v2_evaluate(gold, preds, na_probs=odds)
    from bert_core.kinds.squad_post import answer_f1

    f1 = {g.qid: answer_f1(preds[g.qid], g.answers) for g in gold if g.answers}
    threshold, best = tune_null_threshold(odds, f1, {g.qid: bool(g.answers) for g in gold})
    assert threshold > min(odds.values())  # an interior optimum, not "abstain everywhere"
    assert best == pytest.approx(official["best_f1"])
    assert threshold == pytest.approx(official["best_f1_thresh"])
    applied = squad_v2_evaluate(gold, {q: ("" if odds[q] > threshold else p) for q, p in preds.items()})
    assert applied["f1"] == pytest.approx(best)


def test_ner_word_tags_first_subtoken():
    id2label = {0: "O", 1: "B-PER", 2: "I-PER"}
    feat = {"word_ids": [None, 0, 0, 1, 2, None]}  # word 3 was cut by max_seq_length
    logits = np.array([[9, 0, 0], [0, 9, 0], [0, 0, 9], [0, 0, 9], [9, 0, 0], [9, 0, 0], [0, 9, 0]], float)
    (tags,) = ner_word_tags([feat], [logits], id2label, [4])
    assert tags == ["B-PER", "I-PER", "O", "O"]  # the second sub-token's I-PER is ignored


def test_multiple_choice_and_classification():
    choice, probs = multiple_choice_predictions(np.array([[0.0, 2.0, 1.0, -1.0], [5.0, 0.0, 0.0, 0.0]]))
    assert choice.tolist() == [1, 0] and np.allclose(probs.sum(1), 1.0) and probs.shape == (2, 4)
    assert classification_predictions(np.array([[0.1, 0.9], [2.0, -1.0]]), regression=False).tolist() == [
        1,
        0,
    ]
    assert classification_predictions(np.array([[3.5], [1.25]]), regression=True).tolist() == [3.5, 1.25]
