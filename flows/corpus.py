"""Prefect flow of the ``corpus`` stage: ``python -m flows.corpus [--workers N]``.

Builds ``data/corpus`` with :func:`bert_core.corpus.build_corpus`, from the Hub or, with
``BERT_DATA_ROOT``, from ``local_sources``.
"""

from __future__ import annotations

from functools import partial
from pathlib import Path
from typing import Annotated

from prefect import flow
from pydantic import Field

from bert_core.corpus import CorpusParams, build_corpus
from bert_core.corpus.units import plan_units
from bert_core.sources import data_root
from bert_core.tracking.ui import log_corpus_sources
from flows._cli import exit_command, run_stage
from flows._stage import data_check_dir, headline, stage
from flows.stages import get

STAGE = get("corpus")


@flow(name="corpus", log_prints=True)
def corpus_flow(
    params_file: str = STAGE.default("params_file"),
    out_dir: str = STAGE.default("out_dir"),
    workers: Annotated[int, Field(ge=1)] | None = None,
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
    checks = data_check_dir("corpus", out_dir, STAGE.outs[0])
    with stage("corpus", params, out_dir, metrics_path=metrics_path, dirs=(out_dir,), checks_dir=checks) as s:
        stats = build_corpus(
            params, s[out_dir], data_root=root, workers=workers, report_dir=checks / "corpus"
        )
        log_corpus_sources(params, stats, root)  # the Dataset column and lineage in the MLflow UI
        details = stats.as_metrics()
        s.done(
            headline(details, STAGE.headline),
            details=details,
            reports=[stats.check_report],
            artifacts=[(Path(out_dir) / "manifest.json", None)],
            tags={"corpus.params_hash": stats.params_hash, "corpus.workers": stats.workers},
        )
    return s.details


def _check(params: CorpusParams, **_: object) -> None:
    """Refused before Prefect starts: a source path that matches no file, or a file misnamed for its bytes."""
    root = data_root()
    plan_units(params.active_sources(root), root, split=False)


#: The command line, ``main(argv)``: the stage runner itself (no call of its own between the command and the work).
main = partial(run_stage, "corpus", corpus_flow, doc=__doc__, check=_check)


if __name__ == "__main__":
    exit_command(main())
