"""The stage runner's half of every stage flow: outputs, tracking, reports and metrics, in one place.

A stage flow is a recipe::

    @flow(name="corpus", log_prints=True)
    def corpus_flow(params_file: str = ..., out_dir: str = ..., metrics_path: str | None = None) -> dict:
        params = STAGE.load_params(params_file)
        with stage("corpus", params, out_dir, metrics_path=metrics_path,
                   checks_dir=data_check_dir("corpus", out_dir, STAGE.outs[0])) as s:
            stats = build_corpus(params, s[out_dir], report_dir=s.checks_dir / "corpus")  # the library entry
            s.done(stats.as_metrics(), reports=[stats.check_report])
        return s.metrics

:func:`stage` owns what every stage repeats: the fail-fast check that every out can be written, a fresh
data-check folder (logged to MLflow even when a check fails the stage), the MLflow run
(:func:`stage_run`, with the Prefect flow-run id among its tags and the library's INFO lines shown), the
staged outs and their all-or-nothing commit together with the DVC metrics file (the stage's headline
figures) and its details file (every statistic, :func:`details_file`), the withdrawal of a model
registered inside the block when the commit fails, and, once committed, the check reports, artifacts,
tags and every statistic in MLflow and the headline metrics as a Prefect artifact. Signals, exit codes and argument parsing
are the command line's (:mod:`flows._cli`).
"""

from __future__ import annotations

import contextlib
import fnmatch
import json
import logging
import os
import shutil
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tabulate import tabulate

from bert_core import tracking
from bert_core.atomic import OutputSet, atomic_outputs, check_writable, write_json_atomic, write_text_atomic
from bert_core.constants import REPO_ROOT
from bert_core.params import flatten
from bert_core.tracking import PIPELINE_EXPERIMENT, StageRun

METRICS_DIR = REPO_ROOT / "metrics"


def in_repo(path: str | os.PathLike[str], what: str = "path") -> Path:
    """A path from params or a run form: an absolute path as given (the user's explicit choice); a relative
    one is relative to the repository and must stay inside it (a form's ``../..`` never leaves it).

    Raises:
        ValueError: naming ``what`` and the path, when a relative path leads out of the repository.
    """
    p = Path(path).expanduser()
    if p.is_absolute():
        return p
    full = (REPO_ROOT / p).resolve()
    if not full.is_relative_to(REPO_ROOT.resolve()):
        raise ValueError(
            f"{what} {str(path)!r} is relative and leads out of the repository (to {full}); give an "
            "absolute path to write or read outside it"
        )
    return REPO_ROOT / p


log = logging.getLogger("bert_core.stage")

#: The loggers whose INFO records every stage shows (the library logs on ``bert_core.<module>``).
LIBRARY_LOGGERS = ("bert_core",)


def _in_run(record: logging.LogRecord) -> bool:
    """Whether a record can go to the Prefect API (it belongs to a flow or task run)."""
    from prefect.context import FlowRunContext, TaskRunContext

    return bool(getattr(record, "flow_run_id", None) or FlowRunContext.get() or TaskRunContext.get())


@contextlib.contextmanager
def library_logs(level: int = logging.INFO) -> Iterator[None]:
    """Within the block, the library's records at ``level`` and above reach the console and, inside a flow
    run, the run's logs in Prefect; the loggers are restored afterwards.

    Prefect's logging configuration leaves the root logger at WARNING, so ``bert_core``'s INFO lines
    (progress, ``step N train: ...``) were dropped. ``PREFECT_LOGGING_EXTRA_LOGGERS=bert_core`` (set in
    :mod:`flows`) attaches the API handler but keeps the level, and takes effect only when it is set
    before Prefect configures logging: this sets the level and attaches the handler where it is missing
    (records logged outside a flow run are then not sent: no "without a flow run id" warning).
    """
    from prefect.logging.handlers import APILogHandler

    added: list[tuple[logging.Logger, logging.Handler | None, int]] = []
    for name in LIBRARY_LOGGERS:
        logger = logging.getLogger(name)
        handler = None
        if not any(isinstance(h, APILogHandler) for h in logger.handlers):  # e.g. set by EXTRA_LOGGERS
            handler = APILogHandler()
            handler.addFilter(_in_run)
            logger.addHandler(handler)
        added.append((logger, handler, logger.level))
        if logger.getEffectiveLevel() > level:
            logger.setLevel(level)
    try:
        yield
    finally:
        for logger, handler, old_level in added:
            logger.setLevel(old_level)
            if handler is not None:
                logger.removeHandler(handler)


def prefect_tags() -> dict[str, str]:
    """``{"prefect_flow_run_id": <id>}`` inside a Prefect flow run, else ``{}``."""
    with contextlib.suppress(Exception):
        from prefect.runtime import flow_run

        if flow_run.id:
            return {"prefect_flow_run_id": flow_run.id}
    return {}


