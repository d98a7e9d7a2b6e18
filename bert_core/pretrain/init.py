"""Continued pretraining: the model starts from the checkpoint the ``vocab`` stage copied.

When ``vocab.from_checkpoint`` is set, the vocab stage writes the checkpoint's ``config.json`` and weights to
``<vocab_dir>/checkpoint/`` (:mod:`bert_core.vocab.checkpoint`), next to its tokenizer. Pretraining then
builds the model from that config rather than from ``pretrain.model.preset`` (hidden size, layers, heads,
intermediate size, position table, vocabulary and token types are the checkpoint's), loads the encoder, and
loads the MLM and NSP heads when the checkpoint has them (a bare ``BertModel`` such as all-MiniLM-L6-v2
gets fresh heads, initialised as in the paper; ``init_mlm_bias: unigram`` then applies to the fresh MLM
bias). ``pretrain.model.overrides`` may still change what does not decide a tensor's shape or meaning
(dropout, ``initializer_range`` for the fresh heads); a size it contradicts is refused, naming the key and
the checkpoint.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bert_core.config import BertConfig
from bert_core.pretrain.params import ModelParams
from bert_core.vocab.checkpoint import CHECKPOINT_SUBDIR, SOURCE_FILE

log = logging.getLogger(__name__)

#: Config fields a checkpoint fixes: overriding them would not fit (or would change the meaning of) its weights.
FIXED_FIELDS = (
    "vocab_size",
    "hidden_size",
    "num_hidden_layers",
    "num_attention_heads",
    "intermediate_size",
    "max_position_embeddings",
    "type_vocab_size",
    "hidden_act",
    "layer_norm_eps",
)


@dataclass(frozen=True)
class InitCheckpoint:
    """The checkpoint a continued pretraining run starts from.

    Attributes:
        path: ``<vocab_dir>/checkpoint`` (``config.json`` + ``model.safetensors``).
        source: What ``vocab.from_checkpoint`` named (a directory, Hub id or ``models:/`` URI).
        weights_sha256: sha256 of the copied weights (part of the checkpoint fingerprint of the run).
        config: The checkpoint's config.
    """

    path: Path
    source: str
    weights_sha256: str
    config: BertConfig


def find_init_checkpoint(vocab_dir: str | Path) -> InitCheckpoint | None:
    """The checkpoint copied by the vocab stage into ``vocab_dir``, or ``None`` (a trained vocabulary).

    Raises:
        FileNotFoundError: the checkpoint subdirectory lacks its record or its weights.
        ValueError: its config is not a BERT config.
    """
    from bert_core.hf import read_config

    path = Path(vocab_dir) / CHECKPOINT_SUBDIR
    if not path.is_dir():
        return None
    record_file = path / SOURCE_FILE
    if not record_file.is_file() or not (path / "model.safetensors").is_file():
        raise FileNotFoundError(
            f"{path} lacks {SOURCE_FILE} or model.safetensors: it was not written by the vocab stage; "
            "rebuild the vocabulary (dvc repro vocab)"
        )
    record = json.loads(record_file.read_text(encoding="utf-8"))
    return InitCheckpoint(path, str(record["source"]), str(record["weights_sha256"]), read_config(path))


def checkpoint_config(model: ModelParams, init: InitCheckpoint, max_position_embeddings: int) -> BertConfig:
    """The model config of a continued run: the checkpoint's, with ``unpad`` and the overrides that fit it.

    Args:
        model: ``pretrain.model`` (``preset`` is not used: the checkpoint decides the architecture).
        init: The checkpoint.
        max_position_embeddings: The position table the pretraining data was built for.

    Raises:
        ValueError: an override of a size the checkpoint fixes, or data built for another position table;
            each message names the key, its file and the checkpoint.
    """
    where = f"{init.path} (vocab.from_checkpoint={init.source!r})"
    for name, value in model.overrides.items():
        if name in FIXED_FIELDS and value != getattr(init.config, name):
            raise ValueError(
                f"pretrain.model.overrides.{name}={value!r} (params/pretrain.yaml) contradicts the checkpoint "
                f"{where}, which has {name}={getattr(init.config, name)!r}; continued pretraining keeps the "
                f"checkpoint's architecture: remove {name} from the overrides"
            )
    if max_position_embeddings != init.config.max_position_embeddings:
        raise ValueError(
            f"the pretraining data was built for max_position_embeddings={max_position_embeddings} "
            f"(pretrain_data.max_position_embeddings, params/pretrain_data.yaml) but the checkpoint {where} "
            f"has {init.config.max_position_embeddings}; set pretrain_data.max_position_embeddings: "
            f"{init.config.max_position_embeddings} and rebuild the data (dvc repro pretrain_data)"
        )
    return init.config.replace(unpad=model.unpad, **model.overrides)


def load_init_weights(model: Any, init: InitCheckpoint) -> dict[str, Any]:
    """Load the checkpoint into ``model`` (a freshly initialised ``BertForPreTraining``).

    Tensors the checkpoint lacks (the heads of a bare encoder) keep their fresh initialisation.

    Returns:
        What was loaded, for the run's metrics: ``source``, ``weights_sha256``, ``mlm_head`` and
        ``nsp_head`` (``"loaded"`` or ``"fresh"``), ``fresh_tensors`` (how many were not in the checkpoint).

    Raises:
        bert_core.hf.CheckpointError: a tensor whose shape does not fit (never for a config built by
            :func:`checkpoint_config`), or no tensor that matches.
    """
    from bert_core.hf import load_state_dict_into, read_state_dict

    state, files = read_state_dict(init.path)
    report = load_state_dict_into(model, state, source=files)
    missing = set(report.missing_keys)

    def head(prefix: str) -> str:
        return "fresh" if any(k.startswith(prefix) for k in missing) else "loaded"

    encoder_missing = [k for k in missing if k.startswith("bert.") and not k.startswith("bert.pooler.")]
    if encoder_missing:
        raise ValueError(
            f"{init.path} (vocab.from_checkpoint={init.source!r}) lacks encoder tensors "
            f"{sorted(encoder_missing)[:5]}; it is not a complete BERT checkpoint"
        )
    out = {
        "source": init.source,
        "weights_sha256": init.weights_sha256,
        "mlm_head": head("cls.predictions."),
        "nsp_head": head("cls.seq_relationship."),
        "fresh_tensors": len(missing),
    }
    log.info(
        "continued pretraining from %s: encoder loaded, MLM head %s, NSP head %s",
        init.source,
        out["mlm_head"],
        out["nsp_head"],
    )
    return out
