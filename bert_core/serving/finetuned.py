"""Registering a fine-tuned model: an MLflow Model of its task, with a card that names its runs.

The stage's own model directory (a DVC output) keeps its run-free, deterministic card; the registered copy
gets a card naming the pipeline run, the MLflow run and the registered name
(:func:`bert_core.modelcard.staged_with_card`). The registration itself is :func:`bert_core.tracking.register`:
the alias moves only on a better dev score.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from bert_core import modelcard
from bert_core.constants import DVC_LOCK
from bert_core.evaluate.references import reference_for
from bert_core.serving import mlflow_model, serving_task
from bert_core.tracking import Registration, git_commit, pipeline_run_id, register


def finetuned_card(spec: Any, settings: Any, result: Any, metrics: Mapping[str, float], name: str):
    """The card of a fine-tuned model: ``card(run_ids=None) -> str``."""
    commit = git_commit()

    def card(run_ids: Mapping[str, str] | None = None) -> str:
        return modelcard.finetuned_card_for(
            spec,
            metrics,
            result.model,
            params=settings.model_dump(mode="json"),
            git_commit=commit,
            lock_path=DVC_LOCK,
            reference=reference_for(result.model.get("preset")),
            run_ids=run_ids,
            name=name,
            data_label=result.data_split.get("label") or None,
        )

    return card


def register_finetuned(
    model_dir: str | Path,
    *,
    spec: Any,
    settings: Any,
    registry: Any,
    metrics: Mapping[str, float],
    run_id: str,
    experiment: str,
    tags: Mapping[str, str],
    card: Callable[..., str],
) -> Registration:
    """Register a fine-tuned model as a new version of ``<registry.name_prefix><task>``; the alias
    (``registry.alias``) moves only on a better dev score (the task's headline metric)."""
    name = f"{registry.name_prefix}{spec.name}"
    run_ids = {
        "pipeline_run_id": pipeline_run_id(),
        "mlflow_run_id": run_id,
        "mlflow_experiment": experiment,
        "registered_model": name,
    }
    with modelcard.staged_with_card(model_dir, card(run_ids)) as staged:
        return register(
            staged,
            name=name,
            run_id=run_id,
            alias=registry.alias,
            description=f"Fine-tuned BERT for {name}; alias '{registry.alias}' = best on dev",
            tags=dict(tags),
            metric_key=f"dev.{spec.main_metric}",
            value=metrics.get(f"dev.{spec.main_metric}", float("nan")),  # NaN: undefined correlation
            save_model=mlflow_model(
                serving_task(spec, settings, null_threshold=metrics.get("dev.null_threshold"))
            ),
        )
