"""What the training loop trains: the :class:`Objective` protocol and its per-batch :class:`StepOutput`.

An objective is the loss and the statistics of a batch (pretraining: MLM + NSP; fine-tuning: the task
head's loss), not a downstream task: those are :class:`bert_core.tasks.TaskSpec`. The Trainer
(:mod:`bert_core.training.loop`) calls ``step`` per micro-batch and ``summarize`` on the summed stats:

.. code-block:: python

    class MyObjective(Objective):
        def step(self, model, batch):                  # batch: dict of tensors on the device
            out = model(**batch)
            correct = (out.logits.argmax(-1) == batch["labels"]).sum()
            return StepOutput(loss=out.loss, stats={"loss_sum": out.loss.detach() * len(batch["labels"]),
                                                    "correct": correct, "count": batch["labels"].numel()})

        def summarize(self, sums):                     # sums: stats summed over batches and ranks
            return {"loss": sums["loss_sum"] / sums["count"], "acc": sums["correct"] / sums["count"]}

    result = Trainer(model, MyObjective(), train_loader, TrainConfig(max_steps=1000, lr=5e-5, warmup_steps=100),
                     checkpoint_dir=Path("ckpt"), eval_data=dev_loader, on_metrics=print).fit()
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from torch import Tensor, nn


@dataclass
class StepOutput:
    """What an objective returns for one micro-batch.

    Attributes:
        loss: scalar the optimizer minimises (mean over the micro-batch); ``backward()`` is called on it.
        stats: summable statistics (e.g. correct predictions and counts), scalars or fixed-shape
            tensors; the loop sums them over micro-batches, steps and ranks and hands the sums to
            :meth:`Objective.summarize`. Detach them.
    """

    loss: Tensor
    stats: dict[str, Tensor] = field(default_factory=dict)


class Objective:
    """What the model is trained to do: the loss and metrics of a batch. Subclass and override ``step``."""

    def step(self, model: nn.Module, batch: dict[str, Any]) -> StepOutput:
        """Forward one micro-batch (already on the device) in training mode; return loss and stats."""
        raise NotImplementedError

    def eval_step(self, model: nn.Module, batch: dict[str, Any]) -> dict[str, Tensor]:
        """Stats of one evaluation batch (under ``no_grad``, model in eval mode). Default: ``step``'s stats."""
        return self.step(model, batch).stats

    def summarize(self, sums: dict[str, Tensor]) -> dict[str, float]:
        """Turn summed stats into metrics. Default: the sums themselves (scalars only)."""
        return {k: float(v) for k, v in sums.items() if v.numel() == 1}

    def count(self, batch: dict[str, Any]) -> tuple[int, int]:
        """(sequences, tokens) in a CPU batch, for throughput. Default: from ``input_ids``."""
        ids = batch["input_ids"]
        return int(ids.shape[0]), int(ids.numel())

    def flops(self, batch: dict[str, Any]) -> float | None:
        """Training FLOPs of a CPU batch (forward + backward), for MFU; None when unknown."""
        return None
