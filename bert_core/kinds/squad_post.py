"""SQuAD post-processing, as Google's ``run_squad.py`` ``write_predictions`` does it (see :mod:`bert_core.kinds.span_qa`).

For every window of an example the ``n_best_size`` highest start and end logits are paired; a pair is kept when
both ends are context tokens, the start token has its maximal context in that window, ``end >= start`` and the
span has at most ``max_answer_length`` tokens. For SQuAD v2.0 the answer is empty when the null odds exceed a
threshold tuned on dev (:func:`tune_null_threshold`, the official ``find_best_thresh``).
"""

from __future__ import annotations

import logging
import math
from collections import Counter, defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

log = logging.getLogger(__name__)


# ---------------------------------------------------------------------- post-processing
@dataclass
class SquadPredictions:
    """Post-processed SQuAD outputs, keyed by question id.

    Attributes:
        predictions: Final answer text ("" = no answer, after the null threshold for v2.0).
        best_non_null: Best non-empty answer, whatever the null score (what the threshold is tuned on).
        null_odds: ``null_score - best_span_score`` (v2.0; larger = more likely unanswerable).
        nbest: The n best candidates with ``text``, ``start_logit``, ``end_logit``, ``probability`` and
            ``start_char`` / ``end_char`` (the span's character offsets in the context, end exclusive;
            -1 for the empty answer).
        null_threshold: The threshold applied (v2.0), ``None`` for v1.1.
    """

    predictions: dict[str, str]
    best_non_null: dict[str, str]
    null_odds: dict[str, float] = field(default_factory=dict)
    nbest: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    null_threshold: float | None = None

    def with_threshold(self, threshold: float) -> SquadPredictions:
        """The same candidates with a new null threshold applied (answer "" when odds > threshold)."""
        preds = {
            qid: ("" if self.null_odds.get(qid, -math.inf) > threshold else text)
            for qid, text in self.best_non_null.items()
        }
        return SquadPredictions(preds, self.best_non_null, self.null_odds, self.nbest, threshold)


def _top_indices(logits: np.ndarray, n: int) -> np.ndarray:
    n = min(n, logits.shape[0])
    idx = np.argpartition(-logits, n - 1)[:n]
    return idx[np.argsort(-logits[idx], kind="stable")]


def squad_predictions(
    examples: Sequence[Mapping[str, Any]],
    features: Sequence[Mapping[str, Any]],
    start_logits: Sequence[np.ndarray],
    end_logits: Sequence[np.ndarray],
    *,
    n_best_size: int = 20,
    max_answer_length: int = 30,
    version_2: bool = False,
    null_threshold: float = 0.0,
) -> SquadPredictions:
    """Answer every example from the start/end logits of its windows.

    Args:
        examples: SQuAD examples (``id``, ``context``).
        features: Windows from :func:`encode_squad` (``example_index``,
            ``offsets``, ``max_context``).
        start_logits: Per feature, a (L_f,) array (or longer: positions past L_f are ignored).
        end_logits: Per feature, a (L_f,) array.
        n_best_size: Start/end candidates per window and answers kept per question.
        max_answer_length: Longest answer in tokens.
        version_2: Allow "no answer" (SQuAD v2.0).
        null_threshold: Answer "" when ``null_odds`` exceeds it (v2.0).

    Returns:
        :class:`SquadPredictions` for every example (an example whose windows give no valid span gets "").
    """
    by_example: dict[int, list[int]] = defaultdict(list)
    for fi, feat in enumerate(features):
        by_example[int(feat["example_index"])].append(fi)
    best_non_null, null_odds, nbest_out = {}, {}, {}
    for ei, ex in enumerate(examples):
        qid, context = str(ex["id"]), str(ex["context"])
        candidates, null_score = [], math.inf
        for fi in by_example.get(ei, []):
            feat = features[fi]
            length = len(feat["input_ids"])
            s_log = np.asarray(start_logits[fi], dtype=np.float64)[:length]
            e_log = np.asarray(end_logits[fi], dtype=np.float64)[:length]
            offsets, max_context = feat["offsets"], feat["max_context"]
            null_score = min(null_score, float(s_log[0] + e_log[0]))
            for s in _top_indices(s_log, n_best_size):
                if offsets[s] is None or not max_context[s]:
                    continue
                for e in _top_indices(e_log, n_best_size):
                    if offsets[e] is None or e < s or e - s + 1 > max_answer_length:
                        continue
                    candidates.append(
                        (
                            float(s_log[s] + e_log[e]),
                            float(s_log[s]),
                            float(e_log[e]),
                            offsets[s][0],
                            offsets[e][1],
                        )
                    )
        candidates.sort(key=lambda c: -c[0])
        nbest, seen = [], set()
        for _, s_l, e_l, c0, c1 in candidates:
            text = context[c0:c1]
            if text in seen:
                continue
            seen.add(text)
            nbest.append(
                {
                    "text": text,
                    "start_logit": s_l,
                    "end_logit": e_l,
                    "start_char": int(c0),
                    "end_char": int(c1),
                }
            )
            if len(nbest) >= n_best_size:
                break
        best_text = nbest[0]["text"] if nbest else ""
        best_score = nbest[0]["start_logit"] + nbest[0]["end_logit"] if nbest else -math.inf
        if version_2 and math.isfinite(null_score):
            nbest.append(
                {
                    "text": "",
                    "start_logit": null_score / 2,
                    "end_logit": null_score / 2,
                    "start_char": -1,
                    "end_char": -1,
                }
            )
            nbest.sort(key=lambda c: -(c["start_logit"] + c["end_logit"]))
            nbest = nbest[:n_best_size]
            null_odds[qid] = null_score - best_score if nbest and best_text else math.inf
        if nbest:
            scores = np.array([c["start_logit"] + c["end_logit"] for c in nbest])
            probs = np.exp(scores - scores.max())
            probs /= probs.sum()
            for c, p in zip(nbest, probs):
                c["probability"] = float(p)
        best_non_null[qid] = best_text
        nbest_out[qid] = nbest
    result = SquadPredictions(dict(best_non_null), best_non_null, null_odds, nbest_out, None)
    return result.with_threshold(null_threshold) if version_2 else result


