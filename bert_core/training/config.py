"""Settings and outcomes of a training run: :class:`TrainConfig`, :class:`FitResult` and the two faults
the loop raises (:class:`TrainingInterrupted`, :class:`NonFiniteLossError`)."""

from __future__ import annotations

import signal
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, get_args

from bert_core.training.schedule import LinearWarmupDecay

Precision = Literal["auto", "fp32", "bf16", "fp16"]
PRECISIONS = get_args(Precision)
CompileMode = Literal["default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs"]
COMPILE_MODES = get_args(CompileMode)
CUDA_GRAPH_MODES = ("reduce-overhead", "max-autotune")


@dataclass(frozen=True)
class TrainConfig:
    """How to train (what to train on is the Objective's and the loader's business).

    Attributes:
        max_steps: optimizer steps to run; with ``time_budget_s`` too, whichever comes first.
        time_budget_s: wall-clock budget of the training loop in seconds (evaluations and checkpoints
            included); the schedule follows ``elapsed / budget`` (with both limits: whichever share is
            larger) and ``warmup_ratio`` is the warmup share of the run.
        lr: peak learning rate.
        warmup_steps: warmup length in steps (step mode only).
        warmup_ratio: warmup as a share of the run (steps or budget). At most one of the two warmups.
        weight_decay: decay of weight matrices (biases and LayerNorm never decay).
        optimizer: "adamw" (fused where available) or "lamb".
        betas, eps: Adam coefficients.
        max_grad_norm: clip the global gradient norm to this; None = no clipping (norm still logged).
        grad_accum: micro-batches per optimizer step on each rank.
        precision: "auto" (bf16 on a GPU that has it, else fp32), "fp32", "bf16", "fp16" (+ loss scaling).
        compile: wrap the model in ``torch.compile``.
        compile_mode: its ``mode`` (None: torch's default); ``"reduce-overhead"`` replays each step's kernels as
            CUDA graphs, so the host launches a few graphs instead of hundreds of kernels.
        overlap_checks: read each step's non-finite and stop flags one step late, the fused AdamW skipping a
            bad update on the device, so the host queues the next step while the device runs this one
            (:mod:`bert_core.training.step_check`). None: on a GPU with the fused AdamW and no fp16 loss
            scaling; True elsewhere needs the same optimizer (the CPU's has it).
        checkpoint_every: steps between checkpoints (0 = only the final one).
        checkpoint_every_s: seconds of training between checkpoints (None: by steps alone); the clock is
            rank 0's, so every rank checkpoints at the same step.
        final_checkpoint: write a checkpoint marked complete at the end (False: a caller that keeps the
            result itself, as fine-tuning does, writes only the ones a resume needs, and this one only when
            a stop signal arrived during the final evaluation).
        keep_last: checkpoints kept.
        eval_every: steps between evaluations (0 = only at the end).
        max_eval_batches: evaluate on at most this many batches per rank (None = all).
        log_every: steps between metric logs.
        seed: base seed (rank r uses seed + r for its RNGs; the caller seeds model init itself).
        deterministic: ``torch.use_deterministic_algorithms(True)`` (exact resume on CPU).
        device: "auto", "cpu" or "cuda" (ignored when a DistContext is given).
        resume: continue from the newest checkpoint in ``checkpoint_dir`` if there is one.
    """

    max_steps: int | None = None
    time_budget_s: float | None = None
    lr: float = 1e-4
    warmup_steps: int | None = None
    warmup_ratio: float | None = None
    weight_decay: float = 0.01
    optimizer: Literal["adamw", "lamb"] = "adamw"
    betas: tuple[float, float] = (0.9, 0.999)
    eps: float = 1e-6
    max_grad_norm: float | None = 1.0
    grad_accum: int = 1
    precision: Precision = "auto"
    compile: bool = False
    compile_mode: CompileMode | None = None
    overlap_checks: bool | None = None
    checkpoint_every: int = 0
    checkpoint_every_s: float | None = None
    final_checkpoint: bool = True
    keep_last: int = 2
    eval_every: int = 0
    max_eval_batches: int | None = None
    log_every: int = 10
    seed: int = 0
    deterministic: bool = False
    device: str = "auto"
    resume: bool = True

    def __post_init__(self) -> None:
        if self.max_steps is None and self.time_budget_s is None:
            raise ValueError("TrainConfig needs max_steps or time_budget_s (or both)")
        if self.max_steps is not None and self.max_steps < 1:
            raise ValueError(f"max_steps must be >= 1, got {self.max_steps}")
        if self.time_budget_s is not None and self.time_budget_s <= 0:
            raise ValueError(f"time_budget_s must be > 0, got {self.time_budget_s}")
        if self.warmup_steps is not None and self.warmup_ratio is not None:
            raise ValueError("give warmup_steps or warmup_ratio, not both")
        if self.time_budget_s is not None and self.warmup_steps:
            raise ValueError(
                "with time_budget_s the schedule follows elapsed time: give the warmup as warmup_ratio "
                "(a share of the budget), not warmup_steps"
            )
        if self.warmup_ratio is not None and not 0 <= self.warmup_ratio < 1:
            raise ValueError(f"warmup_ratio must be in [0, 1), got {self.warmup_ratio}")
        if (
            self.warmup_steps is not None
            and self.max_steps is not None
            and self.warmup_steps >= self.max_steps
        ):
            raise ValueError(
                f"warmup_steps ({self.warmup_steps}) must be less than max_steps ({self.max_steps})"
            )
        for name in ("grad_accum", "log_every", "keep_last"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        for name in ("checkpoint_every", "eval_every"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}")
        if self.checkpoint_every_s is not None and self.checkpoint_every_s <= 0:
            raise ValueError(f"checkpoint_every_s must be > 0, got {self.checkpoint_every_s}")
        if self.lr <= 0:
            raise ValueError(f"lr must be > 0, got {self.lr}")
        if self.compile_mode is not None and self.compile_mode not in COMPILE_MODES:
            raise ValueError(
                f"compile_mode must be one of {', '.join(COMPILE_MODES)} or None, got {self.compile_mode!r}"
            )
        if self.precision not in PRECISIONS:
            raise ValueError(f"precision must be auto, fp32, bf16 or fp16, got {self.precision!r}")

    @property
    def captures_cuda_graphs(self) -> bool:
        """Whether the compiled model replays CUDA graphs: each step is then marked as a new one, since a graph's
        outputs are reused by its next replay."""
        return self.compile and self.compile_mode in CUDA_GRAPH_MODES

    def schedule(self) -> LinearWarmupDecay:
        """The LR schedule this config describes."""
        if self.warmup_steps is not None:
            assert self.max_steps is not None and self.time_budget_s is None
            return LinearWarmupDecay.from_warmup_steps(self.lr, self.max_steps, self.warmup_steps)
        return LinearWarmupDecay(
            self.lr, max_steps=self.max_steps, budget_s=self.time_budget_s, warmup=self.warmup_ratio or 0.0
        )


@dataclass
class FitResult:
    """Outcome of ``Trainer.fit()``.

    Attributes:
        step: optimizer steps done.
        elapsed_s: wall-clock seconds of training (summed over resumed segments).
        paused_s: of those, the seconds spent in evaluations and checkpoints between steps.
        stop_reason: "max_steps" or "time_budget".
        train_metrics: the last logged training metrics.
        eval_metrics: the final evaluation (empty without evaluation data).
        history: every logged record: ``{"step", "kind": "train"|"eval", **metrics}``.
        checkpoint: the final checkpoint directory (None without a checkpoint_dir).
        resumed_from_step: the step the run was resumed from (None for a fresh start).
        checkpoint_s: seconds this process spent writing checkpoints (rank 0; 0 on the others).
    """

    step: int
    elapsed_s: float
    paused_s: float
    stop_reason: str
    train_metrics: dict[str, float]
    eval_metrics: dict[str, float]
    history: list[dict[str, Any]]
    checkpoint: Path | None
    resumed_from_step: int | None
    checkpoint_s: float = 0.0


class TrainingInterrupted(KeyboardInterrupt):
    """SIGTERM/SIGINT arrived; a checkpoint was written. ``exit_code`` is 128 + signal number.

    An interrupt, not an error: ``except Exception`` does not catch it, and an orchestrator treats it as a
    Ctrl-C (Prefect marks the run Crashed, not Failed).
    """

    def __init__(self, signum: int, step: int, checkpoint: Path | None) -> None:
        name = signal.Signals(signum).name
        where = f"checkpoint {checkpoint}" if checkpoint else "no checkpoint directory was configured"
        super().__init__(f"training stopped by {name} after step {step}; {where}; run again to resume")
        self.signum, self.step, self.checkpoint = signum, step, checkpoint
        self.exit_code = 128 + signum


class NonFiniteLossError(RuntimeError):
    """The loss or gradient norm became NaN/Inf; the bad update was not applied."""

    def __init__(self, step: int, loss: float, grad_norm: float, last_checkpoint: Path | None) -> None:
        keep = (
            f"the last good checkpoint is {last_checkpoint}"
            if last_checkpoint
            else "no checkpoint was written before it"
        )
        super().__init__(
            f"non-finite loss at optimizer step {step} (loss={loss}, grad_norm={grad_norm}); training "
            f"stopped before applying it; {keep}. Lower the learning rate, check the data, or use "
            "fp32/bf16 instead of fp16."
        )
        self.step, self.loss, self.grad_norm, self.last_checkpoint = step, loss, grad_norm, last_checkpoint
