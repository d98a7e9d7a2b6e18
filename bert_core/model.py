"""BERT encoder and task heads in plain PyTorch, weight-compatible with Hugging Face ``transformers``.

Module and parameter names, shapes and initialisation follow ``transformers.models.bert`` (5.x)
exactly, so ``state_dict()`` keys match ``BertModel`` / ``BertForPreTraining`` / ``BertFor*`` one to
one and weights load both ways without a mapping (the only renames, for old checkpoints, live in
``bert_core.hf``). Forward arguments use transformers' keyword names (``input_ids``,
``attention_mask``, ``token_type_ids``, ``labels``, ``next_sentence_label``, ``start_positions``,
``end_positions``), so the same batch dict feeds either implementation.

Deviations from transformers' implementation, and why:

1. **Sparse MLM head.** When ``labels`` is given, ``BertForPreTraining`` and ``BertForMaskedLM``
   gather the hidden states at the labelled positions (``labels != -100``) *before* the transform
   and the vocabulary projection, and return logits only there (``masked_lm_logits``, (N, V)) with
   the matching ``masked_lm_labels`` (N,). The loss is the same mean cross-entropy over those
   positions as transformers' (which projects all B*T positions and ignores -100), but the
   (B, T, V) projection - most of the compute of small models - shrinks ~7x at 15% masking
   (Cramming, Geiping & Goldstein 2023). Without ``labels`` the full (B, T, V) ``prediction_logits``
   / ``logits`` are returned, as in transformers. The pretraining stage instead passes Google's
   ``masked_lm_positions`` / ``masked_lm_ids`` / ``masked_lm_weights`` (B, P), P =
   ``max_predictions_per_seq``: the head gathers P positions per row (static shapes, no ``nonzero``, so
   ``torch.compile`` traces the step as one graph) and the loss is the weight-averaged cross-entropy,
   equal to the ``labels`` path's mean when the weights are 1 at real predictions and 0 at padded slots.
2. **Pretraining loss.** ``loss`` is the sum of whichever of the MLM and NSP losses have labels
   (transformers returns ``None`` unless both are given), and both parts are returned separately
   (``mlm_loss``, ``nsp_loss``). A batch with no masked position gives ``mlm_loss = 0`` (with a
   graph) instead of transformers' NaN, so one odd batch cannot poison a run.
3. **Attention** always uses ``torch.nn.functional.scaled_dot_product_attention`` with an additive
   padding mask built once per forward (in eager mode none when the batch has no padding; under
   ``torch.compile`` always, so no data-dependent branch breaks the graph). Encoder only:
   no decoder, cross-attention, KV cache, head pruning, ``inputs_embeds`` or ``position_ids``
   paths; positions are always 0..T-1 (what every BERT checkpoint was trained with).
4. **Sequence classification** infers the problem type per call and never mutates the config
   (transformers writes ``config.problem_type`` on the first forward); regression labels are cast to
   the logits' dtype, so integer targets work with MSE.
5. **Question answering** requires ``num_labels == 2`` (start, end) at construction instead of
   failing inside ``forward``.
6. Outputs are small dataclasses with only the fields listed on each, not ``ModelOutput``; there is no
   ``hidden_states``/``attentions`` capture.
7. **Unpadded encoding** (``config.unpad``, off by default; MosaicBERT's unpadding): embeddings,
   projections, feed-forward and LayerNorms run on the real tokens only, attention per sequence
   (:mod:`bert_core.unpad`); identical at real tokens, zeros at padding positions of
   ``last_hidden_state``. Question answering, whose loss reads padding positions, stays padded.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any, ClassVar, Self

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.utils.checkpoint import checkpoint

from bert_core.config import BertConfig
from bert_core.constants import IGNORE_INDEX
from bert_core.masked_lm import mlm_outputs
from bert_core.unpad import Packing, embed_packed

_ACTIVATIONS = {
    "gelu": F.gelu,  # exact erf GELU, as transformers' "gelu"
    "gelu_new": partial(F.gelu, approximate="tanh"),
    "gelu_pytorch_tanh": partial(F.gelu, approximate="tanh"),
    "relu": F.relu,
    "silu": F.silu,
    "swish": F.silu,
    "tanh": torch.tanh,
}


# ====================================================================== outputs
@dataclass
class BertModelOutput:
    """Encoder output: ``last_hidden_state`` (B, T, H); ``pooler_output`` (B, H) or None (no pooler)."""

    last_hidden_state: Tensor
    pooler_output: Tensor | None = None


@dataclass
class BertForPreTrainingOutput:
    """MLM + NSP output.

    Attributes:
        loss: ``mlm_loss + nsp_loss`` over the parts whose labels were given; None if neither.
        mlm_loss: Mean cross-entropy over the masked positions (given ``labels`` or ``masked_lm_ids``).
        nsp_loss: Cross-entropy of the NSP classifier (given ``next_sentence_label``).
        prediction_logits: (B, T, V) vocabulary logits at every position; only when ``labels`` is None.
        masked_lm_logits: (N, V) logits at the N positions with ``labels != -100`` (row-major order);
            with ``masked_lm_positions`` (B, P, V), the logits at those positions.
        masked_lm_labels: (N,) the target ids for ``masked_lm_logits``; with ``masked_lm_positions``
            (B, P): ``masked_lm_ids`` with -100 at the slots of weight 0 (padding).
        seq_relationship_logits: (B, 2) NSP logits (0 = IsNext, 1 = random sentence B).
    """

    loss: Tensor | None
    mlm_loss: Tensor | None
    nsp_loss: Tensor | None
    prediction_logits: Tensor | None
    masked_lm_logits: Tensor | None
    masked_lm_labels: Tensor | None
    seq_relationship_logits: Tensor


@dataclass
class MaskedLMOutput:
    """MLM-only output: ``loss``; ``logits`` (B, T, V) without labels; else ``masked_lm_logits`` (N, V)
    and ``masked_lm_labels`` (N,) at the labelled positions."""

    loss: Tensor | None
    logits: Tensor | None
    masked_lm_logits: Tensor | None
    masked_lm_labels: Tensor | None


@dataclass
class ClassifierOutput:
    """Sequence / token / multiple-choice output: ``loss`` (given labels) and ``logits``:
    (B, num_labels) for sequences, (B, T, num_labels) for tokens, (B, num_choices) for multiple choice."""

    loss: Tensor | None
    logits: Tensor


@dataclass
class QuestionAnsweringOutput:
    """Span extraction: ``loss`` (mean of start and end cross-entropy), ``start_logits``/``end_logits`` (B, T)."""

    loss: Tensor | None
    start_logits: Tensor
    end_logits: Tensor


# ====================================================================== encoder
class BertEmbeddings(nn.Module):
    """Token + segment + learned position embeddings, then LayerNorm and dropout (paper section 3)."""

    def __init__(self, config: BertConfig) -> None:
        super().__init__()
        self.word_embeddings = nn.Embedding(
            config.vocab_size, config.hidden_size, padding_idx=config.pad_token_id
        )
        self.position_embeddings = nn.Embedding(config.max_position_embeddings, config.hidden_size)
        self.token_type_embeddings = nn.Embedding(config.type_vocab_size, config.hidden_size)
        self.LayerNorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.dropout = nn.Dropout(config.hidden_dropout_prob)

    def forward(self, input_ids: Tensor, token_type_ids: Tensor | None = None) -> Tensor:
        """(B, T) ids -> (B, T, H) embeddings."""
        seq_len = input_ids.shape[1]
        if seq_len > self.position_embeddings.num_embeddings:
            raise ValueError(
                f"sequence length {seq_len} exceeds max_position_embeddings={self.position_embeddings.num_embeddings}; "
                "truncate the input or use a model with a longer position table"
            )
        x = self.word_embeddings(input_ids)  # (B, T, H)
        if token_type_ids is None:
            x = x + self.token_type_embeddings.weight[0]  # segment 0 everywhere, as a lookup of zeros
        else:
            x = x + self.token_type_embeddings(token_type_ids)
        x = x + self.position_embeddings.weight[:seq_len]  # positions 0..T-1: a slice, not a gather
        return self.dropout(self.LayerNorm(x))


class BertSelfAttention(nn.Module):
    """Multi-head self-attention through ``scaled_dot_product_attention``; returns the context."""

    def __init__(self, config: BertConfig) -> None:
        super().__init__()
        self.num_heads = config.num_attention_heads
        self.head_size = config.head_size
        self.dropout_p = config.attention_probs_dropout_prob
        self.query = nn.Linear(config.hidden_size, config.hidden_size)
        self.key = nn.Linear(config.hidden_size, config.hidden_size)
        self.value = nn.Linear(config.hidden_size, config.hidden_size)

    def forward(self, x: Tensor, mask: Tensor | Packing | None) -> Tensor:
        """x (B, T, H), additive mask (B, 1, 1, T) or None -> context (B, T, H);
        or packed x (N, H) with its :class:`~bert_core.unpad.Packing` -> context (N, H)."""
        dropout_p = self.dropout_p if self.training else 0.0
        if isinstance(mask, Packing):
            return mask.attention(self.query(x), self.key(x), self.value(x), self.num_heads, dropout_p)
        B, T, H = x.shape
        shape = (B, T, self.num_heads, self.head_size)
        q = self.query(x).view(shape).transpose(1, 2)  # (B, A, T, D)
        k = self.key(x).view(shape).transpose(1, 2)  # (B, A, T, D)
        v = self.value(x).view(shape).transpose(1, 2)  # (B, A, T, D)
        ctx = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout_p)  # (B, A, T, D)
        return ctx.transpose(1, 2).reshape(B, T, H)


class BertResidualOutput(nn.Module):
    """dense -> dropout -> LayerNorm(. + residual): transformers' ``BertSelfOutput`` and ``BertOutput``."""

    def __init__(self, config: BertConfig, in_features: int) -> None:
        super().__init__()
        self.dense = nn.Linear(in_features, config.hidden_size)
        self.LayerNorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.dropout = nn.Dropout(config.hidden_dropout_prob)

    def forward(self, x: Tensor, residual: Tensor) -> Tensor:
        """x (B, T, in_features), residual (B, T, H) -> (B, T, H)."""
        return self.LayerNorm(self.dropout(self.dense(x)) + residual)


