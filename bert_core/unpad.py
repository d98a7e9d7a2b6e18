"""Unpadded ("variable-length") encoding: no matmul, LayerNorm or GELU runs on padding.

MosaicBERT (Portes et al. 2023, ``bert_padding.py``) and ModernBERT (Warner et al. 2024) gather the real
tokens of a padded ``(B, T)`` batch into one packed token dimension ``(N, H)``, ``N = attention_mask.sum()``,
run embeddings, the Q/K/V and output projections, the feed-forward block and every LayerNorm on those N
rows only, and scatter back to ``(B, T, H)`` once, after the last layer. Attention is the one operation
that needs the sequence structure: here each layer scatters its packed Q, K, V into ``(B, T)`` slots,
runs :func:`torch.nn.functional.scaled_dot_product_attention` with the padding mask (the same kernel as
the padded path, so the same numbers), and gathers the context back. That keeps attention at the padded
cost (a small part of a BERT step: ``2T / 12H`` of the layer FLOPs, 14% for tiny at T=128, 11% for base
at 512) but needs no varlen kernel, so it runs on every device and dtype and under ``torch.compile``;
on CUDA, a flash varlen kernel (``torch.nn.attention.varlen``) could replace that one function later
(it has no attention dropout yet, which BERT's recipe uses).

Equivalence with the padded path (``tests/test_unpad.py``, fp32 to 1e-5): identical hidden states at
every real token, hence identical pooled output, MLM / NSP / sequence / token-classification logits at
real tokens, losses and gradients. Positions are each token's column index (``flat index % T``), as in
the padded path, so any mask pattern is exact, not only right padding.

What differs, by design: hidden states at padding positions are **zero** in the unpadded output (the
padded path computes a meaningless encoding of ``[PAD]`` there). No head reads them except question
answering, whose loss (as in transformers) takes its softmax over all T positions, padding included: its
loss differs by those terms, so the QA head keeps the padded path (``BertForQuestionAnswering``).

``torch.compile``: the number of real tokens N is data-dependent (``nonzero``: one host synchronisation
per forward, as in MosaicBERT). Under :func:`allow_data_dependent_shapes` (the Trainer calls it when
``compile`` is on) N is a symbolic size and the whole forward and backward compile to one graph, reused
for every batch (``tests/test_unpad.py`` checks ``fullgraph=True``); without it Dynamo breaks the
graph at the ``nonzero``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn


@dataclass
class Packing:
    """Where the real tokens of a padded batch live.

    Attributes:
        indices: (N,) int64 flat positions ``b * T + t`` of the real tokens, in row-major order.
        batch: B.
        seq_len: T.
        attn_mask: (B, 1, 1, T) bool, True at real keys (SDPA's boolean mask), for the attention step.
    """

    indices: Tensor
    batch: int
    seq_len: int
    attn_mask: Tensor

    @classmethod
    def from_mask(cls, attention_mask: Tensor) -> Packing:
        """From a (B, T) 1/0 attention mask."""
        if attention_mask.dim() != 2:
            raise ValueError(
                f"attention_mask must be (batch, seq_len), got shape {tuple(attention_mask.shape)}"
            )
        keep = attention_mask.bool()
        B, T = keep.shape
        indices = keep.flatten().nonzero().squeeze(1)  # (N,) data-dependent N: the one host sync
        return cls(indices=indices, batch=B, seq_len=T, attn_mask=keep[:, None, None, :])

    @property
    def positions(self) -> Tensor:
        """(N,) position id of each real token (its column in the padded batch)."""
        return self.indices % self.seq_len

    def gather(self, x: Tensor) -> Tensor:
        """(B, T, ...) -> (N, ...): the real tokens of a padded tensor."""
        return x.flatten(0, 1).index_select(0, self.indices)

    def scatter(self, x: Tensor) -> Tensor:
        """(N, ...) -> (B, T, ...) with zeros at padding (the inverse of :meth:`gather`)."""
        out = x.new_zeros((self.batch * self.seq_len, *x.shape[1:]))
        out = out.index_copy(0, self.indices, x)
        return out.view(self.batch, self.seq_len, *x.shape[1:])

    def attention(self, q: Tensor, k: Tensor, v: Tensor, num_heads: int, dropout_p: float) -> Tensor:
        """Self-attention of packed q, k, v (N, H) within each sequence -> context (N, H)."""
        H = q.shape[1]
        B, T, D = self.batch, self.seq_len, H // num_heads
        qkv = self.scatter(torch.cat((q, k, v), dim=1))  # (B, T, 3H), zeros at padding
        q, k, v = qkv.view(B, T, 3, num_heads, D).permute(2, 0, 3, 1, 4).unbind(0)  # (B, A, T, D) each
        ctx = F.scaled_dot_product_attention(q, k, v, attn_mask=self.attn_mask, dropout_p=dropout_p)
        return self.gather(ctx.transpose(1, 2).reshape(B, T, H))  # (N, H)


def embed_packed(
    embeddings: nn.Module, input_ids: Tensor, token_type_ids: Tensor | None, packing: Packing
) -> Tensor:
    """``BertEmbeddings`` on the real tokens only: (B, T) ids -> (N, H).

    Same sum as the padded path (word + segment + position ``t``), then LayerNorm and dropout.
    """
    table = embeddings.position_embeddings.num_embeddings
    if input_ids.shape[1] > table:
        raise ValueError(
            f"sequence length {input_ids.shape[1]} exceeds max_position_embeddings="
            f"{embeddings.position_embeddings.num_embeddings}; truncate the input or use a model with a "
            "longer position table"
        )
    ids = input_ids.flatten().index_select(0, packing.indices)  # (N,)
    x = embeddings.word_embeddings(ids)  # (N, H)
    if token_type_ids is None:
        x = x + embeddings.token_type_embeddings.weight[0]
    else:
        x = x + embeddings.token_type_embeddings(token_type_ids.flatten().index_select(0, packing.indices))
    x = x + embeddings.position_embeddings(packing.positions)
    return embeddings.dropout(embeddings.LayerNorm(x))


def allow_data_dependent_shapes() -> None:
    """Let ``torch.compile`` keep data-dependent sizes in the graph instead of breaking it.

    Sets ``torch._dynamo.config.capture_dynamic_output_shape_ops`` (process-wide, read whenever Dynamo
    traces, so also at later recompiles): ``nonzero`` and boolean indexing (the unpadding, the sparse MLM
    gather) give a symbolic size and the forward compiles to one graph. The Trainer calls it when
    ``compile`` is on. Without it each such op is a graph break (a host synchronisation on a GPU).
    """
    import torch._dynamo

    torch._dynamo.config.capture_dynamic_output_shape_ops = True


def set_unpad(model: nn.Module, enabled: bool = True) -> nn.Module:
    """Switch a built or loaded model (any ``bert_core.model`` class) to or from the unpadded encoder.

    ``from_pretrained`` reads ``config.json``, which never carries ``unpad`` (a runtime choice), so
    fine-tuning turns it on here. Heads whose loss reads padding positions (question answering) stay padded.
    """
    base = getattr(model, "bert", model)
    base.unpad = bool(enabled) and not getattr(model, "reads_padding", False)
    model.config = model.config.replace(unpad=base.unpad)
    if base is not model:
        base.config = model.config
    return model
