"""Nested MLflow runs: one per fine-tuning trial under the task's run.

Metrics go through the retrying background sink (:class:`bert_core.tracking.sink.RetryingSink`), so a
briefly unreachable tracking server does not stop fine-tuning.
"""

from __future__ import annotations

import contextlib
import logging
import math
from collections.abc import Iterator, Mapping
from typing import Any

from bert_core.tracking.ui import HEADLINE_METRIC

log = logging.getLogger(__name__)


class _TrialRun:
    """Recorder of one nested run: metrics go through a retrying background sink."""

    def __init__(self, run_id: str, main_metric: str | None = None) -> None:
        from bert_core.tracking.sink import mlflow_sink

        self.run_id = run_id
        self.main_metric = main_metric
        self._sink = mlflow_sink(run_id)

    def log_metrics(self, metrics: Mapping[str, float], step: int | None = None) -> None:
        values = {k: float(v) for k, v in metrics.items() if v is not None and math.isfinite(float(v))}
        if self.main_metric is not None and f"dev.{self.main_metric}" in values:
            # the one comparable column (``dev.main``), as on the task's run: trials sort by it too
            values[HEADLINE_METRIC] = values[f"dev.{self.main_metric}"]
        if values:
            self._sink(step if step is not None else 0, values)

    def set_tags(self, tags: Mapping[str, str]) -> None:
        """Tags set once the trial has trained; a tracking server that fails here costs a warning, not the
        trial."""
        from mlflow import MlflowClient

        client = MlflowClient()
        for key, value in tags.items():
            try:
                client.set_tag(self.run_id, key, value)
            except Exception as err:  # any client or server error
                log.warning("trial run %s: tag %s not set: %s", self.run_id, key, err)

    def close(self) -> int:
        return self._sink.close(timeout_s=60.0)


def own_tags(run: Any) -> dict[str, str]:
    """A run's tags without MLflow's own (``mlflow.*``: run name, parent, source ...)."""
    return {k: v for k, v in run.data.tags.items() if not k.startswith("mlflow.")}


class MlflowTrialTracker:
    """Opens one nested MLflow run per trial under ``parent_run_id`` (same experiment).

    Args:
        parent_run_id: The task's run.
        tags: Tags every trial run gets, besides the parent's own (git commit, pipeline run, task, the
            pretrained model's provenance ...: :func:`own_tags`).
        main_metric: The task's main metric (:attr:`bert_core.tasks.TaskSpec.main_metric`): each trial also logs
            it as ``dev.main`` and gets the tag ``main_metric``, as the task's run does.
    """

    def __init__(
        self, parent_run_id: str, tags: Mapping[str, str] | None = None, main_metric: str | None = None
    ) -> None:
        self.parent_run_id = parent_run_id
        self.tags = dict(tags or {})
        self.main_metric = main_metric

    @contextlib.contextmanager
    def trial(self, name: str, params: Mapping[str, Any], tags: Mapping[str, str]) -> Iterator[_TrialRun]:
        from mlflow import MlflowClient
        from mlflow.entities import Param, RunTag

        client = MlflowClient()
        parent = client.get_run(self.parent_run_id)
        all_tags = {
            **own_tags(parent),
            **self.tags,
            **dict(tags),
            "mlflow.parentRunId": self.parent_run_id,
            "mlflow.runName": name,
            **({"main_metric": self.main_metric} if self.main_metric else {}),
        }
        run = client.create_run(parent.info.experiment_id, run_name=name, tags=all_tags)
        run_id = run.info.run_id
        client.log_batch(
            run_id,
            params=[Param(k, str(v)[:6000]) for k, v in params.items()],
            tags=[RunTag(k, str(v)) for k, v in all_tags.items()],
        )
        recorder = _TrialRun(run_id, self.main_metric)
        status = "FAILED"
        try:
            yield recorder
            status = "FINISHED"
        finally:
            left = recorder.close()
            if left:
                log.warning("trial %s: %d metric record(s) could not be sent to MLflow", name, left)
            with contextlib.suppress(Exception):
                client.set_terminated(run_id, status=status)
