"""Params of the ``pretrain`` stage (``params/pretrain.yaml``, section ``pretrain``): the model preset, the
optimizer shared by the phases, and each phase's share of the budget, batch sizes and schedule.

A phase's sequence length and the model's position table are not declared here: the ``pretrain_data``
stage declares them (``phase_specs.<phase>.max_seq_length``, ``max_position_embeddings``) and records them
in each output's ``index.json``, and pretraining reads them from there (:mod:`bert_core.pretrain.inputs`),
so the two stages cannot disagree.
"""

from __future__ import annotations

import logging
import math
from typing import TYPE_CHECKING, Annotated, Any, Literal

from pydantic import Field, field_validator, model_validator

from bert_core.config import BertConfig
from bert_core.params import StrictModel, mlflow_alias, mlflow_model_name

if TYPE_CHECKING:
    from bert_core.training.config import TrainConfig

log = logging.getLogger(__name__)

Preset = Literal["tiny", "mini", "small", "medium", "base", "large"]


class ModelParams(StrictModel):
    """Which model: a named preset and optional ``BertConfig`` field overrides (``vocab_size`` comes
    from the vocabulary and ``max_position_embeddings`` from the pretraining data, never from here)."""

    preset: Preset = "tiny"
    unpad: bool = Field(
        False,
        description="encode the real tokens only (BertConfig.unpad, bert_core/unpad.py): same loss and "
        "gradients, no matmuls on padding; see docs/benchmarks.md for where it is faster",
    )
    overrides: dict[str, Any] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _check(self) -> ModelParams:
        if "vocab_size" in self.overrides:
            raise ValueError("vocab_size is read from the vocabulary (vocab.txt); remove it from overrides")
        if "max_position_embeddings" in self.overrides:
            raise ValueError(
                "max_position_embeddings is read from the pretraining data (params/pretrain_data.yaml: "
                "pretrain_data.max_position_embeddings); remove it from overrides"
            )
        if "unpad" in self.overrides:
            raise ValueError("set pretrain.model.unpad, not overrides.unpad")
        BertConfig.from_preset(self.preset, vocab_size=30522, **self.overrides)  # validates the fields
        return self

    def config(self, vocab_size: int, max_position_embeddings: int) -> BertConfig:
        """The model's config, given the two sizes the inputs decide (the vocabulary and the data)."""
        return BertConfig.from_preset(
            self.preset,
            vocab_size=vocab_size,
            max_position_embeddings=max_position_embeddings,
            unpad=self.unpad,
            **self.overrides,
        )


class OptimizerParams(StrictModel):
    """Optimizer shared by the phases (each phase has its own schedule)."""

    name: Literal["adamw", "lamb"] = "adamw"
    lr: float = Field(1e-4, gt=0, description="peak learning rate of phases that do not set their own")
    weight_decay: float = Field(0.01, ge=0)
    betas: tuple[Annotated[float, Field(ge=0, lt=1)], Annotated[float, Field(ge=0, lt=1)]] = (0.9, 0.999)
    eps: float = Field(1e-6, gt=0)
    max_grad_norm: float | None = Field(1.0, gt=0)


class PhaseParams(StrictModel):
    """One pretraining phase.

    Attributes:
        name: the data directory under ``data_dir`` (``seq128``, ``seq512``); its ``index.json`` gives the
            phase's sequence length.
        share: share of the total ``max_steps`` / time budget given to this phase.
        micro_batch: the most sequences per forward/backward on one process (its memory bound).
        global_batch: sequences per optimizer step over all processes; each of N processes takes
            ``global_batch / N`` a step, in micro batches of at most ``micro_batch`` (:meth:`split`).
        lr: peak learning rate (None: ``optimizer.lr``).
        warmup_ratio: warmup as a share of the phase's steps (or budget).
        warmup_steps: warmup in steps (step mode only); give one of the two.
    """

    name: str = Field(min_length=1)
    share: float = Field(gt=0, le=1)
    micro_batch: int = Field(ge=1)
    global_batch: int = Field(ge=1)
    lr: float | None = Field(None, gt=0)
    warmup_ratio: float | None = Field(None, ge=0, lt=1)
    warmup_steps: int | None = Field(None, ge=0)

    @model_validator(mode="after")
    def _check(self) -> PhaseParams:
        if self.global_batch % self.micro_batch:
            raise ValueError(
                f"global_batch {self.global_batch} is not a multiple of micro_batch {self.micro_batch} "
                "(global = micro x accumulation x processes)"
            )
        if self.warmup_ratio is not None and self.warmup_steps is not None:
            raise ValueError("give warmup_ratio or warmup_steps, not both")
        return self

    def split(self, world_size: int) -> tuple[int, int]:
        """(sequences per forward/backward, accumulation steps) of each of ``world_size`` processes.

        A process takes ``global_batch / world_size`` sequences a step, in the largest micro batch up to
        ``micro_batch`` that divides them: the recipe's global batch holds on any number of processes (the
        paper's 256 at micro batch 128 is 128 x 2 on one GPU and 32 x 1 on each of eight).
        """
        share, rest = divmod(self.global_batch, world_size)
        if rest:
            raise ValueError(
                f"global_batch = {self.global_batch} cannot be split over {world_size} process(es): "
                f"it must be a multiple of {world_size}"
            )
        micro = max(d for d in range(1, min(self.micro_batch, share) + 1) if share % d == 0)
        return micro, share // micro


