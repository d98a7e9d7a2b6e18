"""Shared fixtures: the real data in ../shared/data when it is present (tests skip cleanly when not)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from bert_core.constants import REPO_ROOT

# The tests never reach the Hugging Face Hub. Set before huggingface_hub and datasets are imported: they read
# these once, at import, so the per-test setting below alone left a Hub call retrying for 23 s.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
# Under pytest-xdist each worker gets its share of the cores (torch's default is all of them, in every worker).
if workers := os.environ.get("PYTEST_XDIST_WORKER_COUNT"):
    os.environ.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // int(workers))))

_DEFAULT_SHARED = REPO_ROOT.parent / "shared" / "data"


def shared_data_root() -> Path | None:
    """The local data root laid out like ../shared/data, or None when it is not on this machine."""
    root = Path(os.environ.get("BERT_SHARED_DATA", _DEFAULT_SHARED))
    return root if root.is_dir() else None


@pytest.fixture(scope="session")
def shared_data() -> Path:
    root = shared_data_root()
    if root is None:
        pytest.skip("../shared/data is not present on this machine")
    return root


@pytest.fixture(scope="session")
def tiny_model(shared_data, tmp_path_factory) -> Path:
    """A tiny random BERT (2 layers of 32) with the real uncased vocab, as the pretrain stage writes one."""
    import shutil

    import torch

    from bert_core.config import BertConfig
    from bert_core.model import BertForPreTraining

    path = tmp_path_factory.mktemp("pretrained") / "model"
    config = BertConfig(
        vocab_size=30522, hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64
    )
    torch.manual_seed(0)
    BertForPreTraining(config).save_pretrained(path)
    shutil.copy(shared_data / "checkpoints" / "bert-base-uncased" / "vocab.txt", path / "vocab.txt")
    return path


@pytest.fixture(autouse=True, scope="session")
def _artifacts_outside_the_repository(tmp_path_factory):
    """A SQLite store's artifacts default to ``./mlruns`` of the working directory, the repository's own; the
    tests' stores (module fixtures' too) keep theirs in a temporary folder instead, through MLflow's variable
    for a server's artifact root (were it renamed, tests would only leak again)."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("_MLFLOW_SERVER_ARTIFACT_ROOT", str(tmp_path_factory.mktemp("mlruns")))
        yield


@pytest.fixture(autouse=True)
def _isolated_tracking(tmp_path_factory, monkeypatch):
    """Every test gets its own MLflow store; nothing touches the repo's mlflow.db."""
    store = tmp_path_factory.mktemp("mlflow")
    # An earlier test's stage_run set the process-wide URI, which wins over the environment: drop it, so
    # MLFLOW_TRACKING_URI (this store, or what a test sets) decides.
    if "mlflow" in sys.modules:
        sys.modules["mlflow"].set_tracking_uri(None)
        # ... and the active experiment an earlier test's set_experiment left (an id of that test's store).
        monkeypatch.setattr(
            sys.modules["mlflow"].tracking.fluent, "_active_experiment_id", None, raising=False
        )
    monkeypatch.delenv("MLFLOW_EXPERIMENT_ID", raising=False)  # set_experiment exports it for subprocesses
    monkeypatch.delenv("MLFLOW_EXPERIMENT_NAME", raising=False)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{store}/mlflow.db")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("DO_NOT_TRACK", "true")
    monkeypatch.setenv("MLFLOW_DISABLE_TELEMETRY", "true")
