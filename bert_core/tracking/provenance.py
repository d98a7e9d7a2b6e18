"""Where a run comes from: the git commit of the code and the id shared by the stage runs of one pipeline run."""

from __future__ import annotations

import os
import subprocess
import uuid

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
