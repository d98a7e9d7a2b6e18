"""The masked-LM loss of ``BertForPreTraining`` / ``BertForMaskedLM`` in its two input forms.

* ``labels`` (B, T), transformers' form (-100 = no prediction): :func:`sparse_mlm` gathers the N labelled
  positions with a boolean mask before the prediction head. N depends on the data, so under
  ``torch.compile`` this is a ``nonzero``: one graph only where Dynamo may keep N symbolic
  (:func:`bert_core.unpad.allow_data_dependent_shapes`, which the Trainer sets), a break elsewhere; it
  stays for callers that use the transformers interface.
* ``masked_lm_positions`` / ``masked_lm_ids`` / ``masked_lm_weights`` (B, P), the form of Google's
  ``run_pretraining.py`` (``max_predictions_per_seq`` = P slots per row, padded slots of weight 0):
  :func:`mlm_at_positions` gathers with static shapes and takes the weighted mean, so the compiled
  pretraining step is one graph. With weights 1/0 it equals the ``labels`` path's loss and gradients.

The ``head`` is the model's ``BertLMPredictionHead`` (transform + tied vocabulary projection).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from bert_core.constants import IGNORE_INDEX


def sparse_mlm(
    head: nn.Module, hidden: Tensor, labels: Tensor | None
) -> tuple[Tensor | None, Tensor | None, Tensor | None, Tensor | None]:
    """MLM logits and loss; with labels only at the labelled positions (``bert_core.model`` deviation 1).

    Returns:
        (loss, full_logits (B, T, V) or None, masked_logits (N, V) or None, masked_labels (N,) or None).
    """
    if labels is None:
        return None, head(hidden), None, None
    if labels.shape != hidden.shape[:2]:
        raise ValueError(
            f"labels must have the shape of input_ids {tuple(hidden.shape[:2])}, got {tuple(labels.shape)}"
        )
    selected = labels != IGNORE_INDEX  # (B, T)
    masked_labels = labels[selected]  # (N,)
    masked_logits = head(hidden[selected])  # (N, H) -> (N, V)
    # The mean over the N labelled positions; with none the sum is 0, so the loss is 0, not NaN (model
    # deviation 2), without a branch on N: under torch.compile a branch on data is a graph break.
    total = F.cross_entropy(masked_logits, masked_labels, reduction="sum")
    loss = total / torch.sym_max(masked_labels.shape[0], 1)
    return loss, None, masked_logits, masked_labels


def mlm_at_positions(
    head: nn.Module,
    hidden: Tensor,
    positions: Tensor,
    ids: Tensor | None,
    weights: Tensor | None,
) -> tuple[Tensor | None, Tensor, Tensor | None]:
    """Static-shape MLM at Google's ``masked_lm_positions`` (``bert_core.model`` deviation 1): gather, project, weighted mean.

    Args:
        hidden: (B, T, H) encoder output.
        positions: (B, P) positions to predict (padded slots: any valid position, e.g. 0).
        ids: (B, P) target ids, or None (logits only).
        weights: (B, P) 1.0 at real predictions, 0.0 at padded slots; None = all real.

    Returns:
        (loss or None, logits (B, P, V), labels (B, P) with -100 where the weight is 0, or None).
    """
    if positions.dim() != 2 or positions.shape[0] != hidden.shape[0]:
        raise ValueError(
            f"masked_lm_positions must be (batch={hidden.shape[0]}, max_predictions), got {tuple(positions.shape)}"
        )
    for name, t in (("masked_lm_ids", ids), ("masked_lm_weights", weights)):
        if t is not None and t.shape != positions.shape:
            raise ValueError(
                f"{name} must have the shape of masked_lm_positions {tuple(positions.shape)}, got {tuple(t.shape)}"
            )
    B, P = positions.shape
    index = positions.long().unsqueeze(-1).expand(B, P, hidden.shape[-1])  # (B, P, H)
    logits = head(hidden.gather(1, index))  # (B, P, H) -> (B, P, V)
    if ids is None:
        return None, logits, None
    ce = F.cross_entropy(logits.flatten(0, 1), ids.flatten(), reduction="none")  # (B*P,)
    if weights is None:
        return ce.mean(), logits, ids
    w = weights.flatten().to(ce.dtype)
    total = w.sum()
    # No real prediction: the numerator is 0, so the loss is 0 (not NaN) without a branch (model deviation 2).
    loss = (ce * w).sum() / total.clamp_min(torch.finfo(total.dtype).tiny)
    return loss, logits, ids.masked_fill(weights == 0, IGNORE_INDEX)


def mlm_outputs(
    head: nn.Module,
    hidden: Tensor,
    labels: Tensor | None,
    positions: Tensor | None,
    ids: Tensor | None,
    weights: Tensor | None,
) -> tuple[Tensor | None, Tensor | None, Tensor | None, Tensor | None]:
    """The ``labels`` path or the static ``masked_lm_positions`` path: (loss, full, masked logits, labels)."""
    if positions is None:
        if ids is not None or weights is not None:
            raise ValueError("masked_lm_ids / masked_lm_weights need masked_lm_positions")
        return sparse_mlm(head, hidden, labels)
    if labels is not None:
        raise ValueError("give labels (B, T) or masked_lm_positions/ids/weights (B, P), not both")
    loss, logits, masked_labels = mlm_at_positions(head, hidden, positions, ids, weights)
    return loss, None, logits, masked_labels
