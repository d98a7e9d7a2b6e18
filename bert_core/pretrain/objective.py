"""The pretraining objective as a :class:`~bert_core.training.Task`: masked LM + next sentence.

BERT paper §3.1: the loss is the mean cross-entropy over the masked positions plus the NSP
cross-entropy. Metrics (from summed statistics, so they are exact over micro-batches, steps and
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
from bert_core.training.task import StepOutput, Task

BATCH_KEYS = ("input_ids", "token_type_ids", "attention_mask", "labels", "next_sentence_label")


class PretrainingTask(Task):
    """MLM + NSP on batches with transformers' keys (``input_ids``, ``token_type_ids``,
    ``attention_mask``, ``labels`` (B, T; -100 = no prediction), ``next_sentence_label`` (B,)).

    Args:
        num_layers, hidden_size, intermediate_size, vocab_size: model sizes, for the FLOPs count (MFU).
    """

    def __init__(self, *, num_layers: int, hidden_size: int, intermediate_size: int, vocab_size: int) -> None:
        self.sizes = {
            "num_layers": num_layers,
            "hidden_size": hidden_size,
            "intermediate_size": intermediate_size,
            "vocab_size": vocab_size,
        }
        self.vocab_size = vocab_size

    @classmethod
    def for_config(cls, config: Any) -> PretrainingTask:
        """From a ``BertConfig`` (or anything with the transformers field names)."""
        return cls(
            num_layers=config.num_hidden_layers,
            hidden_size=config.hidden_size,
            intermediate_size=config.intermediate_size,
            vocab_size=config.vocab_size,
        )

    def step(self, model: nn.Module, batch: dict[str, Any]) -> StepOutput:
        out = model(**{k: batch[k] for k in BATCH_KEYS if k in batch})
        nsp_labels = batch["next_sentence_label"].view(-1)
        # The model returns logits at the labelled positions only (sparse head); a dense head's
        # (B, T, V) logits are reduced to those positions here so both kinds of model work.
        logits, labels = getattr(out, "masked_lm_logits", None), getattr(out, "masked_lm_labels", None)
        if logits is None:
            selected = batch["labels"] != IGNORE_INDEX
            logits, labels = out.prediction_logits[selected], batch["labels"][selected]
        n_masked = labels.numel()
        n_seq = nsp_labels.numel()
        mlm_loss = out.mlm_loss.detach().float()
        nsp_loss = out.nsp_loss.detach().float()
        stats = {
            "mlm_loss_sum": mlm_loss * n_masked,
            "mlm_correct": (logits.detach().argmax(-1) == labels).sum(),
            "mlm_count": torch.tensor(n_masked, device=nsp_labels.device),
            "nsp_loss_sum": nsp_loss * n_seq,
            "nsp_correct": (out.seq_relationship_logits.detach().argmax(-1) == nsp_labels).sum(),
            "nsp_count": torch.tensor(n_seq, device=nsp_labels.device),
        }
        loss = out.loss if out.loss is not None else out.mlm_loss + out.nsp_loss
        return StepOutput(loss=loss, stats=stats)

    def eval_step(self, model: nn.Module, batch: dict[str, Any]) -> dict[str, Tensor]:
        stats = self.step(model, batch).stats
        labels = batch["labels"]
        stats["mlm_label_hist"] = torch.bincount(labels[labels != IGNORE_INDEX], minlength=self.vocab_size)
        stats["nsp_positive"] = batch["next_sentence_label"].sum()
        return stats

    def summarize(self, sums: dict[str, Tensor]) -> dict[str, float]:
        f = {k: v.double() for k, v in sums.items()}
        mlm_n, nsp_n = max(float(f["mlm_count"]), 1.0), max(float(f["nsp_count"]), 1.0)
        mlm_loss = float(f["mlm_loss_sum"]) / mlm_n
        out = {
            "mlm_loss": mlm_loss,
            "mlm_acc": float(f["mlm_correct"]) / mlm_n,
            "nsp_loss": float(f["nsp_loss_sum"]) / nsp_n,
            "nsp_acc": float(f["nsp_correct"]) / nsp_n,
        }
        if "mlm_label_hist" in f:
            hist = f["mlm_label_hist"]
            p = hist[hist > 0] / hist.sum().clamp(min=1)
            pos = float(f["nsp_positive"])
            out.update(
                mlm_ppl=math.exp(min(mlm_loss, 50.0)),
                baseline_mlm_acc=float(hist.max()) / mlm_n,
                baseline_mlm_ppl=math.exp(float(-(p * p.log()).sum())),
                baseline_nsp_acc=max(pos, nsp_n - pos) / nsp_n,
            )
        return out

    def flops(self, batch: dict[str, Any]) -> float | None:
        ids = batch["input_ids"]
        masked = int((batch["labels"] != IGNORE_INDEX).sum())
        return bert_train_flops(
            **self.sizes, seq_len=ids.shape[1], sequences=ids.shape[0], masked_tokens=masked
        )
