"""The value of pretraining, per task: our pretrained model, a reference checkpoint and random init.

The reference checkpoint (``finetune.reference.source``, :mod:`bert_core.finetune.reference`) is fine-tuned
with the same grid, seeds and data as ours; random init is the same architecture trained from scratch
(``random_init_baseline``). The published scores of the same size come from
:mod:`bert_core.evaluate.references` (the one place for them). When no reference checkpoint ran, the
report says why (not configured, or not on local disk) instead of showing an empty column.
"""

from __future__ import annotations

import math

from bert_core.evaluate.summary import EvaluationSummary, Row

REFERENCE_STATUS_KEY = "reference_checkpoint"  # = bert_core.finetune.reference.STATUS_KEY
REFERENCE_LABEL_KEY = "reference_label"  # = bert_core.finetune.reference.LABEL_KEY


def reference_score(summary: EvaluationSummary, row: Row) -> float | None:
    """The reference checkpoint's best dev score on ``row``'s metric (the main dev split only)."""
    result = summary.results.get(row.task)
    best = result.selected_reference if result is not None and row.name == row.task else None
    value = best.dev.get(row.metric) if best is not None else None
    return float(value) if value is not None and math.isfinite(float(value)) else None


def reference_notes(summary: EvaluationSummary) -> list[str]:
    """One sentence per distinct reference status the tasks recorded (what ran, or why nothing did)."""
    notes = {
        str(r.model[REFERENCE_STATUS_KEY])
        for r in summary.results.values()
        if r.model.get(REFERENCE_STATUS_KEY)
    }
    if not notes:
        return ["No reference checkpoint ran (no task sets reference_baseline: true)."]
    return [f"{n[:1].upper()}{n[1:]}." for n in sorted(notes)]  # each note names the reference checkpoint


def reference_label(summary: EvaluationSummary) -> str | None:
    """The reference column's name (``finetune.reference.label``) when every task that ran it agrees."""
    labels = {
        str(r.model[REFERENCE_LABEL_KEY])
        for r in summary.results.values()
        if r.model.get(REFERENCE_LABEL_KEY)
    }
    return labels.pop() if len(labels) == 1 else None


def value_metrics(summary: EvaluationSummary) -> dict[str, float]:
    """``reference_ckpt.<row>.<metric>`` and ``gap_reference.<row>`` (ours minus the reference checkpoint)."""
    out: dict[str, float] = {}
    for row in summary.rows:
        ref = reference_score(summary, row)
        if ref is not None:
            out[f"reference_ckpt.{row.name}.{row.metric}"] = ref
            out[f"gap_reference.{row.name}"] = row.ours - ref
    return out


def _fmt(value: float | None) -> str:
    return "–" if value is None or not math.isfinite(value) else f"{value:.1f}"


def _signed(value: float | None) -> str:
    return "–" if value is None or not math.isfinite(value) else f"{value:+.1f}"


def value_table(summary: EvaluationSummary) -> tuple[str, list[str], list[list[str]]]:
    """(title, header, rows) of the value-of-pretraining table, one row per task."""
    published = summary.reference.model if summary.reference else "none for this size"
    label = reference_label(summary)
    header = [
        "task",
        "metric",
        "train examples",
        "ours (pretrained)",
        f"reference ckpt ({label})" if label else "reference ckpt",
        "ours − reference",
        "random init",
        "ours − random",
        f"published ({published})",
    ]
    rows = []
    for row in (r for r in summary.rows if r.split != "test"):  # the columns compare dev scores
        ref = reference_score(summary, row)
        result = summary.results.get(row.task)
        examples = str(result.selected.train_examples) if result is not None else "–"
        rows.append(
            [
                row.name,
                row.metric,
                examples,
                _fmt(row.ours),
                _fmt(ref),
                _signed(row.ours - ref if ref is not None else None),
                _fmt(row.random_init),
                _signed(row.gap),
                _fmt(row.reference),
            ]
        )
    title = (
        "Value of pretraining: ours vs. a reference checkpoint vs. random init (dev; same protocol; "
        "train examples: the rows trained on, after the profile's train_limit cap)"
    )
    return title, header, rows
