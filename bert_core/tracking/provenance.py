"""Where a run comes from: the git commit of the code, the id shared by the stage runs of one pipeline run,
and the ``dvc.lock`` entries of the stages behind a model (its lineage)."""

from __future__ import annotations

import os
import subprocess
import uuid
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

from bert_core.constants import REPO_ROOT


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


#: ``dvc.lock`` stages behind the pretrained model, in pipeline order.
PRETRAIN_STAGES = ("corpus", "vocab", "pretrain_data")
#: ``dvc.lock`` stages behind a fine-tuned model (the stage itself is recorded only after it completes).
FINETUNE_STAGES = (*PRETRAIN_STAGES, "pretrain")


def dvc_lineage(lock_path: str | os.PathLike[str], stages: Sequence[str]) -> dict[str, Any] | None:
    """The ``dvc.lock`` entries of ``stages`` (cmd, deps/outs hashes, params), or ``None`` without a lock.

    Stages missing from the lock are left out (DVC records a stage only once it completes, so the stage
    running now is recorded from its previous run, if any: the card says so). A lock that is not YAML
    yields ``{"error": ...}`` rather than failing the stage: the card is documentation, not a gate.
    """
    path = Path(lock_path)
    if not path.is_file():
        return None
    try:
        lock = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
        entries = lock.get("stages", {}) or {}
    except (OSError, yaml.YAMLError, AttributeError) as err:
        return {"error": f"{path}: not readable as a DVC lock file ({str(err)[:200]})"}
    out: dict[str, Any] = {}
    for stage in stages:
        entry = entries.get(stage)
        if not isinstance(entry, Mapping):
            continue
        out[stage] = {
            "cmd": entry.get("cmd"),
            "deps": _hashes(entry.get("deps")),
            "outs": _hashes(entry.get("outs")),
            "params": entry.get("params") or {},
        }
    return out


def _hashes(items: Any) -> dict[str, str]:
    """``{path: hash}`` of a ``dvc.lock`` deps or outs list."""
    return {
        str(i.get("path")): str(i.get("md5") or i.get("hash") or i.get("etag") or "")
        for i in (items or [])
        if isinstance(i, Mapping)
    }


def under_dvc() -> str | None:
    """The DVC stage running this process (``DVC_STAGE``, set by ``dvc repro``), or ``None``."""
    return os.environ.get("DVC_STAGE") or None


def corpus_datasets(lock_path: str | os.PathLike[str]) -> list[str]:
    """Hub ids of the corpora the ``corpus`` stage read, from its params in ``dvc.lock`` (else none).

    None in local mode (``BERT_DATA_ROOT`` set, as the pipeline sets it for every stage): the corpus was
    then read from ``corpus.local_sources``, files that have no Hub id.
    """
    if os.environ.get("BERT_DATA_ROOT", "").strip():
        return []
    lineage = dvc_lineage(lock_path, ("corpus",)) or {}
    params = (lineage.get("corpus") or {}).get("params") or {}
    sources = []
    for values in params.values():
        corpus = (
            (values or {}).get("corpus.sources") or ((values or {}).get("corpus") or {}).get("sources") or []
        )
        sources += [s.get("path") for s in corpus if isinstance(s, Mapping) and s.get("kind") == "hf"]
    return [s for s in dict.fromkeys(sources) if s]
