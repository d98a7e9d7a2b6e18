"""The ``evaluate`` stage: one summary of every fine-tuned task, as DVC metrics and a report with plots.

Reads each task's ``summary.json`` (written by :func:`bert_core.finetune.run.finetune_task`) and writes:

- a flat metrics dict (``metrics/evaluate.json``): ``<row>.<metric>`` for every dev metric of every task
  (rows are task names; MNLI's mismatched dev set is the row ``mnli_mm``), ``<row>.<main>_std`` over
  seeds, ``glue.average`` (the paper's average, WNLI excluded, over the GLUE rows present) with
  ``glue.reference_average`` on the same rows for the same model size, ``random_init.<row>`` /
  ``gap.<row>`` where the random-init baseline ran, ``gap.mean``, and ``glue.random_init_average`` with
  ``gap.glue_average`` (fine-tuned minus random init, on the GLUE rows the baseline ran on);
- ``evaluate.md`` and a self-contained ``evaluate.html`` (PNG plots embedded) with a per-task chart next
  to the published numbers of the same model size (:mod:`bert_core.finetune.references`), the
  pretrained-vs-random-init gap, the learning-rate/seed grid and the learning curves.
"""

from __future__ import annotations

import base64
import html
import io
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bert_core.atomic import atomic_path, write_json_atomic
from bert_core.finetune.references import (
    GLUE_AVERAGE_ROWS,
    HEADLINE,
    Reference,
    glue_average,
    reference_for,
)
from bert_core.finetune.results import FinetuneResult

SUMMARY_NAME = "summary.json"


@dataclass
class Row:
    """One line of the comparison: a task (or MNLI's mismatched half) and its headline metric."""

    name: str
    task: str
    metric: str
    ours: float
    ours_std: float = 0.0
    seeds: int = 1
    random_init: float | None = None
    reference: float | None = None
    reference_split: str | None = None
    all_metrics: dict[str, float] = field(default_factory=dict)

    @property
    def gap(self) -> float | None:
        return None if self.random_init is None else self.ours - self.random_init


@dataclass
class EvaluationSummary:
    """Everything the report shows."""

    results: dict[str, FinetuneResult]
    rows: list[Row]
    preset: str | None
    reference: Reference | None

    def glue(self) -> dict[str, Any]:
        ours, rows = glue_average({r.name: r.ours for r in self.rows})
        ref, ref_rows = (None, [])
        if self.reference is not None and rows:
            scores = {r: self.reference.scores.get(r, {}).get(HEADLINE[r]) for r in rows}
            if all(v is not None for v in scores.values()):
                ref, ref_rows = glue_average(scores)
        random_rows = {r.name: r.random_init for r in self.rows if r.random_init is not None}
        rnd, rnd_rows = glue_average(random_rows)
        # the fine-tuned average on exactly the rows the random-init baseline has: the like-for-like gap
        ours_on_rnd, _ = glue_average({r.name: r.ours for r in self.rows if r.name in rnd_rows})
        return {"average": ours, "rows": rows, "reference_average": ref, "reference_rows": ref_rows,
                "random_init_average": rnd, "random_init_rows": rnd_rows,
                "pretrained_on_random_rows": ours_on_rnd}  # fmt: skip

    def metrics(self) -> dict[str, float]:
        """The flat DVC metrics (see the module docstring)."""
        out: dict[str, float] = {}
        for row in self.rows:
            for k, v in row.all_metrics.items():
                out[f"{row.name}.{k}"] = v
            if row.seeds > 1:
                out[f"{row.name}.{row.metric}_std"] = row.ours_std
            if row.random_init is not None:
                out[f"random_init.{row.name}.{row.metric}"] = row.random_init
                out[f"gap.{row.name}.{row.metric}"] = row.gap  # type: ignore[assignment]
        gaps = [r.gap for r in self.rows if r.gap is not None]
        if gaps:
            out["gap.mean"] = sum(gaps) / len(gaps)
        glue = self.glue()
        if glue["average"] is not None:
            out["glue.average"] = glue["average"]
            out["glue.tasks"] = float(len(glue["rows"]))
        if glue["reference_average"] is not None:
            out["glue.reference_average"] = glue["reference_average"]
        if glue["random_init_average"] is not None:
            out["glue.random_init_average"] = glue["random_init_average"]
            out["gap.glue_average"] = glue["pretrained_on_random_rows"] - glue["random_init_average"]
        out["tasks"] = float(len(self.results))
        return {k: float(v) for k, v in out.items() if v is not None and math.isfinite(float(v))}