class PretrainParams(StrictModel):
    """Params of the ``pretrain`` stage (``params/pretrain.yaml``, section ``pretrain``)."""

    model: ModelParams = Field(default_factory=ModelParams)
    max_steps: int | None = Field(None, ge=1, description="optimizer steps over all phases")
    time_budget_minutes: float | None = Field(None, gt=0, description="wall-clock budget over all phases")
    phases: list[PhaseParams] = Field(min_length=1)
    optimizer: OptimizerParams = Field(default_factory=OptimizerParams)
    precision: Literal["auto", "fp32", "bf16", "fp16"] = "auto"
    compile: bool = False
    nsp: bool = Field(
        True,
        description="add the next-sentence loss (paper); false: MLM alone (RoBERTa, the paper's No NSP "
        "ablation), the NSP head kept untrained so the exported model has the same tensors; build its data "
        "with pretrain_data.random_next_prob: 0",
    )
    init_mlm_bias: Literal["zeros", "unigram"] = Field(
        "zeros",
        description="MLM output bias at init: zeros (paper) or log unigram frequencies of the training "
        "labels, which saves short runs the first thousands of steps spent learning token frequencies",
    )
    checkpoint_every: int = Field(200, ge=0, description="steps between checkpoints (0: phase ends only)")
    checkpoint_minutes: float = Field(
        0.0,
        ge=0,
        description="minutes of training between checkpoints, whichever of the two comes first (0: by "
        "steps alone); one cadence for any model size and device",
    )
    keep_last: int = Field(2, ge=1)
    eval_every: int = Field(0, ge=0, description="steps between held-out evaluations (0: phase ends only)")
    eval_batches: int | None = Field(50, ge=1, description="held-out batches per evaluation (null: all)")
    eval_batch_size: int | None = Field(None, ge=1, description="null: the phase's micro_batch")
    log_every: int = Field(20, ge=1)
    seed: int = Field(0, ge=0)
    device: str = Field("auto", pattern=r"^(auto|cpu|cuda(:\d+)?)$")
    processes: Annotated[int, Field(ge=1)] | Literal["auto"] = Field(
        1,
        description="training processes on this machine (DDP, one GPU each): auto = one per visible GPU "
        "(1 on a CPU), as many as split every phase's global batch evenly (process_count)",
    )
    num_threads: int | None = Field(None, ge=1, description="CPU threads for torch (null: torch's default)")
    deterministic: bool = False
    registered_model: str = Field("bert-pretrained", min_length=1, description="MLflow registry name")
    registry_alias: str = Field("newest", min_length=1, description="alias moved to each new version")

    @field_validator("registered_model")
    @classmethod
    def _mlflow_name(cls, v: str) -> str:
        return mlflow_model_name(v)

    @field_validator("registry_alias")
    @classmethod
    def _mlflow_alias(cls, v: str) -> str:
        return mlflow_alias(v)

    @model_validator(mode="after")
    def _check(self) -> PretrainParams:
        if self.max_steps is None and self.time_budget_minutes is None:
            raise ValueError("set max_steps or time_budget_minutes (or both: whichever comes first)")
        names = [p.name for p in self.phases]
        if len(set(names)) != len(names):
            raise ValueError(f"phase names must be unique, got {names}")
        total = sum(p.share for p in self.phases)
        if not math.isclose(total, 1.0, abs_tol=1e-6):
            raise ValueError(
                f"phase shares must add up to 1, got {total:g} ({[p.share for p in self.phases]})"
            )
        if self.processes != 1 and self.device.startswith("cuda:"):
            raise ValueError(
                f"processes: {self.processes} with device {self.device}: each process takes a GPU of its "
                "own; use device auto or cuda (CUDA_VISIBLE_DEVICES chooses the GPUs)"
            )
        for i, p in enumerate(self.phases):
            if self.time_budget_minutes is not None and p.warmup_steps:
                raise ValueError(
                    f"phases[{i}].warmup_steps: with time_budget_minutes the schedule follows the clock; "
                    "give the warmup as warmup_ratio"
                )
            steps = self.phase_steps(i)
            if steps is not None and p.warmup_steps is not None and p.warmup_steps >= steps:
                raise ValueError(
                    f"phases[{i}] ({p.name}) gets {steps} steps ({p.share:g} of max_steps={self.max_steps}) "
                    f"but warmup_steps = {p.warmup_steps}: the warmup must be shorter than the phase"
                )
        return self

    def process_count(self) -> int:
        """How many training processes to start here: ``processes``, or for ``auto`` one per visible GPU
        (none unless ``device`` allows CUDA: 1), the most, up to that, that split every phase's
        ``global_batch`` evenly (:meth:`PhaseParams.split`)."""
        if self.processes != "auto":
            return self.processes
        import torch

        gpus = torch.cuda.device_count() if self.device != "cpu" and torch.cuda.is_available() else 1
        splits = [k for k in range(1, gpus + 1) if all(p.global_batch % k == 0 for p in self.phases)]
        n = splits[-1]  # 1 splits every batch
        if n < gpus:
            batches = "/".join(map(str, sorted({p.global_batch for p in self.phases})))
            log.warning(
                "processes: auto uses %d of the %d GPUs: global_batch %s splits evenly over %d processes, not %d",
                n,
                gpus,
                batches,
                n,
                gpus,
            )
        return n

    def phase_steps(self, i: int) -> int | None:
        """Optimizer steps of phase ``i`` (None without ``max_steps``); at least 1."""
        if self.max_steps is None:
            return None
        return max(1, round(self.phases[i].share * self.max_steps))

    def phase_budget_s(self, i: int) -> float | None:
        """Wall-clock seconds of phase ``i`` (None without ``time_budget_minutes``)."""
        if self.time_budget_minutes is None:
            return None
        return self.phases[i].share * self.time_budget_minutes * 60.0

    def train_config(self, i: int, world_size: int = 1) -> TrainConfig:
        """The :class:`TrainConfig` of phase ``i`` run on ``world_size`` processes.

        Settings that :class:`TrainConfig` names alike are passed by name (one definition each, bounds
        checked when the params are parsed); the rest follow from the phase: its steps or budget, its
        learning rate (else ``optimizer.lr``), the gradient accumulation that makes ``global_batch``, and a
        seed of its own (``seed + 1000 * i``), so a phase's data order differs from the previous phase's.
        """
        from bert_core.training.config import TrainConfig  # the training package imports torch

        phase, optimizer = self.phases[i], self.optimizer
        return TrainConfig(
            **self.model_dump(include=_TRAIN_CONFIG_FIELDS),
            **optimizer.model_dump(include=_TRAIN_CONFIG_OPTIMIZER_FIELDS),
            **phase.model_dump(include=_TRAIN_CONFIG_PHASE_FIELDS),
            optimizer=optimizer.name,
            lr=phase.lr or optimizer.lr,
            max_steps=self.phase_steps(i),
            time_budget_s=self.phase_budget_s(i),
            grad_accum=phase.split(world_size)[1],
            max_eval_batches=self.eval_batches,
            seed=self.seed + 1000 * i,
            checkpoint_every_s=self.checkpoint_minutes * 60 or None,
        )


#: Fields that :class:`TrainConfig` takes under the same name, from the stage, its optimizer and a phase.
_TRAIN_CONFIG_FIELDS = {
    "precision",
    "compile",
    "checkpoint_every",
    "keep_last",
    "eval_every",
    "log_every",
    "deterministic",
    "device",
}
_TRAIN_CONFIG_OPTIMIZER_FIELDS = {"weight_decay", "betas", "eps", "max_grad_norm"}
_TRAIN_CONFIG_PHASE_FIELDS = {"warmup_steps", "warmup_ratio"}
