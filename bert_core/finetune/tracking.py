"""MLflow helpers of the fine-tuning stage (the only module of the package that imports mlflow).

- :func:`resolve_model_source`: a local HF directory, or a registry URI (``models:/bert-pretrained@latest``,
  ``models:/bert-pretrained/3``) downloaded to a local directory, with its provenance (name, version,
  run, content fingerprint) for the run tags.
- :class:`MlflowTrialTracker`: one nested run per trial under the task's run, metrics sent in the
  background with retries (:class:`bert_core.training.RetryingSink`), so a briefly unreachable tracking
  server does not stop fine-tuning.
- :func:`register_if_better`: a new version of the task's registered model, and the alias moved to it
  only when it beats the version the alias points to on the dev metric.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import math
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

#: Tag on registered versions holding :func:`fingerprint` of the model directory (finds local copies).
FINGERPRINT_TAG = "model_fingerprint"
_REGISTRY_URI = re.compile(r"^models:/(?P<name>[^/@]+)(?:@(?P<alias>[^/]+)|/(?P<version>\d+|latest))/?$")


@dataclass
class ResolvedSource:
    """A pretrained model on local disk and where it came from."""

    path: Path
    info: dict[str, Any] = field(default_factory=dict)


def fingerprint(model_dir: str | Path, *, chunk: int = 1 << 20) -> str:
    """Short sha256 of a model directory's weights and config (identifies the exact pretrained model)."""
    digest = hashlib.sha256()
    model_dir = Path(model_dir)
    for name in ("config.json", "model.safetensors", "pytorch_model.bin"):
        path = model_dir / name
        if path.is_file():
            with open(path, "rb") as fh:
                while block := fh.read(chunk):
                    digest.update(block)
    return digest.hexdigest()[:16]


def resolve_model_source(source: str, download_dir: str | Path) -> ResolvedSource:
    """A local directory for ``source`` (downloading registry models) and its provenance.

    Args:
        source: A local Hugging Face BERT directory, or ``models:/<name>@<alias>`` /
            ``models:/<name>/<version>`` in the MLflow registry (``MLFLOW_TRACKING_URI``);
            ``@latest`` and ``/latest`` mean the newest version (MLflow reserves the alias "latest").
        download_dir: Where registry artifacts are downloaded.

    Raises:
        FileNotFoundError: a local source that is not a model directory.
        ValueError: a malformed registry URI, or an unknown model, alias or version.
    """
    if source.startswith("models:/"):
        match = _REGISTRY_URI.match(source)
        if not match:
            raise ValueError(
                f"model source {source!r} is not a registry URI: use models:/<name>@<alias> or models:/<name>/<version>"
            )
        import mlflow
        from mlflow import MlflowClient

        client = MlflowClient()
        name = match["name"]
        selector = match["alias"] or match["version"]
        try:
            if selector.lower() == "latest":  # MLflow reserves "latest": the newest version
                versions = client.search_model_versions(f"name = '{name}'")
                if not versions:
                    raise ValueError(f"registered model {name!r} has no versions")
                mv = max(versions, key=lambda v: int(v.version))
            elif match["alias"]:
                mv = client.get_model_version_by_alias(name, match["alias"])
            else:
                mv = client.get_model_version(name, match["version"])
        except Exception as err:  # mlflow raises MlflowException for unknown names/aliases/versions
            raise ValueError(
                f"model source {source!r}: not found in the MLflow registry at {mlflow.get_tracking_uri()} ({err}); "
                "check the name and alias/version (mlflow ui: Models), or point finetune.model.source at a "
                "local directory"
            ) from err
        target = Path(download_dir)
        target.mkdir(parents=True, exist_ok=True)
        local = Path(
            mlflow.artifacts.download_artifacts(
                artifact_uri=f"models:/{name}/{mv.version}", dst_path=str(target)
            )
        )
        path = _model_root(local)
        info = {"uri": source, "model": name, "model_version": str(mv.version), "run_id": mv.run_id or ""}
        info["sha"] = fingerprint(path)
        return ResolvedSource(path, info)
    path = Path(source).expanduser()
    if not (path / "config.json").is_file():
        raise FileNotFoundError(
            f"model source {str(path)!r} is not a Hugging Face model directory (no config.json). Run the "
            f"pretrain stage (dvc repro pretrain), or set finetune.model.source to a local BERT directory or "
            f"to a registry URI such as models:/bert-pretrained@latest"
        )
    sha = fingerprint(path)
    return ResolvedSource(path, {"uri": str(path), "sha": sha, **_registered_version(path, sha)})


def _registered_version(model_dir: Path, sha: str) -> dict[str, str]:
    """The registry name/version of a local model directory, when it can be found.

    First ``registered_model.json`` (``{"name", "version"}``) in the directory, written by a stage that
    registered it; else a registered version tagged ``model_fingerprint`` = :func:`fingerprint`. A
    tracking server that cannot be reached only loses this provenance (logged), never the run.
    """
    marker = model_dir / "registered_model.json"
    if marker.is_file():
        try:
            data = json.loads(marker.read_text(encoding="utf-8"))
            return {"model": str(data["name"]), "model_version": str(data["version"])}
        except (ValueError, KeyError, TypeError) as err:
            log.warning("%s is not a registration marker (%s); ignoring it", marker, err)
    try:
        from mlflow import MlflowClient

        versions = MlflowClient().search_model_versions(f"tags.{FINGERPRINT_TAG} = '{sha}'")
    except Exception as err:  # provenance only: never fail the stage for it
        log.info("could not look up the registry version of %s: %s", model_dir, err)
        return {}
    if not versions:
        return {}
    newest = max(versions, key=lambda v: int(v.version))
    return {"model": newest.name, "model_version": str(newest.version)}


