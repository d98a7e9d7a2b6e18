"""The ``pretrain`` stage's entry point: MLM + NSP pretraining of a BERT preset in the paper's two phases.

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

import logging
import shutil
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import torch

from bert_core.atomic import atomic_path, write_csv_atomic
from bert_core.config import BertConfig
from bert_core.constants import TOKENIZER_FILES
from bert_core.pretrain.init import checkpoint_config, find_init_checkpoint, load_init_weights
from bert_core.pretrain.inputs import PhaseData, read_inputs, unigram_log_prior
from bert_core.pretrain.objective import PretrainingObjective
from bert_core.pretrain.params import PretrainParams
from bert_core.tracking import MetricsCallback
from bert_core.tracking.fingerprint import json_fingerprint
from bert_core.training import FitResult, Trainer
from bert_core.training.distributed import DistContext, resolve_device
from bert_core.training.progress import LaterPhase, TrainProgress

log = logging.getLogger(__name__)


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


def _fingerprint(*parts: Any) -> str:
    return json_fingerprint(parts)


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
    model_card: Callable[[dict[str, Any], dict[str, Any], BertConfig], str] | None = None,
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
        model_card: ``model_card(metrics, data_stats, config)`` -> the ``README.md`` written with the model, in the
            same atomic move (:func:`bert_core.modelcard.pretrained_card`; keep it free of run ids and
            timings: the model directory is a DVC output that a rerun reproduces byte for byte).

    Returns:
        The :class:`PretrainResult`.
    """
    data_dir, vocab_dir, out_dir = Path(data_dir), Path(vocab_dir), Path(out_dir)
    dist = dist or DistContext(device=resolve_device(params.device))
    inputs = read_inputs(params, data_dir, vocab_dir, dist.world_size)
    data_stats = inputs.stats
    ckpt_root = Path(checkpoint_root) if checkpoint_root else out_dir.with_name(out_dir.name + ".checkpoints")
    init = find_init_checkpoint(vocab_dir)
    if init is None:
        config = params.model.config(inputs.vocab_size, inputs.max_position_embeddings)
    else:  # continued pretraining: the checkpoint the vocab stage copied decides the architecture
        config = checkpoint_config(params.model, init, inputs.max_position_embeddings)
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
    init_report = load_init_weights(model, init) if init is not None else None
    model.train()
    if params.init_mlm_bias == "unigram" and (init_report is None or init_report["mlm_head"] == "fresh"):
        with torch.no_grad():
            first = inputs.phases[0]
            model.cls.predictions.bias.copy_(unigram_log_prior(first.train_dir, index=first.train_index))
    objective = PretrainingObjective.for_config(config, nsp=params.nsp)
    # Continued pretraining: the checkpoint's own held-out figures, the "before" of the run's "after".
    before = _heldout_before(params, model, objective, inputs, dist) if init is not None else None
    log.info(
        "pretraining %s (%.1fM parameters) on %s, %d process(es)",
        params.model.preset if init is None else f"from {init.source}",
        model.num_parameters() / 1e6,
        dist.device,
        dist.world_size,
    )

    fp = _fingerprint(
        config.to_dict(), params.optimizer.model_dump(mode="json"), params.seed, params.init_mlm_bias
    )
    if init is not None:  # a checkpoint of a run from other weights never resumes this one
        fp = _fingerprint(fp, init.weights_sha256)
    if not params.nsp:  # other weights; the paper's objective keeps the fingerprints of its checkpoints
        fp = _fingerprint(fp, "mlm_only")
    history: list[dict[str, Any]] = []
    fits: list[FitResult] = []
    phase_metrics: dict[str, Any] = {}
    step_offset = 0
    for i, (phase, phase_data) in enumerate(zip(params.phases, inputs.phases, strict=True)):
        # The sequence length comes from the data; it stays in the fingerprint as a phase field (the
        # fingerprint of a phase is the same as when the params declared it, so such checkpoints resume).
        phase_fields = {**phase.model_dump(mode="json"), "max_seq_length": phase_data.max_seq_length}
        fp = _fingerprint(
            fp, phase_fields, params.phase_steps(i), params.phase_budget_s(i), phase_data.train_sha256
        )
        trainer, progress = _phase_trainer(
            params,
            i,
            model,
            objective,
            phase_data,
            dist,
            ckpt_root / f"{phase.name}-{fp}",
            fp,
            on_metrics,
            step_offset,
            later=_later_phases(params, inputs, i),
        )
        fit = trainer.fit()
        progress.finish(fit.stop_reason, done=fit.step)
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
    if init_report is not None:  # in the data statistics too, which the model card lists as its inputs
        metrics["init"] = data_stats["init_from"] = init_report
        metrics["heldout_before"] = before
    if dist.is_main:
        readme = model_card(metrics, data_stats, config) if model_card else None
        save_model(model, vocab_dir, out_dir, readme=readme)
    dist.barrier()
    return PretrainResult(out_dir, metrics, history, data_stats, config, fits)


