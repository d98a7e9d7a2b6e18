"""The ``evaluate`` report's plots, as PNG bytes: scores vs published, learning-rate grid, learning curves."""

from __future__ import annotations

import io
import math
from typing import Any

from bert_core.evaluate.datanotes import axis_label, best_baseline
from bert_core.evaluate.summary import EvaluationSummary, Row


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
    """Grouped bars per task: ours (mean ± std over seeds as error bar), random init, the best trivial
    baseline on the same rows, published."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = summary.rows
    fig, ax = plt.subplots(figsize=(max(6.0, 1.1 * len(rows) + 2), 4.2))
    x = list(range(len(rows)))
    ours = [r.ours if math.isfinite(r.ours) else 0.0 for r in rows]
    baselines = [_best_baseline(summary, r) for r in rows]
    ours_style = dict(yerr=[r.ours_std for r in rows], capsize=3, label="fine-tuned", color="#1f77b4")
    series: list[tuple[list[float], dict[str, Any]]] = [(ours, ours_style)]
    if any(r.random_init is not None for r in rows):
        series.append(
            ([r.random_init or 0.0 for r in rows], {"label": "random init (dev)", "color": "#ff7f0e"})
        )
    if any(b is not None for b in baselines):
        series.append(([b or 0.0 for b in baselines], {"label": "best trivial baseline", "color": "#2ca02c"}))
    if any(r.reference is not None for r in rows):
        ref_label = f"published, {summary.reference.model}" if summary.reference else "published"
        style = {"color": "#bbbbbb", "hatch": "//", "edgecolor": "#666666"}
        series.append(([r.reference or 0.0 for r in rows], {"label": ref_label, **style}))
    width = 0.8 / len(series)
    for k, (values, style) in enumerate(series):
        ax.bar([i + (k - (len(series) - 1) / 2) * width for i in x], values, width, **style)
    labels = []
    for r in rows:
        data = axis_label(summary.results, r.task, r.split)  # rows other than the official splits', named
        ref = f"ref {r.reference_split}" if r.reference_split else ""
        labels.append("\n".join([r.name, r.metric, *[f"({x})" for x in (data, ref) if x]]))
    ax.set_xticks(x, labels, fontsize=8)
    ax.set_ylabel("score (0-100)")
    ax.axhline(0, color="black", linewidth=0.6)
    ax.set_title("Scores per task vs trivial baselines and published scores (same model size)")
    ax.legend(fontsize=8, loc="best")
    return _figure_png(fig, dpi)


def plot_learning_curves(summary: EvaluationSummary, dpi: int = 110) -> bytes:
    """Per task: training loss of the selected trial (and the random-init one) and its dev metric."""
    fig, axes, tasks = _task_grid(summary, 4.6, 3.2)
    for ax, result in zip(axes.flat, tasks):
        for trial, style in ((result.selected, "-"), (result.selected_random, "--")):
            if trial is None or not trial.history:
                continue
            ax.plot(
                [h["epoch"] for h in trial.history],
                [h["loss"] for h in trial.history],
                style,
                marker=".",
                color="#1f77b4",
                label=f"train loss ({trial.init})",
            )
        ax.set_xlabel("epoch")
        ax.set_ylabel("training loss", color="#1f77b4")
        ax2 = ax.twinx()
        for trial, style in ((result.selected, "o-"), (result.selected_random, "s--")):
            if trial is None or not trial.evals:
                continue
            ax2.plot(
                [e["epoch"] for e in trial.evals],
                [e.get(result.main_metric, math.nan) for e in trial.evals],
                style,
                color="#d62728",
                label=f"dev {result.main_metric} ({trial.init})",
            )
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
        for init, marker, color in (
            ("pretrained", "o", "#1f77b4"),
            ("random", "s", "#ff7f0e"),
            ("reference", "^", "#2ca02c"),
        ):
            trials = [t for t in result.trials if t.init == init]
            if trials:
                ax.scatter(
                    [t.learning_rate for t in trials],
                    [t.dev.get(result.main_metric, math.nan) for t in trials],
                    marker=marker,
                    color=color,
                    label=init,
                    alpha=0.8,
                )
        ax.set_xscale("log")
        ax.set_xlabel("learning rate")
        ax.set_ylabel(f"dev {result.main_metric}")
        ax.set_title(result.task, fontsize=9)
        ax.legend(fontsize=7)
    return _grid_png(fig, axes, len(tasks), dpi)


def _best_baseline(summary: EvaluationSummary, row: Row) -> float | None:
    """The best trivial baseline's score on ``row``'s rows and metric (the task's main metric)."""
    result = summary.results.get(row.task)
    if result is None or result.main_metric != row.metric:
        return None
    best = best_baseline(result, row.split)
    return None if best is None else best[1]
