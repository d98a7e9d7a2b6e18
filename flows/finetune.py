"""Prefect flow of the ``finetune`` stage, one task per run: ``python -m flows.finetune TASK``.

Resolves the pretrained model (a local directory or an MLflow registry URI), runs
:func:`bert_core.finetune.finetune_task`, and records one MLflow run per task in
:data:`bert_core.tracking.FINETUNE_EXPERIMENT` (one nested run per trial); the selected model becomes a new
version of ``bert-<task>``, whose ``champion`` alias moves only on a better dev score. Outputs: the stage table.
"""

from __future__ import annotations

import logging
import os
import tempfile
from functools import partial
from pathlib import Path
from typing import NamedTuple

from prefect import flow

from bert_core.constants import REPO_ROOT
from bert_core.finetune.params import FinetuneParams
from bert_core.finetune.trials import discard_trials
from bert_core.released import resolve_checkpoint
from bert_core.serving.finetuned import FinetunedModel
from bert_core.tasks.datasource import split_tags
from bert_core.tracking import FINETUNE_EXPERIMENT, MlflowTrialTracker
from bert_core.tracking.ui import log_headline_metric, log_task_data
from flows._cli import exit_command, run_stage
from flows._stage import data_check_dir, headline, stage
from flows.stages import get

STAGE = get("finetune")
log = logging.getLogger("bert_core.flows.finetune")


def check_source_built(source: str, key: str = "finetune.model.source") -> None:
    """Refuse a starting checkpoint that is another stage's DVC output not built yet (``models/pretrained``
    before pretraining ran), naming that stage. Without this, ``models/pretrained`` looks like a Hub id
    (``owner/name``) and the user is told to download it from the Hub.

    Raises:
        bert_core.released.CheckpointSourceError: ``source`` is missing and a stage of the table writes it.
    """
    from bert_core.released import MINILM_DIR, CheckpointSourceError
    from flows.stages import producer

    if source.startswith("models:/") or Path(source).expanduser().exists():
        return
    path = Path(os.path.normpath(source))
    if path.is_absolute():
        try:
            path = path.relative_to(REPO_ROOT)
        except ValueError:
            return
    if (writer := producer(path.as_posix())) is not None:
        raise CheckpointSourceError(
            f"{key}={source!r}: {source} does not exist: the {writer} stage has not run; run "
            f"`dvc repro {writer}` (or `make pipeline`), or set {key} to a released BERT directory "
            f"(`python -m flows.checkpoints unpack-minilm` writes {MINILM_DIR})"
        )


class Outs(NamedTuple):
    """A task's outs (default: the stage table's) and where its data-check reports go (beside the results)."""

    results: Path
    model: Path
    metrics: Path
    curves: list[Path]  # train, dev
    checks: Path


def _outs(
    task: str, out_dir: str | None, model_out: str | None, metrics_path: str | None, plots_dir: str | None
) -> Outs:
    (model_default, out_default), (metrics_default,) = STAGE.outs, STAGE.metrics
    out = Path(out_dir or REPO_ROOT / STAGE.expand(out_default, task))
    curves_dir = Path(plots_dir or (REPO_ROOT / STAGE.expand(STAGE.plots[0], task)).parent)
    return Outs(
        out,
        Path(model_out or REPO_ROOT / STAGE.expand(model_default, task)),
        Path(metrics_path or REPO_ROOT / STAGE.expand(metrics_default, task)),
        [curves_dir / "train.csv", curves_dir / "dev.csv"],
        data_check_dir("finetune", out, STAGE.expand(out_default, task)) / task,
    )


