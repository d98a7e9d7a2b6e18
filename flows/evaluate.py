"""Prefect flow of the ``evaluate`` stage: ``python -m flows.evaluate``.

Summarises the fine-tuned tasks with :func:`bert_core.evaluate.evaluate_results`: ``metrics/evaluate.json``
and the report ``reports/evaluate.{md,html}``.
"""

from __future__ import annotations

import logging
from functools import partial

from prefect import flow

from bert_core.constants import DVC_LOCK
from bert_core.evaluate.params import EvaluateParams
from bert_core.evaluate.summary import summary_paths
from bert_core.finetune.params import FinetuneParams
from bert_core.params import load_params
from flows._cli import exit_command, run_stage
from flows._stage import headline, in_repo, metrics_file, stage
from flows.stages import get

STAGE = get("evaluate")
log = logging.getLogger("bert_core.flows.evaluate")


@flow(name="evaluate", log_prints=True)
def evaluate_flow(
    params_file: str = STAGE.default("params_file"),
    finetune_params_file: str = STAGE.default("finetune_params_file"),
    metrics_path: str | None = None,
) -> dict[str, float]:
    """Summarise every fine-tuned task; return the summary metrics.

    Args:
        params_file: YAML file with an ``evaluate`` section.
        finetune_params_file: YAML file whose ``finetune.tasks`` lists the tasks to summarise (all
            summaries found when it lists none).
        metrics_path: DVC metrics file (default ``metrics/evaluate.json``).
    """
    from bert_core.evaluate import evaluate_results
    from bert_core.evaluate.report import score_keys

    params: EvaluateParams = STAGE.load_params(params_file)
    finetune = load_params(finetune_params_file, "finetune", FinetuneParams)
    tasks, own = sorted(finetune.tasks) or None, finetune.own_tasks()
    metrics = metrics_file("evaluate", metrics_path)
    report_dir = in_repo(params.report_dir, "evaluate.report_dir")
    outs = [report_dir / "evaluate.md", report_dir / "evaluate.html", report_dir / "evaluate"]
    run_params = {**params.model_dump(mode="json"), "tasks": tasks}
    with stage("evaluate", run_params, *outs, metrics_path=metrics, dirs=(outs[2],)) as s:
        summary, _ = evaluate_results(
            in_repo(params.results_dir, "evaluate.results_dir"),
            metrics,
            report_dir,
            tasks=tasks,
            own_tasks=own,
            reference_size=params.reference_size,
            dpi=params.dpi,
            lock_path=DVC_LOCK,
            outputs=s.staged,
        )
        s.done(
            headline(
                summary, [*score_keys(summary, {n: o.main_metric for n, o in own.items()}), *STAGE.headline]
            ),
            details=summary,
            artifacts=[(outs[1], "report"), (outs[0], "report"), (outs[2], "report/evaluate")],
        )
    return s.details


def _check(params: EvaluateParams, finetune_params_file: str, **_: object) -> None:
    """The command line's refusal before Prefect starts: a fine-tuning summary not there yet."""
    tasks = load_params(finetune_params_file, "finetune", FinetuneParams).tasks
    summary_paths(in_repo(params.results_dir, "evaluate.results_dir"), sorted(tasks) or None)


#: The command line, ``main(argv)``: the stage runner itself (no call of its own between the command and the work).
main = partial(run_stage, "evaluate", evaluate_flow, doc=__doc__, check=_check)


if __name__ == "__main__":
    exit_command(main())