def load_results(results_dir: str | Path, tasks: list[str] | None = None) -> dict[str, FinetuneResult]:
    """The ``<task>/summary.json`` files under ``results_dir``, by task name (sorted).

    Args:
        results_dir: The finetune stages' results directory.
        tasks: Only these tasks (each must have a summary); ``None`` = every summary found.

    Raises:
        FileNotFoundError: no summaries, or a listed task without one (naming the stage to run).
        ValueError: a summary that cannot be read (naming the file).
    """
    results_dir = Path(results_dir)
    if not results_dir.is_dir():
        raise FileNotFoundError(
            f"{results_dir} does not exist: run the finetune stages first (dvc repro finetune)"
        )
    if tasks is not None:
        missing = [t for t in tasks if not (results_dir / t / SUMMARY_NAME).is_file()]
        if missing:
            stages = ", ".join(f"'dvc repro finetune@{t}'" for t in missing)
            raise FileNotFoundError(
                f"no {SUMMARY_NAME} under {results_dir} for task(s) {missing}: run {stages}"
            )
        paths = [results_dir / t / SUMMARY_NAME for t in sorted(tasks)]
    else:
        paths = sorted(results_dir.glob(f"*/{SUMMARY_NAME}"))
    found = {}
    for path in paths:
        result = FinetuneResult.load(path)
        found[result.task] = result
    if not found:
        raise FileNotFoundError(f"{results_dir} holds no */{SUMMARY_NAME}: run the finetune stages first")
    return found


def _rows_of(result: FinetuneResult, reference: Reference | None) -> list[Row]:
    best = result.selected
    baseline = result.selected_random
    _, std, n = result.seed_spread(best)
    splits = [("dev", result.task, best.dev, baseline.dev if baseline else None)]
    if result.task == "mnli" and "dev_mismatched" in best.other_splits:
        splits.append(("dev_mismatched", "mnli_mm", best.other_splits["dev_mismatched"], None))
    rows = []
    for split, name, metrics, random_metrics in splits:
        metric = HEADLINE.get(name, result.main_metric)
        if metric not in metrics:
            metric = result.main_metric
        ref = reference.scores.get(name, {}).get(metric) if reference else None
        rows.append(
            Row(
                name=name,
                task=result.task,
                metric=metric,
                ours=float(metrics.get(metric, math.nan)),
                ours_std=std if split == "dev" else 0.0,
                seeds=n if split == "dev" else 1,
                random_init=float(random_metrics[metric])
                if random_metrics and metric in random_metrics
                else None,
                reference=ref,
                reference_split=reference.splits.get(name) if reference and ref is not None else None,
                all_metrics={k: float(v) for k, v in metrics.items()},
            )
        )
    return rows


def summarize(
    results_dir: str | Path, *, tasks: list[str] | None = None, reference_size: str = "auto"
) -> EvaluationSummary:
    """Collect the tasks' results and match them with the published scores of the same model size.

    Args:
        results_dir: Directory of ``<task>/summary.json`` files.
        tasks: Only these tasks (``None``: all found).
        reference_size: ``auto`` (the size of the pretrained model), a preset name, or ``none``.
    """
    results = load_results(results_dir, tasks)
    presets = {r.model.get("preset") for r in results.values()}
    preset = next(iter(presets)) if len(presets) == 1 else None
    if reference_size == "none":
        reference = None
    elif reference_size == "auto":
        reference = reference_for(preset)
    else:
        reference = reference_for(reference_size)
        if reference is None:
            raise ValueError(
                f"no published scores for size {reference_size!r}; use auto, none, or a preset name"
            )
        preset = reference_size
    rows = [row for result in results.values() for row in _rows_of(result, reference)]
    order = {
        name: i
        for i, name in enumerate((*GLUE_AVERAGE_ROWS, "wnli", "squad_v1", "squad_v2", "swag", "conll2003"))
    }
    rows.sort(key=lambda r: order.get(r.name, len(order)))
    return EvaluationSummary(results, rows, preset, reference)


