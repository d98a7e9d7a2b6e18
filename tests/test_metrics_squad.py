"""SQuAD scoring reproduces the official evaluate-v1.1.py / evaluate-v2.0.py numbers.

The pinned v1.1 numbers are what the official ``evaluate-v1.1.py`` (rajpurkar/SQuAD-explorer) prints for the
leaderboard prediction files in shared/data on the official dev-v1.1.json; the v2.0 numbers are what the
official ``evaluate-v2.0.py`` prints on the hand-made v2.0 fixture (tests/fixtures/tasks/squad/), run with
no options, with ``-n na-probs-v2.0.json``, and with ``-n ... -t 0.5``.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bert_core.metrics import (
    SquadGold,
    gold_from_json,
    normalize_answer,
    squad_metrics,
    squad_v1_evaluate,
    squad_v2_evaluate,
)
from bert_core.tasks import load_task_split

FIXTURES = Path(__file__).parent / "fixtures" / "tasks"

# file -> (exact_match, f1) printed by the official evaluate-v1.1.py on dev-v1.1.json
OFFICIAL_V11 = {
    "bert_ensemble_google.json": (86.20624408703878, 92.19557978351145),
    "logistic_regression_stanford.json": (40.14191106906339, 50.98153647324461),
    "match_lstm_smu.json": (67.63481551561021, 76.75556184979695),
    "rnet_msra.json": (82.46925260170293, 88.47785965423249),
    "slqa_alibaba.json": (81.94891201513718, 88.38386312172166),
}

_V2_BASE = {
    "exact": 44.44444444444444,
    "f1": 56.34920634920635,
    "total": 18,
    "HasAns_exact": 36.36363636363637,
    "HasAns_f1": 55.844155844155836,
    "HasAns_total": 11,
    "NoAns_exact": 57.142857142857146,
    "NoAns_f1": 57.142857142857146,
    "NoAns_total": 7,
}
_V2_BEST = {
    "best_exact": 61.111111111111114,
    "best_exact_thresh": 0.1,
    "best_f1": 64.68253968253968,
    "best_f1_thresh": 0.4,
}
OFFICIAL_V20 = {
    "plain": _V2_BASE,
    "na_probs": {**_V2_BASE, **_V2_BEST},
    "na_probs_thresh_0.5": {
        **_V2_BASE,
        "exact": 50.0,
        "f1": 61.9047619047619,
        "NoAns_exact": 71.42857142857143,
        "NoAns_f1": 71.42857142857143,
        **_V2_BEST,
    },
}


@pytest.fixture(scope="module")
def dev_v11(shared_data):
    with (shared_data / "squad" / "dev-v1.1.json").open() as f:
        return gold_from_json(json.load(f)["data"])


def _load(path: Path):
    with path.open() as f:
        return json.load(f)


@pytest.mark.parametrize("name", sorted(OFFICIAL_V11))
def test_v11_matches_the_official_script_on_leaderboard_files(shared_data, dev_v11, name):
    preds = _load(shared_data / "squad" / "leaderboard_predictions" / "v1.1" / name)
    out = squad_v1_evaluate(dev_v11, preds)
    em, f1 = OFFICIAL_V11[name]
    assert out["exact_match"] == pytest.approx(em, abs=1e-9)
    assert out["f1"] == pytest.approx(f1, abs=1e-9)
    assert out["total"] == 10570


def test_v11_ignores_unknown_ids_and_scores_missing_ones_zero(shared_data, dev_v11):
    preds = _load(
        shared_data / "squad" / "leaderboard_predictions" / "v1.1" / "logistic_regression_stanford.json"
    )
    dev_ids = {q.qid for q in dev_v11}
    unknown = set(preds) - dev_ids
    out = squad_v1_evaluate(dev_v11, preds)
    assert out["missing"] == 13 and len(out["missing_ids"]) == 13
    assert len(unknown) == len(preds) - (10570 - 13) > 0
    # Dropping the unknown ids changes nothing.
    same = squad_v1_evaluate(dev_v11, {k: v for k, v in preds.items() if k in dev_ids})
    assert same["f1"] == out["f1"] and same["exact_match"] == out["exact_match"]


def test_scoring_canonical_rows_equals_scoring_the_json(shared_data):
    rows = load_task_split("squad_v1", "dev", data_root=shared_data)
    preds = _load(shared_data / "squad" / "leaderboard_predictions" / "v1.1" / "bert_ensemble_google.json")
    out = squad_metrics(rows, preds, version="v1.1")
    assert out["f1"] == pytest.approx(OFFICIAL_V11["bert_ensemble_google.json"][1], abs=1e-9)


@pytest.mark.parametrize(
    ("case", "na", "thresh"),
    [("plain", False, 1.0), ("na_probs", True, 1.0), ("na_probs_thresh_0.5", True, 0.5)],
)
def test_v20_matches_the_official_script_on_the_fixture(case, na, thresh):
    gold = gold_from_json(_load(FIXTURES / "squad" / "dev-v2.0.json")["data"])
    preds = _load(FIXTURES / "squad" / "predictions-v2.0.json")
    na_probs = _load(FIXTURES / "squad" / "na-probs-v2.0.json") if na else None
    out = squad_v2_evaluate(gold, preds, na_probs, na_prob_thresh=thresh)
    expected = OFFICIAL_V20[case]
    assert {k: out[k] for k in expected} == pytest.approx(expected, abs=1e-9)
    assert out["exact_match"] == out["exact"] and out["missing"] == 0
    assert ("best_f1" in out) == na


def test_v20_rows_from_the_loader_score_the_same():
    rows = load_task_split("squad_v2", "dev", data_root=FIXTURES)
    preds = _load(FIXTURES / "squad" / "predictions-v2.0.json")
    out = squad_metrics(rows, preds, version="squad_v2")
    assert out["f1"] == pytest.approx(_V2_BASE["f1"], abs=1e-9)


def test_normalisation_is_the_official_one():
    assert normalize_answer("The  Quick, brown fox!") == "quick brown fox"
    assert normalize_answer("An apple a day") == "apple day"
    assert normalize_answer("theory") == "theory"  # articles only as whole words
    assert normalize_answer("“Curly” quotes") == "“curly” quotes"  # only ASCII punctuation is removed


def test_v11_and_v20_edge_cases_differ_as_in_the_official_scripts():
    gold = [SquadGold("q", ("the",))]  # normalises to ""
    v1 = squad_v1_evaluate(gold, {"q": "The"})
    assert v1["exact_match"] == 100.0 and v1["f1"] == 0.0  # v1.1: no shared token -> F1 0
    v2 = squad_v2_evaluate(gold, {"q": ""})
    assert v2["exact"] == 100.0 and v2["f1"] == 100.0  # v2.0: empty gold dropped -> "" is right
    assert "HasAns_total" in v2 and "NoAns_total" not in v2


def test_max_over_gold_answers_and_partial_f1():
    gold = [SquadGold("q", ("Denver Broncos", "the Broncos"))]
    out = squad_v1_evaluate(gold, {"q": "Broncos won"})
    # vs "the Broncos" -> tokens ["broncos"]: P=1/2, R=1 -> F1=2/3
    assert out["f1"] == pytest.approx(100 * 2 / 3)
    assert out["exact_match"] == 0.0


def test_v20_missing_prediction_counts_as_wrong():
    gold = [SquadGold("a", ("x",)), SquadGold("b", ())]
    out = squad_v2_evaluate(gold, {"a": "x"})
    assert out["missing"] == 1 and out["total"] == 2
    assert out["exact"] == 50.0 and out["NoAns_exact"] == 0.0


def test_v20_na_probs_must_cover_answered_questions():
    gold = [SquadGold("a", ("x",)), SquadGold("b", ())]
    with pytest.raises(ValueError, match="no-answer probabilities are missing"):
        squad_v2_evaluate(gold, {"a": "x", "b": ""}, na_probs={"a": 0.1})


def test_unknown_version_and_v1_without_answers_are_errors():
    with pytest.raises(ValueError, match="unknown SQuAD version"):
        squad_metrics([], {}, version="v3")
    with pytest.raises(ValueError, match="no gold answer"):
        squad_v1_evaluate([SquadGold("q", ())], {"q": ""})
