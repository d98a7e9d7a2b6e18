"""The ``evaluate`` stage: one summary of every fine-tuned task, as DVC metrics and a report with plots.

Reads each task's ``summary.json`` (written by :func:`bert_core.finetune.run.finetune_task`) and writes:

- a flat metrics dict (``metrics_path``; in the pipeline the stage runner keeps the headline of it in
  ``metrics/evaluate.json``, the rows' scores first (:func:`score_keys`), and all of it in
  ``metrics/details/evaluate.json``): ``<row>.<metric>`` for every dev metric of every task
  (rows are task names; MNLI's mismatched dev set is the row ``mnli_mm``, a labelled test set
  ``<task>_test``), ``<row>.<main>_std`` over
  seeds, ``glue.average`` (the paper's average, WNLI excluded, over the GLUE rows present) with
  ``glue.reference_average`` on the same rows for the same model size, ``random_init.<row>`` /
  ``gap.<row>`` where the random-init baseline ran, ``gap.mean``, and ``glue.random_init_average`` with
  ``gap.glue_average`` (fine-tuned minus random init, on the GLUE rows the baseline ran on), and the
  trivial baselines (``<row>.baseline.<name>.<metric>``, ``<row>.best_baseline.<main>``,
  ``<row>.beats_baseline``, ``baseline.tasks_compared`` / ``baseline.tasks_beating``:
  :mod:`bert_core.evaluate.datanotes`);
- ``evaluate.md`` and a self-contained ``evaluate.html`` (PNG plots embedded) with a per-task chart next
  to the published numbers of the same model size (:mod:`bert_core.evaluate.references`), the
  pretrained-vs-random-init gap, each task's best trivial baseline (every fine-tuned score not above it
  marked, and one line saying how many tasks beat theirs), the learning-rate/seed grid and the learning
  curves.
"""

from __future__ import annotations

import base64
import contextlib
import html
import math
from collections.abc import Mapping
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

from tabulate import tabulate

from bert_core.atomic import OutputSet, atomic_path, write_json_atomic
from bert_core.evaluate.datanotes import (
    NOT_ABOVE_BASELINE,
    baseline_table,
    baseline_verdict,
    beats_baseline,
    best_baseline,
    data_notes,
    task_label,
)
from bert_core.evaluate.plots import plot_learning_curves, plot_scores, plot_trials
from bert_core.evaluate.references import headline_metric
from bert_core.evaluate.summary import EvaluationSummary, Row, summarize
from bert_core.evaluate.value import reference_notes, value_metrics, value_table


def _fmt(value: float | None, digits: int = 1) -> str:
    return "–" if value is None or not math.isfinite(value) else f"{value:.{digits}f}"


def _ours_cell(summary: EvaluationSummary, row: Row) -> str:
    """The fine-tuned score (± spread), marked when it does not beat the best trivial baseline on the row's
    split."""
    cell = _fmt(row.ours) + (f" ± {_fmt(row.ours_std)} ({row.seeds} seeds)" if row.seeds > 1 else "")
    result = summary.results.get(row.task)
    if result is not None and beats_baseline(result, row.split) is False:
        cell += f" {NOT_ABOVE_BASELINE}"
    return cell


def _baseline_cell(summary: EvaluationSummary, row: Row) -> str:
    result = summary.results.get(row.task)
    best = best_baseline(result, row.split) if result is not None else None
    return "–" if best is None else f"{_fmt(best[1])} ({best[0]})"


def _tables(summary: EvaluationSummary) -> list[tuple[str, list[str], list[list[str]]]]:
    """(title, header, rows) of every table in the report."""
    glue = summary.glue()
    ref_name = summary.reference.model if summary.reference else "none for this size"
    main = [
        [
            task_label(summary.results, r.task, r.name, r.split),
            r.split,
            r.metric,
            _ours_cell(summary, r),
            _fmt(r.random_init),
            _fmt(r.gap),
            _fmt(r.reference) + (f" ({r.reference_split})" if r.reference_split else ""),
            _baseline_cell(summary, r),
        ]
        for r in summary.rows
    ]
    header = [
        "task",
        "split",
        "metric",
        "fine-tuned",
        "random init",
        "gap",
        f"published ({ref_name})",
        "best trivial baseline",
    ]
    avg = [
        ["GLUE average (fine-tuned)", _fmt(glue["average"]), ", ".join(glue["rows"]) or "–"],
        [
            "GLUE average (published, same rows)",
            _fmt(glue["reference_average"]),
            ", ".join(glue["reference_rows"]) or "–",
        ],
        [
            "GLUE average (random init)",
            _fmt(glue["random_init_average"]),
            ", ".join(glue["random_init_rows"]) or "–",
        ],
        [
            "GLUE average (fine-tuned, random-init rows)",
            _fmt(glue["pretrained_on_random_rows"]),
            ", ".join(glue["random_init_rows"]) or "–",
        ],
    ]
    details = []
    for result in summary.results.values():
        best = result.selected
        details.append(
            [
                result.task,
                f"{best.learning_rate:g}",
                str(best.seed),
                str(len(result.trials)),
                ", ".join(f"{k} {_fmt(v, 2)}" for k, v in sorted(best.dev.items())),
                _fmt(best.examples_per_second, 0),
            ]
        )
    baselines = baseline_table(summary.results)
    return [
        ("Per-task scores", header, main),
        value_table(summary),
        *([baselines] if baselines else []),
        (
            "GLUE average (WNLI excluded, MNLI-m and -mm counted separately, as the BERT paper)",
            ["", "score", "rows"],
            avg,
        ),
        ("Selected trials", ["task", "lr", "seed", "trials", "dev metrics", "train ex/s"], details),
    ]