class BertAttention(nn.Module):
    """Self-attention plus its output projection, residual and LayerNorm."""

    def __init__(self, config: BertConfig) -> None:
        super().__init__()
        self.self = BertSelfAttention(config)
        self.output = BertResidualOutput(config, config.hidden_size)

    def forward(self, x: Tensor, mask: Tensor | Packing | None) -> Tensor:
        return self.output(self.self(x, mask), x)  # (B, T, H)


class BertIntermediate(nn.Module):
    """Feed-forward expansion H -> intermediate_size with the configured activation."""

    def __init__(self, config: BertConfig) -> None:
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.intermediate_size)
        self.act = _ACTIVATIONS[config.hidden_act]

    def forward(self, x: Tensor) -> Tensor:
        return self.act(self.dense(x))  # (B, T, I)


class BertLayer(nn.Module):
    """One post-LayerNorm transformer block (Vaswani et al. 2017, as used by BERT)."""

    def __init__(self, config: BertConfig) -> None:
        super().__init__()
        self.attention = BertAttention(config)
        self.intermediate = BertIntermediate(config)
        self.output = BertResidualOutput(config, config.intermediate_size)

    def forward(self, x: Tensor, mask: Tensor | Packing | None) -> Tensor:
        x = self.attention(x, mask)  # (B, T, H)
        return self.output(self.intermediate(x), x)  # (B, T, H)


