"""Prefect flow of the ``pretrain_data`` stage: ``python -m flows.pretrain_data [--workers N]``.

Reads ``params/pretrain_data.yaml`` (section ``pretrain_data``), builds MLM + NSP instances for each phase
from ``data/corpus`` and ``data/vocab`` into ``data/pretrain_data/<phase>/{train,heldout}`` with
:func:`bert_core.pretrain_data.build_pretrain_data` (validated by the data checks before it is moved into
place), and records the run: MLflow params/metrics/check reports/index files, ``metrics/pretrain_data.json``
for DVC, and a Prefect artifact.
"""

from __future__ import annotations

import argparse
import logging
import sys
import tempfile
from pathlib import Path

from prefect import flow

from bert_core.params import load_params
from bert_core.pretrain_data.build import build_pretrain_data
from bert_core.pretrain_data.params import PretrainDataParams
from flows._stage import finish_stage, stage_run

PARAMS_MODEL = PretrainDataParams
log = logging.getLogger("bert_core.flows.pretrain_data")


@flow(name="pretrain_data", log_prints=True)
def pretrain_data_flow(
    params_file: str = "params/pretrain_data.yaml",
    corpus_dir: str = "data/corpus",
    vocab_dir: str = "data/vocab",
    out_dir: str = "data/pretrain_data",
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
    params = load_params(params_file, "pretrain_data", PretrainDataParams)
    if workers is not None:
        params = params.model_copy(update={"num_workers": max(1, int(workers))})
    with stage_run("pretrain_data", params) as run, tempfile.TemporaryDirectory(prefix="ptd-checks-") as tmp:
        report_dir = Path(tmp) / "data_docs"
        try:
            result = build_pretrain_data(
                params, corpus_dir=corpus_dir, vocab_dir=vocab_dir, output_dir=out_dir, report_dir=report_dir
            )
        finally:
            if report_dir.exists():  # keep the Data Docs even when a check failed the stage
                run.log_artifact(report_dir, artifact_path="data_checks/pretrain_data")
        for report in result.reports:
            run.log_check_report(report)
        for phase in params.phases:
            for split in ("train", "heldout"):
                run.log_artifact(
                    Path(out_dir) / phase / split / "index.json", artifact_path=f"index/{phase}/{split}"
                )
        metrics: dict = dict(result.metrics)
        instances = sum(m["instances"] for ph in result.metrics.values() for m in ph.values())
        tokens = sum(m["tokens"] for ph in result.metrics.values() for m in ph.values())
        metrics |= {
            "elapsed_s": round(result.seconds, 3),
            "instances_per_s": instances / max(result.seconds, 1e-9),
            "tokens_per_s": tokens / max(result.seconds, 1e-9),
            "workers": params.num_workers,
        }
        run.set_tags(
            {"pretrain_data.masking": params.masking, "pretrain_data.phases": ",".join(params.phases)}
        )
        finish_stage("pretrain_data", metrics, run, metrics_path)
    return metrics


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m flows.pretrain_data", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--params", default="params/pretrain_data.yaml")
    parser.add_argument("--corpus", default="data/corpus")
    parser.add_argument("--vocab", default="data/vocab")
    parser.add_argument("--out", default="data/pretrain_data")
    parser.add_argument("--workers", type=int, default=None)
    parser.add_argument("--metrics", default=None, help="metrics JSON (default metrics/pretrain_data.json)")
    args = parser.parse_args(argv)
    try:
        load_params(args.params, "pretrain_data", PretrainDataParams)  # fail fast, before Prefect starts
        pretrain_data_flow(args.params, args.corpus, args.vocab, args.out, args.workers, args.metrics)
    except Exception as err:  # a clear one-line reason and a non-zero exit for DVC
        print(f"pretrain_data stage failed: {type(err).__name__}: {err}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