@flow(name="finetune", log_prints=True)
def finetune_flow(
    task: str,
    params_file: str = STAGE.default("params_file"),
    model_source: str | None = None,
    out_dir: str | None = None,
    model_out: str | None = None,
    metrics_path: str | None = None,
    plots_dir: str | None = None,
    trials_root: str = STAGE.default("trials_root"),
) -> dict[str, float]:
    """Fine-tune one task; return its flat dev metrics.

    Args:
        task: Task name (``sst2``, ``squad_v1``, ``conll2003`` ...; see ``bert_core.tasks.TASKS``), or an own
            task declared under ``finetune.tasks.<name>.define``.
        params_file: YAML file with a ``finetune`` section.
        model_source: Override ``finetune.model.source`` (a directory, ``models:/<name>@<alias>`` or a Hub id).
        out_dir: Predictions and summary (default ``results/finetune/<task>``).
        model_out: The selected model (default ``models/finetuned/<task>``).
        metrics_path: DVC metrics file (default ``metrics/finetune/<task>.json``).
        plots_dir: Learning curves of the selected trial for ``dvc plots`` (default ``plots/finetune/<task>``).
        trials_root: Finished trials, kept until the outputs are committed: a rerun trains only the rest.
    """
    from bert_core.finetune.run import finetune_task  # torch: not imported for --help

    params: FinetuneParams = STAGE.load_params(params_file)
    spec = params.task(task)
    if params.tasks and spec.name not in params.tasks:
        log.warning("task %s is not under finetune.tasks in %s; using the defaults", spec.name, params_file)
    check_source_built(source := model_source or params.model.source)  # before the run opens: nothing to undo
    o = _outs(spec.name, out_dir, model_out, metrics_path, plots_dir)
    tags = {"task": spec.name, "init": params.model.init, "pretrained_source": source}
    run = dict(experiment=FINETUNE_EXPERIMENT, run_name=f"finetune-{spec.name}", tags=tags)
    run |= dict(metrics_path=o.metrics, dirs=(o.results, o.model), checks_dir=o.checks)
    with (
        stage("finetune", params.run_params(spec.name), o.results, o.model, plots=o.curves, **run) as s,
        tempfile.TemporaryDirectory(prefix="finetune-source-") as download,
    ):
        resolved = resolve_checkpoint(source, download)
        s.run.set_tags({f"pretrained_{k}": v for k, v in resolved.info.items()})
        result = finetune_task(
            spec,
            params,
            resolved.path,
            o.results,
            model_out=o.model,
            tracker=MlflowTrialTracker(s.run.run_id, main_metric=spec.main_metric),  # inherits the run's tags
            source_info=resolved.info,
            on_data=lambda data: (s.reports.extend(data.check_reports), log_task_data(spec.name, data)),
            check_report_dir=o.checks,
            outputs=s.staged,
            trials_root=trials_root,
        )
        s.run.set_tags(split_tags(result.data_split))  # data_split (+ its label unless official splits)
        model = FinetunedModel(spec, params.for_task(spec.name), result, params.registry)
        log_headline_metric(spec.main_metric, model.metrics)  # dev.main + tag main_metric: one column
        model.write(s[o.model], [s[c] for c in o.curves])
        register = partial(model.register, o.model, s.run, experiment=FINETUNE_EXPERIMENT)
        s.done(
            headline(model.details, STAGE.headline, main=spec.main_metric),
            details=model.details,
            artifacts=[(o.results, "results"), *((c, "plots") for c in o.curves)],
            then=register if params.registry.enabled else None,  # on the committed model directory
        )
    discard_trials(trials_root, spec.name)
    return s.details


def _check(params: FinetuneParams, task: str, model_source: str | None = None, **_: object) -> None:
    """The command line's refusals before Prefect starts: an unknown task, its data missing from the data
    root, a start not built yet."""
    spec = params.task(task)
    params.for_task(spec.name).data_source(spec).check_files()
    check_source_built(model_source or params.model.source)


#: The command line, ``main(argv)``: the stage runner itself (no call of its own between the command and the work).
main = partial(run_stage, "finetune", finetune_flow, doc=__doc__, check=_check)


if __name__ == "__main__":
    exit_command(main())
