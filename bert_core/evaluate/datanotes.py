"""What the report says about a task's data beyond its scores: a dev-split label, and trivial baselines.

Kept apart from the report's tables (:mod:`bert_core.evaluate.report`) so that each piece is one small
function: :func:`task_label` (the task cell: ``squad_v1 (dev split: articles 25-48 of dev-v1.1, trained on
1-24)``), :func:`data_notes` (a sentence per task whose scores are not on the official splits, and the v2.0
null threshold's provenance), :func:`baseline_table` (each baseline beside the fine-tuned score on the
same rows) and :func:`baseline_metrics` (the same as flat metrics).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from bert_core.finetune.results import FinetuneResult

BASELINE_NOTES = {
    "overlap_sentence": "the context sentence sharing the most words with the question, answered whole",
    "all_empty": "no answer to every question (= the share of unanswerable questions)",
}


def _label(result: FinetuneResult | None) -> str:
    return str((result.data_split if result is not None else {}).get("label") or "")


def task_label(results: Mapping[str, FinetuneResult], task: str, name: str) -> str:
    """The report's task cell: ``name``, with the data label when the rows are not the official splits."""
    label = _label(results.get(task))
    return f"{name} ({label})" if label else name


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
        elif origin == "own_files":
            notes.append(f"{task}: {_label(result)} (not the official splits).")
        threshold = result.selected.extra.get("null_threshold")
        if threshold is not None and math.isfinite(threshold):
            where = "articles" if origin == "dev_split" else "questions"
            notes.append(
                f"{task}: null-answer threshold {threshold:.3f}, tuned on the evaluated {where} themselves (the "
                "official v2.0 protocol, find_best_thresh on dev), scored with the v2.0 scorer."
            )
    return notes


def baseline_table(results: Mapping[str, FinetuneResult]) -> tuple[str, list[str], list[list[str]]] | None:
    """(title, header, rows): each trivial baseline next to the fine-tuned score on the same evaluated rows."""
    rows: list[list[str]] = []
    for task, result in results.items():
        metric = result.main_metric
        ours = result.selected.dev.get(metric)
        for name, scores in result.baselines.items():
            value = scores.get(metric)
            if value is None or ours is None:
                continue
            rows.append([task, name, BASELINE_NOTES.get(name, ""), metric, f"{value:.1f}", f"{ours:.1f}",
                         f"{ours - value:+.1f}"])  # fmt: skip
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
    return "Trivial baselines on the same evaluated questions", header, rows


def baseline_metrics(results: Mapping[str, FinetuneResult]) -> dict[str, Any]:
    """``<task>.baseline.<name>.<metric>`` for every baseline, ``<task>.dev_split`` = 1 for dev-split rows."""
    out: dict[str, Any] = {}
    for task, result in results.items():
        for name, scores in result.baselines.items():
            out.update({f"{task}.baseline.{name}.{k}": float(v) for k, v in scores.items()})
        if result.data_split.get("origin") == "dev_split":
            out[f"{task}.dev_split"] = 1.0
    return out