class BertEncoder(nn.Module):
    """A stack of ``num_hidden_layers`` blocks, optionally with activation checkpointing."""

    def __init__(self, config: BertConfig) -> None:
        super().__init__()
        self.layer = nn.ModuleList(BertLayer(config) for _ in range(config.num_hidden_layers))
        self.gradient_checkpointing = False

    def forward(self, x: Tensor, mask: Tensor | Packing | None) -> Tensor:
        for layer in self.layer:
            if self.gradient_checkpointing and self.training:
                x = checkpoint(layer, x, mask, use_reentrant=False)
            else:
                x = layer(x, mask)
        return x  # (B, T, H)


class BertPooler(nn.Module):
    """tanh(dense(h_[CLS])): the sentence vector used by NSP and sequence-level heads."""

    def __init__(self, config: BertConfig) -> None:
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.hidden_size)

    def forward(self, hidden: Tensor) -> Tensor:
        return torch.tanh(self.dense(hidden[:, 0]))  # (B, H)


def padding_mask(attention_mask: Tensor | None, dtype: torch.dtype) -> Tensor | None:
    """(B, T) 1/0 mask -> additive (B, 1, 1, T) mask for SDPA, or None when nothing is padded.

    Padded keys get the dtype's most negative value (exp underflows to exactly 0, as with a boolean
    mask) rather than -inf, so a row with no real token gives uniform weights instead of NaN.
    """
    if attention_mask is None:
        return None
    if attention_mask.dim() != 2:
        raise ValueError(f"attention_mask must be (batch, seq_len), got shape {tuple(attention_mask.shape)}")
    keep = attention_mask.bool()
    # Eager on a CPU with no padding: SDPA's unmasked path is faster. Compiled, no data-dependent branch; on a
    # GPU, reading the answer would make the host wait for the device in every forward.
    if keep.device.type == "cpu" and not torch.compiler.is_compiling() and bool(keep.all()):
        return None
    bias = torch.zeros(keep.shape, dtype=dtype, device=keep.device)
    bias.masked_fill_(~keep, torch.finfo(dtype).min)
    return bias[:, None, None, :]  # (B, 1, 1, T)


