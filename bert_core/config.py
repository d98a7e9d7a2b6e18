"""The BERT model configuration: a typed, self-validating dataclass with named size presets.

``BertConfig`` holds exactly the fields the encoder and its heads read. It validates itself on
construction and raises ``ValueError`` naming the field, the bad value and what would be valid, so a
typo in ``params/*.yaml`` fails before any tensor is allocated.

Sizes are named (BERT paper; Turc et al. 2019 for the compact models)::

    tiny   L=2  H=128  A=2        mini   L=4  H=256  A=4      small  L=4  H=512  A=8
    medium L=8  H=512  A=8        base   L=12 H=768  A=12     large  L=24 H=1024 A=16

The vocabulary size is never defaulted: it must come from the vocab the model is trained with (a
mismatch gives index errors or NaNs; the stages refuse one before training, see the vocab-size row of
docs/reliability.md), hence ``from_preset(name, vocab_size=...)``.

``to_hf_dict`` / ``from_hf_dict`` read and write the ``config.json`` of a Hugging Face BERT model
directory (``model_type: "bert"``), so a directory written here loads in ``transformers`` and back.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

ACTIVATIONS = ("gelu", "gelu_new", "gelu_pytorch_tanh", "relu", "silu", "swish", "tanh")
PROBLEM_TYPES = ("regression", "single_label_classification", "multi_label_classification")

# name -> (num_hidden_layers, hidden_size, num_attention_heads); intermediate size is 4H.
PRESETS: dict[str, tuple[int, int, int]] = {
    "tiny": (2, 128, 2),
    "mini": (4, 256, 4),
    "small": (4, 512, 8),
    "medium": (8, 512, 8),
    "base": (12, 768, 12),
    "large": (24, 1024, 16),
}


def preset_for(num_hidden_layers: int, hidden_size: int) -> str | None:
    """The preset name of a (L, H) shape, or ``None`` when it is not a published size."""
    for name, (layers, hidden, _) in PRESETS.items():
        if (layers, hidden) == (num_hidden_layers, hidden_size):
            return name
    return None


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _default_label(i: int) -> str:
    return f"LABEL_{i}"


@dataclass(frozen=True)
class BertConfig:
    """Hyperparameters of a BERT encoder and its task heads (names as in ``transformers.BertConfig``).

    Attributes:
        vocab_size: WordPiece vocabulary size; must equal the size of the vocab the data uses.
        hidden_size: H, the width of every hidden state. Must be divisible by ``num_attention_heads``.
        num_hidden_layers: L, the number of transformer blocks.
        num_attention_heads: A, attention heads per block (head size H / A).
        intermediate_size: Feed-forward inner size; ``None`` means 4H (the paper's choice).
        hidden_act: Feed-forward and MLM-transform activation; "gelu" is the exact erf GELU.
        hidden_dropout_prob: Dropout on embeddings and on each sub-layer output.
        attention_probs_dropout_prob: Dropout on the attention probabilities.
        max_position_embeddings: Longest sequence the learned position table covers.
        type_vocab_size: Number of segment ids (2: sentence A and B).
        layer_norm_eps: LayerNorm epsilon.
        initializer_range: Std of the truncated-free normal init of weights (as in transformers).
        pad_token_id: Id of ``[PAD]``; its embedding row starts at zero and gets no gradient.
        num_labels: Output size of sequence/token classification heads (1 = regression) and of
            the QA head (2: start and end logits).
        classifier_dropout: Dropout before classification heads; ``None`` means ``hidden_dropout_prob``.
        problem_type: Sequence-classification loss; ``None`` infers it like transformers
            (1 label -> regression, integer labels -> cross-entropy, float labels -> BCE).
        id2label: Optional label names by id, written to ``config.json`` for pipelines.
        unpad: Run the encoder on the real tokens only (``bert_core.unpad``: embeddings, projections,
            feed-forward and LayerNorms on the packed ``(N, H)`` tokens of a padded batch; hidden states
            at padding come back as zeros). Same results at real tokens; question answering keeps the
            padded path. A runtime choice like transformers' ``attn_implementation``: not written to
            ``config.json``.
    """

    vocab_size: int
    hidden_size: int = 768
    num_hidden_layers: int = 12
    num_attention_heads: int = 12
    intermediate_size: int | None = None
    hidden_act: str = "gelu"
    hidden_dropout_prob: float = 0.1
    attention_probs_dropout_prob: float = 0.1
    max_position_embeddings: int = 512
    type_vocab_size: int = 2
    layer_norm_eps: float = 1e-12
    initializer_range: float = 0.02
    pad_token_id: int = 0
    num_labels: int = 2
    classifier_dropout: float | None = None
    problem_type: str | None = None
    id2label: dict[int, str] | None = None
    unpad: bool = False

    def __post_init__(self) -> None:
        for name in (
            "vocab_size",
            "hidden_size",
            "num_hidden_layers",
            "num_attention_heads",
            "max_position_embeddings",
            "type_vocab_size",
            "num_labels",
        ):
            value = getattr(self, name)
            if not _is_int(value) or value < 1:
                raise ValueError(f"BertConfig.{name}={value!r} is invalid: expected an integer >= 1")
        if self.intermediate_size is None:
            object.__setattr__(self, "intermediate_size", 4 * self.hidden_size)
        if not _is_int(self.intermediate_size) or self.intermediate_size < 1:
            raise ValueError(
                f"BertConfig.intermediate_size={self.intermediate_size!r} is invalid: expected an integer "
                ">= 1 (usually 4 * hidden_size), or None for 4 * hidden_size"
            )
        if self.hidden_size % self.num_attention_heads:
            raise ValueError(
                f"BertConfig.hidden_size={self.hidden_size} is not divisible by "
                f"num_attention_heads={self.num_attention_heads}: choose a head count that divides the hidden "
                f"size (e.g. {self.hidden_size // 64 or 1} heads of size 64)"
            )
        if self.hidden_act not in ACTIVATIONS:
            raise ValueError(
                f"BertConfig.hidden_act={self.hidden_act!r} is not supported; valid: {ACTIVATIONS}"
            )
        for name in ("hidden_dropout_prob", "attention_probs_dropout_prob", "classifier_dropout"):
            value = getattr(self, name)
            if value is None and name == "classifier_dropout":
                continue
            if not _is_number(value) or not 0.0 <= value < 1.0:
                raise ValueError(f"BertConfig.{name}={value!r} is invalid: expected a probability in [0, 1)")
        if not _is_number(self.layer_norm_eps) or not self.layer_norm_eps > 0:
            raise ValueError(
                f"BertConfig.layer_norm_eps={self.layer_norm_eps!r} is invalid: expected a number > 0"
            )
        if not _is_number(self.initializer_range) or self.initializer_range < 0:
            raise ValueError(
                f"BertConfig.initializer_range={self.initializer_range!r} is invalid: expected a number >= 0"
            )
        if not _is_int(self.pad_token_id) or not 0 <= self.pad_token_id < self.vocab_size:
            raise ValueError(
                f"BertConfig.pad_token_id={self.pad_token_id!r} is invalid: expected an integer in "
                f"[0, vocab_size={self.vocab_size})"
            )
        if not isinstance(self.unpad, bool):
            raise ValueError(f"BertConfig.unpad={self.unpad!r} is invalid: expected true or false")
        if self.problem_type is not None and self.problem_type not in PROBLEM_TYPES:
            raise ValueError(
                f"BertConfig.problem_type={self.problem_type!r} is invalid; valid: None or one of {PROBLEM_TYPES}"
            )
        if self.id2label is not None:
            labels = {int(k): str(v) for k, v in dict(self.id2label).items()}
            if sorted(labels) != list(range(self.num_labels)):
                raise ValueError(
                    f"BertConfig.id2label has ids {sorted(labels)} but num_labels={self.num_labels}: "
                    f"expected exactly the ids 0..{self.num_labels - 1}"
                )
            object.__setattr__(self, "id2label", labels)

    # ------------------------------------------------------------------ constructors
    @classmethod
    def from_preset(cls, name: str, *, vocab_size: int, **overrides: Any) -> BertConfig:
        """Build a named size (tiny, mini, small, medium, base, large) with optional field overrides.

        Args:
            name: Preset name (case-insensitive).
            vocab_size: Size of the vocabulary the model will use (from the vocab file).
            **overrides: Any other ``BertConfig`` field, e.g. ``hidden_dropout_prob=0.0``.

        Raises:
            ValueError: unknown preset or field, or an invalid value.
        """
        key = str(name).lower()
        if key not in PRESETS:
            raise ValueError(f"unknown BERT preset {name!r}; valid presets: {', '.join(PRESETS)}")
        layers, hidden, heads = PRESETS[key]
        values: dict[str, Any] = {
            "num_hidden_layers": layers,
            "hidden_size": hidden,
            "num_attention_heads": heads,
            "intermediate_size": 4 * hidden,
        }
        _check_field_names(overrides, where=f"overrides of preset {key!r}")
        if "hidden_size" in overrides and "intermediate_size" not in overrides:
            values["intermediate_size"] = None  # keep the 4H rule for an overridden width
        values.update(overrides)
        return cls(vocab_size=vocab_size, **values)

    def replace(self, **changes: Any) -> BertConfig:
        """A copy with some fields changed (validated like a new config)."""
        _check_field_names(changes, where="BertConfig.replace")
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        """Plain dict of every field (for logging as run parameters)."""
        return dataclasses.asdict(self)

    # ------------------------------------------------------------------ Hugging Face config.json
    def to_hf_dict(self, architectures: list[str] | None = None) -> dict[str, Any]:
        """The ``config.json`` dict of a transformers BERT model directory.

        Args:
            architectures: Class names to record (e.g. ``["BertForPreTraining"]``); transformers'
                ``pipeline`` and Auto classes use it to pick a head.
        """
        id2label = self.id2label or {i: _default_label(i) for i in range(self.num_labels)}
        out: dict[str, Any] = {
            "architectures": list(architectures) if architectures else None,
            "model_type": "bert",
            "vocab_size": self.vocab_size,
            "hidden_size": self.hidden_size,
            "num_hidden_layers": self.num_hidden_layers,
            "num_attention_heads": self.num_attention_heads,
            "intermediate_size": self.intermediate_size,
            "hidden_act": self.hidden_act,
            "hidden_dropout_prob": self.hidden_dropout_prob,
            "attention_probs_dropout_prob": self.attention_probs_dropout_prob,
            "max_position_embeddings": self.max_position_embeddings,
            "type_vocab_size": self.type_vocab_size,
            "initializer_range": self.initializer_range,
            "layer_norm_eps": self.layer_norm_eps,
            "pad_token_id": self.pad_token_id,
            "classifier_dropout": self.classifier_dropout,
            "problem_type": self.problem_type,
            "id2label": {str(i): label for i, label in id2label.items()},
            "label2id": {label: i for i, label in id2label.items()},
            "position_embedding_type": "absolute",
            "tie_word_embeddings": True,
            "is_decoder": False,
            "add_cross_attention": False,
        }
        if out["architectures"] is None:
            del out["architectures"]
        return out

    @classmethod
    def from_hf_dict(cls, hf: dict[str, Any], source: str = "config.json") -> BertConfig:
        """Read a transformers BERT ``config.json`` dict.

        Args:
            hf: The parsed JSON.
            source: Where it came from, for error messages.

        Raises:
            ValueError: not a BERT config, an architecture variant this encoder does not implement
                (relative positions, decoder, untied output embeddings), or an invalid value.
        """
        model_type = hf.get("model_type")
        if model_type is not None and model_type != "bert":
            raise ValueError(
                f"{source} has model_type={model_type!r}: this loader reads BERT models only "
                "(model_type 'bert'); use transformers directly for other architectures"
            )
        if "vocab_size" not in hf or "hidden_size" not in hf:
            raise ValueError(f"{source} does not look like a BERT config: it lacks vocab_size/hidden_size")
        unsupported = {
            "position_embedding_type": ("absolute", None),
            "is_decoder": (False, None),
            "add_cross_attention": (False, None),
            "tie_word_embeddings": (True, None),
        }
        for key, allowed in unsupported.items():
            if hf.get(key) not in allowed:
                raise ValueError(
                    f"{source} sets {key}={hf[key]!r}, which this encoder does not implement "
                    f"(supported: {allowed[0]!r})"
                )
        names = {f.name for f in dataclasses.fields(cls)}
        kwargs = {k: v for k, v in hf.items() if k in names and k != "id2label"}
        if hf.get("id2label"):
            id2label = {int(k): str(v) for k, v in hf["id2label"].items()}
            kwargs["num_labels"] = len(id2label)
            if any(id2label.get(i) != _default_label(i) for i in range(len(id2label))):
                kwargs["id2label"] = id2label
        elif "num_labels" in hf:
            kwargs["num_labels"] = hf["num_labels"]
        if kwargs.get("pad_token_id") is None:
            kwargs.pop("pad_token_id", None)
        try:
            return cls(**kwargs)
        except ValueError as err:
            raise ValueError(f"{source}: {err}") from err

    @property
    def head_size(self) -> int:
        """Size of one attention head (H / A)."""
        return self.hidden_size // self.num_attention_heads


def _check_field_names(values: dict[str, Any], where: str) -> None:
    names = [f.name for f in dataclasses.fields(BertConfig)]
    unknown = sorted(set(values) - set(names))
    if unknown:
        raise ValueError(
            f"unknown BertConfig field(s) {unknown} in {where}; valid fields: {', '.join(names)}"
        )
