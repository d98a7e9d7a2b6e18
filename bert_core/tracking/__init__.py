"""MLflow tracking shared by every stage (imports mlflow lazily; never Prefect or DVC).

Public API (import from here):

- :func:`stage_run`, :class:`StageRun`, :func:`retry_tracking`, :func:`tracking_uri`,
  :func:`git_commit`, :func:`pipeline_run_id`, :func:`numeric_metrics`,
  :data:`PIPELINE_EXPERIMENT`, :data:`FINETUNE_EXPERIMENT` (``run``): one MLflow run per stage run.
  :func:`check_tracking_server`, :class:`TrackingUnavailable`, :func:`bound_http_retries` (``run``):
  failing fast on a tracking server that does not answer (or, for a reader, a missing SQLite store);
  :func:`ensure_tracking_store`, :class:`TrackingStoreRemoved` (``store``): a SQLite store created whole,
  removed mid-run; :class:`TrackingStoreBusy` (``busy``): one another process keeps locked.
- :class:`RetryingSink`, :func:`mlflow_sink`, :func:`fan_out`, ``MetricsCallback`` (``sink``): the
  training loop's buffered, retrying metric sink.
- :func:`register`, :class:`Registration` (``registry``): the one registration path of every stage.
- :func:`fingerprint`, :data:`FINGERPRINT_TAG`, :func:`registered_version` (``fingerprint``): which
  registered version a local model directory is.
- :func:`resolve_model_source`, :class:`ResolvedSource` (``source``): a local or registry model source.
- :class:`MlflowTrialTracker` (``trials``): one nested run per fine-tuning trial.
"""

from bert_core.tracking.busy import TrackingStoreBusy
from bert_core.tracking.fingerprint import FINGERPRINT_TAG, fingerprint, registered_version
from bert_core.tracking.registry import Registration, register
from bert_core.tracking.run import (
    FINETUNE_EXPERIMENT,
    PIPELINE_EXPERIMENT,
    StageRun,
    TrackingUnavailable,
    bound_http_retries,
    check_tracking_server,
    git_commit,
    numeric_metrics,
    pipeline_run_id,
    retry_tracking,
    stage_run,
    tracking_uri,
)
from bert_core.tracking.sink import MetricRecord, MetricsCallback, RetryingSink, fan_out, mlflow_sink
from bert_core.tracking.source import ResolvedSource, resolve_model_source
from bert_core.tracking.store import TrackingStoreRemoved, ensure_tracking_store
from bert_core.tracking.trials import MlflowTrialTracker

__all__ = [
    "FINETUNE_EXPERIMENT",
    "FINGERPRINT_TAG",
    "PIPELINE_EXPERIMENT",
    "MetricRecord",
    "MetricsCallback",
    "MlflowTrialTracker",
    "Registration",
    "ResolvedSource",
    "RetryingSink",
    "StageRun",
    "TrackingStoreBusy",
    "TrackingStoreRemoved",
    "TrackingUnavailable",
    "bound_http_retries",
    "check_tracking_server",
    "ensure_tracking_store",
    "fan_out",
    "fingerprint",
    "git_commit",
    "mlflow_sink",
    "numeric_metrics",
    "pipeline_run_id",
    "register",
    "registered_version",
    "resolve_model_source",
    "retry_tracking",
    "stage_run",
    "tracking_uri",
]
