"""Prefect flow of the ``pretrain`` stage: ``python -m flows.pretrain`` (several GPUs/nodes: ``torchrun
--nproc-per-node=N -m flows.pretrain``).

Reads ``params/pretrain.yaml`` (section ``pretrain``), trains with :func:`bert_core.pretrain.pretrain` on
``data/pretrain_data`` and ``data/vocab``, writes the model to ``models/pretrained`` (HF format), the
loss curve and held-out evaluations to ``plots/`` (DVC plots) and the metrics to
``metrics/pretrain.json``. Training metrics stream to the MLflow run through a sink that buffers and
retries while the tracking server is unreachable. At the end the model directory is logged as the
run's ``model`` artifact and registered as a new version of ``registered_model`` (tags: git commit, DVC
params, data statistics, held-out metrics), and the alias ``registry_alias`` moves to it.

Exit codes: 0 done; 1 error (message on stderr); 128 + N after signal N (SIGTERM 143, SIGINT 130): a
checkpoint was written and the next run resumes from it. Under torchrun only rank 0 talks to Prefect
and MLflow; the other ranks just train.
"""

from __future__ import annotations

import os

# CPU threads that spin while waiting (OpenMP's default) made training 4-6x slower on a shared 2-core
# machine (other processes running); passive waiting costs little when the machine is idle. Must be set
# before torch loads its OpenMP runtime; OMP_WAIT_POLICY=ACTIVE in the environment overrides it.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import json
import logging
import sys
from pathlib import Path
from typing import Any

from bert_core.pretrain import PretrainParams, PretrainResult, pretrain, write_curves
from flows._cli import run_stage
from flows.stages import get

STAGE = get("pretrain")
log = logging.getLogger("bert_core.flows.pretrain")


def register_model(run: Any, result: PretrainResult, params: PretrainParams) -> dict[str, Any]:
    """Log the model directory as the run's ``model`` artifact and register it as a new version.

    Returns:
        ``{"registered_model", "version", "alias"}``.
    """
    from mlflow import MlflowClient
    from mlflow.exceptions import MlflowException

    from flows._stage import git_commit, retry_tracking

    run.log_artifact(result.model_dir, artifact_path="model")
    client = MlflowClient()
    name = params.registered_model
    if not retry_tracking(client.search_registered_models)(filter_string=f"name = '{name}'"):
        try:
            retry_tracking(client.create_registered_model)(
                name,
                description="BERT pretrained with MLM + NSP by the pipeline's `pretrain` stage (HF format).",
            )
        except MlflowException as err:  # created meanwhile by a concurrent run
            if "already exists" not in str(err).lower():
                raise
    from bert_core.finetune.tracking import FINGERPRINT_TAG, fingerprint

    heldout = result.metrics["heldout"]
    tags = {
        # lets fine-tuning runs started from the local models/pretrained name this registered version
        FINGERPRINT_TAG: fingerprint(result.model_dir),
        "git_commit": git_commit(),
        "stage": "pretrain",
        "preset": params.model.preset,
        "dvc_params": json.dumps(params.model_dump(mode="json"), sort_keys=True)[:5000],
        "data_stats": json.dumps(result.data_stats, sort_keys=True)[:5000],
        "heldout_mlm_acc": f"{heldout.get('mlm_acc', float('nan')):.4f}",
        "baseline_mlm_acc": f"{heldout.get('baseline_mlm_acc', float('nan')):.4f}",
        "steps": str(result.metrics["steps"]),
    }
    version = retry_tracking(client.create_model_version)(
        name, source=f"runs:/{run.run_id}/model", run_id=run.run_id, tags=tags,
        description=f"{params.model.preset}, {result.metrics['steps']} steps; held-out MLM accuracy "
        f"{tags['heldout_mlm_acc']} vs {tags['baseline_mlm_acc']} for the most frequent token",
    )  # fmt: skip
    retry_tracking(client.set_registered_model_alias)(name, params.registry_alias, version.version)
    log.info("registered %s version %s (alias %s)", name, version.version, params.registry_alias)
    return {"registered_model": name, "version": int(version.version), "alias": params.registry_alias}


def pretrain_flow_fn(
    params_file: str = STAGE.default("params_file"),
    data_dir: str = STAGE.default("data_dir"),
    vocab_dir: str = STAGE.default("vocab_dir"),
    out_dir: str = STAGE.default("out_dir"),
    checkpoint_root: str = STAGE.default("checkpoint_root"),
    loss_plot: str = STAGE.default("loss_plot"),
    heldout_plot: str = STAGE.default("heldout_plot"),
    metrics_path: str | None = None,
) -> dict:
    """Train, write outputs, track and register; returns the stage metrics."""
    from bert_core.training.distributed import setup_distributed, teardown_distributed
    from bert_core.training.tracking import mlflow_sink
    from flows._stage import finish_stage, stage_run

    params: PretrainParams = STAGE.load_params(params_file)
    dist = setup_distributed(params.device)
    try:
        with stage_run("pretrain", params, tags={"preset": params.model.preset}) as run:
            sink = mlflow_sink(run.run_id, spill_path=Path(checkpoint_root) / "unsent-metrics.jsonl")
            try:
                result = pretrain(
                    params, data_dir, vocab_dir, out_dir, checkpoint_root=checkpoint_root, on_metrics=sink,
                    dist=dist,
                )  # fmt: skip
            finally:
                sink.close(timeout_s=60)
            write_curves(result.history, Path(loss_plot), Path(heldout_plot))
            run.log_artifact(loss_plot, artifact_path="plots")
            run.log_artifact(heldout_plot, artifact_path="plots")
            run.log_metrics({"data": result.data_stats})
            registry = register_model(run, result, params)
            metrics = {**result.metrics, "registry": registry}
            finish_stage("pretrain", metrics, run, metrics_path)
        return metrics
    finally:
        teardown_distributed()


def prefect_flow():
    """The stage's Prefect flow, built on demand: importing this module must not import Prefect."""
    from prefect import flow

    return flow(name="pretrain", log_prints=True)(pretrain_flow_fn)


def _worker_rank(
    params_file: str, data_dir: str, vocab_dir: str, out_dir: str, checkpoint_root: str, **_outputs: Any
) -> None:
    """Ranks other than 0 under torchrun: train only (rank 0 tracks and writes the outputs)."""
    from bert_core.training.distributed import setup_distributed, teardown_distributed

    params: PretrainParams = STAGE.load_params(params_file)
    dist = setup_distributed(params.device)
    try:
        pretrain(params, data_dir, vocab_dir, out_dir, checkpoint_root=checkpoint_root, dist=dist)
    finally:
        teardown_distributed()


def _run(**options: Any) -> None:
    if int(os.environ.get("WORLD_SIZE", "1")) > 1 and int(os.environ.get("RANK", "0")) != 0:
        _worker_rank(**options)
    else:
        prefect_flow()(**options)


def main(argv: list[str] | None = None) -> int:
    from bert_core.training import TrainingInterrupted

    return run_stage(
        "pretrain", _run, argv, doc=__doc__, interrupted=(TrainingInterrupted,), log_to_stderr=True
    )


if __name__ == "__main__":
    sys.exit(main())
