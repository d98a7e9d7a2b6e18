"""The stage pattern, shared by every flow: one MLflow run per stage run, metrics for DVC, a Prefect artifact.

A flow module is thin::

    @flow(name="corpus")
    def corpus_flow(params_file: str = "params/corpus.yaml") -> dict:
        params = load_params(params_file, "corpus", CorpusParams)
        with stage_run("corpus", params) as run:
            stats = build_corpus(params, ...)          # the typed bert_core function
            run.log_metrics(stats.as_metrics())
            finish_stage("corpus", stats.as_metrics(), run)   # metrics/corpus.json + Prefect artifact
        return stats.as_metrics()

Tracking defaults to a SQLite file in the repository (``mlflow.db``); ``MLFLOW_TRACKING_URI`` overrides it.
Tracking calls are retried with backoff (a briefly unreachable server must not fail a stage); deterministic
failures in the stage itself are never retried.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import math
import os
import subprocess
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

from bert_core.atomic import process_alive, write_json_atomic
from bert_core.constants import REPO_ROOT
from bert_core.params import flatten

METRICS_DIR = REPO_ROOT / "metrics"
PIPELINE_EXPERIMENT = "bert-pipeline"
FINETUNE_EXPERIMENT = "bert-finetune"

log = logging.getLogger("bert_core.stage")
T = TypeVar("T")


def tracking_uri() -> str:
    """``MLFLOW_TRACKING_URI`` or the repository's SQLite store (absolute, so the cwd does not matter)."""
    return os.environ.get("MLFLOW_TRACKING_URI") or f"sqlite:///{REPO_ROOT / 'mlflow.db'}"


def ensure_tracking_store(uri: str) -> None:
    """Create a new SQLite tracking store whole or not at all (other stores: nothing to do).

    MLflow creates its schema table by table, then migrates it; a stage killed during that first
    initialisation would leave a half-created database on which every later run fails ("table ... already
    exists"). The schema is built in a temporary file and linked into place only when complete; when
    another process got there first, its store is kept.
    """
    if not uri.startswith("sqlite:///"):
        return
    path = Path(uri.removeprefix("sqlite:///").split("?", 1)[0])
    for stale in path.parent.glob(f".{path.name}.tmp-*"):  # left by a process killed while creating it
        pid = stale.name.rsplit(".tmp-", 1)[1].split("-", 1)[0]
        if pid.isdigit() and not process_alive(int(pid)):
            stale.unlink(missing_ok=True)
    if path.exists():
        return
    from mlflow.store.tracking import DEFAULT_LOCAL_FILE_AND_ARTIFACT_PATH
    from mlflow.store.tracking.sqlalchemy_store import SqlAlchemyStore

    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}")
    try:
        store = SqlAlchemyStore(f"sqlite:///{tmp}", DEFAULT_LOCAL_FILE_AND_ARTIFACT_PATH)
        store.engine.dispose()
        try:
            os.link(tmp, path)  # fails if another process created the store meanwhile: keep theirs
        except FileExistsError:
            pass
        except OSError:  # a filesystem without hard links
            if not path.exists():
                os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def git_commit() -> str:
    """The current git commit (with ``-dirty`` when the work tree has changes), or ``unknown``."""
    try:
        sha = subprocess.run(
            ["git", "rev-parse", "HEAD"],
            cwd=REPO_ROOT,
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=REPO_ROOT,
            capture_output=True,
            text=True,
            timeout=10,
        ).stdout.strip()
        return sha + ("-dirty" if dirty else "")
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def pipeline_run_id() -> str:
    """Id shared by every stage run of one pipeline run (``BERT_PIPELINE_RUN_ID``; set by the pipeline flow)."""
    value = os.environ.get("BERT_PIPELINE_RUN_ID")
    if not value:
        value = f"adhoc-{uuid.uuid4().hex[:12]}"
        os.environ["BERT_PIPELINE_RUN_ID"] = value
    return value