def tune_null_threshold(
    null_odds: Mapping[str, float],
    answered_scores: Mapping[str, float],
    has_answer: Mapping[str, bool],
) -> tuple[float, float]:
    """The null threshold that maximises a dev score (the official v2.0 ``find_best_thresh``).

    A question is answered with its best span when its null odds are <= the threshold, else left empty.
    An empty answer scores 1 on an unanswerable question and 0 otherwise; a span scores
    ``answered_scores[qid]`` on an answerable question and 0 on an unanswerable one. Questions with equal
    odds move together (the official script splits ties arbitrarily).

    Args:
        null_odds: ``null_score - best_span_score`` per question id.
        answered_scores: Exact match or F1 (0..1) of the best span per answerable question id.
        has_answer: Whether each question id has a gold answer.

    Returns:
        ``(threshold, score)``: the threshold and the score it reaches, in percent (0..100).
    """
    qids = [q for q in has_answer if q in null_odds]
    if not qids:
        return 0.0, 0.0
    current = float(sum(1 for q in qids if not has_answer[q]))  # everything left empty
    best, best_threshold = current, None
    ordered = sorted(qids, key=lambda q: null_odds[q])
    i = 0
    while i < len(ordered):
        odds = null_odds[ordered[i]]
        while i < len(ordered) and null_odds[ordered[i]] == odds:
            q = ordered[i]
            current += float(answered_scores.get(q, 0.0)) if has_answer[q] else -1.0
            i += 1
        if current > best and math.isfinite(odds):
            best, best_threshold = current, odds
    if best_threshold is None:  # answering nothing is best: a threshold below every finite odds value
        finite = [null_odds[q] for q in qids if math.isfinite(null_odds[q])]
        best_threshold = (min(finite) if finite else 0.0) - 1.0
    return float(best_threshold), 100.0 * best / len(qids)


def answer_f1(prediction: str, gold_answers: Sequence[str]) -> float:
    """Official SQuAD token F1 (0..1) of ``prediction`` against its best-matching gold answer.

    Uses the official answer normalisation (:func:`bert_core.metrics.normalize_answer`); an empty gold
    list (an unanswerable question) scores 1 for an empty prediction and 0 otherwise.
    """
    from bert_core.metrics import normalize_answer

    pred = normalize_answer(prediction).split()
    best = 0.0
    for gold in [g for g in gold_answers if normalize_answer(g)] or [""]:
        ref = normalize_answer(gold).split()
        if not ref or not pred:
            best = max(best, float(ref == pred))
            continue
        same = sum((Counter(ref) & Counter(pred)).values())
        if same:
            precision, recall = same / len(pred), same / len(ref)
            best = max(best, 2 * precision * recall / (precision + recall))
    return best


# ---------------------------------------------------------------------- prediction files
def write_squad_predictions(
    out_dir: str | Path,
    predictions: Mapping[str, str],
    *,
    null_odds: Mapping[str, float] | None = None,
    nbest: Mapping[str, Any] | None = None,
) -> dict[str, Path]:
    """Write ``predictions.json`` (+ ``null_odds.json``, ``nbest_predictions.json``) into ``out_dir``."""
    from bert_core.atomic import write_json_atomic

    out_dir = Path(out_dir)
    paths = {"predictions": write_json_atomic(out_dir / "predictions.json", dict(predictions))}
    if null_odds is not None:
        # JSON has no infinity: a question without any valid span gets a large finite odds value.
        finite = {k: (v if np.isfinite(v) else 1e9) for k, v in null_odds.items()}
        paths["null_odds"] = write_json_atomic(out_dir / "null_odds.json", finite)
    if nbest is not None:
        paths["nbest"] = write_json_atomic(out_dir / "nbest_predictions.json", dict(nbest))
    return paths
