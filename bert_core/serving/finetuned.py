"""What the finetune stage hands on once trained: the model's card, learning curves, figures and registry entry.

:class:`FinetunedModel` writes the card and the curves into the stage's staged outputs, gives the stage's
figures (every metric, the best trivial baseline beside the score) and, after the commit, registers the
committed model directory.

The stage's own model directory (a DVC output) keeps its run-free, deterministic card; the registered copy
gets a card naming the pipeline run, the MLflow run and the registered name
(:func:`bert_core.modelcard.staged_with_card`). The registration itself is :func:`bert_core.tracking.register`:
the alias moves only on a better dev score.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bert_core import modelcard
from bert_core.constants import DVC_LOCK, REPO_ROOT
from bert_core.evaluate.references import reference_for, split_row
from bert_core.finetune.results import best_of_baselines
from bert_core.serving import mlflow_model, serving_task
from bert_core.tracking import Registration, git_commit, pipeline_run_id, register
from bert_core.tracking.provenance import FINETUNE_STAGES, dvc_lineage
from bert_core.tracking.trials import own_tags


@dataclass
class FinetunedModel:
    """A fine-tuning result on its way out of the stage.

    Args:
        spec: The task (:class:`bert_core.tasks.TaskSpec`).
        settings: The task's settings (:class:`bert_core.finetune.params.TaskSettings`).
        result: The stage's :class:`bert_core.finetune.results.FinetuneResult`.
        registry: ``finetune.registry`` (name prefix, alias, enabled).
    """

    spec: Any
    settings: Any
    result: Any
    registry: Any
    metrics: dict[str, float] = field(init=False)

    def __post_init__(self) -> None:
        self.metrics = self.result.metrics()
        self.card = finetuned_card(
            self.spec,
            self.settings,
            self.result,
            self.metrics,
            f"{self.registry.name_prefix}{self.spec.name}",
        )

    @property
    def details(self) -> dict[str, Any]:
        """Every figure of the stage: the metrics, the best trivial baseline on the main metric, its name."""
        from bert_core.evaluate.datanotes import best_baseline

        best = best_baseline(self.result)
        main = self.spec.main_metric
        return {**self.metrics, **({f"best_baseline.{main}": best[1]} if best else {}), "main_metric": main}

    def write(self, model_dir: Path, curves: Sequence[Path]) -> None:
        """The run-free card into ``model_dir`` (a DVC output) and the selected trial's learning curves to
        ``curves`` (train, dev), all staged paths."""
        from bert_core.modelcard import write_card

        write_card(model_dir, self.card())
        with tempfile.TemporaryDirectory(prefix="curves-", dir=Path(curves[0]).parent) as scratch:
            for curve, written in zip(curves, self.result.write_curves(scratch), strict=True):
                os.replace(written, curve)

    def register(self, model_dir: Path, run: Any, *, experiment: str) -> Registration:
        """Register the committed ``model_dir`` (tags: the stage run's own, and the selected trial), and record
        the outcome on ``run`` (a :class:`bert_core.tracking.run.StageRun`)."""
        from mlflow import MlflowClient

        registration = register_finetuned(
            model_dir,
            spec=self.spec,
            settings=self.settings,
            registry=self.registry,
            metrics=self.metrics,
            run_id=run.run_id,
            experiment=experiment,
            card=self.card,
            tags={
                **own_tags(MlflowClient().get_run(run.run_id)),
                "selected_trial": self.result.selected.name,
            },
            eval_set=self.result.data_split.get("eval_set", ""),
        )
        run.set_tags(registration.as_tags())
        run.log_metrics({"registry.alias_moved": float(registration.alias_moved)})
        return registration


def finetuned_card_for(
    spec: Any,
    metrics: Mapping[str, float],
    model_info: Mapping[str, Any],
    *,
    params: Mapping[str, Any] | None,
    git_commit: str,
    lock_path: str | os.PathLike[str] | None,
    run_ids: Mapping[str, str] | None = None,
    name: str | None = None,
    reference: Any = None,
    data_label: str | None = None,
    from_pipeline: bool = True,
    baselines: Mapping[str, Mapping[str, float]] | None = None,
    split_baselines: Mapping[str, Mapping[str, Mapping[str, float]]] | None = None,
) -> str:
    """:func:`bert_core.modelcard.finetuned_card` for a :class:`bert_core.tasks.TaskSpec` and a fine-tuning run's flat metrics.

    ``data_label`` names the evaluated rows when they are not the official dev split (a dev split: ``dev
    split: articles 25-48 of dev-v1.1, trained on 1-24``); the card's dev scores are then headed by it.

    ``model_info`` is the pretrained model's provenance (:func:`bert_core.finetune.run.model_info`:
    ``preset``, ``source``, and ``model``/``model_version`` when it is a registered version);
    ``from_pipeline``: the model started from the pretrain stage's output, so the upstream stages'
    ``dvc.lock`` entries are its lineage (not for a released checkpoint). ``baselines``: the result's trivial
    baselines (name -> metric -> score); ``split_baselines``: those of each further evaluated split.
    ``reference`` the published scores of its size
    (``bert_core.evaluate.references.reference_for(model_info["preset"])``).
    """
    preset = model_info.get("preset")
    preset = None if preset in (None, "custom") else str(preset)
    ref = reference
    published = dict(ref.scores.get(spec.name, {})) if ref else {}
    if model_info.get("model") and model_info.get("model_version"):
        base = f"{model_info['model']}/{model_info['model_version']}"
    else:
        base = str(model_info.get("source") or "") or None

    def on(split: str) -> dict[str, float]:
        prefix = f"{split}."
        return {
            k.removeprefix(prefix): v
            for k, v in metrics.items()
            if k.startswith(prefix) and k.count(".") == 1
        }

    def best(scores: Mapping[str, Mapping[str, float]] | None) -> dict[str, tuple[str, float]]:
        keys = dict.fromkeys(k for values in (scores or {}).values() for k in values)
        return {k: b for k in keys if (b := best_of_baselines(scores or {}, k)) is not None}

    dev = on("dev")
    others = [
        modelcard.SplitScores(
            split,
            on(split),
            best((split_baselines or {}).get(split)),
            dict(ref.scores.get(split_row(spec.name, split), {})) if ref else {},
        )
        for split in spec.dev_splits[1:]
        if on(split)
    ]
    stages = FINETUNE_STAGES if from_pipeline else ()
    return modelcard.finetuned_card(
        name=name or f"bert-{spec.name}",
        task=spec.name,
        kind=spec.kind,
        main_metric=spec.main_metric,
        dev_metrics=dev,
        dev_split=data_label or spec.dev_splits[0],
        datasets=[spec.hub_path] if getattr(spec, "hub_path", None) else [],
        hub_config=getattr(spec, "hub_config", None),
        preset=preset,
        published=published or None,
        published_model=ref.model if published and ref else None,
        published_split=ref.splits.get(spec.name) if published and ref else None,
        base_model=base,
        params=params,
        git_commit=git_commit,
        lineage=dvc_lineage(lock_path, stages) if lock_path is not None else None,
        pretraining=dict(model_info),
        labels=tuple(getattr(spec, "labels", ()) or ())[:50],
        run_ids=run_ids,
        outside_source=None if from_pipeline else base,
        best_baselines=best(baselines),
        other_splits=others,
    )


def _from_pipeline(model_info: Mapping[str, Any]) -> bool:
    """Whether fine-tuning started from the pretrain stage's output (a local path; a registered version
    or a released checkpoint is another model than the one the upstream ``dvc.lock`` entries describe)."""
    from bert_core.finetune.params import PRETRAINED_DIR

    source = str(model_info.get("source") or "")
    if not source or source.startswith("models:/"):
        return False
    return Path(source).expanduser().resolve() == (REPO_ROOT / PRETRAINED_DIR).resolve()


def finetuned_card(spec: Any, settings: Any, result: Any, metrics: Mapping[str, float], name: str):
    """The card of a fine-tuned model: ``card(run_ids=None) -> str``."""
    commit = git_commit()

    def card(run_ids: Mapping[str, str] | None = None) -> str:
        return finetuned_card_for(
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
            from_pipeline=_from_pipeline(result.model),
            baselines=result.baselines,
            split_baselines=result.split_baselines,
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
    eval_set: str = "",
) -> Registration:
    """Register a fine-tuned model as a new version of ``<registry.name_prefix><task>``; the alias
    (``registry.alias``) moves only on a better dev score (the task's headline metric) on the same rows
    (``eval_set``, empty: the whole official dev split; :func:`bert_core.tracking.register`)."""
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
            eval_set=eval_set,
        )