def _phase_trainer(
    params: PretrainParams,
    i: int,
    model: torch.nn.Module,
    objective: PretrainingObjective,
    data: PhaseData,
    dist: DistContext,
    ckpt_dir: Path,
    fingerprint: str,
    on_metrics: MetricsCallback | None,
    step_offset: int,
    later: Sequence[LaterPhase] = (),
) -> tuple[Trainer, TrainProgress]:
    """The trainer of phase ``i`` (its loaders, schedule, checkpoints and metrics callback) and its progress
    reporter."""
    from bert_core.pretrain_data.loader import PretrainingLoader

    phase = params.phases[i]
    cfg = params.train_config(i, dist.world_size)
    # The static-shape MLM targets (masked positions and weights) make the compiled step one graph; eager,
    # where shapes cost nothing, transformers' dense labels are up to ~10% faster on CPU (docs/benchmarks.md,
    # "Static-shape MLM step"). Both give the same loss, gradients and metrics (tests/test_static_mlm.py).
    mlm_format = _mlm_format(params)
    micro_batch, _ = phase.split(dist.world_size)
    train = PretrainingLoader(
        data.train_dir,
        micro_batch,
        rank=dist.rank,
        world_size=dist.world_size,
        seed=cfg.seed,
        expected_vocab_size=model.config.vocab_size,
        mlm_format=mlm_format,
        index=data.train_index,
    )
    steps, budget = cfg.max_steps, cfg.time_budget_s

    progress = TrainProgress(
        f"pretrain phase {phase.name}",
        steps,
        log_every=cfg.log_every,
        budget_s=budget,
        later=later,
        logger=log,
    )

    def track(step: int, metrics: dict[str, float]) -> None:
        if on_metrics is None:
            return
        prefix = "heldout/" if any(k.startswith("eval_") for k in metrics) else "train/"
        out = {prefix + k.removeprefix("eval_"): v for k, v in metrics.items()}
        out["phase"] = float(i)
        on_metrics(step + step_offset, out)

    def emit(step: int, metrics: dict[str, float]) -> None:
        if not any(k.startswith("eval_") for k in metrics):
            progress.window(step, metrics)
        track(step, metrics)

    log.info(
        "phase %s: %s, global batch %d = %d x %d accumulation x %d process(es), %d train steps/epoch",
        phase.name,
        f"{steps} steps" if steps else f"{budget:.0f} s budget",
        phase.global_batch,
        micro_batch,
        cfg.grad_accum,
        dist.world_size,
        train.steps_per_epoch // cfg.grad_accum,
    )
    trainer = Trainer(
        model,
        objective,
        train,
        cfg,
        checkpoint_dir=ckpt_dir,
        eval_data=partial(_heldout, params, i, data, dist, mlm_format),
        on_metrics=emit,
        dist=dist,
        fingerprint=fingerprint,
        # a resumed run's tracking run is a new one: it gets the curve before the checkpoint too
        replay_to=track if on_metrics is not None else None,
    )
    return trainer, progress


def _mlm_format(params: PretrainParams) -> str:
    return "positions" if params.compile else "labels"


