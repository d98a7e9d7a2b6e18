"""The stage runner's half of every stage flow: :func:`stage` owns outputs, tracking, reports and metrics.

A stage flow is a recipe::

    with stage("corpus", params, out_dir, metrics_path=metrics_path, checks_dir=...) as s:
        stats = build_corpus(params, s[out_dir], report_dir=s.checks_dir / "corpus")  # the library entry
        s.done(stats.as_metrics(), reports=[stats.check_report])

Signals, exit codes and argument parsing are the command line's (:mod:`flows._cli`).
"""

from __future__ import annotations

import contextlib
import fnmatch
import json
import logging
import os
import re
import shutil
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tabulate import tabulate

from bert_core import tracking
from bert_core.atomic import (
    TEMP_MARKER,
    OutputSet,
    atomic_outputs,
    check_writable,
    write_json_atomic,
    write_text_atomic,
)
from bert_core.constants import REPO_ROOT, repo_relative
from bert_core.params import flatten
from bert_core.tracking import PIPELINE_EXPERIMENT, StageRun
from flows.stages import details_file, get


def in_repo(path: str | os.PathLike[str], what: str = "path") -> Path:
    """A path from params or a run form: an absolute one as given; a relative one inside the repository
    (a form's ``../..`` never leaves it: ``ValueError`` naming ``what``)."""
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
    run, the run's logs in Prefect (whose logging setup leaves them at WARNING); restored afterwards."""
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


def _prefect_tags() -> dict[str, str]:
    with contextlib.suppress(Exception):
        from prefect.runtime import flow_run

        if flow_run.id:
            return {"prefect_flow_run_id": flow_run.id}
    return {}


def metrics_file(stage: str, path: str | os.PathLike[str] | None = None) -> Path:
    """The stage's DVC metrics file: ``path``, or the stage table's (``metrics/<stage>.json``) in the repository."""
    return Path(path) if path else REPO_ROOT / get(stage).metrics[0]  # an empty form field: the default


#: Where a stage's data-check reports (Data Docs) go when it writes its outputs where DVC puts them.
CHECKS_DIR = REPO_ROOT / "reports" / "data_checks"


def data_check_dir(stage: str, out: str | os.PathLike[str], default_out: str | os.PathLike[str]) -> Path:
    """The data-check folder of one run of ``stage``: ``reports/data_checks/<stage>`` in the repository for
    the default output, else beside the output (``--out /tmp/try/corpus`` → ``/tmp/try/reports/...``), so
    a trial run never replaces the pipeline's reports. The stage empties it before a run."""
    if Path(out).resolve() == (REPO_ROOT / default_out).resolve():
        return CHECKS_DIR / stage
    return Path(out).resolve().parent / "reports" / "data_checks" / stage


#: At most this many flat keys in a stage's DVC metrics file (one terminal-wide ``dvc metrics show`` row).
MAX_HEADLINE = 20


def headline(
    metrics: dict[str, Any], patterns: tuple[str, ...] | list[str], *, main: str | None = None
) -> dict[str, Any]:
    """The flat keys of ``metrics`` matching the :mod:`fnmatch` ``patterns``, in pattern order, each once,
    at most :data:`MAX_HEADLINE` (the rest with a warning: they stay in the details file). ``{main}`` stands
    for a task's main metric; ``name=pattern`` puts the first match under ``name`` (``score=dev.{main}``
    gives every task the same ``dvc metrics show`` columns)."""
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


def markdown_artifact(key: str, markdown: str, description: str) -> None:
    """A Markdown artifact of the current Prefect run in its UI (none outside a run); ``key`` is made a
    valid artifact key. A convenience: a failure to create one is only logged."""
    try:
        from prefect.artifacts import create_markdown_artifact
        from prefect.context import FlowRunContext, TaskRunContext

        if FlowRunContext.get() is None and TaskRunContext.get() is None:
            return
        key = re.sub(r"-+", "-", re.sub(r"[^a-z0-9]", "-", key.lower())).strip("-")
        create_markdown_artifact(key=key, markdown=markdown, description=description)
    except Exception as err:
        log.warning("could not create the Prefect artifact %s: %s", key, err)


def metrics_artifact(key: str, stage: str, metrics: dict[str, Any]) -> None:
    """The stage's metrics as a Markdown table artifact (:func:`markdown_artifact`)."""
    markdown_artifact(key, markdown_table(metrics, f"{stage} metrics"), f"Metrics of {stage}")


