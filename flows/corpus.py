"""Prefect flow of the ``corpus`` stage: ``python -m flows.corpus [--workers N]``.

Reads ``params/corpus.yaml`` (section ``corpus``), builds ``data/corpus`` with
:func:`bert_core.corpus.build_corpus` from the Hub sources, or from ``local_sources`` under
``BERT_DATA_ROOT`` when it is set, and records the run (MLflow run, ``metrics/corpus.json``, Prefect
artifact, data-check report).
"""

from __future__ import annotations

import logging
import shutil
from pathlib import Path

from prefect import flow

from bert_core.atomic import check_writable
from bert_core.corpus import CorpusParams, build_corpus
from bert_core.sources import data_root
from bert_core.tracking.ui import log_corpus_sources
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

STAGE = get("corpus")
log = logging.getLogger("bert_core.flows.corpus")


@flow(name="corpus", log_prints=True)
def corpus_flow(
    params_file: str = STAGE.default("params_file"),
    out_dir: str = STAGE.default("out_dir"),
    workers: int | None = None,
    metrics_path: str | None = None,
) -> dict:
    """Build the document corpus; return its metrics.

    Args:
        params_file: YAML file with a ``corpus`` section.
        out_dir: Output directory (replaced atomically).
        workers: Worker processes; default ``corpus.workers``. The output does not depend on it.
        metrics_path: DVC metrics file; default ``metrics/corpus.json`` in the repository.
    """
    params: CorpusParams = STAGE.load_params(params_file)
    root = data_root()
    check_writable(out_dir, metrics_path or METRICS_DIR / "corpus.json")  # fail fast
    # The data-check report outlives the run (a failed check's message points at it): one folder per suite.
    checks_dir = data_check_dir("corpus", out_dir, STAGE.outs[0])
    shutil.rmtree(checks_dir, ignore_errors=True)
    report_dir = checks_dir / "corpus"
    with stage_run("corpus", params) as run:
        # The corpus and its metrics file are committed together or not at all; the builder stages its
        # directory inside the staged one (renames only, no copy).
        with stage_outputs("corpus", out_dir, metrics_path=metrics_path) as staged:
            try:
                stats = build_corpus(
                    params, staged[out_dir], data_root=root, workers=workers, report_dir=report_dir
                )
            finally:
                if report_dir.exists():  # keep the Data Docs even when a check failed the stage
                    run.log_artifact(report_dir, artifact_path="data_checks/corpus")
            metrics = stats.as_metrics()
            write_stage_metrics("corpus", metrics, metrics_path, outputs=staged)
        run.log_check_report(stats.check_report)
        log_corpus_sources(params, stats, root)  # the Dataset column and lineage in the MLflow UI
        run.log_artifact(Path(out_dir) / "manifest.json")
        run.set_tags({"corpus.params_hash": stats.params_hash, "corpus.workers": stats.workers})
        finish_stage("corpus", metrics, run, metrics_path, written=True)
    return metrics


def main(argv: list[str] | None = None) -> int:
    return run_stage("corpus", corpus_flow, argv, doc=__doc__)


if __name__ == "__main__":
    exit_command(main())
