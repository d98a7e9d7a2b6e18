"""Hugging Face model-directory I/O: the one place where checkpoint names are mapped.

A Hugging Face BERT directory holds ``config.json`` and the weights as ``model.safetensors`` (or
``pytorch_model.bin``, or a sharded ``*.index.json``). Our parameter names *are* transformers' names
(``bert_core.model``), so loading only has to reproduce what ``transformers.PreTrainedModel.
from_pretrained`` does to a checkpoint's keys:

* old LayerNorm names ``LayerNorm.gamma`` / ``LayerNorm.beta`` -> ``LayerNorm.weight`` / ``.bias``;
* the ``bert.`` prefix: a bare ``BertModel`` checkpoint loads into a head model (the prefix is added)
  and a head checkpoint loads into ``BertModel`` (the prefix is stripped, the heads are unused);
* tied aliases (``cls.predictions.decoder.weight`` / ``.bias``) are not separate weights;
* the old ``embeddings.position_ids`` buffer is dropped;
* tensors the model has but the checkpoint lacks (a new task head) keep their fresh initialisation
  and are reported; checkpoint tensors the model has no place for are reported and ignored.

Safety: nothing here unpickles arbitrary objects. Safetensors files are read directly;
``pytorch_model.bin`` is read with ``torch.load(weights_only=True)``, and a pickle that carries code
(a ``__reduce__`` calling a function) is refused with :class:`UnsafeCheckpointError`.

Writing: ``save_pretrained`` writes ``config.json`` + ``model.safetensors`` (metadata
``{"format": "pt"}``, tied aliases left out, as transformers does) atomically, so
``transformers.AutoModelFor*.from_pretrained`` loads it with no missing or unexpected keys.
"""

from __future__ import annotations

import json
import logging
import os
import pickle
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

from bert_core.atomic import atomic_path, write_json_atomic
from bert_core.config import BertConfig
from bert_core.integrity import verify_output
from bert_core.owned import share_like_umask

if TYPE_CHECKING:
    from torch import nn

log = logging.getLogger(__name__)

CONFIG_NAME = "config.json"
SAFETENSORS_NAME = "model.safetensors"
WEIGHTS_FILES = (
    SAFETENSORS_NAME,
    "model.safetensors.index.json",
    "pytorch_model.bin",
    "pytorch_model.bin.index.json",
)
PREFIX = "bert."
_BASE_MODULES = ("embeddings.", "encoder.", "pooler.")
_DROPPED_BUFFERS = ("embeddings.position_ids", "embeddings.token_type_ids")
_LEGACY_RENAMES = (("LayerNorm.gamma", "LayerNorm.weight"), ("LayerNorm.beta", "LayerNorm.bias"))

M = TypeVar("M", bound="nn.Module")


class CheckpointError(ValueError):
    """A model directory or weights file that cannot be loaded; the message says why and what to do."""


class UnsafeCheckpointError(CheckpointError):
    """A pickled checkpoint that would execute code when loaded."""


@dataclass
class LoadReport:
    """What loading did.

    Attributes:
        source: The weights file(s) read.
        missing_keys: Model tensors absent from the checkpoint (left at their fresh initialisation).
        unexpected_keys: Checkpoint tensors the model has no place for (ignored).
        mismatched_keys: (name, checkpoint shape, model shape) re-initialised under
            ``ignore_mismatched_sizes``.
        renamed_keys: Legacy names that were mapped, old -> new.
    """

    source: list[Path]
    missing_keys: list[str] = field(default_factory=list)
    unexpected_keys: list[str] = field(default_factory=list)
    mismatched_keys: list[tuple[str, tuple[int, ...], tuple[int, ...]]] = field(default_factory=list)
    renamed_keys: dict[str, str] = field(default_factory=dict)


# ====================================================================== reading
def _require_dir(path: Path) -> None:
    if not path.exists():
        raise FileNotFoundError(f"model directory {path} does not exist")
    if not path.is_dir():
        raise FileNotFoundError(
            f"{path} is a file; pass the model directory that holds {CONFIG_NAME} and {SAFETENSORS_NAME}"
        )


def _listing(path: Path) -> str:
    names = sorted(p.name for p in path.iterdir())
    return ", ".join(names[:20]) + (" ..." if len(names) > 20 else "") if names else "(empty)"


