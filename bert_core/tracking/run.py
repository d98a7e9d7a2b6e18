"""One MLflow run per stage run, and the retries that keep a briefly unreachable server from failing it.

A stage function opens its run with :func:`stage_run` and logs through the returned :class:`StageRun`
(every call retried with backoff; deterministic failures in the stage itself are never retried)::

    with stage_run("corpus", params) as run:
        stats = build_corpus(params, ...)
        run.log_metrics(stats.as_metrics())

Every run carries the standard tags (``stage``, ``git_commit``, ``pipeline_run_id``, ``dvc_experiment``,
``data_root``); an orchestrator adds its own through ``tags`` (``flows/_stage.py``: the Prefect flow-run id).
Tracking defaults to a SQLite file in the repository (``mlflow.db``); ``MLFLOW_TRACKING_URI`` overrides it.

Failing fast: :func:`stage_run` first checks that an ``http(s)`` tracking server answers
(:func:`check_tracking_server`: a few seconds, three attempts) and raises :class:`TrackingUnavailable`
naming the URI otherwise, before the stage does any work. MLflow's own HTTP retries are bounded for this
process (:data:`HTTP_CLIENT_DEFAULTS`, set only where the user has not set them), and :func:`retry_tracking`
stops retrying after :data:`RETRY_BUDGET_S`, so a server that goes away mid-run fails a tracking call within
about a minute instead of MLflow's four minutes per call. A SQLite store removed (or replaced) while the
stage runs is a deterministic failure: :class:`TrackingStoreRemoved`, at once, without retries.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import math
import os
import time
import urllib.parse
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

from bert_core.params import flatten
from bert_core.tracking.busy import (
    STORE_BUSY_ATTEMPTS,
    release_interrupted_writes,
    store_busy_error,
    store_locked,
)
from bert_core.tracking.provenance import git_commit, pipeline_run_id
from bert_core.tracking.store import (
    TrackingStoreRemoved,
    TrackingUnavailable,
    check_store_present,
    default_store_uri,
    ensure_tracking_store,
    forget_store_connections,
    require_store,
    sqlite_store_path,
    tracking_uri,
    watch_store,
)

#: The experiment of the pipeline's stage runs (corpus, vocab, pretrain_data, pretrain, evaluate).
PIPELINE_EXPERIMENT = "bert-pipeline"
#: The experiment of the fine-tuning runs (one parent run per task, one nested run per trial).
FINETUNE_EXPERIMENT = "bert-finetune"

log = logging.getLogger("bert_core.stage")
T = TypeVar("T")


#: MLflow's HTTP client settings for this process, unless the user set them: at most 2 retries 1-2 s apart
#: and 30 s per request (MLflow's defaults, 7 retries with a backoff factor of 2 and 120 s per request,
#: make one call to a server that is down take about 4 minutes).
HTTP_CLIENT_DEFAULTS = {
    "MLFLOW_HTTP_REQUEST_MAX_RETRIES": "2",
    "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR": "1",
    "MLFLOW_HTTP_REQUEST_TIMEOUT": "30",
}
#: :func:`retry_tracking` starts no new attempt this many seconds after the first one began.
RETRY_BUDGET_S = 60.0
#: The pre-flight check of an http(s) tracking server: attempts, seconds per request, pause between them.
PREFLIGHT_ATTEMPTS = 3
PREFLIGHT_TIMEOUT_S = 5.0
PREFLIGHT_PAUSE_S = 1.0


def _sleep(seconds: float) -> None:
    """``time.sleep`` (one place for tests to record the pauses of this module)."""
    time.sleep(seconds)


def bound_http_retries() -> None:
    """Set :data:`HTTP_CLIENT_DEFAULTS` in this process's environment where the user has not set them.

    MLflow reads these variables at every request, so this takes effect for calls made afterwards; a
    value the user exported (or a test set) is kept.
    """
    for name, value in HTTP_CLIENT_DEFAULTS.items():
        os.environ.setdefault(name, value)


def redact_uri(uri: str) -> str:
    """``uri`` without a password (``http://user:secret@host`` -> ``http://user:***@host``)."""
    parts = urllib.parse.urlsplit(uri)
    if parts.password is None:
        return uri
    netloc = parts.netloc.rsplit("@", 1)
    return urllib.parse.urlunsplit(parts._replace(netloc=f"{parts.username}:***@{netloc[-1]}"))


def _short(err: BaseException, limit: int = 200) -> str:
    text = " ".join(f"{type(err).__name__}: {err}".split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _reason(err: BaseException, timeout_s: float, secret: str | None) -> str:
    """A short reason for a failed request (``connection refused``, ``no answer within 5 s``, ...)."""
    text = " ".join(str(err).split())
    for needle, reason in (
        ("Connection refused", "connection refused (nothing listens on that port)"),
        ("timed out", f"no answer within {timeout_s:g} s"),
        ("timeout", f"no answer within {timeout_s:g} s"),
        ("Name or service not known", "host name not found"),
        ("NameResolutionError", "host name not found"),
        ("No route to host", "no route to host"),
        ("SSLError", "TLS handshake failed"),
        ("Connection reset", "connection reset by the server"),
        ("RemoteDisconnected", "the server closed the connection without answering"),
    ):
        if needle.lower() in text.lower():
            return reason
    short = _short(err)
    return short.replace(secret, "***") if secret else short


def check_tracking_server(
    uri: str,
    *,
    reading: bool = False,
    attempts: int = PREFLIGHT_ATTEMPTS,
    timeout_s: float = PREFLIGHT_TIMEOUT_S,
    pause_s: float = PREFLIGHT_PAUSE_S,
) -> None:
    """Raise :class:`TrackingUnavailable` unless the http(s) tracking server ``uri`` answers (others: no-op).

    One GET of ``<uri>/api/2.0/mlflow/experiments/search?max_results=1`` (with the credentials MLflow
    itself would send) per attempt, ``timeout_s`` each, no MLflow-level retries: a server that refuses
    connections fails in about ``attempts * pause_s`` seconds, one that accepts and never answers in
    about ``attempts * (timeout_s + pause_s)``. Any answer below 500 counts as reachable, except 401/403
    (credentials), which fails at once. ``reading``: a command that only reads the store; a SQLite store
    must then exist (:func:`~bert_core.tracking.store.require_store`).
    """
    if reading:
        require_store(uri)
    if urllib.parse.urlsplit(uri).scheme.lower() not in ("http", "https"):
        return
    from mlflow.utils.credentials import get_default_host_creds
    from mlflow.utils.rest_utils import http_request

    shown = redact_uri(uri)
    port = urllib.parse.urlsplit(uri).port or "<port>"
    what_to_do = (
        f"Start the tracking server (e.g. `mlflow server --host 127.0.0.1 --port {port}`), fix "
        f"MLFLOW_TRACKING_URI, or unset it to use the local SQLite store ({default_store_uri()})"
    )
    started = time.monotonic()
    last = ""
    for attempt in range(1, attempts + 1):
        try:
            resp = http_request(
                get_default_host_creds(uri),
                "/api/2.0/mlflow/experiments/search",
                "GET",
                params={"max_results": 1},
                raise_on_status=False,
                retry_codes=(),
                max_retries=0,
                backoff_factor=0,
                backoff_jitter=0,
                timeout=timeout_s,
            )
        except Exception as err:  # connection refused, timeout, DNS, TLS: the server is not reachable
            last = _reason(err, timeout_s, urllib.parse.urlsplit(uri).password)
        else:
            if resp.status_code in (401, 403):
                raise TrackingUnavailable(
                    f"the MLflow tracking server {shown} refused this client (HTTP {resp.status_code}); "
                    "set MLFLOW_TRACKING_USERNAME and MLFLOW_TRACKING_PASSWORD (or MLFLOW_TRACKING_TOKEN), "
                    "or point MLFLOW_TRACKING_URI at another server"
                )
            if resp.status_code < 500:
                return
            last = f"HTTP {resp.status_code} {resp.reason or ''}".strip()
        if attempt < attempts:
            _sleep(pause_s)
    raise TrackingUnavailable(
        f"the MLflow tracking server {shown} (MLFLOW_TRACKING_URI) does not answer: {attempts} attempt(s) "
        f"in {time.monotonic() - started:.0f} s, last: {last}. {what_to_do}; nothing was run"
    )


def retry_tracking(
    fn: Callable[..., T], *, attempts: int = 6, first_delay: float = 0.5, budget_s: float | None = None
) -> Callable[..., T]:
    """Retry a tracking call with exponential backoff (0.5 s .. 16 s); re-raise after the last attempt.

    No attempt starts more than ``budget_s`` (default :data:`RETRY_BUDGET_S`) after the first one; with
    MLflow's HTTP retries bounded (:func:`bound_http_retries`) a server that is gone fails the call in
    about a minute. A SQLite store removed while the stage runs fails at once with
    :class:`TrackingStoreRemoved` (retrying cannot bring it back); one that another process keeps locked
    fails after :data:`STORE_BUSY_ATTEMPTS` attempts (10 to 40 s) with :class:`TrackingStoreBusy`, which
    names the file and what to do.
    """

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> T:
        budget = RETRY_BUDGET_S if budget_s is None else budget_s
        # a stat(): name a removed store before MLflow logs its SQLAlchemy traceback
        check_store_present(tracking_uri())
        started = time.monotonic()
        delay, locked = first_delay, 0
        for attempt in range(1, attempts + 1):
            try:
                return fn(*args, **kwargs)
            except Exception as err:  # any transport error is worth a retry here
                check_store_present(tracking_uri())  # a deleted store is deterministic: name it, never retry
                if store_locked(err) and (store := sqlite_store_path(tracking_uri())) is not None:
                    locked += 1
                    if locked >= STORE_BUSY_ATTEMPTS or attempt == attempts:
                        raise store_busy_error(store, time.monotonic() - started) from err
                elif attempt == attempts or time.monotonic() - started + delay > budget:
                    raise
                log.warning(
                    "tracking call %s failed (%s); retry %d/%d in %.1fs",
                    getattr(fn, "__name__", fn),
                    err,
                    attempt,
                    attempts - 1,
                    delay,
                )
                _sleep(delay)
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
    """Open one MLflow run for a stage run: params, standard tags; status FAILED if the block raises.

    ``tags`` are added to the standard ones (and win on a clash): the stage's own, an orchestrator's run id.
    """
    import mlflow

    bound_http_retries()
    uri = tracking_uri()
    check_tracking_server(uri)
    ensure_tracking_store(uri)
    watch_store(uri)
    retry_tracking(mlflow.set_tracking_uri)(uri)
    base_tags = {
        "stage": stage,
        "git_commit": git_commit(),
        "pipeline_run_id": pipeline_run_id(),
        "dvc_experiment": os.environ.get("DVC_EXP_NAME", ""),
        "data_root": "local" if os.environ.get("BERT_DATA_ROOT") else "hub",
    }
    started = False
    try:
        tag_experiment_kind(retry_tracking(mlflow.set_experiment)(experiment))
        run = retry_tracking(mlflow.start_run)(
            run_name=run_name or stage, nested=nested, tags={**base_tags, **(tags or {})}
        )
        started = True
        handle = StageRun(stage, run)
        if params is not None:
            handle.log_params(params if isinstance(params, dict) else params.model_dump(mode="json"))
        yield handle
    except BaseException as err:
        if not isinstance(err, Exception):  # a signal: the store call it interrupted may still hold the lock
            release_interrupted_writes(err, sqlite_store_path(uri))
        if not started:
            raise
        quiet = logging.getLogger("mlflow.store.db.utils")
        level = quiet.level
        if isinstance(err, TrackingStoreRemoved):  # marking the run FAILED cannot work: no SQL traceback
            quiet.setLevel(logging.CRITICAL)
        try:
            with contextlib.suppress(Exception):
                mlflow.end_run(status="FAILED")  # ends the run locally even when the store is gone
        finally:
            quiet.setLevel(level)
        if isinstance(err, TrackingStoreRemoved) and (path := sqlite_store_path(uri)) is not None:
            forget_store_connections(path)  # after end_run: a fresh connection would create an empty file
        raise
    else:
        retry_tracking(mlflow.end_run)(status="FINISHED")


# ====================================================================== what the MLflow UI shows
#: Experiment tag that picks the MLflow UI's view: without it MLflow 3 may open the GenAI (traces) view.
EXPERIMENT_KIND_TAG = "mlflow.experimentKind"
#: The model-training view (runs table, metrics, datasets); the UI's ``CUSTOM_MODEL_DEVELOPMENT``.
EXPERIMENT_KIND = "custom_model_development"


def tag_experiment_kind(experiment: Any) -> None:
    """Tag ``experiment`` (an MLflow ``Experiment``) as a model-training experiment unless it already is (a
    kind chosen in the UI is kept). A failure only costs the UI's default view: logged, never raised."""
    import mlflow

    client = mlflow.MlflowClient()

    def set_experiment_tag() -> None:  # the name the retry's warning shows
        try:
            client.set_experiment_tag(experiment.experiment_id, EXPERIMENT_KIND_TAG, EXPERIMENT_KIND)
        except Exception:  # stages that start together: on SQLite the later ones hit the tag's unique key
            if not client.get_experiment(experiment.experiment_id).tags.get(EXPERIMENT_KIND_TAG):
                raise

    try:
        if (getattr(experiment, "tags", None) or {}).get(EXPERIMENT_KIND_TAG):
            return
        retry_tracking(set_experiment_tag, attempts=3)()
    except Exception as err:  # the UI's default view only
        log.warning(
            "could not tag experiment %s as %s: %s", getattr(experiment, "name", "?"), EXPERIMENT_KIND, err
        )