def _heldout(params: PretrainParams, i: int, data: PhaseData, dist: DistContext, mlm_format: str) -> Any:
    """Phase ``i``'s held-out loader (in order, every instance)."""
    from bert_core.pretrain_data.loader import PretrainingLoader

    return PretrainingLoader(
        data.heldout_dir,
        params.eval_batch_size or params.phases[i].micro_batch,
        rank=dist.rank,
        world_size=dist.world_size,
        shuffle=False,
        drop_last=False,
        mlm_format=mlm_format,
        index=data.heldout_index,
    )


def _heldout_before(
    params: PretrainParams,
    model: torch.nn.Module,
    objective: PretrainingObjective,
    inputs: Any,
    dist: DistContext,
) -> dict[str, float]:
    """The held-out figures of the model before its first step, on the data and batches the final evaluation
    uses (the last phase's held-out set): what continued pretraining starts from."""
    last = len(params.phases) - 1
    cfg = params.train_config(last, dist.world_size)
    heldout = partial(_heldout, params, last, inputs.phases[last], dist, _mlm_format(params))
    probe = Trainer(model, objective, (), cfg, eval_data=heldout, dist=dist)
    return {k.removeprefix("eval_"): v for k, v in probe.evaluate().items()}


def _later_phases(params: PretrainParams, inputs: Any, i: int) -> list[LaterPhase]:
    """The phases after phase ``i``, for the run's ETA: steps, budget, and tokens per step relative to
    phase ``i``'s (global batch x sequence length)."""
    tokens = [p.global_batch * d.max_seq_length for p, d in zip(params.phases, inputs.phases, strict=True)]
    return [
        LaterPhase(params.phase_steps(j), params.phase_budget_s(j), tokens[j] / tokens[i])
        for j in range(i + 1, len(params.phases))
    ]


def _phase_summary(fit: FitResult) -> dict[str, Any]:
    train = fit.train_metrics
    out: dict[str, Any] = {
        "steps": fit.step,
        "seconds": round(fit.elapsed_s, 2),
        "stop_reason": fit.stop_reason,
    }
    if fit.checkpoint_s:  # what checkpoints cost this run (their cadence: checkpoint_every / _minutes)
        out["checkpoint_s"] = round(fit.checkpoint_s, 2)
    if fit.resumed_from_step is not None:
        out["resumed_from_step"] = fit.resumed_from_step
    for k in ("loss", "mlm_acc", "nsp_acc", "seq_per_s", "tokens_per_s", "mfu"):
        if k in train:
            out[f"train_{k}"] = train[k]
    out.update({k.removeprefix("eval_"): v for k, v in fit.eval_metrics.items()})
    return out


def save_model(model: torch.nn.Module, vocab_dir: Path, out_dir: Path, readme: str | None = None) -> Path:
    """Write ``model`` in HF format plus the tokenizer files of ``vocab_dir`` (and ``readme`` as its model
    card ``README.md``), atomically."""
    with atomic_path(out_dir, is_dir=True) as tmp:
        model.save_pretrained(tmp)
        if readme is not None:
            (tmp / "README.md").write_text(readme, encoding="utf-8")
        for name in TOKENIZER_FILES:
            if (vocab_dir / name).is_file():
                shutil.copy2(vocab_dir / name, tmp / name)
    log.debug("model written to %s", out_dir)  # a stage's runner names the committed outputs
    return out_dir


def write_curves(history: list[dict[str, Any]], loss_csv: Path, heldout_csv: Path | None = None) -> None:
    """The loss curve (and held-out evaluations) as CSV for ``dvc plots``, written atomically."""
    train_cols = ["step", "phase", "loss", "mlm_loss", "nsp_loss", "mlm_acc", "nsp_acc", "lr"]
    eval_cols = [
        "step",
        "phase",
        "eval_mlm_acc",
        "eval_baseline_mlm_acc",
        "eval_mlm_ppl",
        "eval_baseline_mlm_ppl",
        "eval_nsp_acc",
        "eval_baseline_nsp_acc",
    ]
    for path, kind, cols in ((loss_csv, "train", train_cols), (heldout_csv, "eval", eval_cols)):
        if path is None:
            continue
        rows = ([h.get(c, "") for c in cols] for h in history if h["kind"] == kind)
        write_csv_atomic(path, [c.removeprefix("eval_") for c in cols], rows)
