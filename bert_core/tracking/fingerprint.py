"""Model fingerprints: which registered version a local model directory is.

The pretrain stage tags the version it registers with :data:`FINGERPRINT_TAG` = :func:`fingerprint` of the
model directory, so a run that starts from the local ``models/pretrained`` can name the registered version
it uses (:func:`registered_version`).

It also holds the project's one short content hash (:func:`short_hash`, :func:`json_fingerprint`): the first
16 hex digits of a sha256, for checkpoint folders, params hashes and dataset digests.
"""

from __future__ import annotations

import hashlib
import json
import logging
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

#: Tag on registered versions holding :func:`fingerprint` of the model directory (finds local copies).
FINGERPRINT_TAG = "model_fingerprint"


#: Hex digits kept of a sha256 (64 bits: no accidental collision among a project's files and runs).
SHORT_HEX = 16


def short_hash(data: bytes) -> str:
    """The first :data:`SHORT_HEX` hex digits of the sha256 of ``data``."""
    return hashlib.sha256(data).hexdigest()[:SHORT_HEX]


def json_fingerprint(obj: Any) -> str:
    """:func:`short_hash` of ``obj`` as JSON with sorted keys (``default=str`` for paths, dates and the like).

    Equal for equal content whatever the dicts' key order; the same bytes as
    ``json.dumps(obj, sort_keys=True, default=str)``, so hashes recorded before stay valid.
    """
    return short_hash(json.dumps(obj, sort_keys=True, default=str).encode())


def fingerprint(model_dir: str | Path) -> str:
    """Short sha256 of a model directory's weights and config (identifies the exact pretrained model)."""
    digest = hashlib.sha256()
    model_dir = Path(model_dir)
    for name in ("config.json", "model.safetensors", "pytorch_model.bin"):
        path = model_dir / name
        if path.is_file():
            with open(path, "rb") as fh:
                hashlib.file_digest(fh, lambda: digest)  # one digest over the files, in this order
    return digest.hexdigest()[:SHORT_HEX]


def registered_version(model_dir: str | Path, sha: str | None = None) -> dict[str, str]:
    """The registry name/version of a local model directory, when it can be found.

    First ``registered_model.json`` (``{"name", "version"}``) in the directory, written by a stage that
    registered it; else a registered version tagged ``model_fingerprint`` = :func:`fingerprint`. A
    tracking server that cannot be reached only loses this provenance (logged), never the run.

    Returns:
        ``{"model", "model_version"}``, or ``{}`` when the directory is not a known registered version.
    """
    model_dir = Path(model_dir)
    marker = model_dir / "registered_model.json"
    if marker.is_file():
        try:
            data = json.loads(marker.read_text(encoding="utf-8"))
            return {"model": str(data["name"]), "model_version": str(data["version"])}
        except (ValueError, KeyError, TypeError) as err:
            log.warning("%s is not a registration marker (%s); ignoring it", marker, err)
    if sha is None:
        sha = fingerprint(model_dir)
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
