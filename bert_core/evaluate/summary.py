"""What the ``evaluate`` stage summarises: each task's ``summary.json`` (written by
:func:`bert_core.finetune.run.finetune_task`, contract :class:`~bert_core.finetune.results.FinetuneResult`)
as chart rows next to the published scores of the same model size, and the flat DVC metrics.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bert_core.evaluate.crosscheck import SummaryCheckError, check_lock, check_provenance, check_summary
from bert_core.evaluate.datanotes import baseline_metrics
from bert_core.evaluate.references import (
    GLUE_AVERAGE_ROWS,
    Reference,
    glue_average,
    headline_metric,
    reference_for,
    split_row,
)
from bert_core.finetune.results import FinetuneResult

SUMMARY_NAME = "summary.json"


@dataclass
class Row:
    """One line of the comparison: a task's main dev split (``name`` = the task), or a further evaluated split
    (``mnli_mm``, ``conll2003_test``: :func:`~bert_core.evaluate.references.split_row`), and its headline
    metric."""

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
    split: str = "dev"

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
    selection: str = ""

    def glue(self) -> dict[str, Any]:
        ours, rows = glue_average({r.name: r.ours for r in self.rows})
        ref, ref_rows = (None, [])
        if self.reference is not None and rows:
            scores = {r: self.reference.scores.get(r, {}).get(headline_metric(r, "")) for r in rows}
            if all(v is not None for v in scores.values()):
                ref, ref_rows = glue_average(scores)
        random_rows = {r.name: r.random_init for r in self.rows if r.random_init is not None}
        rnd, rnd_rows = glue_average(random_rows)
        # the fine-tuned average on exactly the rows the random-init baseline has: the like-for-like gap
        ours_on_rnd, _ = glue_average({r.name: r.ours for r in self.rows if r.name in rnd_rows})
        return {
            "average": ours,
            "rows": rows,
            "reference_average": ref,
            "reference_rows": ref_rows,
            "random_init_average": rnd,
            "random_init_rows": rnd_rows,
            "pretrained_on_random_rows": ours_on_rnd,
        }

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
        out.update(baseline_metrics(self.results))
        return {k: float(v) for k, v in out.items() if v is not None and math.isfinite(float(v))}


def summary_paths(results_dir: str | Path, tasks: list[str] | None = None) -> dict[str, Path]:
    """The ``<task>/summary.json`` under ``results_dir`` of each of ``tasks`` (``None``: of every task found),
    by task name, sorted; ``FileNotFoundError`` naming the finetune stages to run when one is missing or
    there are none."""
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
                f"no {SUMMARY_NAME} under {results_dir} for configured task(s) {missing} (finetune.tasks): "
                f"run {stages}"
            )
        names = sorted(tasks)
    else:
        names = sorted(p.parent.name for p in results_dir.glob(f"*/{SUMMARY_NAME}"))
    if not names:
        raise FileNotFoundError(f"{results_dir} holds no */{SUMMARY_NAME}: run the finetune stages first")
    return {name: results_dir / name / SUMMARY_NAME for name in names}


def load_results(
    results_dir: str | Path,
    tasks: list[str] | None = None,
    *,
    own_tasks: Mapping[str, Any] | None = None,
    lock_path: str | Path | None = None,
) -> dict[str, FinetuneResult]:
    """The ``<task>/summary.json`` files under ``results_dir``, by task name (sorted), cross-checked.

    Each summary must be the one of its directory's task, with the registry's kind and main metric, and all
    of them must come from the same pretrained model, and be what ``dvc.lock`` recorded for their finetune
    stage (:mod:`bert_core.evaluate.crosscheck`).

    Args:
        results_dir: The finetune stages' results directory.
        tasks: Only these tasks (each must have a summary); ``None`` = every summary found.
        own_tasks: The own tasks' definitions by name (their ``kind`` and ``main_metric`` stand for the
            registry's).
        lock_path: ``dvc.lock`` to compare each task's results directory with (``None``: no comparison).

    Raises:
        FileNotFoundError: no summaries, or a listed task without one (naming the stage to run).
        SummaryCheckError: (a ``ValueError``) summaries that cannot be read or do not belong where they
            lie, each named with the stage to re-run.
    """
    problems: list[str] = []
    checked: dict[str, tuple[Path, FinetuneResult]] = {}
    for name, path in summary_paths(results_dir, tasks).items():
        try:
            result = FinetuneResult.load(path)
        except ValueError as err:
            problems.append(f"{err} (`dvc repro finetune@{name}`)")
            continue
        problem = check_summary(path, name, result, own_tasks)
        if problem is not None:
            problems.append(problem)
        else:
            checked[name] = (path, result)
    problems += check_provenance(checked)
    problems += check_lock(lock_path, checked)
    if problems:
        raise SummaryCheckError(problems)
    return {name: result for name, (_, result) in checked.items()}


def _rows_of(result: FinetuneResult, reference: Reference | None) -> list[Row]:
    best = result.selected
    baseline = result.selected_random
    _, std, n = result.seed_spread(best)
    splits = [("dev", result.task, best.dev, baseline.dev if baseline else None)]
    for split, metrics in best.other_splits.items():  # scored once, by the selected model
        splits.append((split, split_row(result.task, split), metrics, None))
    rows = []
    for split, name, metrics, random_metrics in splits:
        metric = headline_metric(name, result.main_metric)
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
                split=split,
            )
        )
    return rows


def summarize(
    results_dir: str | Path,
    *,
    tasks: list[str] | None = None,
    own_tasks: Mapping[str, Any] | None = None,
    reference_size: str = "auto",
    lock_path: str | Path | None = None,
) -> EvaluationSummary:
    """Collect the tasks' results and match them with the published scores of the same model size.

    Args:
        results_dir: Directory of ``<task>/summary.json`` files.
        tasks: Only these tasks (``None``: all found).
        own_tasks: The own tasks' definitions by name (:func:`load_results`).
        reference_size: ``auto`` (the size of the pretrained model), a preset name, or ``none``.
        lock_path: ``dvc.lock`` to cross-check the results with (:func:`load_results`).
    """
    results = load_results(results_dir, tasks, own_tasks=own_tasks, lock_path=lock_path)
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
        for i, name in enumerate(
            (*GLUE_AVERAGE_ROWS, "wnli", "squad_v1", "squad_v2", "swag", "conll2003", "conll2003_test")
        )
    }
    rows.sort(key=lambda r: order.get(r.name, len(order)))
    selection = (
        f"the tasks of finetune.tasks ({', '.join(sorted(tasks))})"
        if tasks is not None
        else f"every summary found under {results_dir} ({', '.join(results)}; finetune.tasks lists none)"
    )
    return EvaluationSummary(results, rows, preset, reference, selection)
