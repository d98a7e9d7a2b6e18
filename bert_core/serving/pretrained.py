"""Registering the pretrained model: a fill-mask MLflow Model whose card names its runs.

The stage's own model directory (a DVC output) keeps its run-free, deterministic card; the registered copy
gets a card naming the pipeline run, the MLflow run and the registered name
(:func:`bert_core.modelcard.staged_with_card`). The registration itself is :func:`bert_core.tracking.register`;
what a version records is :func:`bert_core.pretrain.registration.version_metadata`. (Fine-tuned models:
:mod:`bert_core.serving.finetuned`; the two are apart so that neither stage depends on the other's code.)
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from typing import Any

from bert_core import modelcard
from bert_core.constants import DVC_LOCK
from bert_core.pretrain.registration import REGISTERED_MODEL_DESCRIPTION, version_metadata
from bert_core.serving import fill_mask_task, mlflow_model
from bert_core.tracking import Registration, git_commit, pipeline_run_id, register
from bert_core.tracking.provenance import PRETRAIN_STAGES, corpus_datasets, dvc_lineage

PretrainedCard = Callable[..., str]


def pretrained_card_for(
    params: Any,
    config: Any,
    metrics: Mapping[str, Any],
    data_stats: Mapping[str, Any],
    *,
    git_commit: str,
    lock_path: str | os.PathLike[str] | None,
    run_ids: Mapping[str, str] | None = None,
) -> str:
    """:func:`bert_core.modelcard.pretrained_card` for the pretrain stage's params (``PretrainParams``), the trained model's
    ``BertConfig`` (its sizes come from the params and the inputs) and result."""
    shape = {
        k: getattr(config, k)
        for k in (
            "num_hidden_layers",
            "hidden_size",
            "num_attention_heads",
            "intermediate_size",
            "max_position_embeddings",
            "vocab_size",
        )
    }
    return modelcard.pretrained_card(
        name=params.registered_model,
        preset=params.model.preset if "init" not in metrics else "custom",  # continued: the checkpoint's size
        config=shape,
        metrics=metrics,
        data_stats=data_stats,
        params=params.model_dump(mode="json"),
        git_commit=git_commit,
        lineage=dvc_lineage(lock_path, PRETRAIN_STAGES) if lock_path is not None else None,
        datasets=corpus_datasets(lock_path) if lock_path is not None else [],
        run_ids=run_ids,
    )


def pretrained_card(params: Any) -> PretrainedCard:
    """The card of a pretrained model: ``card(metrics, data_stats, config, run_ids=None) -> str``."""
    commit = git_commit()

    def card(
        metrics: Mapping[str, Any],
        data_stats: Mapping[str, Any],
        config: Any,
        run_ids: Mapping[str, str] | None = None,
    ) -> str:
        return pretrained_card_for(
            params, config, metrics, data_stats, git_commit=commit, lock_path=DVC_LOCK, run_ids=run_ids
        )

    return card


def register_pretrained(result: Any, params: Any, *, run_id: str, card: PretrainedCard) -> Registration:
    """Register ``result.model_dir`` (a :class:`bert_core.pretrain.PretrainResult`) as a new version of
    ``params.registered_model`` (a fill-mask MLflow Model); ``params.registry_alias`` moves to it."""
    tags, description = version_metadata(result, params)
    run_ids = {
        "pipeline_run_id": pipeline_run_id(),
        "mlflow_run_id": run_id,
        "registered_model": params.registered_model,
    }
    text = card(result.metrics, result.data_stats, result.config, run_ids)
    with modelcard.staged_with_card(result.model_dir, text) as staged:
        return register(
            staged,
            name=params.registered_model,
            run_id=run_id,
            alias=params.registry_alias,
            description=REGISTERED_MODEL_DESCRIPTION,
            tags=tags,
            version_description=description,
            save_model=mlflow_model(fill_mask_task()),
        )
