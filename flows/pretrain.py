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

import argparse
import json
import logging
import sys
from pathlib import Path

from bert_core.params import load_params
from bert_core.pretrain import PretrainParams, PretrainResult, pretrain, write_curves
from bert_core.tracking import FINGERPRINT_TAG, fingerprint, git_commit

log = logging.getLogger("bert_core.flows.pretrain")

DEFAULTS = {
    "params_file": "params/pretrain.yaml",
    "data_dir": "data/pretrain_data",
    "vocab_dir": "data/vocab",
    "out_dir": "models/pretrained",
    "checkpoint_root": "data/pretrain/checkpoints",
    "loss_plot": "plots/pretrain_loss.csv",
    "heldout_plot": "plots/pretrain_heldout.csv",
}


#: Description of the registered model, set when the first pretrain run creates it.
REGISTERED_MODEL_DESCRIPTION = (
    "BERT pretrained with MLM + NSP by the pipeline's `pretrain` stage (HF format)."
)


def version_metadata(result: PretrainResult, params: PretrainParams) -> tuple[dict[str, str], str]:
    """Tags (git commit, DVC params, data statistics, held-out metrics) and description of the new version."""
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
    description = (
        f"{params.model.preset}, {result.metrics['steps']} steps; held-out MLM accuracy "
        f"{tags['heldout_mlm_acc']} vs {tags['baseline_mlm_acc']} for the most frequent token"
    )
    return tags, description


def pretrain_flow_fn(
    params_file: str = DEFAULTS["params_file"],
    data_dir: str = DEFAULTS["data_dir"],
    vocab_dir: str = DEFAULTS["vocab_dir"],
    out_dir: str = DEFAULTS["out_dir"],
    checkpoint_root: str = DEFAULTS["checkpoint_root"],
    loss_plot: str = DEFAULTS["loss_plot"],
    heldout_plot: str = DEFAULTS["heldout_plot"],
    metrics_path: str | None = None,
) -> dict:
    """Train, write outputs, track and register; returns the stage metrics."""
    from bert_core.tracking import mlflow_sink, register
    from bert_core.training.distributed import setup_distributed, teardown_distributed
    from flows._stage import finish_stage, stage_run

    params = load_params(params_file, "pretrain", PretrainParams)
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
            tags, description = version_metadata(result, params)
            registration = register(
                result.model_dir, name=params.registered_model, run_id=run.run_id, alias=params.registry_alias,
                description=REGISTERED_MODEL_DESCRIPTION, tags=tags, version_description=description,
            )  # fmt: skip
            metrics = {**result.metrics, "registry": registration.as_record()}
            finish_stage("pretrain", metrics, run, metrics_path)
        return metrics
    finally:
        teardown_distributed()


def _flow():
    from prefect import flow

    return flow(name="pretrain", log_prints=True)(pretrain_flow_fn)


#: How flows.serve finds this stage's flow (built lazily: importing this module must not import Prefect).
PREFECT_FLOW = _flow


def _worker_rank(args: argparse.Namespace) -> None:
    """Ranks other than 0 under torchrun: train only (rank 0 tracks and writes the outputs)."""
    from bert_core.training.distributed import setup_distributed, teardown_distributed

    params = load_params(args.params, "pretrain", PretrainParams)
    dist = setup_distributed(params.device)
    try:
        pretrain(params, args.data, args.vocab, args.out, checkpoint_root=args.checkpoints, dist=dist)
    finally:
        teardown_distributed()


def main(argv: list[str] | None = None) -> int:
    from bert_core.training import NonFiniteLossError, TrainingInterrupted

    parser = argparse.ArgumentParser(prog="python -m flows.pretrain", description=__doc__.split("\n\n")[0])
    parser.add_argument("--params", default=DEFAULTS["params_file"])
    parser.add_argument("--data", default=DEFAULTS["data_dir"])
    parser.add_argument("--vocab", default=DEFAULTS["vocab_dir"])
    parser.add_argument("--out", default=DEFAULTS["out_dir"])
    parser.add_argument("--checkpoints", default=DEFAULTS["checkpoint_root"])
    parser.add_argument("--loss-plot", default=DEFAULTS["loss_plot"])
    parser.add_argument("--heldout-plot", default=DEFAULTS["heldout_plot"])
    parser.add_argument("--metrics", default=None, help="metrics JSON (default metrics/pretrain.json)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)
    try:
        if int(os.environ.get("WORLD_SIZE", "1")) > 1 and int(os.environ.get("RANK", "0")) != 0:
            _worker_rank(args)
        else:
            _flow()(args.params, args.data, args.vocab, args.out, args.checkpoints, args.loss_plot,
                    args.heldout_plot, args.metrics)  # fmt: skip
    except TrainingInterrupted as err:
        print(f"pretrain stage interrupted: {err}", file=sys.stderr)
        return err.exit_code
    except (NonFiniteLossError, Exception) as err:
        print(f"pretrain stage failed: {type(err).__name__}: {err}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
