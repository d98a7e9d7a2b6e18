"""MLM + NSP pretraining data: instance creation, compact storage, parallel builder, streaming loader.

Public entry points (imported lazily so ``import bert_core.pretrain_data`` stays light):

* :class:`~bert_core.pretrain_data.params.PretrainDataParams` — the stage's typed params;
* :func:`~bert_core.pretrain_data.build.build_pretrain_data` — build ``<out>/<phase>/{train,heldout}``;
* :class:`~bert_core.pretrain_data.loader.PretrainingLoader` — shuffled, DDP-split, resumable batches;
* :func:`~bert_core.pretrain_data.loader.check_vocab_size` — refuse a model/data vocabulary mismatch.
"""

from __future__ import annotations

from typing import Any

_EXPORTS = {
    "PretrainDataParams": "params",
    "PhaseSpec": "params",
    "build_pretrain_data": "build",
    "BuildResult": "build",
    "PretrainingLoader": "loader",
    "check_vocab_size": "loader",
    "check_max_seq_length": "loader",
    "InstanceStore": "storage",
    "read_index": "storage",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        import importlib

        return getattr(importlib.import_module(f"{__name__}.{_EXPORTS[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
