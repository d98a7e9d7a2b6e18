"""The one training loop, shared by pretraining and fine-tuning.

``Trainer.fit()`` runs a fixed lifecycle: **setup** (device, precision, optimizer, resume from the
newest checkpoint, ``torch.compile``, DDP) -> **train** (gradient accumulation, clipping, schedule,
logging, periodic evaluation and checkpoints) -> **evaluate** -> **save** (a final checkpoint marked
complete) -> **clean up** (signal handlers, global flags). What is trained on and what is measured is
pluggable through an :class:`Objective` (an example: :mod:`bert_core.training.objective`).

Data protocol: ``train_data`` is re-iterable; each ``iter()`` continues where the last one stopped and a
new epoch begins when one is exhausted. A loader with ``state_dict()`` / ``load_state_dict()`` is resumed
exactly from its saved position; one without is resumed by calling ``set_epoch(epoch)`` (if it has it)
and skipping the batches already consumed in that epoch, which is exact for loaders whose order depends
only on the epoch. Under DDP each rank's loader yields that rank's share of the global batch.

Counting: ``step`` is the number of optimizer steps done; metrics logged "at step s" describe steps up to
s, and checkpoint ``step-s`` holds the state after s steps. The global batch: micro x accum x world size.

Faults: SIGTERM/SIGINT finish the current step, write a checkpoint and raise :class:`TrainingInterrupted`;
a non-finite loss or gradient norm raises :class:`NonFiniteLossError` before the bad update is applied
(on a GPU, read one step late while the device skips the update: :mod:`bert_core.training.step_check`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import logging
import os
import random
import signal
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from bert_core.device import to_device
from bert_core.tracking import MetricsCallback
from bert_core.training import checkpoint as ckpt
from bert_core.training.config import FitResult, NonFiniteLossError, TrainConfig, TrainingInterrupted
from bert_core.training.distributed import DistContext, resolve_device
from bert_core.training.evaluation import evaluate_objective
from bert_core.training.flops import peak_tflops
from bert_core.training.objective import Objective
from bert_core.training.optim import build_optimizer
from bert_core.training.step_check import StepCheck, StepFlags
from bert_core.training.window import MetricsWindow

log = logging.getLogger(__name__)

__all__ = ["Trainer"]


# ====================================================================== trainer
class Trainer:
    """Runs the training lifecycle for one model, objective and loader (see the module docstring).

    Args:
        model: the model to train (unwrapped); it is moved to the device.
        objective: what the model is trained to do: loss and statistics of a batch.
        train_data: re-iterable training batches (dicts of CPU tensors) for this rank.
        config: the ``TrainConfig``.
        checkpoint_dir: where checkpoints go (None: no checkpoints, no resume).
        eval_data: evaluation batches for this rank, or a zero-argument callable returning a fresh
            iterable for each evaluation.
        evaluator: instead of ``eval_data``: ``evaluator(model) -> metrics`` (e.g. SQuAD post-processing).
        on_metrics: called as ``on_metrics(step, metrics)`` on rank 0 at each log and evaluation.
        dist: the process's ``DistContext`` (default: single process on ``config.device``).
        fingerprint: identifies the run's settings; resuming a checkpoint with another fingerprint raises.
        replay_to: after a resume, called as ``on_metrics`` is with each record of the checkpoint's history
            (rank 0), for a caller whose tracking run is new in each process: it then holds the whole curve.
    """

    def __init__(
        self,
        model: nn.Module,
        objective: Objective,
        train_data: Iterable[dict[str, Any]],
        config: TrainConfig,
        *,
        checkpoint_dir: Path | None = None,
        eval_data: Iterable[dict[str, Any]] | Callable[[], Iterable[dict[str, Any]]] | None = None,
        evaluator: Callable[[nn.Module], dict[str, float]] | None = None,
        on_metrics: MetricsCallback | None = None,
        dist: DistContext | None = None,
        fingerprint: str = "",
        replay_to: MetricsCallback | None = None,
    ) -> None:
        self.model = model
        self.objective = objective
        self.train_data = train_data
        self.config = config
        self.checkpoint_dir = Path(checkpoint_dir) if checkpoint_dir is not None else None
        self.eval_data = eval_data
        self.evaluator = evaluator
        self.on_metrics = on_metrics
        self.dist = dist or DistContext(device=resolve_device(config.device))
        self.fingerprint = fingerprint
        self.replay_to = replay_to
        self.device = self.dist.device
        self.schedule = config.schedule()
        # run state (saved in checkpoints)
        self.step = 0
        self.elapsed_s = self.paused_s = 0.0  # paused: evaluations and checkpoints between steps
        self.checkpoint_s = 0.0  # writing this process's checkpoints (rank 0), not saved in them
        self.history: list[dict[str, Any]] = []
        self.eval_metrics: dict[str, float] = {}
        self.train_metrics: dict[str, float] = {}
        self._data_pos = {"epoch": 0, "batches": 0}  # for loaders without state_dict
        self._last_ckpt: Path | None = None
        self._resumed_from: int | None = None
        self._saved_windows: list[dict[str, Any]] | None = None  # a resumed checkpoint's logging windows
        self._complete = False
        self._stop_reason = "max_steps"
        self._stop_signal: int | None = None
        self._stop_any = False  # a stop signal on some rank, as the step flags tell
        self._check: StepCheck | None = None  # made with the optimizer (_setup)

    # ------------------------------------------------------------------ lifecycle
    def fit(self) -> FitResult:
        """setup -> train -> evaluate -> save -> clean up. See the module docstring for the faults raised."""
        self._prev_deterministic = torch.are_deterministic_algorithms_enabled()
        # TF32 for the run only: the flags are process-wide, a caller's float32 work after fit() keeps its own
        self._prev_tf32 = (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32)
        old_handlers: dict[int, Any] = {}
        try:
            self._setup()
            old_handlers = self._install_signal_handlers()
            if not self._complete:
                self._stop_reason = self._train()
                self._evaluate()
                self._complete = True
                # without a final checkpoint, a signal during the final evaluation still writes one
                if self.config.final_checkpoint or self._stop_requested():
                    self._save()
                if self._stop_requested():  # a signal during the final evaluation or save
                    raise TrainingInterrupted(self._stop_signal or signal.SIGTERM, self.step, self._last_ckpt)
            return FitResult(
                step=self.step,
                elapsed_s=self.elapsed_s,
                paused_s=self.paused_s,
                stop_reason=self._stop_reason,
                train_metrics=self.train_metrics,
                eval_metrics=self.eval_metrics,
                history=self.history,
                checkpoint=self._last_ckpt,
                resumed_from_step=self._resumed_from,
                checkpoint_s=self.checkpoint_s,
            )
        finally:
            self._cleanup(old_handlers)

    # ------------------------------------------------------------------ setup
    def _setup(self) -> None:
        cfg, dev = self.config, self.device
        if cfg.deterministic:
            os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
            torch.use_deterministic_algorithms(True)
        self._set_precision()
        if dev.type == "cuda":
            torch.backends.cuda.matmul.allow_tf32 = True
            torch.backends.cudnn.allow_tf32 = True
        self.model.to(dev)
        self.model.train()
        self.optimizer = build_optimizer(
            self.model,
            name=cfg.optimizer,
            lr=cfg.lr,
            weight_decay=cfg.weight_decay,
            betas=cfg.betas,
            eps=cfg.eps,
            fused=None,
        )
        self.scaler = torch.amp.GradScaler(dev.type, enabled=self.precision == "fp16")
        stopped = lambda: self._stop_signal is not None  # noqa: E731
        self._check = StepCheck.for_run(
            cfg.overlap_checks, self.dist, self._now, stopped, self.optimizer, self.scaler
        )
        self._peak = (
            peak_tflops(torch.cuda.get_device_name(dev), self.precision) if dev.type == "cuda" else None
        )
        self._seed_rngs()
        self._resume()
        net: nn.Module = self.model
        if cfg.compile:
            from bert_core.unpad import allow_data_dependent_shapes

            allow_data_dependent_shapes()  # unpadding / sparse gathers stay in the graph
            net = torch.compile(net, mode=cfg.compile_mode)
        if self.dist.distributed:
            from torch.nn.parallel import DistributedDataParallel

            net = DistributedDataParallel(
                net, device_ids=[dev.index] if dev.type == "cuda" else None, gradient_as_bucket_view=True
            )
        self.net = net

    def _set_precision(self) -> None:
        p = self.config.precision
        if p == "auto":
            p = "bf16" if self.device.type == "cuda" and torch.cuda.is_bf16_supported() else "fp32"
        elif p == "fp16" and self.device.type != "cuda":
            raise ValueError("precision fp16 needs a CUDA device; use fp32 (or bf16) on the CPU")
        self.precision = p
        self._autocast_dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(p)

    def _seed_rngs(self) -> None:
        seed = self.config.seed + self.dist.rank
        random.seed(seed)
        np.random.seed(seed % 2**32)
        torch.manual_seed(seed)

    def _resume(self) -> None:
        if self.checkpoint_dir is None or not self.config.resume:
            return
        found = ckpt.resume_newest(
            self.checkpoint_dir,
            model=self.model,
            optimizer=self.optimizer,
            scaler=self.scaler,
            dist=self.dist,
            fingerprint=self.fingerprint,
        )
        if found is None:
            return
        path, state, data_state = found
        self._restore_state(state)
        if hasattr(self.train_data, "load_state_dict") and data_state is not None:
            self.train_data.load_state_dict(data_state)
        self._last_ckpt = path
        self._resumed_from = self.step
        log.info("resumed from %s (step %d, %.0f s trained)", path, self.step, self.elapsed_s)
        if self.replay_to is not None and self.dist.is_main:
            for record in self.history:
                self.replay_to(record["step"], {k: v for k, v in record.items() if k not in ("step", "kind")})

    def _restore_state(self, state: dict[str, Any]) -> None:
        self.step = int(state["step"])
        self.elapsed_s = float(state["elapsed_s"])
        self.paused_s = float(state.get("paused_s", 0.0))
        self.history = list(state.get("history", []))
        self.eval_metrics = dict(state.get("eval_metrics", {}))
        self.train_metrics = dict(state.get("train_metrics", {}))
        self._data_pos = dict(state.get("data_pos", self._data_pos))
        self._saved_windows = state.get("train_windows")
        self._complete = bool(state.get("complete", False))
        self._stop_reason = state.get("stop_reason", "max_steps")

    # ------------------------------------------------------------------ train
    def _batches(self) -> Iterator[dict[str, Any]]:
        """Endless stream of training batches; tracks the position for loaders without state_dict."""
        data = self.train_data
        stateful = hasattr(data, "state_dict") and hasattr(data, "load_state_dict")
        skip = 0 if stateful else self._data_pos["batches"]
        empty_passes = 0
        while True:
            if not stateful and hasattr(data, "set_epoch"):
                data.set_epoch(self._data_pos["epoch"])
            got = False
            for batch in itertools.islice(iter(data), skip, None):
                got = True
                self._data_pos["batches"] += 1
                yield batch
            # One empty pass is normal (resumed exactly at the end of an epoch); two mean no data.
            empty_passes = 0 if got else empty_passes + 1
            if empty_passes >= 2:
                raise ValueError("the training data yielded no batch: is the data directory empty?")
            skip = 0
            self._data_pos = {"epoch": self._data_pos["epoch"] + 1, "batches": 0}

    def _autocast(self):
        if self._autocast_dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(self.device.type, dtype=self._autocast_dtype)

    def _now(self) -> float:
        """This process's training clock: seconds trained before a resume plus this segment's."""
        return self._elapsed_base + (time.perf_counter() - self._t_start)

    def _train(self) -> str:
        cfg = self.config
        batches = self._batches()
        self._elapsed_base, self._t_start = self.elapsed_s, time.perf_counter()
        self._saved_at = self.elapsed_s
        saved, self._saved_windows = self._saved_windows, None
        resumed = saved and len(saved) == self.dist.world_size  # mid-window: its sums go on
        self._win = (
            MetricsWindow.restored(saved[self.dist.rank], self.device)
            if resumed
            else MetricsWindow(self.device)
        )
        params = [p for p in self.model.parameters() if p.requires_grad]
        start = self.step
        while True:
            if cfg.max_steps is not None and self.step >= cfg.max_steps:
                reason = "max_steps"
                break
            if cfg.time_budget_s is not None and self.elapsed_s >= cfg.time_budget_s:
                reason = "time_budget"
                break
            loss_sum = torch.zeros((), device=self.device)
            for micro in range(cfg.grad_accum):
                if cfg.captures_cuda_graphs:
                    torch.compiler.cudagraph_mark_step_begin()
                batch = next(batches)
                seqs, toks = self.objective.count(batch)
                flops = self.objective.flops(batch) if self._peak is not None else None
                batch = to_device(batch, self.device)
                sync = micro == cfg.grad_accum - 1 or not self.dist.distributed
                with contextlib.nullcontext() if sync else self.net.no_sync(), self._autocast():
                    out = self.objective.step(self.net, batch)
                    loss = out.loss / cfg.grad_accum
                self.scaler.scale(loss).backward()
                loss_sum += out.loss.detach().float()
                self._win.add_micro(seqs, toks, flops, out.stats)
            loss_mean = loss_sum / cfg.grad_accum
            if self.scaler.is_enabled():
                self.scaler.unscale_(self.optimizer)
            if cfg.max_grad_norm is not None:
                grad_norm = torch.nn.utils.clip_grad_norm_(params, cfg.max_grad_norm)
            else:
                grad_norm = torch.nn.utils.get_total_norm([p.grad for p in params if p.grad is not None])
            self._take(self._check.measure(self.step + 1, loss_mean, grad_norm))
            lr = self.schedule.lr_for_step(self.step, self.elapsed_s)
            for group in self.optimizer.param_groups:
                group["lr"] = lr
            with self._check.skipping_bad(self.optimizer):
                self.scaler.step(self.optimizer)
            self.scaler.update()
            self.optimizer.zero_grad(set_to_none=True)
            self.step += 1
            self._win.add_step(loss_mean, grad_norm, lr)
            done = (cfg.max_steps is not None and self.step >= cfg.max_steps) or (
                cfg.time_budget_s is not None and self.elapsed_s >= cfg.time_budget_s
            )
            if self.step % cfg.log_every == 0 or done:
                self._log_train()
            elif self.step == start + 1:  # that step held compilation and warm-up: timed from the next
                self._win.restart_clock()
            if cfg.eval_every and self.step % cfg.eval_every == 0 and not done:
                self._timed(self._evaluate)
            if self._stop_any:
                self._timed(self._save)
                raise TrainingInterrupted(self._stop_signal or signal.SIGTERM, self.step, self._last_ckpt)
            every_s = cfg.checkpoint_every_s
            due = (cfg.checkpoint_every and self.step % cfg.checkpoint_every == 0) or (
                every_s is not None and self.elapsed_s - self._saved_at >= every_s
            )
            if due and not done:
                self._timed(self._save)
        return reason

    def _timed(self, fn: Callable[[], Any]) -> None:
        """Run eval/checkpoint work: it counts toward the elapsed time but not toward throughput."""
        t = time.perf_counter()
        fn()
        seconds = time.perf_counter() - t
        self._win.t0 += seconds
        self.paused_s += seconds

    def _take(self, flags: StepFlags | None) -> None:
        """Act on a step's flags (:mod:`bert_core.training.step_check`): a bad step raises with the state
        before its update; a stop is kept for the end of the step; the clock moves on."""
        if flags is None:
            return
        if flags.bad:
            self.step = flags.step - 1  # overlapped: the step was counted, its update skipped on the device
            self.optimizer.zero_grad(set_to_none=True)
            raise NonFiniteLossError(flags.step, float(flags.loss), float(flags.grad_norm), self._last_ckpt)
        self._stop_any = self._stop_any or flags.stop
        self.elapsed_s = flags.elapsed

    def _settle(self) -> None:
        """Read the flags still in flight: before anything that reports or saves the state."""
        if self._check is not None:  # evaluate() before any training has none
            self._take(self._check.settle())

    def _stop_requested(self) -> bool:
        """Whether any rank received SIGTERM/SIGINT (a collective under DDP)."""
        flag = torch.tensor(float(self._stop_signal is not None), device=self.device)
        return bool(self.dist.all_reduce(flag, op="max").item())

    # ------------------------------------------------------------------ metrics
    def _log_train(self) -> None:
        self._settle()
        metrics = self._win.metrics(self.dist, self.objective, self._peak, elapsed_s=self.elapsed_s)
        self.train_metrics = metrics
        self._emit("train", metrics)
        self._win = MetricsWindow(self.device)

    def _emit(self, kind: str, metrics: dict[str, float]) -> None:
        self.history.append({"step": self.step, "kind": kind, **metrics})
        if self.dist.is_main:
            # train windows at DEBUG: the callers' rate-limited progress lines (bert_core.progress) report them
            level = logging.DEBUG if kind == "train" else logging.INFO
            shown = ", ".join(f"{k}={v:.4g}" for k, v in metrics.items())
            log.log(level, "step %d %s: %s", self.step, kind, shown)
            if self.on_metrics is not None:
                self.on_metrics(self.step, metrics)

    # ------------------------------------------------------------------ evaluate
    def evaluate(self) -> dict[str, float]:
        """The evaluation alone, on the model as it is (before any step): its metrics, nothing emitted."""
        self._set_precision()
        self.model.to(self.device)
        self._evaluate(emit=False)
        return self.eval_metrics

    @torch.no_grad()
    def _evaluate(self, *, emit: bool = True) -> None:
        self._settle()
        if self.evaluator is None and self.eval_data is None:
            return
        model = self.model
        model.eval()
        try:
            if self.evaluator is not None:
                metrics = dict(self.evaluator(model))
            else:
                data = self.eval_data() if callable(self.eval_data) else self.eval_data
                metrics = evaluate_objective(
                    model,
                    self.objective,
                    data,
                    device=self.device,
                    dist=self.dist,
                    max_batches=self.config.max_eval_batches,
                    autocast=self._autocast,
                )
        finally:
            model.train()
        self.eval_metrics = metrics
        if emit:
            self._emit("eval", metrics)

    # ------------------------------------------------------------------ save
    def _save(self) -> None:
        self._settle()
        if self.checkpoint_dir is None:
            return
        rng = self.dist.gather_objects(ckpt.capture_rng_state())
        data_state = self.train_data.state_dict() if hasattr(self.train_data, "state_dict") else None
        data_states = self.dist.gather_objects(data_state)
        windows = self.dist.gather_objects(self._win.state())
        if self.dist.is_main:
            state = {
                "elapsed_s": self.elapsed_s,
                "paused_s": self.paused_s,
                "history": self.history,
                "train_windows": windows,
                "eval_metrics": self.eval_metrics,
                "train_metrics": self.train_metrics,
                "data_pos": self._data_pos,
                "fingerprint": self.fingerprint,
                "world_size": self.dist.world_size,
                "complete": self._complete,
                "stop_reason": getattr(self, "_stop_reason", None),
                "schedule": dataclasses.asdict(self.schedule),
            }
            t = time.perf_counter()
            path = ckpt.save_checkpoint(
                self.checkpoint_dir,
                step=self.step,
                model=self.model,
                optimizer=self.optimizer,
                scaler=self.scaler,
                state=state,
                rng_states=rng,
                data_states=data_states,
                keep_last=self.config.keep_last,
            )
            self.checkpoint_s += (seconds := time.perf_counter() - t)
            log.info("checkpoint written: %s (%.2f GB in %.1f s)", path, ckpt.size_bytes(path) / 1e9, seconds)
        self._last_ckpt, self._saved_at = ckpt.step_dir(self.checkpoint_dir, self.step), self.elapsed_s
        self.dist.barrier()

    # ------------------------------------------------------------------ signals and clean-up
    def _install_signal_handlers(self) -> dict[int, Any]:
        if threading.current_thread() is not threading.main_thread():
            log.warning("not on the main thread: SIGTERM/SIGINT will not trigger a checkpoint")
            return {}

        def handler(signum: int, _frame: Any) -> None:
            if self._stop_signal is not None:  # second signal: stop now
                raise KeyboardInterrupt
            self._stop_signal, name = signum, signal.Signals(signum).name
            log.warning("%s received: finishing the current step, writing a checkpoint and stopping", name)

        return {sig: signal.signal(sig, handler) for sig in (signal.SIGTERM, signal.SIGINT)}

    def _cleanup(self, old_handlers: dict[int, Any]) -> None:
        for sig, h in old_handlers.items():
            signal.signal(sig, h)
        torch.use_deterministic_algorithms(self._prev_deterministic)
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = self._prev_tf32
