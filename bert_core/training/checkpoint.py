"""Training checkpoints: written atomically, loaded without unpickling code, the last K kept.

A checkpoint is a directory ``<root>/step-<NNNNNNNN>/`` holding

=====================  ==========================================================================
``model.safetensors``  model weights (``safetensors.torch.save_model``: tied tensors stored once)
``optimizer.pt``       optimizer state (tensors and numbers only)
``scaler.pt``          fp16 loss-scaler state, when one is used
``rng.pt``             per-rank RNG states: python, numpy, torch CPU and CUDA
``data.pt``            per-rank data-loader positions (``loader.state_dict()``)
``state.json``         step, elapsed time, schedule, metric history, run fingerprint, world size
=====================  ==========================================================================

The directory is built under a temporary name and renamed into place (``bert_core.atomic``), so a
crash or SIGKILL while saving leaves the previous checkpoints intact and no complete-looking partial
one. Every ``.pt`` file is read with ``torch.load(weights_only=True)``, which refuses pickled code.
"""

from __future__ import annotations

import json
import logging
import os
import random
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from safetensors.torch import load_model, save_model
from torch import nn

from bert_core.atomic import atomic_path, clean_stale_temps
from bert_core.integrity import CorruptOutputError, verify_output

if TYPE_CHECKING:
    from bert_core.training.distributed import DistContext

log = logging.getLogger(__name__)

_STEP_DIR = re.compile(r"^step-(\d+)$")


class TrainingCheckpointError(RuntimeError):
    """A checkpoint that cannot be used: unreadable, from another model or another run."""


def _fsync_file(path: Path) -> None:
    with open(path, "rb") as fh:
        os.fsync(fh.fileno())