# ====================================================================== base class
class BertPreTrainedModel(nn.Module):
    """Shared init, weight tying and Hugging Face directory I/O for every model class here."""

    # Tied aliases (name -> the parameter it shares); they are not written to checkpoints.
    tied_weights: ClassVar[dict[str, str]] = {}

    def __init__(self, config: BertConfig) -> None:
        super().__init__()
        if not isinstance(config, BertConfig):
            raise TypeError(
                f"{type(self).__name__} needs a bert_core.config.BertConfig, got {type(config).__name__}"
            )
        self.config = config

    def post_init(self) -> None:
        """Initialise weights as transformers does, then tie the MLM decoder to the embeddings.

        The ``bert`` encoder inside a head model has already initialised itself, so it is skipped.
        """
        for name, child in self.named_children():
            if name != "bert":
                child.apply(self._init_weights)
        self.tie_weights()

    @torch.no_grad()
    def _init_weights(self, module: nn.Module) -> None:
        std = self.config.initializer_range
        if isinstance(module, nn.Linear):
            module.weight.normal_(0.0, std)
            if module.bias is not None:
                module.bias.zero_()
        elif isinstance(module, nn.Embedding):
            module.weight.normal_(0.0, std)
            if module.padding_idx is not None:
                module.weight[module.padding_idx].zero_()
        elif isinstance(module, nn.LayerNorm):
            module.weight.fill_(1.0)
            module.bias.zero_()
        elif isinstance(module, BertLMPredictionHead):
            module.bias.zero_()

    def tie_weights(self) -> None:
        """Make the MLM decoder share the word embeddings and the output bias (no-op without an MLM head)."""
        cls = getattr(self, "cls", None)
        if cls is not None and hasattr(cls, "predictions"):
            cls.predictions.decoder.weight = self.bert.embeddings.word_embeddings.weight
            cls.predictions.decoder.bias = cls.predictions.bias

    def gradient_checkpointing_enable(self) -> None:
        """Recompute each block's activations in backward (less memory, ~30% more compute)."""
        base = self if isinstance(self, BertModel) else self.bert
        base.encoder.gradient_checkpointing = True

    def num_parameters(self, trainable_only: bool = False) -> int:
        """Number of distinct parameters (tied ones counted once)."""
        return sum(p.numel() for p in self.parameters() if p.requires_grad or not trainable_only)

    @classmethod
    def from_pretrained(
        cls,
        path: str | os.PathLike[str],
        *,
        config: BertConfig | None = None,
        strict: bool = False,
        ignore_mismatched_sizes: bool = False,
        output_loading_info: bool = False,
        new_head: bool = False,
        **config_overrides: Any,
    ) -> Self | tuple[Self, Any]:
        """Load a Hugging Face BERT model directory (config.json + model.safetensors / pytorch_model.bin).

        Heads not in the checkpoint are initialised fresh and reported (logged as a warning), as in
        transformers; see :func:`bert_core.hf.load_pretrained` for the rules and errors.

        Args:
            path: The model directory.
            config: Use this config instead of the directory's ``config.json``.
            strict: Raise if any weight is newly initialised or any checkpoint tensor is unused.
            ignore_mismatched_sizes: Re-initialise tensors whose shape differs (e.g. a classifier with
                another label count) instead of raising.
            output_loading_info: Also return the :class:`bert_core.hf.LoadReport`.
            new_head: A new task head on the checkpoint's encoder is expected (fine-tuning): it is
                logged at INFO, not as a warning.
            **config_overrides: Fields to change on the loaded config, e.g. ``num_labels=3``.
        """
        from bert_core import hf

        model, report = hf.load_pretrained(
            cls,
            path,
            config=config,
            strict=strict,
            ignore_mismatched_sizes=ignore_mismatched_sizes,
            new_head=new_head,
            **config_overrides,
        )
        return (model, report) if output_loading_info else model

    def save_pretrained(self, path: str | os.PathLike[str]) -> Path:
        """Write ``config.json`` + ``model.safetensors`` that ``transformers.AutoModelFor*`` loads."""
        from bert_core import hf

        return hf.save_pretrained(self, path)


