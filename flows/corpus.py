"""Prefect flow of the ``corpus`` stage: ``python -m flows.corpus [--workers N]``.

Reads ``params/corpus.yaml`` (section ``corpus``), builds ``data/corpus`` with
:func:`bert_core.corpus.build_corpus` from the Hub sources, or from ``local_sources`` under
``BERT_DATA_ROOT`` when it is set, and records the run (MLflow run, ``metrics/corpus.json``, Prefect
artifact, data-check report).
"""

from __future__ import annotations

import argparse
import logging
import sys
import tempfile
from pathlib import Path

from prefect import flow

from bert_core.corpus import CorpusParams, build_corpus
from bert_core.params import load_params
from bert_core.sources import data_root
from flows._stage import finish_stage, stage_run

PARAMS_MODEL = CorpusParams
log = logging.getLogger("bert_core.flows.corpus")


@flow(name="corpus", log_prints=True)
def corpus_flow(
    params_file: str = "params/corpus.yaml",
    out_dir: str = "data/corpus",
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
    params = load_params(params_file, "corpus", CorpusParams)
    root = data_root()
    with stage_run("corpus", params) as run, tempfile.TemporaryDirectory(prefix="corpus-checks-") as tmp:
        report_dir = Path(tmp) / "data_docs"
        try:
            stats = build_corpus(
                params, Path(out_dir), data_root=root, workers=workers, report_dir=report_dir
            )
        finally:
            if report_dir.exists():  # keep the Data Docs even when a check failed the stage
                run.log_artifact(report_dir, artifact_path="data_checks/corpus")
        run.log_check_report(stats.check_report)
        run.log_artifact(Path(out_dir) / "manifest.json")
        run.set_tags({"corpus.params_hash": stats.params_hash, "corpus.workers": stats.workers})
        metrics = stats.as_metrics()
        finish_stage("corpus", metrics, run, metrics_path)
    return metrics


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m flows.corpus", description=__doc__.split("\n\n")[0])
    parser.add_argument("--params", default="params/corpus.yaml")
    parser.add_argument("--out", default="data/corpus")
    parser.add_argument("--workers", type=int, default=None)
    parser.add_argument("--metrics", default=None, help="metrics JSON (default metrics/corpus.json)")
    args = parser.parse_args(argv)
    try:
        load_params(args.params, "corpus", CorpusParams)  # fail fast on bad params, before Prefect starts
        corpus_flow(args.params, args.out, args.workers, args.metrics)
    except Exception as err:  # a clear one-line reason and a non-zero exit for DVC
        print(f"corpus stage failed: {type(err).__name__}: {err}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
