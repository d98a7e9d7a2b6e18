"""Prefect flow of the ``pretrain_data`` stage: ``python -m flows.pretrain_data [--workers N]``.

Reads ``params/pretrain_data.yaml`` (section ``pretrain_data``), builds MLM + NSP instances for each phase
from ``data/corpus`` and ``data/vocab`` into ``data/pretrain_data/<phase>/{train,heldout}`` with
:func:`bert_core.pretrain_data.build_pretrain_data` (validated by the data checks before it is moved into
place), and records the run: MLflow params/metrics/check reports/index files, ``metrics/pretrain_data.json``
for DVC, and a Prefect artifact.
"""

from __future__ import annotations

import logging
import shutil
from pathlib import Path

from prefect import flow

from bert_core.atomic import check_writable
from bert_core.pretrain_data.build import build_pretrain_data
from bert_core.pretrain_data.params import PretrainDataParams
from flows._cli import exit_command, run_stage
from flows._stage import (
    METRICS_DIR,
    data_check_dir,
    finish_stage,
    stage_outputs,
    stage_run,
    write_stage_metrics,
)
from flows.stages import get

STAGE = get("pretrain_data")
log = logging.getLogger("bert_core.flows.pretrain_data")


@flow(name="pretrain_data", log_prints=True)
def pretrain_data_flow(
    params_file: str = STAGE.default("params_file"),
    corpus_dir: str = STAGE.default("corpus_dir"),
    vocab_dir: str = STAGE.default("vocab_dir"),
    out_dir: str = STAGE.default("out_dir"),
    workers: int | None = None,
    metrics_path: str | None = None,
) -> dict:
    """Build the pretraining instances; return the stage's metrics.

    Args:
        params_file: YAML file with a ``pretrain_data`` section.
        corpus_dir: Output of the corpus stage.
        vocab_dir: Output of the vocab stage.
        out_dir: Output directory (replaced atomically, only when every critical check passes).
        workers: Worker processes; default ``pretrain_data.num_workers``. The output does not depend on it.
        metrics_path: DVC metrics file; default ``metrics/pretrain_data.json``.
    """
    params: PretrainDataParams = STAGE.load_params(params_file)
    if workers is not None:
        params = params.model_copy(update={"num_workers": max(1, int(workers))})
    check_writable(out_dir, metrics_path or METRICS_DIR / "pretrain_data.json")  # fail fast
    # The data-check reports outlive the run (a failed check's message points at them): one folder per
    # phase and split (suite pretrain_data.<phase>.<split>).
    report_dir = data_check_dir("pretrain_data", out_dir, STAGE.outs[0])
    shutil.rmtree(report_dir, ignore_errors=True)
    with stage_run("pretrain_data", params) as run:
        # The instances and the metrics file are committed together or not at all; the builder stages its
        # directory inside the staged one (renames only, no copy).
        with stage_outputs("pretrain_data", out_dir, metrics_path=metrics_path) as staged:
            try:
                result = build_pretrain_data(
                    params, corpus_dir=corpus_dir, vocab_dir=vocab_dir, output_dir=staged[out_dir],
                    report_dir=report_dir,
                )  # fmt: skip
            finally:
                if report_dir.exists():  # keep the Data Docs even when a check failed the stage
                    run.log_artifact(report_dir, artifact_path="data_checks/pretrain_data")
            metrics: dict = dict(result.metrics)
            instances = sum(m["instances"] for ph in result.metrics.values() for m in ph.values())
            tokens = sum(m["tokens"] for ph in result.metrics.values() for m in ph.values())
            metrics |= {
                "elapsed_s": round(result.seconds, 3),
                "instances_per_s": instances / max(result.seconds, 1e-9),
                "tokens_per_s": tokens / max(result.seconds, 1e-9),
                "workers": params.num_workers,
            }
            write_stage_metrics("pretrain_data", metrics, metrics_path, outputs=staged)
        for report in result.reports:
            run.log_check_report(report)
        for phase in params.phases:
            for split in ("train", "heldout"):
                run.log_artifact(
                    Path(out_dir) / phase / split / "index.json", artifact_path=f"index/{phase}/{split}"
                )
        run.set_tags(
            {"pretrain_data.masking": params.masking, "pretrain_data.phases": ",".join(params.phases)}
        )
        finish_stage("pretrain_data", metrics, run, metrics_path, written=True)
    return metrics


def main(argv: list[str] | None = None) -> int:
    return run_stage("pretrain_data", pretrain_data_flow, argv, doc=__doc__)


if __name__ == "__main__":
    exit_command(main())
