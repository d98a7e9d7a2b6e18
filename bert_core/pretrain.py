"""The ``pretrain`` stage: MLM + NSP pretraining of a BERT preset in the paper's two phases.

``pretrain(params, data_dir, vocab_dir, out_dir)`` trains ``BertForPreTraining`` on the instances of the
``pretrain_data`` stage (``<data_dir>/<phase>/{train,heldout}``) with the shared :class:`Trainer`, phase
after phase (BERT paper, appendix A.2: 90% of the steps at sequence length 128, the rest at 512; phase 2
starts from phase 1's weights with a fresh optimizer and its own warmup/decay schedule, as NVIDIA's
recipe), evaluates on the held-out instances next to trivial baselines, and writes the final model in
Hugging Face format (``config.json``, ``model.safetensors`` and the tokenizer files of ``vocab_dir``)
that ``transformers.AutoModelForPreTraining`` loads.

Steps and budget: ``max_steps`` and ``time_budget_minutes`` are totals over all phases; phase ``i`` gets
``share_i`` of each. With a budget the learning-rate schedule follows the elapsed time.

Checkpoints go to ``<checkpoint_root>/<phase>-<fingerprint>/``; the fingerprint hashes everything that
decides the weights (model, phases so far, optimizer, seed, data), so a rerun after a crash resumes and
a rerun with other params starts afresh, never mixing the two. A finished run's checkpoints stay, which
makes a rerun of the same params (e.g. after a failure while registering the model) instant.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import torch
from pydantic import Field, model_validator

from bert_core.atomic import atomic_path, write_csv_atomic
from bert_core.config import BertConfig
from bert_core.params import StrictModel
from bert_core.tracking import MetricsCallback
from bert_core.training import FitResult, TrainConfig, Trainer
from bert_core.training.distributed import DistContext, resolve_device
from bert_core.training.pretraining import PretrainingTask

log = logging.getLogger(__name__)

TOKENIZER_FILES = ("vocab.txt", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")
Preset = Literal["tiny", "mini", "small", "medium", "base", "large"]


# ====================================================================== params
class ModelParams(StrictModel):
    """Which model: a named preset and optional ``BertConfig`` field overrides (``vocab_size`` comes
    from the vocabulary, never from here)."""

    preset: Preset = "tiny"
    overrides: dict[str, Any] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _check(self) -> ModelParams:
        if "vocab_size" in self.overrides:
            raise ValueError("vocab_size is read from the vocabulary (vocab.txt); remove it from overrides")
        BertConfig.from_preset(self.preset, vocab_size=30522, **self.overrides)  # validates the fields
        return self

    def config(self, vocab_size: int) -> BertConfig:
        return BertConfig.from_preset(self.preset, vocab_size=vocab_size, **self.overrides)


class OptimizerParams(StrictModel):
    """Optimizer shared by the phases (each phase has its own schedule)."""

    name: Literal["adamw", "lamb"] = "adamw"
    lr: float = Field(1e-4, gt=0, description="peak learning rate of phases that do not set their own")
    weight_decay: float = Field(0.01, ge=0)
    betas: tuple[float, float] = (0.9, 0.999)
    eps: float = Field(1e-6, gt=0)
    max_grad_norm: float | None = Field(1.0, gt=0)


class PhaseParams(StrictModel):
    """One pretraining phase.

    Attributes:
        name: the data directory under ``data_dir`` (``seq128``, ``seq512``).
        max_seq_length: the phase's sequence length; must match the data and fit the position table.
        share: share of the total ``max_steps`` / time budget given to this phase.
        micro_batch: sequences per forward/backward on one process.
        global_batch: sequences per optimizer step over all processes
            (= micro_batch x gradient accumulation x world size).
        lr: peak learning rate (None: ``optimizer.lr``).
        warmup_ratio: warmup as a share of the phase's steps (or budget).
        warmup_steps: warmup in steps (step mode only); give one of the two.
    """

    name: str = Field(min_length=1)
    max_seq_length: int = Field(ge=8)
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


class PretrainParams(StrictModel):
    """Params of the ``pretrain`` stage (``params/pretrain.yaml``, section ``pretrain``)."""

    model: ModelParams = Field(default_factory=ModelParams)
    max_steps: int | None = Field(None, ge=1, description="optimizer steps over all phases")
    time_budget_minutes: float | None = Field(None, gt=0, description="wall-clock budget over all phases")
    phases: list[PhaseParams] = Field(min_length=1)
    optimizer: OptimizerParams = Field(default_factory=OptimizerParams)
    precision: Literal["auto", "fp32", "bf16", "fp16"] = "auto"
    compile: bool = False
    init_mlm_bias: Literal["zeros", "unigram"] = Field(
        "zeros",
        description="MLM output bias at init: zeros (paper) or log unigram frequencies of the training "
        "labels, which saves short runs the first thousands of steps spent learning token frequencies",
    )
    checkpoint_every: int = Field(200, ge=0, description="steps between checkpoints (0: phase ends only)")
    keep_last: int = Field(2, ge=1)
    eval_every: int = Field(0, ge=0, description="steps between held-out evaluations (0: phase ends only)")
    eval_batches: int | None = Field(50, ge=1, description="held-out batches per evaluation (null: all)")
    eval_batch_size: int | None = Field(None, ge=1, description="null: the phase's micro_batch")
    log_every: int = Field(20, ge=1)
    seed: int = Field(0, ge=0)
    device: str = Field("auto", pattern=r"^(auto|cpu|cuda(:\d+)?)$")
    num_threads: int | None = Field(None, ge=1, description="CPU threads for torch (null: torch's default)")
    deterministic: bool = False
    registered_model: str = Field("bert-pretrained", min_length=1, description="MLflow registry name")
    registry_alias: str = Field("newest", min_length=1, description="alias moved to each new version")

    @model_validator(mode="after")
    def _check(self) -> PretrainParams:
        if self.registry_alias.lower() == "latest":
            raise ValueError(
                "registry_alias 'latest' is reserved by MLflow (models:/<name>/latest); use e.g. 'newest'"
            )
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
        max_pos = self.model.config(30522).max_position_embeddings
        for i, p in enumerate(self.phases):
            if p.max_seq_length > max_pos:
                raise ValueError(
                    f"phases[{i}].max_seq_length = {p.max_seq_length} exceeds the model's "
                    f"max_position_embeddings = {max_pos}; BERT has no position embedding beyond it"
                )
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

    def phase_steps(self, i: int) -> int | None:
        """Optimizer steps of phase ``i`` (None without ``max_steps``); at least 1."""
        if self.max_steps is None:
            return None
        return max(1, round(self.phases[i].share * self.max_steps))

    def phase_budget_s(self, i: int) -> float | None:
        if self.time_budget_minutes is None:
            return None
        return self.phases[i].share * self.time_budget_minutes * 60.0


# ====================================================================== result
@dataclass
class PretrainResult:
    """What the stage produced.

    Attributes:
        model_dir: the final model (HF format with tokenizer files).
        metrics: final held-out metrics and baselines, per-phase figures (nested; for DVC/MLflow).
        history: every logged record over all phases, with the global ``step`` and ``phase``.
        data_stats: per-phase statistics of the data used (instances, tokens, vocab hash).
        config: the model config.
        phases: the Trainer's result per phase.
    """

    model_dir: Path
    metrics: dict[str, Any]
    history: list[dict[str, Any]]
    data_stats: dict[str, Any]
    config: BertConfig
    phases: list[FitResult] = field(default_factory=list)


# ====================================================================== checks
def _vocab_size(vocab_dir: Path) -> tuple[int, str]:
    from bert_core.pretrain_data.vocab import read_vocab

    path = vocab_dir / "vocab.txt"
    if not path.is_file():
        raise FileNotFoundError(f"{path} not found: build the vocabulary first (dvc repro vocab)")
    info = read_vocab(path)
    return info.size, info.sha256


def check_inputs(
    params: PretrainParams, data_dir: Path, vocab_dir: Path, world_size: int = 1
) -> dict[str, Any]:
    """Every check that can fail before training starts; returns per-phase data statistics.

    Raises:
        FileNotFoundError: a missing vocab or data directory (the message names it and how to build it).
        ValueError: vocab mismatch between data and model, data of another sequence length, or a
            global batch that the processes cannot split evenly.
    """
    from bert_core.pretrain_data.loader import check_vocab_size
    from bert_core.pretrain_data.storage import read_index

    vocab_size, vocab_sha = _vocab_size(vocab_dir)
    stats: dict[str, Any] = {"vocab_size": vocab_size}
    for i, phase in enumerate(params.phases):
        per_process = phase.micro_batch * world_size
        if phase.global_batch % per_process:
            raise ValueError(
                f"pretrain.phases[{i}].global_batch = {phase.global_batch} cannot be split over {world_size} "
                f"process(es) x micro_batch {phase.micro_batch}: it must be a multiple of {per_process}"
            )
        for split in ("train", "heldout"):
            d = data_dir / phase.name / split
            index = read_index(d)  # FileNotFoundError naming the directory
            check_vocab_size(d, vocab_size)
            if index.get("vocab_sha256") not in (None, vocab_sha):
                raise ValueError(
                    f"{d} was built with another vocabulary of the same size (sha256 "
                    f"{index['vocab_sha256'][:12]}... vs {vocab_dir / 'vocab.txt'} {vocab_sha[:12]}...); "
                    "rebuild the data with this vocab (dvc repro pretrain_data)"
                )
            if int(index["max_seq_length"]) != phase.max_seq_length:
                raise ValueError(
                    f"pretrain.phases[{i}].max_seq_length = {phase.max_seq_length} but {d} holds "
                    f"{index['max_seq_length']}-token instances; make them agree"
                )
            n = sum(s["num_instances"] for s in index["shards"])
            stats[f"{phase.name}.{split}"] = {
                "instances": n,
                "tokens": sum(s["num_tokens"] for s in index["shards"]),
                "predictions": sum(s.get("num_predictions", 0) for s in index["shards"]),
                "max_predictions_per_seq": index.get("max_predictions_per_seq"),
                "masking": index.get("masking"),
            }
            if split == "train" and n < phase.global_batch:
                raise ValueError(
                    f"{d} holds {n} instances, fewer than one global batch of {phase.global_batch}; "
                    f"lower pretrain.phases[{i}].global_batch or build more data"
                )
    return stats


def unigram_log_prior(train_dir: Path, max_items: int = 20_000_000) -> torch.Tensor:
    """Log frequencies ``(V,)`` of the MLM targets in a training data directory (add-one smoothed).

    Uses the stored labels of statically masked data, else the stored tokens (minus special tokens),
    reading at most ``max_items`` of them. Setting the MLM output bias to this makes the untrained model
    predict the unigram distribution (the best context-free guess) from step 0; the default (zeros) is
    the paper's initialisation.
    """
    import numpy as np

    from bert_core.pretrain_data.storage import InstanceStore

    store = InstanceStore(train_dir)
    counts = np.zeros(store.vocab_size, dtype=np.int64)
    left = max_items
    for shard in store.shards:
        values = shard.arrays.get("mlm_labels") if store.static else None
        if values is None:
            values = shard.arrays["tokens"]
        chunk = np.asarray(values[:left], dtype=np.int64)
        counts += np.bincount(chunk, minlength=store.vocab_size)
        left -= len(chunk)
        if left <= 0:
            break
    if not store.static:
        counts[list(store.index["special_token_ids"].values())] = 0
    probs = (counts + 1) / (counts.sum() + len(counts))
    return torch.from_numpy(np.log(probs)).float()


def _fingerprint(*parts: Any) -> str:
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()[:16]


# ====================================================================== the stage
def pretrain(
    params: PretrainParams,
    data_dir: str | Path,
    vocab_dir: str | Path,
    out_dir: str | Path,
    *,
    checkpoint_root: str | Path | None = None,
    on_metrics: MetricsCallback | None = None,
    dist: DistContext | None = None,
) -> PretrainResult:
    """Pretrain, evaluate and write the model (see the module docstring).

    Args:
        params: the stage's params.
        data_dir: output of ``pretrain_data`` (holds ``<phase>/{train,heldout}``).
        vocab_dir: the vocabulary (``vocab.txt`` and tokenizer files, copied into the model).
        out_dir: the model directory to write (replaced atomically at the end).
        checkpoint_root: where checkpoints go (default: ``<out_dir>.checkpoints`` next to it).
        on_metrics: ``on_metrics(global_step, metrics)`` at every log/evaluation (rank 0), keys
            ``train/<name>`` and ``heldout/<name>``.
        dist: the process's DDP context (default: one process on ``params.device``).

    Returns:
        The :class:`PretrainResult`.
    """
    data_dir, vocab_dir, out_dir = Path(data_dir), Path(vocab_dir), Path(out_dir)
    dist = dist or DistContext(device=resolve_device(params.device))
    data_stats = check_inputs(params, data_dir, vocab_dir, dist.world_size)
    ckpt_root = Path(checkpoint_root) if checkpoint_root else out_dir.with_name(out_dir.name + ".checkpoints")
    config = params.model.config(data_stats["vocab_size"])
    if params.deterministic and params.time_budget_minutes is not None:
        log.warning(
            "deterministic is set but so is time_budget_minutes: when the budget is the nearer limit, the "
            "schedule and the stopping step depend on timing; set time_budget_minutes: null for bit-exact runs"
        )
    if params.num_threads:
        torch.set_num_threads(params.num_threads)
    torch.manual_seed(params.seed)
    from bert_core.model import BertForPreTraining

    model = BertForPreTraining(config)
    if params.init_mlm_bias == "unigram":
        with torch.no_grad():
            model.cls.predictions.bias.copy_(unigram_log_prior(data_dir / params.phases[0].name / "train"))
    task = PretrainingTask.for_config(config)
    log.info(
        "pretraining %s (%.1fM parameters) on %s, %d process(es)",
        params.model.preset, model.num_parameters() / 1e6, dist.device, dist.world_size,
    )  # fmt: skip

    fp = _fingerprint(
        config.to_dict(), params.optimizer.model_dump(mode="json"), params.seed, params.init_mlm_bias
    )
    history: list[dict[str, Any]] = []
    fits: list[FitResult] = []
    phase_metrics: dict[str, Any] = {}
    step_offset = 0
    for i, phase in enumerate(params.phases):
        train_index = (data_dir / phase.name / "train" / "index.json").read_bytes()
        fp = _fingerprint(fp, phase.model_dump(mode="json"), params.phase_steps(i), params.phase_budget_s(i),
                          hashlib.sha256(train_index).hexdigest())  # fmt: skip
        fit = _run_phase(params, i, model, task, data_dir, dist, ckpt_root / f"{phase.name}-{fp}", fp,
                         on_metrics, step_offset)  # fmt: skip
        fits.append(fit)
        history += [{**h, "step": h["step"] + step_offset, "phase": phase.name} for h in fit.history]
        phase_metrics[phase.name] = _phase_summary(fit)
        step_offset += fit.step

    final_eval = fits[-1].eval_metrics
    metrics = {
        "heldout": {k.removeprefix("eval_"): v for k, v in final_eval.items()},
        "phases": phase_metrics,
        "steps": step_offset,
        "parameters_m": model.num_parameters() / 1e6,
        "train_seconds": sum(f.elapsed_s for f in fits),
    }
    if dist.is_main:
        save_model(model, vocab_dir, out_dir)
    dist.barrier()
    return PretrainResult(out_dir, metrics, history, data_stats, config, fits)


def _run_phase(
    params: PretrainParams,
    i: int,
    model: torch.nn.Module,
    task: PretrainingTask,
    data_dir: Path,
    dist: DistContext,
    ckpt_dir: Path,
    fingerprint: str,
    on_metrics: MetricsCallback | None,
    step_offset: int,
) -> FitResult:
    from bert_core.pretrain_data.loader import PretrainingLoader

    phase = params.phases[i]
    accum = phase.global_batch // (phase.micro_batch * dist.world_size)
    seed = params.seed + 1000 * i
    train = PretrainingLoader(
        data_dir / phase.name / "train", phase.micro_batch, rank=dist.rank, world_size=dist.world_size,
        seed=seed, expected_vocab_size=model.config.vocab_size,
    )  # fmt: skip
    heldout_dir = data_dir / phase.name / "heldout"
    eval_bs = params.eval_batch_size or phase.micro_batch

    def heldout() -> PretrainingLoader:
        return PretrainingLoader(
            heldout_dir, eval_bs, rank=dist.rank, world_size=dist.world_size, shuffle=False, drop_last=False
        )

    steps, budget = params.phase_steps(i), params.phase_budget_s(i)
    cfg = TrainConfig(
        max_steps=steps,
        time_budget_s=budget,
        lr=phase.lr or params.optimizer.lr,
        warmup_steps=phase.warmup_steps,
        warmup_ratio=phase.warmup_ratio,
        weight_decay=params.optimizer.weight_decay,
        optimizer=params.optimizer.name,
        betas=params.optimizer.betas,
        eps=params.optimizer.eps,
        max_grad_norm=params.optimizer.max_grad_norm,
        grad_accum=accum,
        precision=params.precision,
        compile=params.compile,
        checkpoint_every=params.checkpoint_every,
        keep_last=params.keep_last,
        eval_every=params.eval_every,
        max_eval_batches=params.eval_batches,
        log_every=params.log_every,
        seed=seed,
        deterministic=params.deterministic,
        device=params.device,
    )

    def emit(step: int, metrics: dict[str, float]) -> None:
        if on_metrics is None:
            return
        heldout_metrics = any(k.startswith("eval_") for k in metrics)
        prefix = "heldout/" if heldout_metrics else "train/"
        out = {prefix + k.removeprefix("eval_"): v for k, v in metrics.items()}
        out["phase"] = float(i)
        on_metrics(step + step_offset, out)

    log.info(
        "phase %s: %s, global batch %d = %d x %d accumulation x %d process(es), %d train steps/epoch",
        phase.name, f"{steps} steps" if steps else f"{budget:.0f} s budget", phase.global_batch,
        phase.micro_batch, accum, dist.world_size, train.steps_per_epoch // accum,
    )  # fmt: skip
    trainer = Trainer(
        model, task, train, cfg, checkpoint_dir=ckpt_dir, eval_data=heldout, on_metrics=emit, dist=dist,
        fingerprint=fingerprint,
    )  # fmt: skip
    return trainer.fit()


def _phase_summary(fit: FitResult) -> dict[str, Any]:
    train = fit.train_metrics
    out: dict[str, Any] = {
        "steps": fit.step,
        "seconds": round(fit.elapsed_s, 2),
        "stop_reason": fit.stop_reason,
    }
    for k in ("loss", "mlm_acc", "nsp_acc", "seq_per_s", "tokens_per_s", "mfu"):
        if k in train:
            out[f"train_{k}"] = train[k]
    out.update({k.removeprefix("eval_"): v for k, v in fit.eval_metrics.items()})
    return out


def save_model(model: torch.nn.Module, vocab_dir: Path, out_dir: Path) -> Path:
    """Write ``model`` in HF format plus the tokenizer files of ``vocab_dir``, atomically."""
    with atomic_path(out_dir, is_dir=True) as tmp:
        model.save_pretrained(tmp)
        for name in TOKENIZER_FILES:
            if (vocab_dir / name).is_file():
                shutil.copy2(vocab_dir / name, tmp / name)
    log.info("model written to %s", out_dir)
    return out_dir


def write_curves(history: list[dict[str, Any]], loss_csv: Path, heldout_csv: Path | None = None) -> None:
    """The loss curve (and held-out evaluations) as CSV for ``dvc plots``, written atomically."""
    train_cols = ["step", "phase", "loss", "mlm_loss", "nsp_loss", "mlm_acc", "nsp_acc", "lr"]
    eval_cols = ["step", "phase", "eval_mlm_acc", "eval_baseline_mlm_acc", "eval_mlm_ppl",
                 "eval_baseline_mlm_ppl", "eval_nsp_acc", "eval_baseline_nsp_acc"]  # fmt: skip
    for path, kind, cols in ((loss_csv, "train", train_cols), (heldout_csv, "eval", eval_cols)):
        if path is None:
            continue
        rows = ([h.get(c, "") for c in cols] for h in history if h["kind"] == kind)
        write_csv_atomic(path, [c.removeprefix("eval_") for c in cols], rows)