def read_config(path: str | os.PathLike[str]) -> BertConfig:
    """Read ``<path>/config.json`` into a :class:`BertConfig`.

    Raises:
        FileNotFoundError: no such directory or no config.json in it.
        CheckpointError: invalid JSON.
        ValueError: not a BERT config (``model_type``), an unsupported variant or an invalid value.
    """
    path = Path(path)
    _require_dir(path)
    file = path / CONFIG_NAME
    if not file.is_file():
        raise FileNotFoundError(
            f"{path} has no {CONFIG_NAME}; a Hugging Face model directory needs {CONFIG_NAME} and "
            f"{SAFETENSORS_NAME} (or pytorch_model.bin). Files present: {_listing(path)}"
        )
    verify_output(path, [file])
    try:
        data = json.loads(file.read_text(encoding="utf-8"))
    except json.JSONDecodeError as err:
        raise CheckpointError(
            f"{file} is not valid JSON (line {err.lineno}, column {err.colno}): {err.msg}"
        ) from err
    if not isinstance(data, dict):
        raise CheckpointError(f"{file} must hold a JSON object, got {type(data).__name__}")
    return BertConfig.from_hf_dict(data, source=str(file))


def find_weights(path: str | os.PathLike[str]) -> Path:
    """The weights file of a model directory, preferring safetensors as transformers does."""
    path = Path(path)
    _require_dir(path)
    for name in WEIGHTS_FILES:
        if (path / name).is_file():
            return path / name
    raise FileNotFoundError(
        f"{path} has no weights file: expected one of {', '.join(WEIGHTS_FILES)}. Files present: {_listing(path)}"
    )


def check_finite(file: Path, state: dict[str, torch.Tensor]) -> None:
    """Refuse weights holding NaN or infinity: such a model predicts garbage (every score NaN) silently.

    Raises:
        CheckpointError: naming the file, the first such tensor and how many of its values are not finite.
    """
    for name, tensor in state.items():
        if tensor.is_floating_point() and not bool(torch.isfinite(tensor).all()):
            bad = int((~torch.isfinite(tensor)).sum())
            raise CheckpointError(
                f"{file}: tensor {name} holds {bad} NaN or infinite value(s) of {tensor.numel()}; the weights "
                "are damaged or come from a diverged run. Restore the file (`dvc checkout` / `dvc pull`), "
                "re-run the stage that wrote it, or use an earlier checkpoint"
            )


def _read_safetensors(file: Path) -> dict[str, torch.Tensor]:
    verify_output(file.parent, [file])
    try:
        state = load_file(file, device="cpu")
    except (SafetensorError, OSError) as err:
        size = file.stat().st_size if file.exists() else 0
        raise CheckpointError(
            f"{file} ({size} bytes) cannot be read as safetensors ({err}); the file is truncated or corrupt "
            "(an interrupted download or copy?): fetch or save it again"
        ) from err
    check_finite(file, state)
    return state


