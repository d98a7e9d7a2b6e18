"""What the report says about a task's data beyond its scores: a dev-split label, and trivial baselines.

Kept apart from the report's tables (:mod:`bert_core.evaluate.report`) so that each piece is one small
function: :func:`task_label` (the task cell: ``squad_v1 (dev split: articles 25-48 of dev-v1.1, trained on
1-24)``), :func:`data_notes` (a sentence per task whose scores are not on the official splits, and the v2.0
null threshold's provenance), :func:`baseline_table` (each baseline beside the fine-tuned score on the
same rows), :func:`baseline_verdict` (how many tasks beat their best baseline) and :func:`baseline_metrics`
(the same as flat metrics).

A fine-tuned score *beats* its task's best trivial baseline when it is strictly above the highest baseline
score on the task's main metric; an undefined (NaN) score beats nothing. The report marks every score that
does not (:data:`NOT_ABOVE_BASELINE`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from bert_core.evaluate.references import split_row
from bert_core.finetune.results import FinetuneResult, best_of_baselines

BASELINE_NOTES = {
    "overlap_sentence": "the context sentence sharing the most words with the question, answered whole",
    "all_empty": "no answer to every question (= the share of unanswerable questions)",
    "majority": "the most frequent training label (NER: tag) for every row",
    "mean": "the mean training score for every pair (correlation 0)",
    "tfidf_logreg": "TF-IDF 1-2 grams + logistic regression, fitted on the same training rows",
    "tfidf_ridge": "TF-IDF 1-2 grams + ridge regression, fitted on the same training rows",
    "word_overlap": "the pair's word overlap (TF-IDF cosine, shared words) + a linear model, same training rows",
    "lexicon": "CoNLL-2003's baseline: training entity phrases of a single type, longest first",
    "tfidf_ending": "TF-IDF of the ending alone + logistic regression, best-scored ending",
}
#: What the report adds to a fine-tuned score that does not beat its task's best trivial baseline.
NOT_ABOVE_BASELINE = "≤ baseline"


def _label(result: FinetuneResult | None, key: str = "label") -> str:
    return str((result.data_split if result is not None else {}).get(key) or "")


def task_label(results: Mapping[str, FinetuneResult], task: str, name: str, split: str = "dev") -> str:
    """The report's task cell: ``name``, with the data label when the rows are not the official splits (a
    further split's row: with its own rows' cut, ``conll2003_test (first 1000 of 3453 rows)``)."""
    label = _label(results.get(task), "label" if split == "dev" else f"{split}_set")
    return f"{name} ({label})" if label else name


def axis_label(results: Mapping[str, FinetuneResult], task: str, split: str = "dev") -> str:
    """A few words for a plot's task axis when the scored rows are not the whole official dev split
    (``dev split``, ``own files``, ``dev rows cut``; a further split's: ``test rows cut``), else empty: the
    report's notes say the rest."""
    info = results[task].data_split if task in results else {}
    if split != "dev":
        return f"{split} rows cut" if info.get(f"{split}_set") else ""
    origin = info.get("origin", "official")
    if origin in ("dev_split", "own_files"):
        return origin.replace("_", " ")
    return "dev rows cut" if info.get("eval_set") else ""


def data_notes(results: Mapping[str, FinetuneResult]) -> list[str]:
    """One sentence per task trained or scored on something else than the official splits."""
    notes = []
    for task, result in results.items():
        origin = result.data_split.get("origin", "official")
        if origin == "dev_split":
            notes.append(
                f"{task}: {_label(result)}. The official train file is not available here, so the model was "
                "trained on one half of the official dev file and scored on the other (no article in both): "
                "these are not official dev scores and do not compare with published ones."
            )
        elif origin == "own_files" and _label(result):
            notes.append(f"{task}: {_label(result)} (not the official splits).")
        elif origin == "own_files":  # an own task: its files are its splits
            info = result.data_split
            notes.append(
                f"{task}: an own task, trained on {info.get('train_source')}, scored on {info.get('eval_source')}."
            )
        elif result.data_split.get("eval_set"):
            notes.append(
                f"{task}: scored on the {result.data_split['eval_set']}, set by `eval_limit`: not the official "
                "dev score, and only roughly comparable with published ones."
            )
        for split in result.selected.other_splits:
            if cut := result.data_split.get(f"{split}_set"):
                notes.append(
                    f"{task}: {split} scored on the {cut}, set by `eval_limit`: not the official {split} score."
                )
        threshold = result.selected.extra.get("null_threshold")
        if threshold is not None and math.isfinite(threshold):
            where = "articles" if origin == "dev_split" else "questions"
            notes.append(
                f"{task}: null-answer threshold {threshold:.3f}, tuned on the evaluated {where} themselves (the "
                "official v2.0 protocol, find_best_thresh on dev), scored with the v2.0 scorer."
            )
    return notes


def _scores(result: FinetuneResult, split: str) -> dict[str, float]:
    """The selected model's metrics on ``split`` (``dev``: the main dev split)."""
    return result.selected.dev if split == "dev" else result.selected.other_splits.get(split, {})


def _baselines(result: FinetuneResult, split: str) -> dict[str, dict[str, float]]:
    """The trivial baselines on ``split`` (``dev``: the main dev split)."""
    return result.baselines if split == "dev" else result.split_baselines.get(split, {})


def _splits(result: FinetuneResult) -> list[tuple[str, str]]:
    """``(split, row)`` of each evaluated split: ``("dev", <task>)``, then the further ones."""
    return [("dev", result.task), *((s, split_row(result.task, s)) for s in result.selected.other_splits)]


def best_baseline(result: FinetuneResult, split: str = "dev") -> tuple[str, float] | None:
    """``(name, score)`` of the task's highest baseline on ``split`` and its main metric; ``None`` if none
    scored it."""
    return best_of_baselines(_baselines(result, split), result.main_metric)


def beats_baseline(result: FinetuneResult, split: str = "dev") -> bool | None:
    """Whether the selected model's main score on ``split`` is strictly above the best baseline there
    (``None``: none)."""
    best = best_baseline(result, split)
    if best is None:
        return None
    ours = float(_scores(result, split).get(result.main_metric, math.nan))
    return ours > best[1]  # NaN > x is False: an undefined score beats nothing


def baseline_verdict(results: Mapping[str, FinetuneResult]) -> str | None:
    """The report's one line: ``k of n tasks beat their best trivial baseline`` (and which do not)."""
    verdicts = {task: beats_baseline(r) for task, r in results.items()}
    compared = {task: v for task, v in verdicts.items() if v is not None}
    if not compared:
        return None
    losing = [task for task, v in compared.items() if not v]
    line = f"{len(compared) - len(losing)} of {len(compared)} tasks beat their best trivial baseline"
    return line + (f" (not: {', '.join(losing)}, marked {NOT_ABOVE_BASELINE})." if losing else ".")


def baseline_table(results: Mapping[str, FinetuneResult]) -> tuple[str, list[str], list[list[str]]] | None:
    """(title, header, rows): each trivial baseline next to the fine-tuned score on the same evaluated rows."""
    rows: list[list[str]] = []
    for result, (split, row) in ((r, s) for r in results.values() for s in _splits(r)):
        metric = result.main_metric
        ours = _scores(result, split).get(metric)
        for name, scores in _baselines(result, split).items():
            value = scores.get(metric)
            if value is None or ours is None:
                continue
            mark = "" if ours > value else f" {NOT_ABOVE_BASELINE}"  # this row's baseline, not the best
            rows.append(
                [
                    row,
                    name,
                    BASELINE_NOTES.get(name, ""),
                    metric,
                    f"{value:.1f}",
                    f"{ours:.1f}{mark}",
                    f"{ours - value:+.1f}",
                ]
            )
    if not rows:
        return None
    header = [
        "task",
        "baseline",
        "what it answers",
        "metric",
        "baseline",
        "fine-tuned",
        "fine-tuned - baseline",
    ]
    return "Trivial baselines on the same evaluated rows", header, rows


def baseline_metrics(results: Mapping[str, FinetuneResult]) -> dict[str, Any]:
    """``<row>.baseline.<name>.<metric>`` for every baseline, ``<row>.best_baseline.<main metric>`` and
    ``<row>.beats_baseline`` (1 or 0) where a baseline scored the main metric (a row: the task's main dev
    split, or a further one, ``conll2003_test``), ``baseline.tasks_compared`` and ``baseline.tasks_beating``
    over the tasks (their main dev split), ``<task>.dev_split`` = 1 for dev-split rows."""
    out: dict[str, Any] = {}
    compared = beating = 0
    for task, result in results.items():
        for split, row in _splits(result):
            for name, scores in _baselines(result, split).items():
                out.update({f"{row}.baseline.{name}.{k}": float(v) for k, v in scores.items()})
            best, beats = best_baseline(result, split), beats_baseline(result, split)
            if best is not None:
                out[f"{row}.best_baseline.{result.main_metric}"] = best[1]
                out[f"{row}.beats_baseline"] = float(bool(beats))
        if (beats := beats_baseline(result)) is not None:
            compared, beating = compared + 1, beating + bool(beats)
        if result.data_split.get("origin") == "dev_split":
            out[f"{task}.dev_split"] = 1.0
    if compared:
        out["baseline.tasks_compared"], out["baseline.tasks_beating"] = float(compared), float(beating)
    return out