# ====================================================================== plots
def _figure_png(fig: Any, dpi: int) -> bytes:
    """The figure as PNG bytes; closes it."""
    import matplotlib.pyplot as plt

    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=dpi, bbox_inches="tight")
    plt.close(fig)
    return buf.getvalue()


def _task_grid(summary: EvaluationSummary, width: float, height: float) -> tuple[Any, Any, list[Any]]:
    """A figure with one panel per task (at most 3 per row): ``(fig, axes, results)``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    tasks = list(summary.results.values())
    cols = min(3, len(tasks))
    nrows = math.ceil(len(tasks) / cols)
    fig, axes = plt.subplots(nrows, cols, figsize=(width * cols, height * nrows), squeeze=False)
    return fig, axes, tasks


def _grid_png(fig: Any, axes: Any, n_tasks: int, dpi: int) -> bytes:
    """Blank the unused panels, lay out, and render (see :func:`_task_grid`)."""
    for ax in list(axes.flat)[n_tasks:]:
        ax.axis("off")
    fig.tight_layout()
    return _figure_png(fig, dpi)


def plot_scores(summary: EvaluationSummary, dpi: int = 110) -> bytes:
    """Grouped bars per task: ours (mean ± std over seeds as error bar), random init, published."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = summary.rows
    fig, ax = plt.subplots(figsize=(max(6.0, 1.1 * len(rows) + 2), 4.2))
    x = list(range(len(rows)))
    width = 0.27
    ours = [r.ours if math.isfinite(r.ours) else 0.0 for r in rows]
    ax.bar([i - width for i in x], ours, width, yerr=[r.ours_std for r in rows], capsize=3,
           label="fine-tuned (dev)", color="#1f77b4")  # fmt: skip
    if any(r.random_init is not None for r in rows):
        ax.bar(x, [r.random_init or 0.0 for r in rows], width, label="random init (dev)", color="#ff7f0e")
    if any(r.reference is not None for r in rows):
        ref_label = f"published, {summary.reference.model}" if summary.reference else "published"
        ax.bar([i + width for i in x], [r.reference or 0.0 for r in rows], width, label=ref_label,
               color="#bbbbbb", hatch="//", edgecolor="#666666")  # fmt: skip
    labels = [
        f"{r.name}\n{r.metric}" + (f"\n(ref {r.reference_split})" if r.reference_split else "") for r in rows
    ]
    ax.set_xticks(x, labels, fontsize=8)
    ax.set_ylabel("score (0-100)")
    ax.axhline(0, color="black", linewidth=0.6)
    ax.set_title("Dev scores per task vs published scores for the same model size")
    ax.legend(fontsize=8, loc="best")
    return _figure_png(fig, dpi)


def plot_learning_curves(summary: EvaluationSummary, dpi: int = 110) -> bytes:
    """Per task: training loss of the selected trial (and the random-init one) and its dev metric."""
    fig, axes, tasks = _task_grid(summary, 4.6, 3.2)
    for ax, result in zip(axes.flat, tasks):
        for trial, style in ((result.selected, "-"), (result.selected_random, "--")):
            if trial is None or not trial.history:
                continue
            ax.plot([h["epoch"] for h in trial.history], [h["loss"] for h in trial.history], style, marker=".",
                    color="#1f77b4", label=f"train loss ({trial.init})")  # fmt: skip
        ax.set_xlabel("epoch")
        ax.set_ylabel("training loss", color="#1f77b4")
        ax2 = ax.twinx()
        for trial, style in ((result.selected, "o-"), (result.selected_random, "s--")):
            if trial is None or not trial.evals:
                continue
            ax2.plot([e["epoch"] for e in trial.evals], [e.get(result.main_metric, math.nan) for e in trial.evals],
                     style, color="#d62728", label=f"dev {result.main_metric} ({trial.init})")  # fmt: skip
        ax2.set_ylabel(f"dev {result.main_metric}", color="#d62728")
        ax.set_title(
            f"{result.task}: lr {result.selected.learning_rate:g}, seed {result.selected.seed}", fontsize=9
        )
        handles = ax.get_legend_handles_labels()[0] + ax2.get_legend_handles_labels()[0]
        if handles:
            ax.legend(handles, [h.get_label() for h in handles], fontsize=7, loc="best")
    return _grid_png(fig, axes, len(tasks), dpi)


