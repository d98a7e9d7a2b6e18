"""Prefect flow of the ``pretrain`` stage: ``python -m flows.pretrain`` (several GPUs or nodes:
``torchrun --nproc-per-node=N -m flows.pretrain``; only rank 0 talks to Prefect and MLflow).

Trains with :func:`bert_core.pretrain.pretrain` (from the checkpoint the vocab stage copied, for continued
pretraining), writes ``models/pretrained`` in HF format and registers it (alias ``registry_alias``). A
signal writes a checkpoint and exits 128 + N; the next run resumes from it.
"""

from __future__ import annotations

import logging
from functools import partial
from pathlib import Path
from typing import Any

from bert_core.pretrain import PretrainParams, pretrain, write_curves
from flows._cli import exit_command, is_rank, run_stage
from flows.stages import get

STAGE = get("pretrain")
log = logging.getLogger("bert_core.flows.pretrain")


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
    from bert_core.pretrain.init import find_init_checkpoint
    from bert_core.serving.pretrained import pretrained_card, register_pretrained
    from bert_core.tracking import mlflow_sink
    from bert_core.tracking.ui import log_pretrain_data
    from bert_core.training.distributed import setup_distributed, teardown_distributed
    from flows._stage import headline, stage

    params: PretrainParams = STAGE.load_params(params_file)
    if not is_rank() and (n := params.process_count()) > 1:
        log.warning(
            "pretrain.processes gives %d processes here, but a flow run trains in its own process only: "
            "the stage command (python -m flows.pretrain, dvc repro, the bert-pipeline deployment) starts "
            "them all",
            n,
        )
    dist = setup_distributed(params.device)
    card = pretrained_card(params)
    init = find_init_checkpoint(vocab_dir)  # vocab.from_checkpoint: continued pretraining
    tags = {"preset": "checkpoint", "init_from": init.source} if init else {"preset": params.model.preset}
    run = dict(metrics_path=metrics_path, dirs=(out_dir,), tags=tags)
    # The model, the curves and the metrics file are committed together or not at all (the checkpoints
    # live in checkpoint_root, outside them: an interrupted run resumes from there).
    try:
        with stage("pretrain", params, out_dir, plots=(loss_plot, heldout_plot), **run) as s:
            sink = mlflow_sink(s.run.run_id, spill_path=Path(checkpoint_root) / "unsent-metrics.jsonl")
            try:
                result = pretrain(
                    params,
                    data_dir,
                    vocab_dir,
                    s[out_dir],
                    checkpoint_root=checkpoint_root,
                    on_metrics=sink,
                    dist=dist,
                    model_card=card,
                )
            finally:
                sink.close(timeout_s=60)
            write_curves(result.history, s[loss_plot], s[heldout_plot])
            s.run.log_metrics({"data": result.data_stats})
            log_pretrain_data(data_dir, [phase.name for phase in params.phases])
            # The registry record goes into the metrics file, so the model is registered before the
            # commit, and withdrawn if the outs are then not committed.
            registration = s.registered(register_pretrained(result, params, run_id=s.run.run_id, card=card))
            details = {**result.metrics, "registry": registration.as_record()}
            s.done(
                headline(details, STAGE.headline),
                details=details,
                artifacts=[(loss_plot, "plots"), (heldout_plot, "plots")],
            )
        return s.details
    finally:
        teardown_distributed()


def prefect_flow():
    """The stage's Prefect flow, built on demand: importing this module must not import Prefect."""
    from prefect import flow

    return flow(name="pretrain", log_prints=True)(pretrain_flow_fn)


def __getattr__(name: str) -> Any:
    """``flows.pretrain.pretrain_flow``, the entrypoint of the work-pool deployment (:mod:`flows.pool`):
    the flow, built on first access, so a plain import (torchrun's other ranks) still skips Prefect."""
    if name == "pretrain_flow":
        built = globals()["pretrain_flow"] = prefect_flow()
        return built
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _other_rank(
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


#: The command line, ``main(argv)``: the stage runner itself (no call of its own between the command and the work).
main = partial(
    run_stage,
    "pretrain",
    prefect_flow,
    doc=__doc__,
    other_ranks=_other_rank,
    processes=PretrainParams.process_count,
    log_to_stderr=True,
)


if __name__ == "__main__":
    exit_command(main())
