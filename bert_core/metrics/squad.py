"""SQuAD v1.1 and v2.0 scoring, exactly as the official evaluation scripts compute it.

Re-implements ``evaluate-v1.1.py`` and ``evaluate-v2.0.py`` from rajpurkar/SQuAD-explorer (Rajpurkar et al.,
2016, 2018); tests pin the official scripts' numbers on the leaderboard prediction files.

Both versions normalise answers the same way (lower-case, drop ASCII punctuation, drop the articles
a/an/the, collapse whitespace), take the max over the gold answers, and report EM and F1 on the 0-100 scale.
They differ in edge cases, which are kept:

* v1.1: token F1 is 0 when no token is shared (so a normalised-empty prediction gets F1 0 even against a
  normalised-empty gold); EM compares the normalised strings. Every question in the dataset counts in the
  denominator; a question without a prediction scores 0 (the script prints one message per such id).
* v2.0: gold answers that normalise to "" are dropped and an unanswerable question's only gold answer is
  ""; F1 is 1 when both token lists are empty. Adds ``HasAns_*``/``NoAns_*`` breakdowns, and with
  no-answer probabilities the ``best_exact``/``best_f1`` over thresholds (``find_best_thresh``).

One deliberate deviation: the official v2.0 script skips questions without a prediction in ``exact``/``f1``
and then crashes (KeyError) on the HasAns/NoAns breakdown. Here, as in v1.1, a missing prediction counts as
wrong (0) everywhere and ``missing`` reports how many there were. With complete predictions the numbers are
the official ones. Prediction ids that are not in the dataset are ignored in both versions.
"""

from __future__ import annotations

import collections
import re
import string
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

_PUNCT = frozenset(string.punctuation)
_ARTICLES = re.compile(r"\b(a|an|the)\b", re.UNICODE)


def normalize_answer(text: str) -> str:
    """Lower text and remove punctuation, articles and extra whitespace (the official normalisation)."""
    text = text.lower()
    text = "".join(ch for ch in text if ch not in _PUNCT)
    text = _ARTICLES.sub(" ", text)
    return " ".join(text.split())


@dataclass(frozen=True)
class SquadGold:
    """The gold side of one question: its id and its answer texts in dataset order ([] = unanswerable)."""

    qid: str
    answers: tuple[str, ...]


def gold_from_json(dataset: Sequence[Mapping[str, Any]]) -> list[SquadGold]:
    """Flatten the official ``data`` list (articles -> paragraphs -> qas) into :class:`SquadGold`, in order."""
    return [
        SquadGold(str(qa["id"]), tuple(a["text"] for a in qa["answers"]))
        for article in dataset
        for paragraph in article["paragraphs"]
        for qa in paragraph["qas"]
    ]


def gold_from_rows(rows: Iterable[Mapping[str, Any]]) -> list[SquadGold]:
    """:class:`SquadGold` from the canonical span-QA rows of :func:`bert_core.tasks.load_task_split`."""
    return [SquadGold(str(r["id"]), tuple(r["answers"]["text"])) for r in rows]


# ---------------------------------------------------------------------------------------------- v1.1 ---
def _f1_v1(prediction: str, ground_truth: str) -> float:
    pred_toks = normalize_answer(prediction).split()
    gold_toks = normalize_answer(ground_truth).split()
    num_same = sum((collections.Counter(pred_toks) & collections.Counter(gold_toks)).values())
    if num_same == 0:
        return 0.0
    precision = num_same / len(pred_toks)
    recall = num_same / len(gold_toks)
    return (2 * precision * recall) / (precision + recall)


def _em_v1(prediction: str, ground_truth: str) -> bool:
    return normalize_answer(prediction) == normalize_answer(ground_truth)