def _read_pickle(file: Path) -> dict[str, torch.Tensor]:
    verify_output(file.parent, [file])
    try:
        obj = torch.load(file, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as err:
        found = re.search(r"Unsupported global: GLOBAL (\S+)", str(err))
        what = (
            f"references {found.group(1)}, which is not a tensor type" if found else "holds more than tensors"
        )
        raise UnsafeCheckpointError(
            f"refusing to load {file}: the pickle {what}, and unpickling it could run arbitrary code. Only "
            "plain state dicts (name -> tensor) are accepted. If you trust its origin, convert it to "
            "safetensors in a sandbox and load that instead."
        ) from err
    except (RuntimeError, EOFError, OSError) as err:
        raise CheckpointError(
            f"{file} cannot be read as a PyTorch checkpoint ({str(err).splitlines()[0]}); the file is "
            "truncated or corrupt: fetch or save it again"
        ) from err
    if not isinstance(obj, dict) or not all(
        isinstance(k, str) and torch.is_tensor(v) for k, v in obj.items()
    ):
        raise CheckpointError(
            f"{file} does not hold a flat state dict (name -> tensor); got {type(obj).__name__}. A training "
            "checkpoint (model + optimizer) is not a model directory: export the model with save_pretrained"
        )
    check_finite(file, obj)
    return obj


def read_state_dict(path: str | os.PathLike[str]) -> tuple[dict[str, torch.Tensor], list[Path]]:
    """Read every tensor of a model directory (or of one weights file).

    Returns:
        (state dict as stored, the files read).
    """
    path = Path(path)
    file = path if path.is_file() else find_weights(path)
    if file.name.endswith(".index.json"):
        verify_output(file.parent, [file])
        try:
            weight_map = json.loads(file.read_text(encoding="utf-8"))["weight_map"]
        except (json.JSONDecodeError, KeyError, TypeError) as err:
            raise CheckpointError(
                f"{file} is not a valid shard index (needs a 'weight_map' object): {err}"
            ) from err
        state: dict[str, torch.Tensor] = {}
        shards = sorted({file.parent / name for name in weight_map.values()})
        for shard in shards:
            if not shard.is_file():
                raise FileNotFoundError(
                    f"{file} lists shard {shard.name}, which is missing from {file.parent}"
                )
            state.update(_read_safetensors(shard) if shard.suffix == ".safetensors" else _read_pickle(shard))
        return state, shards
    reader = _read_safetensors if file.suffix == ".safetensors" else _read_pickle
    return reader(file), [file]


# ====================================================================== name mapping
def normalise_keys(
    state: dict[str, torch.Tensor], expected: set[str], tied: dict[str, str]
) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """Map a checkpoint's names onto a model's names (the rules in the module docstring).

    Args:
        state: Checkpoint tensors by name.
        expected: The model's ``state_dict()`` keys.
        tied: The model's tied aliases (alias -> parameter it shares).

    Returns:
        (renamed state dict without tied aliases, legacy renames old -> new).
    """
    renamed: dict[str, str] = {}
    out: dict[str, torch.Tensor] = {}
    for key, tensor in state.items():
        new = key
        for old_suffix, new_suffix in _LEGACY_RENAMES:
            if new.endswith(old_suffix):
                new = new[: -len(old_suffix)] + new_suffix
        if new != key:
            renamed[key] = new
        if new.endswith(_DROPPED_BUFFERS):
            continue
        out[new] = tensor

    expects_prefix = any(k.startswith(PREFIX) for k in expected)
    has_prefix = any(k.startswith(PREFIX) for k in out)
    if expects_prefix and not has_prefix:  # bare encoder checkpoint -> head model
        out = {(PREFIX + k if k.startswith(_BASE_MODULES) else k): v for k, v in out.items()}
    elif has_prefix and not expects_prefix:  # head checkpoint -> bare encoder
        out = {(k[len(PREFIX) :] if k.startswith(PREFIX) else k): v for k, v in out.items()}

    for alias, target in tied.items():
        if alias in out:
            tensor = out.pop(alias)
            out.setdefault(target, tensor)
    return out, renamed


def load_state_dict_into(
    model: nn.Module,
    state: dict[str, torch.Tensor],
    *,
    source: list[Path] | None = None,
    strict: bool = False,
    ignore_mismatched_sizes: bool = False,
    init_missing: bool = False,
    new_head: bool = False,
) -> LoadReport:
    """Copy checkpoint tensors into ``model`` (cast to the model's dtype) after :func:`normalise_keys`.

    Args:
        init_missing: (Re-)initialise the modules owning missing or mismatched tensors with the
            model's ``_init_weights`` first; needed when ``model`` was built uninitialised
            (``to_empty``), harmless otherwise.
        new_head: The caller puts a new task head on a checkpoint's encoder (fine-tuning): tensors outside
            the encoder (``bert.``) that the checkpoint lacks are expected, and logged at INFO, not as a
            warning. A missing encoder tensor is a warning either way.

    Raises:
        CheckpointError: shapes differ (naming each tensor and both shapes) unless
            ``ignore_mismatched_sizes``; nothing matches; or, with ``strict``, any missing/unexpected key.
    """
    source = source or []
    where = ", ".join(str(s) for s in source) or "the checkpoint"
    tied: dict[str, str] = getattr(model, "tied_weights", {})
    model_state = model.state_dict()
    expected = set(model_state)
    state, renamed = normalise_keys(state, expected, tied)
    wanted = expected - set(tied)

    report = LoadReport(source=source, renamed_keys=renamed)
    report.unexpected_keys = sorted(set(state) - expected)
    report.missing_keys = sorted(wanted - set(state))
    loadable: dict[str, torch.Tensor] = {}
    for key in sorted(wanted & set(state)):
        have, want = tuple(state[key].shape), tuple(model_state[key].shape)
        if have != want:
            report.mismatched_keys.append((key, have, want))
        else:
            loadable[key] = state[key]

    if report.mismatched_keys and not ignore_mismatched_sizes:
        lines = "\n".join(
            f"  {k}: checkpoint {list(h)} vs model {list(w)}" for k, h, w in report.mismatched_keys[:10]
        )
        more = len(report.mismatched_keys) - 10
        raise CheckpointError(
            f"{where} does not fit this model: {len(report.mismatched_keys)} tensor(s) differ in shape\n{lines}"
            + (f"\n  ... and {more} more" if more > 0 else "")
            + "\nThe checkpoint is from a different model size or vocabulary. Load it with its own config.json "
            "(no config= or size overrides), or pass ignore_mismatched_sizes=True to re-initialise these tensors "
            "(e.g. a classifier with another number of labels)."
        )
    if not loadable:
        raise CheckpointError(
            f"no tensor in {where} matches a parameter of {type(model).__name__} (checkpoint names such as "
            f"{sorted(state)[:3]}); it is not a transformers-format BERT checkpoint"
        )
    if strict and (report.missing_keys or report.unexpected_keys):
        raise CheckpointError(
            f"strict load of {where} into {type(model).__name__} failed: missing {report.missing_keys}, "
            f"unexpected {report.unexpected_keys}"
        )
    fresh = report.missing_keys + [k for k, _, _ in report.mismatched_keys]
    if init_missing:
        for owner in sorted({key.rpartition(".")[0] for key in fresh}):
            model._init_weights(model.get_submodule(owner))
    model.load_state_dict(loadable, strict=False)
    if hasattr(model, "tie_weights"):
        model.tie_weights()
    head = [k for k in fresh if new_head and not k.startswith(PREFIX)]
    if head:
        log.info("%s: the task head is new, initialised fresh: %s", type(model).__name__, head)
    if surprising := [k for k in fresh if k not in head]:
        log.warning(
            "%s: newly initialised (not in %s): %s; train the model before using it for predictions",
            type(model).__name__,
            where,
            surprising,
        )
    if report.unexpected_keys:
        log.info("%s: unused tensors of %s: %s", type(model).__name__, where, report.unexpected_keys)
    return report


def load_pretrained(
    model_cls: Callable[[BertConfig], M],
    path: str | os.PathLike[str],
    *,
    config: BertConfig | None = None,
    strict: bool = False,
    ignore_mismatched_sizes: bool = False,
    new_head: bool = False,
    **config_overrides: Any,
) -> tuple[M, LoadReport]:
    """Build ``model_cls`` from a Hugging Face model directory and load its weights.

    The model is built without initialising it (on the meta device, then allocated), so only the
    tensors the checkpoint lacks are initialised. It is returned in eval mode, as transformers does;
    call ``.train()`` to fine-tune.

    Args:
        model_cls: A class from ``bert_core.model`` (anything built from a ``BertConfig``).
        path: The model directory.
        config: Use this config instead of ``config.json``.
        strict: Raise if any tensor is newly initialised or unused.
        ignore_mismatched_sizes: Re-initialise tensors whose shape differs instead of raising.
        new_head: A new task head is expected (:func:`load_state_dict_into`).
        **config_overrides: ``BertConfig`` fields to change, e.g. ``num_labels=3``.
    """
    path = Path(path)
    cfg = config if config is not None else read_config(path)
    if config_overrides:
        cfg = cfg.replace(**config_overrides)
    state, files = read_state_dict(path)
    with torch.device("meta"):
        model = model_cls(cfg)
    model.to_empty(device="cpu")
    report = load_state_dict_into(
        model,
        state,
        source=files,
        strict=strict,
        ignore_mismatched_sizes=ignore_mismatched_sizes,
        init_missing=True,
        new_head=new_head,
    )
    model.eval()
    return model, report


# ====================================================================== writing
def model_tensors(model: nn.Module) -> dict[str, torch.Tensor]:
    """The tensors to serialise: ``state_dict`` without tied aliases, contiguous, on the CPU."""
    tied = getattr(model, "tied_weights", {})
    return {k: v.detach().cpu().contiguous() for k, v in model.state_dict().items() if k not in tied}


def save_pretrained(model: nn.Module, path: str | os.PathLike[str]) -> Path:
    """Write ``config.json`` + ``model.safetensors`` for ``model`` into directory ``path``.

    A new directory appears complete or not at all. In an existing directory (which may also hold
    tokenizer files) each file is replaced atomically, weights first, config last.

    Returns:
        The directory.
    """
    path = Path(path)
    config: BertConfig = model.config
    config_dict = config.to_hf_dict(architectures=[type(model).__name__])
    config_dict["dtype"] = str(next(model.parameters()).dtype).removeprefix("torch.")
    tensors = model_tensors(model)
    if path.exists() and not path.is_dir():
        raise FileExistsError(f"{path} exists and is a file; save_pretrained needs a directory path")
    if not path.exists():
        with atomic_path(path, is_dir=True) as tmp:
            save_file(tensors, tmp / SAFETENSORS_NAME, metadata={"format": "pt"})
            share_like_umask(tmp / SAFETENSORS_NAME)
            (tmp / CONFIG_NAME).write_text(
                json.dumps(config_dict, indent=2, sort_keys=True) + "\n", encoding="utf-8"
            )
        return path
    with atomic_path(path / SAFETENSORS_NAME) as tmp:
        save_file(tensors, tmp, metadata={"format": "pt"})
        share_like_umask(tmp)
    write_json_atomic(path / CONFIG_NAME, config_dict)
    return path
