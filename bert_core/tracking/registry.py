"""One way to register a model, used by every stage that produces one (pretrain, finetune).

:func:`register` logs the model directory as an artifact of the stage's run (as an MLflow Model, a
``pyfunc`` that wraps ``bert_core``, when given the task JSON: :mod:`bert_core.serving`), creates the registered model
when it is missing (tolerating another run creating it at the same moment), creates a new version with
its tags and description, and moves an alias to it: always (pretrain's ``newest``), or only when the new
version beats the one the alias points to on a dev metric (finetune's ``champion``). Every registry call
is retried with backoff (:func:`bert_core.tracking.run.retry_tracking`).
"""

from __future__ import annotations

import logging
import math
import tempfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bert_core.tracking.run import retry_tracking

log = logging.getLogger(__name__)


@dataclass
class Registration:
    """Outcome of :func:`register`: the new version and whether the alias moved to it."""

    name: str
    version: str
    alias: str
    alias_moved: bool
    value: float | None = None
    previous_version: str | None = None
    previous_value: float | None = None

    def as_tags(self) -> dict[str, str]:
        """Run tags naming the version and the alias move (the fine-tuning run's)."""
        return {
            "registered_model": self.name,
            "registered_version": self.version,
            f"alias_{self.alias}_moved": str(self.alias_moved).lower(),
            f"alias_{self.alias}_version": self.version if self.alias_moved else str(self.previous_version),
        }

    def withdraw(self) -> None:
        """Take this registration back: the alias returns to the version it pointed to before (or is
        removed) and the new version is deleted. For a stage that registers before committing its outputs
        and then fails to commit: the registry must not name a model the workspace does not have."""
        from mlflow import MlflowClient

        client = MlflowClient()
        if self.alias_moved:
            if self.previous_version is not None:
                retry_tracking(client.set_registered_model_alias)(
                    self.name, self.alias, self.previous_version
                )
            else:
                retry_tracking(client.delete_registered_model_alias)(self.name, self.alias)
        retry_tracking(client.delete_model_version)(self.name, self.version)
        log.warning("withdrew %s version %s (alias %s back on %s)", self.name, self.version, self.alias,
                    self.previous_version or "nothing")  # fmt: skip

    def as_record(self) -> dict[str, Any]:
        """``{"registered_model", "version", "alias"}`` (the pretrain stage's metrics entry)."""
        return {"registered_model": self.name, "version": int(self.version), "alias": self.alias}


def _float(value: Any) -> float:
    try:
        v = float(value)
    except (TypeError, ValueError):
        return -math.inf
    return v if math.isfinite(v) else -math.inf


def _ensure_registered_model(client: Any, name: str, description: str | None) -> None:
    """Create registered model ``name`` unless it exists; a concurrent create by another run is fine."""
    from mlflow.exceptions import MlflowException

    if retry_tracking(client.search_registered_models)(filter_string=f"name = '{name}'"):
        return

    def create() -> None:
        try:
            client.create_registered_model(name, description=description)
        except MlflowException as err:  # created meanwhile by a concurrent run: not worth a retry
            if getattr(err, "error_code", "") != "RESOURCE_ALREADY_EXISTS" and (
                "already exists" not in str(err).lower()
            ):
                raise

    retry_tracking(create)()


def register(
    model_dir: str | Path,
    *,
    name: str,
    run_id: str,
    alias: str,
    description: str | None = None,
    tags: Mapping[str, Any] | None = None,
    version_description: str | None = None,
    metric_key: str | None = None,
    value: float | None = None,
    artifact_path: str = "model",
    save_model: Callable[[Path, Path], Any] | None = None,
) -> Registration:
    """Log ``model_dir`` to run ``run_id``, register it as a new version of ``name`` and move ``alias``.

    Args:
        model_dir: The model directory (Hugging Face format), logged as the run's ``artifact_path``.
        name: The registered model; created (with ``description``) when missing.
        run_id: The stage's MLflow run.
        alias: The alias to move to the new version.
        description: Of the registered model, when this call creates it.
        tags: Tags of the new version (values are stored as strings).
        version_description: Of the new version.
        metric_key, value: Without them the alias always moves. With them the version also gets the tags
            ``selection_metric`` = ``metric_key`` and ``metric_key`` = ``value``, and the alias moves only when
            ``value`` is strictly greater than the ``metric_key`` tag of the version the alias points to
            now (or when the alias points nowhere / that version has no such tag; NaN never wins).
        save_model: ``save_model(model_dir, dest)`` writes the MLflow Model of ``model_dir`` to ``dest``
            (:func:`bert_core.serving.mlflow_model`: a ``pyfunc`` with signature and input example that
            holds ``model_dir`` as ``artifacts/hf_model``); that directory is then what is logged, so the
            version loads with ``mlflow.pyfunc.load_model("models:/<name>@<alias>")``. Without it the
            directory's files are logged as they are (not an MLflow Model). The stages always pass it;
            it is a parameter so that this module does not import the model code (the stages' DVC deps).

    Returns:
        The new version and whether the alias moved.
    """
    from mlflow import MlflowClient

    client = MlflowClient()
    if save_model is None:
        retry_tracking(client.log_artifacts)(run_id, str(model_dir), artifact_path=artifact_path)
    else:
        with tempfile.TemporaryDirectory(prefix="mlflow-model-") as tmp:
            save_model(Path(model_dir), Path(tmp) / "model")
            retry_tracking(client.log_artifacts)(
                run_id, str(Path(tmp) / "model"), artifact_path=artifact_path
            )
    _ensure_registered_model(client, name, description)
    version_tags = {str(k): str(v) for k, v in (tags or {}).items()}
    if metric_key is not None:
        version_tags.update({"selection_metric": metric_key, metric_key: repr(float(value))})
    mv = retry_tracking(client.create_model_version)(
        name, source=f"runs:/{run_id}/{artifact_path}", run_id=run_id, tags=version_tags,
        description=version_description,
    )  # fmt: skip
    if metric_key is None:
        previous = retry_tracking(client.get_registered_model)(name).aliases.get(alias)
        retry_tracking(client.set_registered_model_alias)(name, alias, mv.version)
        log.info("registered %s version %s (alias %s)", name, mv.version, alias)
        return Registration(name, str(mv.version), alias, True,
                            previous_version=None if previous is None else str(previous))  # fmt: skip

    previous_version, previous_value = None, None
    current = retry_tracking(client.get_registered_model)(name).aliases.get(alias)
    if current is not None:
        previous_version = str(current)
        previous = retry_tracking(client.get_model_version)(name, previous_version)
        previous_value = _float((previous.tags or {}).get(metric_key))
    moved = current is None or _float(value) > (previous_value if previous_value is not None else -math.inf)
    if moved:
        retry_tracking(client.set_registered_model_alias)(name, alias, mv.version)
    log.info("registered %s version %s (%s=%.4g); alias %s %s", name, mv.version, metric_key, value, alias,
             "moved" if moved else f"stays on version {previous_version} ({previous_value:.4g})")  # fmt: skip
    return Registration(name, str(mv.version), alias, moved, float(value), previous_version,
                        None if previous_value is None or not math.isfinite(previous_value) else previous_value)  # fmt: skip
