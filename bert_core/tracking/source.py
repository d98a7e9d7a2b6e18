"""Where a stage's starting model comes from: a local directory, or a version in the MLflow registry.

:func:`resolve_model_source` turns ``finetune.model.source`` (a local HF directory, or a registry URI such
as ``models:/bert-pretrained@latest`` / ``models:/bert-pretrained/3``) into a local directory (downloading
registry models) and its provenance (name, version, run, content fingerprint) for the run tags.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bert_core.tracking.fingerprint import fingerprint, registered_version

_REGISTRY_URI = re.compile(r"^models:/(?P<name>[^/@]+)(?:@(?P<alias>[^/]+)|/(?P<version>\d+|latest))/?$")


@dataclass
class ResolvedSource:
    """A pretrained model on local disk and where it came from."""

    path: Path
    info: dict[str, Any] = field(default_factory=dict)


def resolve_model_source(
    source: str, download_dir: str | Path, *, provenance: bool = True, key: str = "finetune.model.source"
) -> ResolvedSource:
    """A local directory for ``source`` (downloading registry models) and its provenance.

    Args:
        source: A local Hugging Face BERT directory, or ``models:/<name>@<alias>`` /
            ``models:/<name>/<version>`` in the MLflow registry (``MLFLOW_TRACKING_URI``);
            ``@latest`` and ``/latest`` mean the newest version (MLflow reserves the alias "latest").
        download_dir: Where registry artifacts are downloaded.
        provenance: Also fingerprint the weights (``info["sha"]``) and look a local directory up in the
            registry; off for a caller that keeps only the path and hashes what it copies itself.
        key: The params key that gave ``source``, named in the errors.

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
                f"check the name and alias/version (mlflow ui: Models), or point {key} at a local directory"
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
        if provenance:
            info["sha"] = fingerprint(path)
        return ResolvedSource(path, info)
    path = Path(source).expanduser()
    if not (path / "config.json").is_file():
        raise FileNotFoundError(
            f"model source {str(path)!r} is not a Hugging Face model directory (no config.json). Run the "
            f"pretrain stage (dvc repro pretrain), or set {key} to a local BERT directory or "
            f"to a registry URI such as models:/bert-pretrained@latest"
        )
    if not provenance:
        return ResolvedSource(path, {"uri": str(path)})
    sha = fingerprint(path)
    return ResolvedSource(path, {"uri": str(path), "sha": sha, **registered_version(path, sha)})


def _model_root(local: Path) -> Path:
    """The directory holding ``config.json`` inside a downloaded artifact tree."""
    if (local / "config.json").is_file():
        return local
    found = sorted(local.rglob("config.json"), key=lambda p: len(p.parts))
    if not found:
        raise FileNotFoundError(f"{local}: the downloaded registry artifacts hold no config.json")
    return found[0].parent