# ====================================================================== heads
class BertModel(BertPreTrainedModel):
    """The bare encoder: embeddings, transformer blocks and (optionally) the pooler."""

    def __init__(self, config: BertConfig, add_pooling_layer: bool = True) -> None:
        super().__init__(config)
        self.embeddings = BertEmbeddings(config)
        self.encoder = BertEncoder(config)
        self.pooler = BertPooler(config) if add_pooling_layer else None
        self.unpad = config.unpad  # a head whose loss reads padding positions turns it off
        self.post_init()

    def forward(
        self,
        input_ids: Tensor,
        attention_mask: Tensor | None = None,
        token_type_ids: Tensor | None = None,
    ) -> BertModelOutput:
        """Encode a batch.

        Args:
            input_ids: (B, T) token ids.
            attention_mask: (B, T) 1 for real tokens, 0 for padding; None = no padding.
            token_type_ids: (B, T) segment ids (0 = sentence A, 1 = sentence B); None = all 0.
        """
        if self.unpad and attention_mask is not None:  # deviation 7: no compute on padding
            packing = Packing.from_mask(attention_mask)
            x = embed_packed(self.embeddings, input_ids, token_type_ids, packing)  # (N, H)
            x = packing.scatter(self.encoder(x, packing))  # (N, H) -> (B, T, H), zeros at padding
        else:
            x = self.embeddings(input_ids, token_type_ids)  # (B, T, H)
            x = self.encoder(x, padding_mask(attention_mask, x.dtype))  # (B, T, H)
        pooled = self.pooler(x) if self.pooler is not None else None  # (B, H)
        return BertModelOutput(last_hidden_state=x, pooler_output=pooled)