@contextlib.contextmanager
def stage_run(
    stage: str,
    params: Any,
    *,
    experiment: str = PIPELINE_EXPERIMENT,
    run_name: str | None = None,
    tags: dict[str, Any] | None = None,
    nested: bool = False,
) -> Iterator[StageRun]:
    """:func:`bert_core.tracking.stage_run` with the Prefect flow-run id among the run's tags, and the
    library's INFO lines shown (:func:`library_logs`)."""
    with (
        library_logs(),
        tracking.stage_run(
            stage,
            params,
            experiment=experiment,
            run_name=run_name,
            tags={**prefect_tags(), **(tags or {})},
            nested=nested,
        ) as run,
    ):
        yield run


def metrics_file(stage: str, path: str | os.PathLike[str] | None = None) -> Path:
    """The stage's DVC metrics file: ``path``, or ``metrics/<stage>.json`` in the repository."""
    return Path(path) if path is not None else METRICS_DIR / f"{stage}.json"


#: Where a stage's data-check reports (Data Docs) go when it writes its outputs where DVC puts them.
CHECKS_DIR = REPO_ROOT / "reports" / "data_checks"


def data_check_dir(stage: str, out: str | os.PathLike[str], default_out: str | os.PathLike[str]) -> Path:
    """The folder for the data-check reports of one run of ``stage`` (``<stage>`` under ``data_checks``).

    They follow the run's output: with the default output (``default_out``, relative to the repository),
    ``reports/data_checks/<stage>`` in the repository, as DVC runs it; with an output elsewhere
    (``--out /tmp/try/corpus``), ``reports/data_checks/<stage>`` beside it (``/tmp/try/reports/...``),
    so that a trial run neither replaces the pipeline's reports nor writes into a repository it was not
    asked to write into. The folder is the stage's own: the stage empties it before a run.
    """
    if Path(out).resolve() == (REPO_ROOT / default_out).resolve():
        return CHECKS_DIR / stage
    return Path(out).resolve().parent / "reports" / "data_checks" / stage


@contextlib.contextmanager
def stage_outputs(
    stage: str,
    *outs: str | os.PathLike[str],
    metrics_path: str | os.PathLike[str] | None = None,
    dirs: tuple[str | os.PathLike[str], ...] = (),
) -> Iterator[OutputSet]:
    """Stage every out of ``stage`` (``outs`` and its metrics file) and commit them all together, or none.

    :func:`bert_core.atomic.atomic_outputs` over ``outs`` + :func:`metrics_file`: write each out to
    ``staged[out]`` (a ``.<name>.tmp-*`` sibling; a builder that stages its own directory with
    ``atomic_path(staged[out])`` only adds a rename) and the metrics with :func:`write_stage_metrics`
    (``outputs=staged``). An error anywhere, the metrics file included, leaves every previous out in place
    and no temporaries.
    """
    with atomic_outputs([*outs, metrics_file(stage, metrics_path)], dirs=dirs) as staged:
        yield staged


def write_stage_metrics(
    stage: str,
    metrics: dict[str, Any],
    path: str | os.PathLike[str] | None = None,
    *,
    outputs: OutputSet | None = None,
) -> Path:
    """Write the stage's DVC metrics file (``metrics/<stage>.json``): atomically, or into ``outputs``'s
    staged temporary (committed with the stage's other outs); return the final path."""
    path = metrics_file(stage, path)
    write_json_atomic(outputs[path] if outputs is not None else path, metrics)
    return path


def details_file(metrics_path: str | os.PathLike[str]) -> Path:
    """The stage's detailed statistics beside its metrics file: ``details/<name>`` in the metrics file's
    folder (``metrics/details/corpus.json``, ``metrics/finetune/details/sst2.json``).

    The DVC metrics file holds the headline figures a user compares across runs (``dvc metrics show`` and
    ``dvc metrics diff`` print every key as a column); everything else goes here, a plain JSON out.
    """
    path = Path(metrics_path)
    return path.parent / "details" / path.name


#: At most this many flat keys in a stage's DVC metrics file (one terminal-wide ``dvc metrics show`` row).
MAX_HEADLINE = 20