def squad_v1_evaluate(gold: Sequence[SquadGold], predictions: Mapping[str, str]) -> dict[str, Any]:
    """Official SQuAD v1.1 EM/F1.

    Args:
        gold: Questions in dataset order (each needs at least one answer).
        predictions: Question id -> predicted answer text. Unknown ids are ignored.

    Returns:
        ``{"exact_match", "f1"}`` (0-100) plus ``total`` (questions) and ``missing`` (questions without a
        prediction, scored 0) and ``missing_ids``.
    """
    if not gold:
        raise ValueError("the SQuAD dataset has no questions")
    exact_match = 0.0
    f1 = 0.0
    missing: list[str] = []
    for q in gold:
        if q.qid not in predictions:
            missing.append(q.qid)
            continue
        if not q.answers:
            raise ValueError(f"question {q.qid} has no gold answer; SQuAD v1.1 scoring needs one (use v2.0)")
        pred = predictions[q.qid]
        exact_match += max(_em_v1(pred, a) for a in q.answers)
        f1 += max(_f1_v1(pred, a) for a in q.answers)
    total = len(gold)
    return {
        "exact_match": 100.0 * exact_match / total,
        "f1": 100.0 * f1 / total,
        "total": total,
        "missing": len(missing),
        "missing_ids": missing,
    }


# ---------------------------------------------------------------------------------------------- v2.0 ---
def _tokens_v2(text: str) -> list[str]:
    return normalize_answer(text).split() if text else []


def _f1_v2(a_gold: str, a_pred: str) -> float:
    gold_toks = _tokens_v2(a_gold)
    pred_toks = _tokens_v2(a_pred)
    if not gold_toks or not pred_toks:
        return float(gold_toks == pred_toks)  # no-answer: 1 if both empty, else 0
    num_same = sum((collections.Counter(gold_toks) & collections.Counter(pred_toks)).values())
    if num_same == 0:
        return 0.0
    precision = num_same / len(pred_toks)
    recall = num_same / len(gold_toks)
    return (2 * precision * recall) / (precision + recall)


def _best_thresh(
    preds: Mapping[str, str],
    scores: Mapping[str, float],
    na_probs: Mapping[str, float],
    has_ans: Mapping[str, bool],
    answered: set[str],
) -> tuple[float, float]:
    """``find_best_thresh`` of the official script: best score over no-answer thresholds, and the threshold.

    Start from "predict no-answer everywhere" and walk the questions by increasing no-answer probability,
    switching each to its span prediction. The walk order is a stable sort of ``na_probs`` in its given
    order, as in the official script (it decides ties).
    """
    # Missing predictions can never be right, not even as an abstention.
    cur = sum(1 for k, v in has_ans.items() if not v and k in answered)
    best, best_t = cur, 0.0
    for qid in sorted(na_probs, key=lambda k: na_probs[k]):
        if qid not in answered:
            continue
        if has_ans[qid]:
            diff = scores[qid]
        else:
            diff = -1 if preds[qid] else 0
        cur += diff
        if cur > best:
            best, best_t = cur, na_probs[qid]
    return 100.0 * best / len(scores), float(best_t)