class BertPredictionHeadTransform(nn.Module):
    """dense -> activation -> LayerNorm applied before the vocabulary projection."""

    def __init__(self, config: BertConfig) -> None:
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.hidden_size)
        self.act = _ACTIVATIONS[config.hidden_act]
        self.LayerNorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)

    def forward(self, x: Tensor) -> Tensor:
        return self.LayerNorm(self.act(self.dense(x)))


class BertLMPredictionHead(nn.Module):
    """Transform + vocabulary projection whose weight is the (tied) word-embedding matrix."""

    def __init__(self, config: BertConfig) -> None:
        super().__init__()
        self.transform = BertPredictionHeadTransform(config)
        self.decoder = nn.Linear(config.hidden_size, config.vocab_size)
        self.bias = nn.Parameter(torch.zeros(config.vocab_size))

    def forward(self, x: Tensor) -> Tensor:
        return self.decoder(self.transform(x))  # (..., H) -> (..., V)


class BertOnlyMLMHead(nn.Module):
    def __init__(self, config: BertConfig) -> None:
        super().__init__()
        self.predictions = BertLMPredictionHead(config)


class BertPreTrainingHeads(nn.Module):
    def __init__(self, config: BertConfig) -> None:
        super().__init__()
        self.predictions = BertLMPredictionHead(config)
        self.seq_relationship = nn.Linear(config.hidden_size, 2)


class BertForPreTraining(BertPreTrainedModel):
    """Encoder + masked-LM head (tied to the word embeddings) + next-sentence-prediction head."""

    tied_weights: ClassVar[dict[str, str]] = {
        "cls.predictions.decoder.weight": "bert.embeddings.word_embeddings.weight",
        "cls.predictions.decoder.bias": "cls.predictions.bias",
    }

    def __init__(self, config: BertConfig) -> None:
        super().__init__(config)
        self.bert = BertModel(config)
        self.cls = BertPreTrainingHeads(config)
        self.post_init()

    def forward(
        self,
        input_ids: Tensor,
        attention_mask: Tensor | None = None,
        token_type_ids: Tensor | None = None,
        labels: Tensor | None = None,
        next_sentence_label: Tensor | None = None,
        masked_lm_positions: Tensor | None = None,
        masked_lm_ids: Tensor | None = None,
        masked_lm_weights: Tensor | None = None,
    ) -> BertForPreTrainingOutput:
        """MLM + NSP forward.

        Args:
            input_ids, attention_mask, token_type_ids: (B, T), see :meth:`BertModel.forward`.
            labels: (B, T) original ids at masked positions, -100 elsewhere (transformers' form).
            next_sentence_label: (B,) 0 = B follows A, 1 = B is random.
            masked_lm_positions, masked_lm_ids, masked_lm_weights: (B, P) Google's static-shape form,
                instead of ``labels`` (see :func:`bert_core.masked_lm.mlm_at_positions`).
        """
        out = self.bert(input_ids, attention_mask, token_type_ids)
        mlm_loss, full, masked_logits, masked_labels = mlm_outputs(
            self.cls.predictions,
            out.last_hidden_state,
            labels,
            masked_lm_positions,
            masked_lm_ids,
            masked_lm_weights,
        )
        nsp_logits = self.cls.seq_relationship(out.pooler_output)  # (B, 2)
        nsp_loss = None
        if next_sentence_label is not None:
            nsp_loss = F.cross_entropy(nsp_logits, next_sentence_label.view(-1))
        if mlm_loss is not None and nsp_loss is not None:
            loss = mlm_loss + nsp_loss
        else:
            loss = mlm_loss if mlm_loss is not None else nsp_loss
        return BertForPreTrainingOutput(
            loss=loss,
            mlm_loss=mlm_loss,
            nsp_loss=nsp_loss,
            prediction_logits=full,
            masked_lm_logits=masked_logits,
            masked_lm_labels=masked_labels,
            seq_relationship_logits=nsp_logits,
        )