def _markdown_table(header: list[str], rows: list[list[str]]) -> str:
    esc = [[c.replace("|", "\\|") for c in row] for row in rows]  # a "|" in a cell would end it
    return tabulate(esc, header, tablefmt="pipe", disable_numparse=True)


def _intro(summary: EvaluationSummary) -> str:
    models = {
        str(r.model.get("uri") or r.model.get("source", "?"))
        + (f" (fingerprint {r.model['sha']})" if r.model.get("sha") else "")
        for r in summary.results.values()
    }
    size = summary.preset or "custom"
    tasks = f"Tasks: {summary.selection}, each summary checked against its task and pretrained model. "
    return (
        (tasks if summary.selection else "")
        + f"Fine-tuned from {', '.join(sorted(models))} (size: {size}). Our scores are on the *dev* sets (the "
        "selected learning rate and seed, as the BERT paper selects on dev; a `<task>_test` row is a labelled test "
        "set, scored once by that model); published GLUE scores are "
        "mostly *test* scores, so the comparison is indicative. Spread: mean ± std over the seeds of the "
        "selected learning rate. " + " ".join(reference_notes(summary))
    )


def _written(final: Path, outputs: OutputSet | None, *, is_dir: bool = False) -> AbstractContextManager[Path]:
    """Where to write ``final``: its staged temporary in ``outputs`` (committed with the others), else an
    :func:`~bert_core.atomic.atomic_path` of its own."""
    if outputs is None:
        return atomic_path(final, is_dir=is_dir)
    staged = outputs[final]
    if is_dir:
        staged.mkdir(exist_ok=True)
    return contextlib.nullcontext(staged)


