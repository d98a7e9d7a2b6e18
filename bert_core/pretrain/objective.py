"""The pretraining objective as a :class:`~bert_core.training.Objective`: masked LM + next sentence.

BERT paper §3.1: the loss is the mean cross-entropy over the masked positions plus the NSP
cross-entropy. With ``nsp=False`` (``pretrain.nsp: false``; RoBERTa, and the paper's own "No NSP"
ablation) the loss is the MLM term alone: the NSP head stays in the model, so the exported checkpoint has
the same tensors as ever, but it learns nothing, and no NSP figure is reported (an untrained head's
accuracy would only mislead). Metrics (from summed statistics, so they are exact over micro-batches, steps and
ranks): MLM loss / accuracy / perplexity over masked tokens, NSP loss / accuracy over sequences.

Evaluation also reports two trivial baselines on the same held-out batches, so a reader sees what was
learned: ``baseline_mlm_acc``, the accuracy of always predicting the single most frequent masked
token (chosen *on the held-out labels themselves*, the best any constant predictor can do there), its
unigram perplexity ``baseline_mlm_ppl`` (the best context-free predictor), and ``baseline_nsp_acc``,
the majority NSP class.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import Tensor, nn

from bert_core.constants import IGNORE_INDEX
from bert_core.training.flops import bert_train_flops
from bert_core.training.objective import Objective, StepOutput

POSITION_KEYS = ("masked_lm_positions", "masked_lm_ids", "masked_lm_weights")
BATCH_KEYS = (
    "input_ids",
    "token_type_ids",
    "attention_mask",
    "labels",
    "next_sentence_label",
    *POSITION_KEYS,
)


def target_ids(batch: dict[str, Any]) -> Tensor:
    """(N,) the ids of the batch's real MLM predictions, in row-major order, from either target form."""
    if "masked_lm_positions" in batch:
        return batch["masked_lm_ids"][batch["masked_lm_weights"] > 0]
    labels = batch["labels"]
    return labels[labels != IGNORE_INDEX]