class BertForMaskedLM(BertPreTrainedModel):
    """Encoder (no pooler) + tied masked-LM head: MLM-only pretraining and fill-mask."""

    tied_weights: ClassVar[dict[str, str]] = BertForPreTraining.tied_weights

    def __init__(self, config: BertConfig) -> None:
        super().__init__(config)
        self.bert = BertModel(config, add_pooling_layer=False)
        self.cls = BertOnlyMLMHead(config)
        self.post_init()

    def forward(
        self,
        input_ids: Tensor,
        attention_mask: Tensor | None = None,
        token_type_ids: Tensor | None = None,
        labels: Tensor | None = None,
        masked_lm_positions: Tensor | None = None,
        masked_lm_ids: Tensor | None = None,
        masked_lm_weights: Tensor | None = None,
    ) -> MaskedLMOutput:
        """Args as :meth:`BertForPreTraining.forward` without NSP."""
        hidden = self.bert(input_ids, attention_mask, token_type_ids).last_hidden_state
        loss, full, masked_logits, masked_labels = mlm_outputs(
            self.cls.predictions, hidden, labels, masked_lm_positions, masked_lm_ids, masked_lm_weights
        )
        return MaskedLMOutput(
            loss=loss, logits=full, masked_lm_logits=masked_logits, masked_lm_labels=masked_labels
        )


def _classifier_dropout(config: BertConfig) -> nn.Dropout:
    p = config.classifier_dropout if config.classifier_dropout is not None else config.hidden_dropout_prob
    return nn.Dropout(p)


class BertForSequenceClassification(BertPreTrainedModel):
    """Pooled [CLS] vector -> dropout -> linear (GLUE). ``num_labels == 1`` is regression (MSE)."""

    def __init__(self, config: BertConfig) -> None:
        super().__init__(config)
        self.num_labels = config.num_labels
        self.bert = BertModel(config)
        self.dropout = _classifier_dropout(config)
        self.classifier = nn.Linear(config.hidden_size, config.num_labels)
        self.post_init()

    def forward(
        self,
        input_ids: Tensor,
        attention_mask: Tensor | None = None,
        token_type_ids: Tensor | None = None,
        labels: Tensor | None = None,
    ) -> ClassifierOutput:
        """labels: (B,) class ids, (B,) floats for regression, or (B, num_labels) floats for multi-label."""
        pooled = self.bert(input_ids, attention_mask, token_type_ids).pooler_output  # (B, H)
        logits = self.classifier(self.dropout(pooled))  # (B, num_labels)
        loss = None
        if labels is not None:
            problem = self.config.problem_type
            if problem is None:
                if self.num_labels == 1:
                    problem = "regression"
                elif labels.dtype in (torch.long, torch.int):
                    problem = "single_label_classification"
                else:
                    problem = "multi_label_classification"
            if problem == "regression":
                target = labels.to(logits.dtype)
                if self.num_labels == 1:
                    loss = F.mse_loss(logits.squeeze(), target.squeeze())
                else:
                    loss = F.mse_loss(logits, target)
            elif problem == "single_label_classification":
                loss = F.cross_entropy(logits.view(-1, self.num_labels), labels.view(-1))
            else:
                loss = F.binary_cross_entropy_with_logits(logits, labels.to(logits.dtype))
        return ClassifierOutput(loss=loss, logits=logits)


