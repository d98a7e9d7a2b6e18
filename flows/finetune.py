"""Prefect flow of the ``finetune`` stage, one task per run: ``python -m flows.finetune TASK``.

Reads ``params/finetune.yaml`` (section ``finetune``), resolves the pretrained model (a local directory or
an MLflow registry URI), and runs :func:`bert_core.finetune.finetune_task`. Tracking, in the MLflow
experiment :data:`bert_core.tracking.FINETUNE_EXPERIMENT`:

- one run per task (``finetune-<task>``) with the selected model's flat metrics (``dev.accuracy`` ...),
  the predictions and summary as artifacts, and tags ``task``, ``init``, ``pretrained_*``, git commit,
  DVC experiment, pipeline run id;
- one nested run per trial (learning rate x seed x init) with the same metric keys;
- the selected model registered as a new version of ``bert-<task>``; the alias (``champion``) moves only
  when the new version beats it on the dev metric.

DVC outputs: ``models/finetuned/<task>`` (model), ``results/finetune/<task>`` (predictions, summary) and
``metrics/finetune/<task>.json`` (flat metrics, so ``dvc metrics diff`` lines up per task) and
``plots/finetune/<task>/{train,dev}.csv`` (the selected trial's learning curves, ``dvc plots show``).
"""

from __future__ import annotations

import os

# OpenMP threads that spin while waiting made a training step ~7x slower on the shared 2-core machine
# (973 ms vs 143 ms per tiny-model step with 2 threads); passive waiting costs little on an idle machine.
# Must be set before torch loads its OpenMP runtime; OMP_WAIT_POLICY=ACTIVE in the environment overrides it.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import contextlib
import logging
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from prefect import flow

from bert_core.atomic import atomic_outputs, check_writable, write_json_atomic
from bert_core.constants import REPO_ROOT
from bert_core.finetune.params import FinetuneParams
from bert_core.sources import data_root
from bert_core.tracking import FINETUNE_EXPERIMENT
from flows._cli import exit_command, interrupt_as_crash, run_stage
from flows._stage import data_check_dir, publish_artifact, stage_run
from flows.stages import get

STAGE = get("finetune")
log = logging.getLogger("bert_core.flows.finetune")


def _log_check_reports(run: Any, reports: list[Any]) -> None:
    for report in reports:
        try:
            run.log_check_report(report)
        except Exception as err:  # a report that cannot be logged must not fail the stage
            log.warning("could not log data-check report %s: %s", getattr(report, "suite", "?"), err)


@contextlib.contextmanager
def _keep_reports_on_failure(run: Any, report_dir: Path) -> Iterator[None]:
    """On a failure (a failed data check), log the reports written so far to MLflow too."""
    try:
        yield
    except Exception:
        if report_dir.exists():
            try:
                run.log_artifact(report_dir, artifact_path="data_checks")
            except Exception as err:  # the stage's own error matters more
                log.warning("could not log the data-check reports in %s: %s", report_dir, err)
        raise


def _standard_tags(run_id: str) -> dict[str, str]:
    """The stage run's own tags (git commit, pipeline run id, DVC experiment ...) for its trial runs."""
    from mlflow import MlflowClient

    tags = MlflowClient().get_run(run_id).data.tags
    return {k: v for k, v in tags.items() if not k.startswith("mlflow.")}


