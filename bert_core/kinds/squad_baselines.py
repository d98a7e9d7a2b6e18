"""Trivial SQuAD baselines, scored by the official scorers on the same evaluated questions as the model.

A fine-tuned score means little without the score of something that cannot read: these show how far above
a shallow heuristic the model is, on exactly the questions it was scored on (the report prints them beside
the task's row).

* ``overlap_sentence``: the context sentence that shares the most words with the question, answered whole.
  Words are lower-cased ``\\w+`` tokens without a short stop-word list; sentences end at ``.``, ``!`` or
  ``?`` followed by white space; ties go to the earlier sentence. It finds the right region often (the idea
  of the sliding-window baseline of the SQuAD paper, Rajpurkar et al. 2016, §5, without its answer-span
  search), but knows nothing of answer boundaries, so its F1 is low: a model that has learned spans must be
  far above it.
* ``all_empty`` (SQuAD v2.0 only): "no answer" to every question. Its EM and F1 equal the share of
  unanswerable questions (the v2.0 scorer gives an empty prediction 1 on those and 0 elsewhere): a v2.0
  model must beat it, or its null threshold has simply learned to abstain.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Mapping, Sequence
from typing import Any

_SENTENCE_END = re.compile(r"(?<=[.!?])\s+")
_WORD = re.compile(r"\w+", re.UNICODE)
_STOP_WORDS = (
    "a an the of in on at to for from by with as and or but is are was were be been being do does did has have "
    "had what which who whom whose when where why how that this these those it its there their they he she his "
    "her than then into about after before during"
)
_STOP = frozenset(_STOP_WORDS.split())


def _words(text: str) -> set[str]:
    return {w for w in _WORD.findall(text.lower()) if w not in _STOP}


@functools.lru_cache(maxsize=4096)  # many questions share a paragraph
def _sentences(context: str) -> tuple[tuple[str, frozenset[str]], ...]:
    sentences = [s.strip() for s in _SENTENCE_END.split(context) if s.strip()] or [context.strip()]
    return tuple((s, frozenset(_words(s))) for s in sentences)


def overlap_sentence(question: str, context: str) -> str:
    """The sentence of ``context`` sharing the most non-stop words with ``question`` (the earliest on ties)."""
    asked = _words(question)
    return max(_sentences(context), key=lambda s: len(asked & s[1]))[0]  # max keeps the first of equal keys


def squad_baselines(
    rows: Sequence[Mapping[str, Any]], *, version_2: bool, metric_keys: Sequence[str] = ("f1",)
) -> dict[str, dict[str, float]]:
    """Score the baselines on canonical SQuAD rows with the official scorer of the version.

    Args:
        rows: The evaluated rows (``id``, ``question``, ``context``, ``answers``).
        version_2: Score with the v2.0 scorer and add ``all_empty``.
        metric_keys: The metric keys kept (the task's: ``f1``, ``exact_match`` / ``exact``).

    Returns:
        ``{"overlap_sentence": {"f1": ..., ...}, "all_empty": {...}}`` on the 0-100 scale; empty for no rows.
    """
    from bert_core.metrics import squad_metrics

    if not rows:
        return {}
    version = "squad_v2" if version_2 else "squad_v1"
    predictions = {
        "overlap_sentence": {str(r["id"]): overlap_sentence(r["question"], r["context"]) for r in rows}
    }
    if version_2:
        predictions["all_empty"] = {str(r["id"]): "" for r in rows}
    out = {}
    for name, preds in predictions.items():
        scores = squad_metrics(rows, preds, version=version)
        out[name] = {k: float(scores[k]) for k in metric_keys if k in scores}
    return out