def capture_rng_state() -> dict[str, Any]:
    """This process's RNG states as tensors and plain Python values (``weights_only``-loadable)."""
    np_state = np.random.get_state()
    state: dict[str, Any] = {
        "python": random.getstate(),
        "numpy": {
            "key": torch.from_numpy(np_state[1].astype(np.int64)),
            "pos": int(np_state[2]),
            "has_gauss": int(np_state[3]),
            "cached_gaussian": float(np_state[4]),
        },
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def restore_rng_state(state: dict[str, Any]) -> None:
    """Inverse of ``capture_rng_state``."""
    random.setstate(_as_tuple(state["python"]))
    npd = state["numpy"]
    np.random.set_state(
        (
            "MT19937",
            npd["key"].numpy().astype(np.uint32),
            npd["pos"],
            npd["has_gauss"],
            npd["cached_gaussian"],
        )
    )
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def _as_tuple(obj: Any) -> Any:
    """random.setstate needs tuples all the way down; be lenient about lists."""
    if isinstance(obj, list | tuple):
        return tuple(_as_tuple(x) for x in obj)
    return obj


def _to_storable(obj: Any) -> Any:
    """Make a loader state loadable with ``weights_only=True``: numpy arrays/scalars -> tensors/numbers."""
    if isinstance(obj, np.ndarray):
        return torch.from_numpy(np.ascontiguousarray(obj))
    if isinstance(obj, np.generic):
        return obj.item()
    if isinstance(obj, dict):
        return {k: _to_storable(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return type(obj)(_to_storable(v) for v in obj)
    return obj


def step_dir(root: Path, step: int) -> Path:
    return Path(root) / f"step-{step:08d}"


def size_bytes(ckpt: Path) -> int:
    """The bytes of a checkpoint's files."""
    return sum(f.stat().st_size for f in Path(ckpt).iterdir() if f.is_file())


def list_checkpoints(root: Path) -> list[Path]:
    """Complete checkpoints under ``root``, oldest first."""
    root = Path(root)
    if not root.is_dir():
        return []
    found = []
    for child in root.iterdir():
        m = _STEP_DIR.match(child.name)
        if m and (child / "state.json").is_file():
            found.append((int(m.group(1)), child))
    return [p for _, p in sorted(found)]


def save_checkpoint(
    root: Path,
    *,
    step: int,
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    state: dict[str, Any],
    rng_states: list[dict[str, Any]],
    data_states: list[Any],
    scaler: torch.amp.GradScaler | None = None,
    keep_last: int = 2,
) -> Path:
    """Write checkpoint ``step`` atomically under ``root`` and delete all but the newest ``keep_last``.

    Args:
        root: checkpoint directory of the run.
        step: optimizer steps done.
        model: the unwrapped model (no DDP / compile wrapper).
        optimizer: its optimizer.
        state: JSON-serialisable trainer state (``step`` is added).
        rng_states: ``capture_rng_state()`` of every rank, rank order.
        data_states: loader ``state_dict()`` of every rank (None where a loader has none).
        scaler: fp16 GradScaler, if any.
        keep_last: number of checkpoints to keep (>= 1).

    Returns:
        The checkpoint directory.
    """
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    final = step_dir(root, step)
    with atomic_path(final, is_dir=True) as tmp:
        save_model(model, str(tmp / "model.safetensors"))
        torch.save(optimizer.state_dict(), tmp / "optimizer.pt")
        if scaler is not None and scaler.is_enabled():
            torch.save(scaler.state_dict(), tmp / "scaler.pt")
        torch.save(rng_states, tmp / "rng.pt")
        torch.save(_to_storable(data_states), tmp / "data.pt")
        (tmp / "state.json").write_text(json.dumps({**state, "step": step}, indent=1), encoding="utf-8")
        for f in tmp.iterdir():
            _fsync_file(f)
    for old in list_checkpoints(root)[: -max(keep_last, 1)]:
        _remove_tree(old)
    return final


def _remove_tree(path: Path) -> None:
    import shutil

    shutil.rmtree(path, ignore_errors=True)


def _verify(ckpt: Path, files: list[Path] | None = None) -> None:
    """Check the checkpoint's files against the checksums written with it (``atomic_path`` records them)."""
    try:
        verify_output(ckpt, files)
    except CorruptOutputError as exc:
        raise TrainingCheckpointError(f"{exc}; or delete {ckpt} to resume from an older checkpoint") from exc


def read_state(ckpt: Path) -> dict[str, Any]:
    """The ``state.json`` of a checkpoint."""
    path = Path(ckpt) / "state.json"
    _verify(Path(ckpt), [path])
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise TrainingCheckpointError(f"cannot read {path}: {exc}") from exc


def _load_pt(path: Path) -> Any:
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # pickle.UnpicklingError for code, RuntimeError for truncation, ...
        raise TrainingCheckpointError(
            f"{path} cannot be loaded safely ({type(exc).__name__}: {exc}). Checkpoint files may only hold "
            "tensors and plain values; delete this checkpoint directory to resume from an older one."
        ) from exc


def load_checkpoint(
    ckpt: Path,
    *,
    model: nn.Module,
    optimizer: torch.optim.Optimizer | None = None,
    scaler: torch.amp.GradScaler | None = None,
) -> tuple[dict[str, Any], list[dict[str, Any]], list[Any]]:
    """Load weights (and optimizer / scaler state) from ``ckpt`` into the given objects.

    Returns:
        ``(state, rng_states, data_states)``: the trainer state and the per-rank RNG and loader states.

    Raises:
        TrainingCheckpointError: a file is missing, truncated, differs from the checksum written with it, holds
            pickled code, or the weights do not fit the model (a checkpoint of another model size).
    """
    ckpt = Path(ckpt)
    _verify(ckpt)  # every file, once, before any is read
    state = read_state(ckpt)
    weights = ckpt / "model.safetensors"
    try:
        missing, unexpected = load_model(model, str(weights), strict=False)
    except Exception as exc:  # truncated header, shape mismatch, missing file
        raise TrainingCheckpointError(
            f"cannot load model weights from {weights}: {exc}. Is this checkpoint from a different model "
            "size or a different run? Delete it or point the run at another checkpoint directory."
        ) from exc
    if missing or unexpected:
        raise TrainingCheckpointError(
            f"{weights} does not match the model: missing {sorted(missing)[:5]}, unexpected "
            f"{sorted(unexpected)[:5]} — it was written for a different model configuration"
        )
    if optimizer is not None:
        optimizer.load_state_dict(_load_pt(ckpt / "optimizer.pt"))
    if scaler is not None and (ckpt / "scaler.pt").is_file():
        scaler.load_state_dict(_load_pt(ckpt / "scaler.pt"))
    rng_states = _load_pt(ckpt / "rng.pt")
    data_states = _load_pt(ckpt / "data.pt")
    return state, rng_states, data_states


def latest_loadable(root: Path) -> list[Path]:
    """Checkpoints under ``root``, newest first, after removing leftovers of interrupted saves."""
    clean_stale_temps(root)
    return list(reversed(list_checkpoints(root)))


def resume_newest(
    root: Path,
    *,
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    scaler: torch.amp.GradScaler | None,
    dist: DistContext,
    fingerprint: str,
) -> tuple[Path, dict[str, Any], Any] | None:
    """Load the newest loadable checkpoint under ``root`` (the Trainer's resume).

    Weights, optimizer and scaler state are loaded in place and this rank's RNG state is restored. A
    checkpoint that cannot be read falls back to the previous one; only the oldest one's error is raised.
    Rank 0 lists the candidates, every rank loads the same one.

    Returns:
        ``(path, state, this rank's data-loader state)``, or None when there is no checkpoint.

    Raises:
        TrainingCheckpointError: the newest readable checkpoint was written with other settings (``fingerprint``)
            or another number of processes, or no candidate can be loaded.
    """
    candidates = latest_loadable(root) if dist.is_main else []
    candidates = dist.broadcast_object([str(c) for c in candidates])
    for path in map(Path, candidates):
        try:
            state = read_state(path)
        except TrainingCheckpointError as exc:
            if path == Path(candidates[-1]):
                raise
            log.error("%s; trying the previous checkpoint", exc)
            continue
        if fingerprint and state.get("fingerprint") != fingerprint:
            raise TrainingCheckpointError(
                f"{path} was written by a run with other settings (fingerprint {state.get('fingerprint')!r}, "
                f"this run {fingerprint!r}); use another checkpoint directory or delete {root}"
            )
        if state.get("world_size", 1) != dist.world_size:
            raise TrainingCheckpointError(
                f"{path} was written with {state.get('world_size')} processes, this run has "
                f"{dist.world_size}; resume with the same number of processes (the data position "
                "is per process)"
            )
        try:
            state, rng_states, data_states = load_checkpoint(
                path, model=model, optimizer=optimizer, scaler=scaler
            )
        except TrainingCheckpointError as exc:
            if path == Path(candidates[-1]):
                raise
            log.error("%s; trying the previous checkpoint", exc)
            continue
        restore_rng_state(rng_states[dist.rank])
        return path, state, data_states[dist.rank]
    return None