def retry_tracking(fn: Callable[..., T], *, attempts: int = 6, first_delay: float = 0.5) -> Callable[..., T]:
    """Retry a tracking call with exponential backoff (0.5 s .. 16 s); re-raise after the last attempt."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> T:
        delay = first_delay
        for attempt in range(1, attempts + 1):
            try:
                return fn(*args, **kwargs)
            except Exception as err:  # any transport error is worth a retry here
                if attempt == attempts:
                    raise
                log.warning(
                    "tracking call %s failed (%s); retry %d/%d in %.1fs",
                    getattr(fn, "__name__", fn),
                    err,
                    attempt,
                    attempts - 1,
                    delay,
                )
                time.sleep(delay)
                delay = min(delay * 2, 16.0)
        raise AssertionError("unreachable")

    return wrapper


def numeric_metrics(metrics: dict[str, Any]) -> dict[str, float]:
    """Flatten and keep the finite numbers (MLflow metrics must be floats)."""
    out = {}
    for k, v in flatten(metrics).items():
        if isinstance(v, bool):
            v = float(v)
        if isinstance(v, int | float) and math.isfinite(float(v)):
            out[k.replace("@", "_")] = float(v)
    return out


class StageRun:
    """Retrying facade over one active MLflow run."""

    def __init__(self, stage: str, run: Any) -> None:
        self.stage = stage
        self.run = run
        self.run_id: str = run.info.run_id

    def log_metrics(self, metrics: dict[str, Any], step: int | None = None) -> None:
        import mlflow

        values = numeric_metrics(metrics)
        if values:
            retry_tracking(mlflow.log_metrics)(values, step=step)

    def log_params(self, params: dict[str, Any]) -> None:
        import mlflow

        flat = {k: str(v)[:6000] for k, v in flatten(params).items()}
        items = list(flat.items())
        for i in range(0, len(items), 100):
            retry_tracking(mlflow.log_params)(dict(items[i : i + 100]))

    def set_tags(self, tags: dict[str, Any]) -> None:
        import mlflow

        retry_tracking(mlflow.set_tags)({k: str(v) for k, v in tags.items()})

    def log_artifact(self, path: str | os.PathLike[str], artifact_path: str | None = None) -> None:
        import mlflow

        path = Path(path)
        if path.is_dir():
            retry_tracking(mlflow.log_artifacts)(str(path), artifact_path=artifact_path)
        elif path.exists():
            retry_tracking(mlflow.log_artifact)(str(path), artifact_path=artifact_path)

    def log_check_report(self, report: Any) -> None:
        """Keep a data-check report (Data Docs HTML + summary) under ``data_checks/<suite>``."""
        self.log_metrics({f"checks.{report.suite}.failed": len(report.failed)})
        if getattr(report, "report_dir", None):
            self.log_artifact(report.report_dir, artifact_path=f"data_checks/{report.suite}")
        import mlflow

        retry_tracking(mlflow.log_dict)(report.summary(), f"data_checks/{report.suite}/summary.json")


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
    """Open one MLflow run for a stage run: params, standard tags; status FAILED if the block raises."""
    import mlflow

    ensure_tracking_store(tracking_uri())
    retry_tracking(mlflow.set_tracking_uri)(tracking_uri())
    retry_tracking(mlflow.set_experiment)(experiment)
    base_tags = {
        "stage": stage,
        "git_commit": git_commit(),
        "pipeline_run_id": pipeline_run_id(),
        "dvc_experiment": os.environ.get("DVC_EXP_NAME", ""),
        "data_root": "local" if os.environ.get("BERT_DATA_ROOT") else "hub",
    }
    with contextlib.suppress(Exception):
        from prefect.runtime import flow_run

        if flow_run.id:
            base_tags["prefect_flow_run_id"] = flow_run.id
    run = retry_tracking(mlflow.start_run)(
        run_name=run_name or stage, nested=nested, tags={**base_tags, **(tags or {})}
    )
    handle = StageRun(stage, run)
    try:
        if params is not None:
            handle.log_params(params if isinstance(params, dict) else params.model_dump(mode="json"))
        yield handle
    except BaseException:
        with contextlib.suppress(Exception):
            mlflow.end_run(status="FAILED")
        raise
    else:
        retry_tracking(mlflow.end_run)(status="FINISHED")


def write_stage_metrics(
    stage: str, metrics: dict[str, Any], path: str | os.PathLike[str] | None = None
) -> Path:
    """Write the stage's DVC metrics file (``metrics/<stage>.json``) atomically."""
    path = Path(path) if path is not None else METRICS_DIR / f"{stage}.json"
    return write_json_atomic(path, metrics)


def markdown_table(metrics: dict[str, Any], title: str | None = None) -> str:
    lines = [f"### {title}", ""] if title else []
    lines += ["| metric | value |", "|---|---|"]
    for k, v in flatten(metrics).items():
        if isinstance(v, float):
            v = f"{v:.6g}"
        lines.append(f"| {k} | {v} |")
    return "\n".join(lines)


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
) -> Path:
    """Log metrics to MLflow (if a run is given), write the DVC metrics file, publish the Prefect artifact."""
    if run is not None:
        run.log_metrics(metrics)
    path = write_stage_metrics(stage, metrics, metrics_path)
    publish_artifact(stage, metrics)
    return path