@flow(name="finetune", log_prints=True)
@interrupt_as_crash  # TrainingInterrupted: the run is Crashed, the exit status 130/143
def finetune_flow(
    task: str,
    params_file: str = STAGE.default("params_file"),
    model_source: str | None = None,
    out_dir: str | None = None,
    model_out: str | None = None,
    metrics_path: str | None = None,
    plots_dir: str | None = None,
) -> dict[str, float]:
    """Fine-tune one task; return its flat dev metrics.

    Args:
        task: Task name (``sst2``, ``squad_v1``, ``conll2003`` ...; see ``bert_core.tasks.TASKS``).
        params_file: YAML file with a ``finetune`` section.
        model_source: Override ``finetune.model.source`` (a directory, ``models:/<name>@<alias>`` or a Hub id).
        out_dir: Predictions and summary (default ``results/finetune/<task>``).
        model_out: The selected model (default ``models/finetuned/<task>``).
        metrics_path: DVC metrics file (default ``metrics/finetune/<task>.json``).
        plots_dir: Learning curves of the selected trial for ``dvc plots`` (default ``plots/finetune/<task>``).
    """
    from bert_core import modelcard
    from bert_core.evaluate.references import reference_for
    from bert_core.finetune.run import finetune_task
    from bert_core.released import download_hub_checkpoint, is_hub_id
    from bert_core.serving import mlflow_model, serving_task
    from bert_core.tasks import get_task
    from bert_core.tasks.datasource import split_tags
    from bert_core.tracking import (
        MlflowTrialTracker,
        git_commit,
        pipeline_run_id,
        register,
        resolve_model_source,
    )
    from bert_core.tracking.ui import log_headline_metric, log_task_data

    params: FinetuneParams = STAGE.load_params(params_file)
    spec = get_task(task)
    if params.tasks and spec.name not in params.tasks:
        log.warning(
            "task %s is not listed under finetune.tasks in %s; using the defaults", spec.name, params_file
        )
    settings = params.for_task(spec.name)
    source = model_source or params.model.source
    (model_default, out_default), (metrics_default,) = STAGE.outs, STAGE.metrics
    out = Path(out_dir or REPO_ROOT / STAGE.expand(out_default, spec.name))
    model_dir = Path(model_out or REPO_ROOT / STAGE.expand(model_default, spec.name))
    metrics_file = Path(metrics_path or REPO_ROOT / STAGE.expand(metrics_default, spec.name))
    curves_dir = Path(plots_dir or (REPO_ROOT / STAGE.expand(STAGE.plots[0], spec.name)).parent)
    run_params = {
        "task": spec.name,
        "model": params.model.model_dump(mode="json"),
        "settings": settings.model_dump(mode="json"),
        "device": params.device,
        "precision": params.precision,
    }
    tags = {"task": spec.name, "init": params.model.init, "pretrained_source": source}
    curves = [curves_dir / "train.csv", curves_dir / "dev.csv"]
    finals = [out, model_dir, metrics_file, *curves]
    check_writable(*finals)  # fail fast, naming the output, before the model is fetched or trained
    # The data-check reports outlive the run (a failed check's message points at them): one folder per suite.
    report_dir = data_check_dir("finetune", out, STAGE.expand(out_default, spec.name)) / spec.name
    shutil.rmtree(report_dir, ignore_errors=True)
    with (
        stage_run("finetune", run_params, experiment=FINETUNE_EXPERIMENT, run_name=f"finetune-{spec.name}",
                  tags=tags) as run,
        tempfile.TemporaryDirectory(prefix="finetune-source-") as download,
    ):  # fmt: skip
        hub = source if is_hub_id(source) else None  # a Hub id: downloaded here (offline: fails in seconds)
        local = str(download_hub_checkpoint(hub, Path(download) / "hub")) if hub else source
        resolved = resolve_model_source(local, download)
        if hub:
            resolved.info.update(uri=f"hf://{hub}", model=hub)
        run.set_tags({f"pretrained_{k}": v for k, v in resolved.info.items()})
        trial_tags = {**_standard_tags(run.run_id), **tags,
                      **{f"pretrained_{k}": str(v) for k, v in resolved.info.items()}}  # fmt: skip
        # Every out (results, model, metrics file, curves) is committed together or not at all.
        with atomic_outputs(finals, dirs=[out]) as staged, _keep_reports_on_failure(run, report_dir):
            result = finetune_task(
                spec.name,
                params,
                resolved.path,
                out,
                model_out=model_dir,
                data_root=data_root(),
                tracker=MlflowTrialTracker(run.run_id, trial_tags, main_metric=spec.main_metric),
                source_info=resolved.info,
                on_data=lambda data: (
                    _log_check_reports(run, data.check_reports),
                    log_task_data(spec.name, data),
                ),
                check_report_dir=report_dir,
                outputs=staged,
            )
            metrics = result.metrics()
            run.set_tags(split_tags(result.data_split))  # data_split (+ its label unless official splits)
            log_headline_metric(
                spec.main_metric, metrics
            )  # dev.main + tag main_metric: one column across tasks
            name = f"{params.registry.name_prefix}{spec.name}"

            def card(run_ids: dict[str, str] | None = None) -> str:
                return modelcard.finetuned_card_for(
                    spec, metrics, result.model, params=settings.model_dump(mode="json"), git_commit=git_commit(),
                    lock_path=REPO_ROOT / "dvc.lock",
                    reference=reference_for(result.model.get("preset")), run_ids=run_ids, name=name,
                    data_label=result.data_split.get("label") or None,
                )  # fmt: skip

            modelcard.write_card(staged[model_dir], card())  # run-free: the directory is a DVC output
            write_json_atomic(staged[metrics_file], metrics)
            with tempfile.TemporaryDirectory(prefix="curves-", dir=staged[out]) as scratch:
                for curve, written in zip(curves, result.write_curves(scratch)):
                    os.replace(written, staged[curve])
        run.log_artifact(out, artifact_path="results")
        for curve in curves:
            run.log_artifact(curve, artifact_path="plots")
        if params.registry.enabled:
            run_ids = {"pipeline_run_id": pipeline_run_id(), "mlflow_run_id": run.run_id,
                       "mlflow_experiment": FINETUNE_EXPERIMENT, "registered_model": name}  # fmt: skip
            with modelcard.staged_with_card(model_dir, card(run_ids)) as staged_model:
                registration = register(
                    staged_model,
                    name=name,
                    run_id=run.run_id,
                    alias=params.registry.alias,
                    description=f"Fine-tuned BERT for {name}; alias '{params.registry.alias}' = best on dev",
                    tags={**trial_tags, "selected_trial": result.selected.name},
                    metric_key=f"dev.{spec.main_metric}",
                    value=metrics.get(f"dev.{spec.main_metric}", float("nan")),  # NaN: undefined correlation
                    save_model=mlflow_model(
                        serving_task(spec, settings, null_threshold=metrics.get("dev.null_threshold"))
                    ),
                )
            run.set_tags(registration.as_tags())
            run.log_metrics({"registry.alias_moved": float(registration.alias_moved)})
        run.log_metrics(metrics)  # the metrics file was committed with the other outs
        publish_artifact(f"finetune-{spec.name}", metrics)
    return metrics


def main(argv: list[str] | None = None) -> int:
    from bert_core.training import TrainingInterrupted

    return run_stage("finetune", finetune_flow, argv, doc=__doc__, interrupted=(TrainingInterrupted,))


if __name__ == "__main__":
    exit_command(main())