class BertForTokenClassification(BertPreTrainedModel):
    """Per-token linear classifier (NER); labels -100 are ignored (e.g. non-first sub-tokens)."""

    def __init__(self, config: BertConfig) -> None:
        super().__init__(config)
        self.num_labels = config.num_labels
        self.bert = BertModel(config, add_pooling_layer=False)
        self.dropout = _classifier_dropout(config)
        self.classifier = nn.Linear(config.hidden_size, config.num_labels)
        self.post_init()

    def forward(
        self,
        input_ids: Tensor,
        attention_mask: Tensor | None = None,
        token_type_ids: Tensor | None = None,
        labels: Tensor | None = None,
    ) -> ClassifierOutput:
        """labels: (B, T) tag ids, -100 = ignore."""
        hidden = self.bert(input_ids, attention_mask, token_type_ids).last_hidden_state  # (B, T, H)
        logits = self.classifier(self.dropout(hidden))  # (B, T, num_labels)
        loss = None
        if labels is not None:
            loss = F.cross_entropy(
                logits.view(-1, self.num_labels), labels.view(-1), ignore_index=IGNORE_INDEX
            )
        return ClassifierOutput(loss=loss, logits=logits)


class BertForQuestionAnswering(BertPreTrainedModel):
    """Span extraction (SQuAD): a start and an end logit per token."""

    # The span loss's softmax covers padding positions too (as transformers'), so ``config.unpad``
    # (zeros at padding) would change it: this head always encodes padded.
    reads_padding: ClassVar[bool] = True

    def __init__(self, config: BertConfig) -> None:
        super().__init__(config)
        if config.num_labels != 2:
            raise ValueError(
                f"BertForQuestionAnswering needs num_labels=2 (start and end logits), got {config.num_labels}"
            )
        self.num_labels = 2
        self.bert = BertModel(config, add_pooling_layer=False)
        self.bert.unpad = False  # see reads_padding
        self.qa_outputs = nn.Linear(config.hidden_size, 2)
        self.post_init()

    def forward(
        self,
        input_ids: Tensor,
        attention_mask: Tensor | None = None,
        token_type_ids: Tensor | None = None,
        start_positions: Tensor | None = None,
        end_positions: Tensor | None = None,
    ) -> QuestionAnsweringOutput:
        """start_positions / end_positions: (B,) token indices; positions outside [0, T) are ignored."""
        hidden = self.bert(input_ids, attention_mask, token_type_ids).last_hidden_state  # (B, T, H)
        start_logits, end_logits = self.qa_outputs(hidden).unbind(-1)  # (B, T) each
        loss = None
        if start_positions is not None and end_positions is not None:
            T = start_logits.shape[1]
            # As transformers: clamp out-of-window positions to T and ignore them.
            start = start_positions.view(-1).clamp(0, T)
            end = end_positions.view(-1).clamp(0, T)
            loss = (
                F.cross_entropy(start_logits, start, ignore_index=T)
                + F.cross_entropy(end_logits, end, ignore_index=T)
            ) / 2
        return QuestionAnsweringOutput(loss=loss, start_logits=start_logits, end_logits=end_logits)


class BertForMultipleChoice(BertPreTrainedModel):
    """SWAG-style: score each (context, choice) pair with one vector; softmax over the choices."""

    def __init__(self, config: BertConfig) -> None:
        super().__init__(config)
        self.bert = BertModel(config)
        self.dropout = _classifier_dropout(config)
        self.classifier = nn.Linear(config.hidden_size, 1)
        self.post_init()

    def forward(
        self,
        input_ids: Tensor,
        attention_mask: Tensor | None = None,
        token_type_ids: Tensor | None = None,
        labels: Tensor | None = None,
    ) -> ClassifierOutput:
        """input_ids, attention_mask, token_type_ids: (B, C, T); labels: (B,) index of the right choice."""
        if input_ids.dim() != 3:
            raise ValueError(
                f"BertForMultipleChoice expects input_ids of shape (batch, choices, seq_len), got {tuple(input_ids.shape)}"
            )
        B, C, T = input_ids.shape
        flat = [None if t is None else t.reshape(B * C, T) for t in (attention_mask, token_type_ids)]
        pooled = self.bert(input_ids.reshape(B * C, T), *flat).pooler_output  # (B*C, H)
        logits = self.classifier(self.dropout(pooled)).view(B, C)  # (B, C)
        loss = F.cross_entropy(logits, labels) if labels is not None else None
        return ClassifierOutput(loss=loss, logits=logits)