def plot_trials(summary: EvaluationSummary, dpi: int = 110) -> bytes:
    """Per task: the dev main metric of every trial against its learning rate (one dot per seed)."""
    fig, axes, tasks = _task_grid(summary, 4.2, 2.8)
    for ax, result in zip(axes.flat, tasks):
        for init, marker, color in (("pretrained", "o", "#1f77b4"), ("random", "s", "#ff7f0e")):
            trials = [t for t in result.trials if t.init == init]
            if trials:
                ax.scatter([t.learning_rate for t in trials], [t.dev.get(result.main_metric, math.nan) for t in trials],
                           marker=marker, color=color, label=init, alpha=0.8)  # fmt: skip
        ax.set_xscale("log")
        ax.set_xlabel("learning rate")
        ax.set_ylabel(f"dev {result.main_metric}")
        ax.set_title(result.task, fontsize=9)
        ax.legend(fontsize=7)
    return _grid_png(fig, axes, len(tasks), dpi)


# ====================================================================== report
def _fmt(value: float | None, digits: int = 1) -> str:
    return "–" if value is None or not math.isfinite(value) else f"{value:.{digits}f}"


def _tables(summary: EvaluationSummary) -> list[tuple[str, list[str], list[list[str]]]]:
    """(title, header, rows) of every table in the report."""
    glue = summary.glue()
    ref_name = summary.reference.model if summary.reference else "none for this size"
    main = [
        [r.name, r.metric, _fmt(r.ours) + (f" ± {_fmt(r.ours_std)} ({r.seeds} seeds)" if r.seeds > 1 else ""),
         _fmt(r.random_init), _fmt(r.gap), _fmt(r.reference) + (f" ({r.reference_split})" if r.reference_split else "")]
        for r in summary.rows
    ]  # fmt: skip
    header = ["task", "metric", "fine-tuned (dev)", "random init (dev)", "gap", f"published ({ref_name})"]
    avg = [
        ["GLUE average (fine-tuned)", _fmt(glue["average"]), ", ".join(glue["rows"]) or "–"],
        ["GLUE average (published, same rows)", _fmt(glue["reference_average"]), ", ".join(glue["reference_rows"]) or "–"],
        ["GLUE average (random init)", _fmt(glue["random_init_average"]), ", ".join(glue["random_init_rows"]) or "–"],
        ["GLUE average (fine-tuned, random-init rows)", _fmt(glue["pretrained_on_random_rows"]),
         ", ".join(glue["random_init_rows"]) or "–"],
    ]  # fmt: skip
    details = []
    for result in summary.results.values():
        best = result.selected
        details.append([
            result.task, f"{best.learning_rate:g}", str(best.seed), str(len(result.trials)),
            ", ".join(f"{k} {_fmt(v, 2)}" for k, v in sorted(best.dev.items())),
            _fmt(best.examples_per_second, 0),
        ])  # fmt: skip
    return [
        ("Per-task dev scores", header, main),
        ("GLUE average (WNLI excluded, MNLI-m and -mm counted separately, as the BERT paper)",
         ["", "score", "rows"], avg),
        ("Selected trials", ["task", "lr", "seed", "trials", "dev metrics", "train ex/s"], details),
    ]  # fmt: skip


def _markdown_table(header: list[str], rows: list[list[str]]) -> str:
    esc = [[c.replace("|", "\\|") for c in row] for row in rows]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(row) + " |" for row in esc]
    return "\n".join(lines)