def headline(
    metrics: dict[str, Any], patterns: tuple[str, ...] | list[str], *, main: str | None = None
) -> dict[str, Any]:
    """The headline figures of ``metrics``: its flat keys (:func:`bert_core.params.flatten`) matching
    ``patterns`` (:mod:`fnmatch` patterns, e.g. ``phases.*.steps``; ``{main}`` stands for ``main``, a
    task's main metric), in pattern order, each key once, at most :data:`MAX_HEADLINE` of them.

    ``name=pattern`` puts the first key matching ``pattern`` under ``name``: ``score=dev.{main}`` gives
    every task's metrics file the same columns (``dvc metrics show metrics/finetune`` lines the tasks up,
    whatever their main metric).

    More than :data:`MAX_HEADLINE` matches keep the first ones, with a warning naming the others (they
    stay in the details file): a stage that has run for hours is not failed over a column of its summary.
    """
    flat = flatten(metrics)
    out: dict[str, Any] = {}
    taken: set[str] = set()  # the flat keys already shown (under their name or an alias)
    for entry in patterns:
        name, _, pattern = entry.rpartition("=")
        pattern = pattern.replace("{main}", main) if main is not None else pattern
        keys = [k for k in flat if k not in taken and fnmatch.fnmatchcase(k, pattern)]
        if name:
            keys = keys[:1]
            if keys and name not in out:
                out[name] = flat[keys[0]]
        else:
            out.update({k: flat[k] for k in keys if k not in out})
        taken.update(keys)
    if len(out) > MAX_HEADLINE:
        left = list(out)[MAX_HEADLINE:]
        log.warning(
            "%d headline metrics match %s, more than %d: %s only in the details file; narrow the stage's "
            "headline patterns (flows/stages/__init__.py)",
            len(out),
            list(patterns),
            MAX_HEADLINE,
            left,
        )
        out = {k: out[k] for k in list(out)[:MAX_HEADLINE]}
    return out


def markdown_table(metrics: dict[str, Any], title: str | None = None) -> str:
    rows = [(k, f"{v:.6g}" if isinstance(v, float) else str(v)) for k, v in flatten(metrics).items()]
    table = tabulate(rows, ["metric", "value"], tablefmt="pipe", disable_numparse=True)
    return f"### {title}\n\n{table}" if title else table


def publish_artifact(stage: str, metrics: dict[str, Any]) -> None:
    """Show the stage's metrics as a Markdown table artifact in the Prefect UI (no-op outside a flow run)."""
    try:
        from prefect.artifacts import create_markdown_artifact
        from prefect.context import FlowRunContext

        if FlowRunContext.get() is None:
            return
        key = "".join(c if c.isalnum() else "-" for c in stage.lower())
        create_markdown_artifact(
            key=f"{key}-metrics",
            markdown=markdown_table(metrics, f"{stage} metrics"),
            description=f"Metrics of stage {stage}",
        )
    except Exception as err:  # the UI artifact is a convenience, never fatal
        log.warning("could not publish Prefect artifact for %s: %s", stage, err)


def finish_stage(
    stage: str,
    metrics: dict[str, Any],
    run: StageRun | None = None,
    metrics_path: str | os.PathLike[str] | None = None,
    *,
    written: bool = False,
) -> Path:
    """Log metrics to MLflow (if a run is given), write the DVC metrics file, publish the Prefect artifact.

    ``written=True``: the metrics file was already committed with the stage's other outs
    (:func:`stage_outputs`); it is not written again.
    """
    if run is not None:
        run.log_metrics(metrics)
    path = metrics_file(stage, metrics_path) if written else write_stage_metrics(stage, metrics, metrics_path)
    publish_artifact(stage, metrics)
    return path