@dataclass
class StageBody:
    """What a :func:`stage` block works with (``run``, ``body[out]`` the staged out, ``checks_dir``) and
    hands back through :meth:`done`."""

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
        """The staged details and metrics files (the metrics in the headline's order)."""
        if self.metrics is None:
            raise RuntimeError(f"stage {stage} finished without its metrics (StageBody.done)")
        write_json_atomic(details_path, self.details)
        write_text_atomic(metrics_path, json.dumps(self.metrics, indent=2, default=str) + "\n")

    def finish(self, label: str) -> None:
        """After the commit: reports, artifacts, tags, ``then`` steps, details; the headline to Prefect."""
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
        metrics_artifact(f"{label}-metrics", label, self.metrics)

    def registered(self, registration: tracking.Registration) -> tracking.Registration:
        """Keep a registration made inside the block: withdrawn if the outs are then not committed."""
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
        """The stage's result: headline ``metrics`` (the DVC metrics file), ``details`` (every statistic;
        default ``metrics``), data-check reports, and what to do once the outs are committed: artifacts
        (final paths, MLflow folder), tags, and ``then`` (e.g. registering the committed model)."""
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
def _fresh(checks_dir: Path | None) -> Iterator[None]:
    """The run's data-check folder starts empty (a failed check's message points at its report); the
    previous run's reports, kept aside, come back when the run fails before writing any."""
    if checks_dir is None or not checks_dir.exists():
        yield
        return
    old = checks_dir.with_name(f".{checks_dir.name}{TEMP_MARKER}old-{os.getpid()}")
    shutil.rmtree(old, ignore_errors=True)
    os.replace(checks_dir, old)
    try:
        yield
    except BaseException:
        if not checks_dir.exists():
            os.replace(old, checks_dir)
        raise
    finally:
        shutil.rmtree(old, ignore_errors=True)


@contextlib.contextmanager
def stage(
    name: str,
    params: Any,
    *outs: str | os.PathLike[str],
    metrics_path: str | os.PathLike[str] | None = None,
    dirs: tuple[str | os.PathLike[str], ...] = (),
    plots: tuple[str | os.PathLike[str], ...] = (),
    checks_dir: Path | None = None,
    experiment: str = PIPELINE_EXPERIMENT,
    run_name: str | None = None,
    tags: dict[str, Any] | None = None,
) -> Iterator[StageBody]:
    """One stage run: every out checked writable before any work (``dirs``: the outs that are directories,
    created empty), ``checks_dir`` emptied, one MLflow run (``params`` its params), the ``outs`` staged and
    committed with the ``plots`` (CSV), the metrics and details files, all or none; a registration made in
    the block withdrawn when the commit fails; the data-check folder logged even on failure."""
    final_metrics = metrics_file(name, metrics_path)
    final_details = details_file(final_metrics)
    # a slip of the hand never replaces a params file or a user's notes with a stage's JSON or CSV
    for path, suffix, what in [
        (final_metrics, ".json", "metrics file"),
        *((p, ".csv", "plot") for p in plots),
    ]:
        if Path(path).suffix != suffix:
            raise ValueError(
                f"{what} {path}: a stage writes {suffix[1:].upper()} there; give a path ending in {suffix}"
            )
    dir_outs = {Path(d) for d in dirs}
    for out in outs:  # fail fast, before any work, naming the out
        check_writable(out, is_dir=Path(out) in dir_outs or None)
    check_writable(*plots, final_metrics, final_details, is_dir=False)
    with (
        _fresh(checks_dir),
        library_logs(),
        tracking.stage_run(
            name, params, experiment=experiment, run_name=run_name, tags={**_prefect_tags(), **(tags or {})}
        ) as run,
    ):
        body: StageBody | None = None
        try:
            with atomic_outputs([*outs, *plots, final_metrics, final_details], dirs=dirs) as staged:
                body = StageBody(run, staged, checks_dir)
                yield body
                body.write_metrics(name, staged[final_metrics], staged[final_details])
        except BaseException:
            if body is not None:
                _withdraw(body.registrations)
            raise
        finally:
            _log_checks_dir(run, checks_dir)
        log.info(
            "%s: outputs in place: %s", run_name or name, ", ".join(repo_relative(o) for o in staged.finals)
        )
        body.finish(run_name or name)