def _intro(summary: EvaluationSummary) -> str:
    models = {r.model.get("source", "?") for r in summary.results.values()}
    size = summary.preset or "custom"
    return (
        f"Fine-tuned from {', '.join(sorted(models))} (size: {size}). Our scores are on the *dev* sets (the "
        "selected learning rate and seed, as the BERT paper selects on dev); published GLUE scores are "
        "mostly *test* scores, so the comparison is indicative. Spread: mean ± std over the seeds of the "
        "selected learning rate."
    )


def render_report(
    summary: EvaluationSummary, out_md: Path, out_html: Path, *, dpi: int = 110
) -> dict[str, Path]:
    """Write the Markdown report (+ its PNGs in ``<out_md stem>/``) and the self-contained HTML report."""
    plots = {
        "scores": ("Dev scores vs published scores", plot_scores(summary, dpi)),
        "trials": ("Learning-rate grid and seeds", plot_trials(summary, dpi)),
        "learning_curves": ("Learning curves of the selected trials", plot_learning_curves(summary, dpi)),
    }
    tables = _tables(summary)
    title = "Fine-tuning evaluation"
    plot_dir = out_md.parent / out_md.stem
    paths: dict[str, Path] = {}
    with atomic_path(plot_dir, is_dir=True) as tmp_dir:
        for name, (_, png) in plots.items():
            (tmp_dir / f"{name}.png").write_bytes(png)
    for name in plots:
        paths[f"plot.{name}"] = plot_dir / f"{name}.png"

    md = [f"# {title}", "", _intro(summary), ""]
    for heading, header, rows in tables:
        md += [f"## {heading}", "", _markdown_table(header, rows), ""]
    for name, (caption, _) in plots.items():
        md += [f"## {caption}", "", f"![{caption}]({plot_dir.name}/{name}.png)", ""]
    with atomic_path(out_md) as tmp:
        tmp.write_text("\n".join(md), encoding="utf-8")
    paths["markdown"] = out_md

    parts = [
        "<!DOCTYPE html><html><head><meta charset='utf-8'>",
        f"<title>{html.escape(title)}</title><style>body{{font-family:sans-serif;max-width:1100px;margin:auto}}"
        "table{border-collapse:collapse;margin:8px 0}td,th{border:1px solid #ccc;padding:3px 8px;font-size:13px}"
        "th{background:#f2f2f2}img{max-width:100%}</style></head><body>",
        f"<h1>{html.escape(title)}</h1><p>{html.escape(_intro(summary))}</p>",
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
    with atomic_path(out_html) as tmp:
        tmp.write_text("\n".join(parts), encoding="utf-8")
    paths["html"] = out_html
    return paths


def evaluate_results(
    results_dir: str | Path,
    metrics_path: str | Path,
    report_dir: str | Path,
    *,
    tasks: list[str] | None = None,
    reference_size: str = "auto",
    dpi: int = 110,
) -> tuple[dict[str, float], dict[str, Path]]:
    """The ``evaluate`` stage function: summary metrics JSON + Markdown/HTML report with plots.

    Args:
        results_dir: ``results/finetune`` (one ``<task>/summary.json`` per task).
        metrics_path: The DVC metrics file to write (``metrics/evaluate.json``).
        report_dir: Where ``evaluate.md``, ``evaluate.html`` and ``evaluate/*.png`` go (``reports``).
        tasks: Only these tasks (the finetune stages of the pipeline); ``None``: every summary found.
        reference_size: ``auto`` (the pretrained model's size), a preset name, or ``none``.
        dpi: Plot resolution.

    Returns:
        ``(metrics, written paths)``.
    """
    summary = summarize(results_dir, tasks=tasks, reference_size=reference_size)
    report_dir = Path(report_dir)
    paths = render_report(summary, report_dir / "evaluate.md", report_dir / "evaluate.html", dpi=dpi)
    metrics = summary.metrics()
    paths["metrics"] = write_json_atomic(metrics_path, metrics)
    return metrics, paths