@dataclass
class StageBody:
    """What the body of a :func:`stage` block works with and hands back.

    Attributes:
        run: The stage's MLflow run.
        staged: The staged outs: write the out ``out`` to ``body[out]``.
        checks_dir: The run's data-check folder (``None`` for a stage without data checks).
        metrics: Set by :meth:`done`: the headline figures, for the DVC metrics file and the Prefect artifact.
        details: Set by :meth:`done`: every statistic, for the details file (:func:`details_file`) and MLflow.
    """

    run: StageRun
    staged: OutputSet
    checks_dir: Path | None
    metrics: dict[str, Any] | None = None
    details: dict[str, Any] | None = None
    reports: list[Any] = field(default_factory=list)
    artifacts: list[tuple[Path, str | None]] = field(default_factory=list)
    tags: dict[str, Any] = field(default_factory=dict)
    registrations: list[tracking.Registration] = field(default_factory=list)
    after_commit: list[Callable[[], None]] = field(default_factory=list)

    def __getitem__(self, out: str | os.PathLike[str]) -> Path:
        return self.staged[out]

    def write_metrics(self, stage: str, metrics_path: Path, details_path: Path) -> None:
        """The staged details and metrics files; the metrics in the headline's order (task scores first:
        ``dvc metrics show`` prints the columns so)."""
        if self.metrics is None:
            raise RuntimeError(f"stage {stage} finished without its metrics (StageBody.done)")
        write_json_atomic(details_path, self.details)
        write_text_atomic(metrics_path, json.dumps(self.metrics, indent=2, default=str) + "\n")

    def finish(self, label: str) -> None:
        """After the commit: log the data-check reports, artifacts and tags, run the ``then`` steps, log
        the details, and publish the headline as the Prefect artifact ``label``."""
        for report in self.reports:
            try:
                self.run.log_check_report(report)
            except Exception as err:  # a report that cannot be logged must not fail the stage
                log.warning("could not log data-check report %s: %s", getattr(report, "suite", "?"), err)
        for path, where in self.artifacts:
            self.run.log_artifact(path, artifact_path=where)
        if self.tags:
            self.run.set_tags(self.tags)
        for step in self.after_commit:
            step()
        self.run.log_metrics(self.details)
        publish_artifact(label, self.metrics)

    def registered(self, registration: tracking.Registration) -> tracking.Registration:
        """Keep a registration made inside the block: it is withdrawn if the outs are then not committed
        (the registry never names a model the workspace does not hold)."""
        self.registrations.append(registration)
        return registration

    def done(
        self,
        metrics: dict[str, Any],
        *,
        details: dict[str, Any] | None = None,
        reports: list[Any] = (),  # type: ignore[assignment]
        artifacts: list[tuple[str | os.PathLike[str], str | None]] = (),  # type: ignore[assignment]
        tags: dict[str, Any] | None = None,
        then: Callable[[], None] | None = None,
    ) -> None:
        """The stage's result: its headline ``metrics`` (the DVC metrics file: what a user compares across
        runs, a handful of flat keys, see :func:`headline`) and its ``details`` (every statistic: the
        details file and MLflow; default ``metrics``), data-check reports, and what to do once the outs
        are committed: artifacts to log (final paths, with their MLflow artifact folder), tags to set, and
        ``then`` (work on the committed outs, e.g. registering a model directory)."""
        self.metrics = metrics
        self.details = details if details is not None else metrics
        self.reports += [r for r in reports if r is not None]
        self.artifacts += [(Path(p), where) for p, where in artifacts]
        self.tags |= tags or {}
        if then is not None:
            self.after_commit.append(then)


def _log_checks_dir(run: StageRun, checks_dir: Path | None) -> None:
    """The run's data-check folder as MLflow artifacts (also after a failure: the failed check's report)."""
    if checks_dir is not None and checks_dir.exists():
        try:
            run.log_artifact(checks_dir, artifact_path=f"data_checks/{checks_dir.name}")
        except Exception as err:  # the stage's own outcome matters more
            log.warning("could not log the data-check reports in %s: %s", checks_dir, err)


def _withdraw(registrations: list[tracking.Registration]) -> None:
    for registration in reversed(registrations):
        try:
            registration.withdraw()
        except Exception as err:  # the stage's own error is the one to report
            log.error(
                "could not withdraw %s version %s: %s; delete it in the MLflow UI",
                registration.name,
                registration.version,
                err,
            )


@contextlib.contextmanager
def stage(
    name: str,
    params: Any,
    *outs: str | os.PathLike[str],
    metrics_path: str | os.PathLike[str] | None = None,
    dirs: tuple[str | os.PathLike[str], ...] = (),
    checks_dir: Path | None = None,
    experiment: str = PIPELINE_EXPERIMENT,
    run_name: str | None = None,
    tags: dict[str, Any] | None = None,
) -> Iterator[StageBody]:
    """One stage run, from the fail-fast checks to the committed outs (see the module docstring).

    Args:
        name: The stage (its metrics file is ``metrics/<name>.json`` unless ``metrics_path`` is given).
        params: Logged as the MLflow run's params (a params model or a dict).
        outs: The stage's outs; written to ``body[out]``, committed with the metrics and details files,
            all or none.
        metrics_path: The DVC metrics file (its details file: :func:`details_file`).
        dirs: Outs created as empty directories before the block.
        checks_dir: The run's data-check folder: emptied first, logged to MLflow afterwards (also on failure).
        experiment, run_name, tags: The MLflow run's experiment, name (also the Prefect artifact's; default
            ``name``) and extra tags.

    Raises:
        RuntimeError: the block ended without calling :meth:`StageBody.done`.
    """
    final_metrics = metrics_file(name, metrics_path)
    final_details = details_file(final_metrics)
    check_writable(*outs, final_metrics, final_details)  # fail fast, before any work, naming the out
    if checks_dir is not None:
        shutil.rmtree(checks_dir, ignore_errors=True)  # a failed check's message points at its report
    with stage_run(name, params, experiment=experiment, run_name=run_name, tags=tags) as run:
        body: StageBody | None = None
        try:
            with atomic_outputs([*outs, final_metrics, final_details], dirs=dirs) as staged:
                body = StageBody(run, staged, checks_dir)
                yield body
                body.write_metrics(name, staged[final_metrics], staged[final_details])
        except BaseException:
            if body is not None:
                _withdraw(body.registrations)
            raise
        finally:
            _log_checks_dir(run, checks_dir)
        body.finish(run_name or name)