def squad_v2_evaluate(
    gold: Sequence[SquadGold],
    predictions: Mapping[str, str],
    na_probs: Mapping[str, float] | None = None,
    na_prob_thresh: float = 1.0,
) -> dict[str, Any]:
    """Official SQuAD v2.0 scores.

    Args:
        gold: Questions in dataset order; ``answers == ()`` marks an unanswerable question.
        predictions: Question id -> answer text ("" = no answer). Unknown ids are ignored.
        na_probs: Optional question id -> predicted probability of no answer (``--na-prob-file``); must
            cover every answered question. Enables ``best_exact``/``best_f1`` and their thresholds.
        na_prob_thresh: Predict "" where the no-answer probability exceeds this (official default 1.0).

    Returns:
        The official keys ``exact``, ``f1``, ``total``, ``HasAns_exact``, ``HasAns_f1``, ``HasAns_total``,
        ``NoAns_exact``, ``NoAns_f1``, ``NoAns_total`` (the two groups only when present), with
        ``na_probs`` also ``best_exact``, ``best_exact_thresh``, ``best_f1``, ``best_f1_thresh``; plus
        ``exact_match`` (= ``exact``), ``missing`` and ``missing_ids``. Scores are 0-100.

    Raises:
        ValueError: empty dataset, or ``na_probs`` lacks an answered question.
    """
    if not gold:
        raise ValueError("the SQuAD dataset has no questions")
    has_ans = {q.qid: bool(q.answers) for q in gold}
    answered = {q.qid for q in gold if q.qid in predictions}
    missing = [q.qid for q in gold if q.qid not in predictions]
    if na_probs is None:
        probs: Mapping[str, float] = {k: 0.0 for k in predictions}
    else:
        lacking = [qid for qid in (q.qid for q in gold) if qid in answered and qid not in na_probs]
        if lacking:
            raise ValueError(
                f"no-answer probabilities are missing for {len(lacking)} answered question(s), "
                f"e.g. {lacking[:3]}; the na-prob file must map every question id to a probability"
            )
        probs = na_probs

    exact_raw: dict[str, float] = {}
    f1_raw: dict[str, float] = {}
    for q in gold:
        if q.qid not in answered:
            exact_raw[q.qid] = f1_raw[q.qid] = 0.0
            continue
        golds = [a for a in q.answers if normalize_answer(a)] or [""]
        pred = predictions[q.qid]
        exact_raw[q.qid] = float(max(int(normalize_answer(a) == normalize_answer(pred)) for a in golds))
        f1_raw[q.qid] = max(_f1_v2(a, pred) for a in golds)

    def thresholded(raw: Mapping[str, float]) -> dict[str, float]:
        return {
            qid: (float(not has_ans[qid]) if qid in answered and probs[qid] > na_prob_thresh else s)
            for qid, s in raw.items()
        }

    exact, f1 = thresholded(exact_raw), thresholded(f1_raw)

    def block(ids: list[str]) -> tuple[float, float, int]:
        return (
            100.0 * sum(exact[k] for k in ids) / len(ids),
            100.0 * sum(f1[k] for k in ids) / len(ids),
            len(ids),
        )

    out: dict[str, Any] = {}
    out["exact"], out["f1"], out["total"] = block(list(exact))
    for prefix, ids in (
        ("HasAns", [k for k, v in has_ans.items() if v]),
        ("NoAns", [k for k, v in has_ans.items() if not v]),
    ):
        if ids:
            out[f"{prefix}_exact"], out[f"{prefix}_f1"], out[f"{prefix}_total"] = block(ids)
    if na_probs is not None:
        out["best_exact"], out["best_exact_thresh"] = _best_thresh(
            predictions, exact_raw, probs, has_ans, answered
        )
        out["best_f1"], out["best_f1_thresh"] = _best_thresh(predictions, f1_raw, probs, has_ans, answered)
    out["exact_match"] = out["exact"]
    out["missing"] = len(missing)
    out["missing_ids"] = missing
    return out


def is_v2_dataset(dataset_json: Mapping[str, Any]) -> bool:
    """Whether an official-format SQuAD JSON is v2.0 (by its ``version`` or any ``is_impossible`` flag)."""
    if str(dataset_json.get("version", "")).lstrip("v").startswith("2"):
        return True
    return any(
        "is_impossible" in qa
        for article in dataset_json.get("data", [])
        for paragraph in article.get("paragraphs", [])
        for qa in paragraph.get("qas", [])
    )


def squad_metrics(
    rows: Iterable[Mapping[str, Any]],
    predictions: Mapping[str, str],
    version: str,
    na_probs: Mapping[str, float] | None = None,
) -> dict[str, Any]:
    """Score predictions against canonical span-QA rows (``load_task_split("squad_v1"|"squad_v2", ...)``).

    Args:
        rows: Canonical rows with ``id`` and ``answers.text``.
        predictions: Question id -> answer text.
        version: ``"v1.1"`` / ``"squad_v1"`` or ``"v2.0"`` / ``"squad_v2"``.
        na_probs: v2.0 only: question id -> no-answer probability.

    Returns:
        The dict of :func:`squad_v1_evaluate` or :func:`squad_v2_evaluate`; both have ``exact_match``, ``f1``.
    """
    gold = gold_from_rows(rows)
    if version in ("v1.1", "1.1", "squad_v1", "squad"):
        if na_probs is not None:
            raise ValueError("no-answer probabilities only apply to SQuAD v2.0")
        return squad_v1_evaluate(gold, predictions)
    if version in ("v2.0", "2.0", "squad_v2"):
        return squad_v2_evaluate(gold, predictions, na_probs)
    raise ValueError(f"unknown SQuAD version {version!r}; use 'v1.1' or 'v2.0'")