class PretrainingObjective(Objective):
    """MLM + NSP on batches with ``input_ids``, ``token_type_ids``, ``attention_mask`` (B, T),
    ``next_sentence_label`` (B,) and the MLM targets either as Google's static-shape
    ``masked_lm_positions`` / ``masked_lm_ids`` / ``masked_lm_weights`` (B, P) (what
    :class:`~bert_core.pretrain_data.loader.PretrainingLoader` gives by default: the compiled step has no
    graph break) or as transformers' ``labels`` (B, T; -100 = no prediction). Losses and metrics are the
    same for both.

    Args:
        num_layers, hidden_size, intermediate_size, vocab_size: model sizes, for the FLOPs count (MFU).
        nsp: Add the NSP loss (the paper); ``False`` trains on the MLM loss alone.
    """

    def __init__(
        self, *, num_layers: int, hidden_size: int, intermediate_size: int, vocab_size: int, nsp: bool = True
    ) -> None:
        self.sizes = {
            "num_layers": num_layers,
            "hidden_size": hidden_size,
            "intermediate_size": intermediate_size,
            "vocab_size": vocab_size,
        }
        self.vocab_size = vocab_size
        self.nsp = nsp

    @classmethod
    def for_config(cls, config: Any, *, nsp: bool = True) -> PretrainingObjective:
        """From a ``BertConfig`` (or anything with the transformers field names)."""
        return cls(
            num_layers=config.num_hidden_layers,
            hidden_size=config.hidden_size,
            intermediate_size=config.intermediate_size,
            vocab_size=config.vocab_size,
            nsp=nsp,
        )

    def step(self, model: nn.Module, batch: dict[str, Any]) -> StepOutput:
        out = model(**{k: batch[k] for k in BATCH_KEYS if k in batch})
        nsp_labels = batch["next_sentence_label"].view(-1)
        # The model returns logits at the predicted positions only: (N, V) and (N,) labels, or with
        # positions (B, P, V) and (B, P) labels that are -100 at padded slots (never equal to an argmax).
        # A dense head's (B, T, V) logits (transformers, given ``labels``) are reduced here.
        logits, labels = getattr(out, "masked_lm_logits", None), getattr(out, "masked_lm_labels", None)
        if logits is None:
            selected = batch["labels"] != IGNORE_INDEX
            logits, labels = out.prediction_logits[selected], batch["labels"][selected]
        n_masked = (labels != IGNORE_INDEX).sum()
        mlm_loss = out.mlm_loss.detach().float()
        stats = {
            "mlm_loss_sum": mlm_loss * n_masked,
            "mlm_correct": (logits.detach().argmax(-1) == labels).sum(),
            "mlm_count": n_masked,
        }
        if not self.nsp:
            # MLM alone. The NSP loss stays in the graph at weight 0 so that every parameter has a
            # gradient (zero for the NSP head and pooler): DDP, which this loop runs without
            # find_unused_parameters, would otherwise wait for gradients that never come.
            return StepOutput(loss=out.mlm_loss + 0.0 * out.nsp_loss, stats=stats)
        n_seq = nsp_labels.numel()
        nsp_loss = out.nsp_loss.detach().float()
        stats |= {
            "nsp_loss_sum": nsp_loss * n_seq,
            "nsp_correct": (out.seq_relationship_logits.detach().argmax(-1) == nsp_labels).sum(),
            "nsp_count": torch.full((), n_seq, device=nsp_labels.device),  # a fill, not a synchronising copy
        }
        loss = out.loss if out.loss is not None else out.mlm_loss + out.nsp_loss
        return StepOutput(loss=loss, stats=stats)

    def eval_step(self, model: nn.Module, batch: dict[str, Any]) -> dict[str, Tensor]:
        stats = self.step(model, batch).stats
        stats["mlm_label_hist"] = torch.bincount(target_ids(batch), minlength=self.vocab_size)
        if self.nsp:
            stats["nsp_positive"] = batch["next_sentence_label"].sum()
        return stats

    def summarize(self, sums: dict[str, Tensor]) -> dict[str, float]:
        """MLM (and, with NSP, NSP) loss and accuracy; on held-out sums also perplexity and the baselines.
        Without NSP the ``nsp_*`` keys are absent."""
        f = {k: v.double() for k, v in sums.items()}
        mlm_n = max(float(f["mlm_count"]), 1.0)
        mlm_loss = float(f["mlm_loss_sum"]) / mlm_n
        out = {"mlm_loss": mlm_loss, "mlm_acc": float(f["mlm_correct"]) / mlm_n}
        nsp_n = max(float(f["nsp_count"]), 1.0) if "nsp_count" in f else None
        if nsp_n is not None:
            out |= {"nsp_loss": float(f["nsp_loss_sum"]) / nsp_n, "nsp_acc": float(f["nsp_correct"]) / nsp_n}
        if "mlm_label_hist" in f:
            hist = f["mlm_label_hist"]
            p = hist[hist > 0] / hist.sum().clamp(min=1)
            out.update(
                mlm_ppl=math.exp(min(mlm_loss, 50.0)),
                baseline_mlm_acc=float(hist.max()) / mlm_n,
                baseline_mlm_ppl=math.exp(float(-(p * p.log()).sum())),
            )
            if nsp_n is not None and "nsp_positive" in f:
                pos = float(f["nsp_positive"])
                out["baseline_nsp_acc"] = max(pos, nsp_n - pos) / nsp_n
        return out

    def flops(self, batch: dict[str, Any]) -> float | None:
        ids = batch["input_ids"]
        masked = target_ids(batch).numel()
        return bert_train_flops(
            **self.sizes, seq_len=ids.shape[1], sequences=ids.shape[0], masked_tokens=masked
        )