def render_report(
    summary: EvaluationSummary,
    out_md: Path,
    out_html: Path,
    *,
    dpi: int = 110,
    outputs: OutputSet | None = None,
) -> dict[str, Path]:
    """Write the Markdown report (+ its PNGs in ``<out_md stem>/``) and the self-contained HTML report.

    With ``outputs`` (:func:`bert_core.atomic.atomic_outputs` over the three), each is written to its
    staged temporary and committed by the caller with the stage's other outs; else each atomically.
    """
    plots = {
        "scores": ("Scores vs trivial baselines and published scores", plot_scores(summary, dpi)),
        "trials": ("Learning-rate grid and seeds", plot_trials(summary, dpi)),
        "learning_curves": ("Learning curves of the selected trials", plot_learning_curves(summary, dpi)),
    }
    tables = _tables(summary)
    title = "Fine-tuning evaluation"
    plot_dir = out_md.parent / out_md.stem
    paths: dict[str, Path] = {}
    with _written(plot_dir, outputs, is_dir=True) as tmp_dir:
        for name, (_, png) in plots.items():
            (tmp_dir / f"{name}.png").write_bytes(png)
    for name in plots:
        paths[f"plot.{name}"] = plot_dir / f"{name}.png"

    verdict = baseline_verdict(summary.results)
    notes = [*([verdict] if verdict else []), *data_notes(summary.results)]
    md = [f"# {title}", "", _intro(summary), "", *(f"- {n}" for n in notes), *([""] if notes else [])]
    for heading, header, rows in tables:
        md += [f"## {heading}", "", _markdown_table(header, rows), ""]
    for name, (caption, _) in plots.items():
        md += [f"## {caption}", "", f"![{caption}]({plot_dir.name}/{name}.png)", ""]
    with _written(out_md, outputs) as tmp:
        tmp.write_text("\n".join(md), encoding="utf-8")
    paths["markdown"] = out_md

    parts = [
        "<!DOCTYPE html><html><head><meta charset='utf-8'>",
        f"<title>{html.escape(title)}</title><style>body{{font-family:sans-serif;max-width:1100px;margin:auto}}"
        "table{border-collapse:collapse;margin:8px 0}td,th{border:1px solid #ccc;padding:3px 8px;font-size:13px}"
        "th{background:#f2f2f2}img{max-width:100%}</style></head><body>",
        f"<h1>{html.escape(title)}</h1><p>{html.escape(_intro(summary))}</p>",
        *([f"<ul>{''.join(f'<li>{html.escape(n)}</li>' for n in notes)}</ul>"] if notes else []),
    ]
    for heading, header, rows in tables:
        parts.append(f"<h2>{html.escape(heading)}</h2><table><tr>")
        parts.append("".join(f"<th>{html.escape(h)}</th>" for h in header) + "</tr>")
        for row in rows:
            parts.append("<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in row) + "</tr>")
        parts.append("</table>")
    for caption, png in plots.values():
        data = base64.b64encode(png).decode("ascii")
        parts.append(
            f"<h2>{html.escape(caption)}</h2><img alt='{html.escape(caption)}' src='data:image/png;base64,{data}'>"
        )
    parts.append("</body></html>")
    with _written(out_html, outputs) as tmp:
        tmp.write_text("\n".join(parts), encoding="utf-8")
    paths["html"] = out_html
    return paths


#: Key prefixes of the evaluate metrics that are not a chart row's scores.
_NOT_ROWS = frozenset({"glue", "gap", "gap_reference", "random_init", "reference_ckpt", "baseline", "tasks"})


def score_keys(metrics: dict[str, float], own_mains: Mapping[str, str] | None = None) -> list[str]:
    """The rows' task scores in :func:`evaluate_results`'s metrics, in row order, as headline patterns
    (:func:`flows._stage.headline`): ``<row>.<metric>`` with each row's headline metric
    (:func:`~bert_core.evaluate.references.headline_metric`; an own task's from ``own_mains``, its main
    metric by name, also for its ``<task>_test`` row), shown as ``<row>.dev_split.<metric>`` where
    the row trained and was scored on halves of the dev file, so that it is never read, or diffed, as an
    official dev score. They are the first columns of the DVC metrics file."""
    rows = dict.fromkeys(
        k.split(".", 1)[0] for k in metrics if "." in k and k.split(".", 1)[0] not in _NOT_ROWS
    )
    mains = own_mains or {}
    keys = []
    for row in rows:
        metric = headline_metric(row, mains.get(row) or mains.get(row.rpartition("_")[0], ""))
        if f"{row}.{metric}" in metrics:
            dev_split = f"{row}.dev_split" in metrics
            keys.append(f"{row}.dev_split.{metric}={row}.{metric}" if dev_split else f"{row}.{metric}")
    return keys


def evaluate_results(
    results_dir: str | Path,
    metrics_path: str | Path,
    report_dir: str | Path,
    *,
    tasks: list[str] | None = None,
    own_tasks: Mapping[str, Any] | None = None,
    reference_size: str = "auto",
    dpi: int = 110,
    lock_path: str | Path | None = None,
    outputs: OutputSet | None = None,
) -> tuple[dict[str, float], dict[str, Path]]:
    """The ``evaluate`` stage function: summary metrics JSON + Markdown/HTML report with plots.

    Args:
        results_dir: ``results/finetune`` (one ``<task>/summary.json`` per task).
        metrics_path: The DVC metrics file to write (``metrics/evaluate.json``).
        report_dir: Where ``evaluate.md``, ``evaluate.html`` and ``evaluate/*.png`` go (``reports``).
        tasks: Only these tasks (the finetune stages of the pipeline); ``None``: every summary found.
        own_tasks: The own tasks' definitions by name (:meth:`bert_core.finetune.FinetuneParams.own_tasks`).
        reference_size: ``auto`` (the pretrained model's size), a preset name, or ``none``.
        dpi: Plot resolution.
        lock_path: ``dvc.lock`` whose ``finetune@<task>`` outputs the results must match (``None``: not
            compared; see :mod:`bert_core.evaluate.crosscheck`).
        outputs: Write the metrics file and the reports into these staged temporaries (all four are
            then committed together by the caller: :func:`bert_core.atomic.atomic_outputs`); ``None``:
            each is written atomically on its own.

    Returns:
        ``(metrics, written paths)``.
    """
    summary = summarize(
        results_dir, tasks=tasks, own_tasks=own_tasks, reference_size=reference_size, lock_path=lock_path
    )
    # nothing is written before every check passed: a refused summary never leaves a partial report
    report_dir = Path(report_dir)
    paths = render_report(
        summary, report_dir / "evaluate.md", report_dir / "evaluate.html", dpi=dpi, outputs=outputs
    )
    metrics = {**summary.metrics(), **value_metrics(summary)}
    metrics_path = Path(metrics_path)
    write_json_atomic(outputs[metrics_path] if outputs is not None else metrics_path, metrics)
    paths["metrics"] = metrics_path
    return metrics, paths
