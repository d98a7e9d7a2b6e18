"""Prefect flow of the ``pretrain_data`` stage: ``python -m flows.pretrain_data [--workers N]``.

Builds the MLM (+ NSP) instances of each phase with :func:`bert_core.pretrain_data.build_pretrain_data`,
moved into place only when every critical data check passes.
"""

from __future__ import annotations

from functools import partial
from pathlib import Path
from typing import Annotated

from prefect import flow
from pydantic import Field

from bert_core.pretrain_data.build import SPLITS, build_pretrain_data
from bert_core.pretrain_data.params import PretrainDataParams
from flows._cli import exit_command, run_stage
from flows._stage import data_check_dir, headline, stage
from flows.stages import get

STAGE = get("pretrain_data")


@flow(name="pretrain_data", log_prints=True)
def pretrain_data_flow(
    params_file: str = STAGE.default("params_file"),
    corpus_dir: str = STAGE.default("corpus_dir"),
    vocab_dir: str = STAGE.default("vocab_dir"),
    out_dir: str = STAGE.default("out_dir"),
    workers: Annotated[int, Field(ge=1)] | None = None,
    metrics_path: str | None = None,
) -> dict:
    """Build the pretraining instances; return the stage's metrics.

    Args:
        params_file: YAML file with a ``pretrain_data`` section.
        corpus_dir: Output of the corpus stage.
        vocab_dir: Output of the vocab stage.
        out_dir: Output directory (replaced atomically, only when every critical check passes). An
            interrupted build keeps its finished tasks beside it, and the next run continues after them.
        workers: Worker processes; default ``pretrain_data.num_workers``. The output does not depend on it.
        metrics_path: DVC metrics file; default ``metrics/pretrain_data.json``.
    """
    params: PretrainDataParams = STAGE.load_params(params_file)
    if workers is not None:
        params = params.model_copy(update={"num_workers": workers})
    checks = data_check_dir("pretrain_data", out_dir, STAGE.outs[0])  # one report per phase and split
    with stage(
        "pretrain_data", params, out_dir, metrics_path=metrics_path, dirs=(out_dir,), checks_dir=checks
    ) as s:
        result = build_pretrain_data(
            params, corpus_dir=corpus_dir, vocab_dir=vocab_dir, output_dir=s[out_dir], report_dir=checks
        )
        details = result.as_metrics()
        s.done(
            headline(details, STAGE.headline),
            details=details,
            reports=result.reports,
            artifacts=[
                (Path(out_dir) / phase / split / "index.json", f"index/{phase}/{split}")
                for phase in params.phases
                for split in SPLITS
            ],
            tags={"pretrain_data.masking": params.masking, "pretrain_data.phases": ",".join(params.phases)},
        )
    return s.details


#: The command line, ``main(argv)``: the stage runner itself (no call of its own between the command and the work).
main = partial(run_stage, "pretrain_data", pretrain_data_flow, doc=__doc__)


if __name__ == "__main__":
    exit_command(main())