def _model_root(local: Path) -> Path:
    """The directory holding ``config.json`` inside a downloaded artifact tree."""
    if (local / "config.json").is_file():
        return local
    found = sorted(local.rglob("config.json"), key=lambda p: len(p.parts))
    if not found:
        raise FileNotFoundError(f"{local}: the downloaded registry artifacts hold no config.json")
    return found[0].parent


class _TrialRun:
    """Recorder of one nested run: metrics go through a retrying background sink."""

    def __init__(self, run_id: str) -> None:
        from bert_core.training import mlflow_sink

        self.run_id = run_id
        self._sink = mlflow_sink(run_id)

    def log_metrics(self, metrics: Mapping[str, float], step: int | None = None) -> None:
        values = {k: float(v) for k, v in metrics.items() if v is not None and math.isfinite(float(v))}
        if values:
            self._sink(step if step is not None else 0, values)

    def close(self) -> int:
        return self._sink.close(timeout_s=60.0)


class MlflowTrialTracker:
    """Opens one nested MLflow run per trial under ``parent_run_id`` (same experiment).

    Args:
        parent_run_id: The task's run.
        tags: Tags every trial run gets (the parent's standard tags: git commit, pipeline run, ...).
    """

    def __init__(self, parent_run_id: str, tags: Mapping[str, str] | None = None) -> None:
        self.parent_run_id = parent_run_id
        self.tags = dict(tags or {})

    @contextlib.contextmanager
    def trial(self, name: str, params: Mapping[str, Any], tags: Mapping[str, str]) -> Iterator[_TrialRun]:
        from mlflow import MlflowClient
        from mlflow.entities import Param, RunTag

        client = MlflowClient()
        parent = client.get_run(self.parent_run_id)
        all_tags = {
            **self.tags,
            **dict(tags),
            "mlflow.parentRunId": self.parent_run_id,
            "mlflow.runName": name,
        }
        run = client.create_run(parent.info.experiment_id, run_name=name, tags=all_tags)
        run_id = run.info.run_id
        client.log_batch(run_id, params=[Param(k, str(v)[:6000]) for k, v in params.items()],
                         tags=[RunTag(k, str(v)) for k, v in all_tags.items()])  # fmt: skip
        recorder = _TrialRun(run_id)
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


@dataclass
class Registration:
    """Outcome of :func:`register_if_better`."""

    name: str
    version: str
    alias: str
    alias_moved: bool
    value: float
    previous_version: str | None = None
    previous_value: float | None = None

    def as_tags(self) -> dict[str, str]:
        return {
            "registered_model": self.name,
            "registered_version": self.version,
            f"alias_{self.alias}_moved": str(self.alias_moved).lower(),
            f"alias_{self.alias}_version": self.version if self.alias_moved else str(self.previous_version),
        }


def _float(value: Any) -> float:
    try:
        v = float(value)
    except (TypeError, ValueError):
        return -math.inf
    return v if math.isfinite(v) else -math.inf


def register_if_better(
    model_dir: str | Path,
    *,
    name: str,
    run_id: str,
    metric_key: str,
    value: float,
    alias: str = "champion",
    tags: Mapping[str, Any] | None = None,
    artifact_path: str = "model",
) -> Registration:
    """Log ``model_dir`` to ``run_id``, register it as a new version of ``name``, move ``alias`` if better.

    The alias moves only when ``value`` is strictly greater than the ``metric_key`` tag of the version
    the alias points to now (or when the alias points nowhere / that version has no such tag). The
    version carries ``metric_key`` as a tag so the next run can compare against it.

    Returns:
        The new version and whether the alias moved.
    """
    from mlflow import MlflowClient
    from mlflow.exceptions import MlflowException

    client = MlflowClient()
    client.log_artifacts(run_id, str(model_dir), artifact_path=artifact_path)
    try:
        client.get_registered_model(name)
    except MlflowException:
        client.create_registered_model(
            name, description=f"Fine-tuned BERT for {name}; alias '{alias}' = best on dev"
        )
    source = f"{client.get_run(run_id).info.artifact_uri.rstrip('/')}/{artifact_path}"
    version_tags = {str(k): str(v) for k, v in (tags or {}).items()}
    version_tags.update({"selection_metric": metric_key, metric_key: repr(float(value))})
    mv = client.create_model_version(name, source=source, run_id=run_id, tags=version_tags)
    previous_version, previous_value = None, None
    try:
        current = client.get_model_version_by_alias(name, alias)
        previous_version = str(current.version)
        previous_value = _float((current.tags or {}).get(metric_key))
    except MlflowException:
        current = None
    moved = current is None or _float(value) > (previous_value if previous_value is not None else -math.inf)
    if moved:
        client.set_registered_model_alias(name, alias, mv.version)
    log.info("registered %s version %s (%s=%.4g); alias %s %s", name, mv.version, metric_key, value, alias,
             "moved" if moved else f"stays on version {previous_version} ({previous_value:.4g})")  # fmt: skip
    return Registration(name, str(mv.version), alias, moved, float(value), previous_version,
                        None if previous_value is None or not math.isfinite(previous_value) else previous_value)  # fmt: skip
