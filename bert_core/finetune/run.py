"""The ``finetune`` stage function: grid x seeds trials on one task, the best one kept (BERT §4, A.3).

:func:`finetune_task` loads the task's data, runs one trial per (init, learning rate, seed) with the shared
:class:`bert_core.training.Trainer` (AdamW, warmup + linear decay, clipping; the objective is a thin
:class:`FinetuneObjective`), selects the best pretrained trial on the dev main metric, and writes:

- ``model_out``: the selected model in Hugging Face format with its tokenizer;
- ``out_dir/summary.json``: every trial (metrics, learning curves), the selection and the model source;
- ``out_dir``: dev predictions of the selected model in the official formats, and for GLUE the test-set
  predictions in the leaderboard's submission format (``out_dir/submission/<Task>.tsv``).

Everything is written atomically at the end, so a failed run leaves the previous outputs untouched.
Tracking is pluggable (:class:`TrialTracker`): the flow passes one that opens a nested MLflow run per
trial; tests pass none.
"""

from __future__ import annotations

import contextlib
import logging
import math
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import torch
from torch import nn

from bert_core.atomic import OutputSet, atomic_outputs, check_writable, write_json_atomic
from bert_core.config import preset_for
from bert_core.finetune.collate import make_loader
from bert_core.finetune.inference import MODEL_INPUTS, TARGETS, load_tokenizer, predict
from bert_core.finetune.params import FinetuneParams, TaskSettings
from bert_core.finetune.reference import run_reference_trials
from bert_core.finetune.results import FinetuneResult, TrialResult
from bert_core.kinds import SplitScore, get_kind, max_seq_length
from bert_core.kinds.task_json import serving_task
from bert_core.progress import Progress
from bert_core.released import check_checkpoint
from bert_core.tasks import TaskSpec
from bert_core.training import Objective, StepOutput, Trainer
from bert_core.unpad import set_unpad

log = logging.getLogger(__name__)


# ====================================================================== tracking protocol
class TrialRecorder(Protocol):
    """Receives one trial's metrics (``dev.*`` and ``train.*`` keys)."""

    def log_metrics(self, metrics: Mapping[str, float], step: int | None = None) -> None: ...


class TrialTracker(Protocol):
    """Opens a recorder per trial (the flow: a nested MLflow run)."""

    def trial(
        self, name: str, params: Mapping[str, Any], tags: Mapping[str, str]
    ) -> contextlib.AbstractContextManager[TrialRecorder]: ...


class _NullRecorder:
    def log_metrics(self, metrics: Mapping[str, float], step: int | None = None) -> None:
        pass


@contextlib.contextmanager
def _no_tracking(*_: Any, **__: Any) -> Iterator[TrialRecorder]:
    yield _NullRecorder()


# ====================================================================== the objective
class FinetuneObjective(Objective):
    """The loss of a task head on a batch; drops the bookkeeping keys the collator adds."""

    def step(self, model: nn.Module, batch: dict[str, Any]) -> StepOutput:
        inputs = {k: batch[k] for k in (*MODEL_INPUTS, *TARGETS) if k in batch}
        out = model(**inputs)
        n = batch["input_ids"].shape[0]
        return StepOutput(loss=out.loss, stats={"loss_sum": out.loss.detach().float() * n,
                                                "examples": torch.tensor(float(n))})  # fmt: skip

    def summarize(self, sums: dict[str, torch.Tensor]) -> dict[str, float]:
        n = float(sums.get("examples", torch.tensor(0.0)))
        return {"train_loss": float(sums["loss_sum"]) / n} if n else {}

    def count(self, batch: dict[str, Any]) -> tuple[int, int]:
        """(examples, real tokens): padding does not count as throughput."""
        return int(batch["input_ids"].shape[0]), int(batch["attention_mask"].sum())


class _EpochLoader:
    """A DataLoader the Trainer can re-seed per epoch (``set_epoch``) for a new length-grouped order; it
    tells ``progress`` the steps done (one batch per step: when batch k+1 is drawn, k steps are done)."""

    def __init__(self, loader: torch.utils.data.DataLoader, progress: Progress | None = None) -> None:
        self.loader, self.progress = loader, progress
        self.drawn = self.examples = 0

    def set_epoch(self, epoch: int) -> None:
        sampler = self.loader.batch_sampler
        if hasattr(sampler, "set_epoch"):
            sampler.set_epoch(epoch)

    def __iter__(self) -> Iterator[dict[str, Any]]:
        for batch in self.loader:
            if self.progress is not None and self.drawn == 0:
                self.progress.reset()  # the clock starts with training, not with the model's setup
            elif self.progress is not None:
                self.progress.update(self.drawn, examples=self.examples)
            self.drawn += 1
            self.examples += int(batch["input_ids"].shape[0])
            yield batch

    def __len__(self) -> int:
        return len(self.loader)


# ====================================================================== data
@dataclass
class SplitData:
    """Rows and features of one split."""

    rows: list[dict[str, Any]]
    features: list[dict[str, Any]]
    source: str = ""


@dataclass
class TrialData:
    """Everything a task's trials read: its splits' rows encoded as features, the data-check reports, notes
    and where the rows came from. Not to be confused with the task files themselves, whose problems raise
    :class:`bert_core.tasks.TaskDataError`."""

    train: SplitData
    dev: dict[str, SplitData]
    test: dict[str, SplitData] = field(default_factory=dict)
    check_reports: list[Any] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    split_info: dict[str, Any] = field(default_factory=dict)  # where the rows came from (tasks.datasource)


def load_task_data(
    spec: TaskSpec,
    settings: TaskSettings,
    tokenizer: Any,
    *,
    data_root: str | Path | None = None,
    data_checks: bool = True,
    check_report_dir: str | Path | None = None,
) -> TrialData:
    """Load, check and encode the train, dev and (when wanted) test splits of a task.

    A missing test split is noted and skipped (leaderboard files are optional); a missing train or dev
    split, malformed rows or a failed critical data check raise.
    """
    from bert_core.tasks import TaskDataError
    from bert_core.tasks.datasource import resolve_task_source

    kind = get_kind(spec)
    source = resolve_task_source(spec, dev_split=settings.dev_split, train_file=settings.train_file,
                                 dev_file=settings.dev_file, data_root=data_root)  # fmt: skip
    loaded: dict[str, Any] = {}

    def load(split: str, limit: int | None) -> SplitData:
        rows = loaded[split] = source.load(split, limit)
        if data_checks and split in ("train", *spec.dev_splits):
            from bert_core.kinds.checks import check_task_split

            suite_dir = f"task-{spec.name}-{split}"  # the suite's name (one report folder per suite)
            report_dir = Path(check_report_dir) / suite_dir if check_report_dir else None
            report = check_task_split(rows, spec, split, report_dir=report_dir)
            data.check_reports.append(report)
            report.raise_for_critical()
        t0 = time.perf_counter()
        features = kind.encode(spec, list(rows), tokenizer, settings, training=split == "train")
        log.info("%s %s: %d rows -> %d features in %.1fs", spec.name, split, len(rows), len(features),
                 time.perf_counter() - t0)  # fmt: skip
        return SplitData(list(rows), features, rows.source)

    data = TrialData(train=SplitData([], []), dev={})
    data.train = load("train", settings.train_limit)
    if not data.train.features:
        raise ValueError(f"{spec.name}: the training split is empty")
    for split in spec.dev_splits:
        data.dev[split] = load(split, settings.eval_limit)
    data.split_info = source.describe(loaded["train"], loaded[spec.main_dev_split])
    if settings.predict_test:
        for split in spec.test_splits:
            try:
                data.test[split] = load(split, settings.test_limit)
            except (TaskDataError, FileNotFoundError) as err:
                note = f"{spec.name}/{split}: no test predictions ({err})"
                log.warning(note)
                data.notes.append(note)
    return data


# ====================================================================== one trial
@dataclass
class _TrialOutcome:
    result: TrialResult
    dev_score: SplitScore


def run_trial(
    spec: TaskSpec,
    data: TrialData,
    settings: TaskSettings,
    source_dir: Path,
    *,
    init: str,
    learning_rate: float,
    seed: int,
    device: str = "auto",
    precision: str = "auto",
    recorder: TrialRecorder | None = None,
) -> tuple[_TrialOutcome, nn.Module]:
    """Train one model and score it on the main dev split; return the outcome and the trained model."""
    recorder = recorder or _NullRecorder()
    main_split = spec.dev_splits[0]
    dev = data.dev[main_split]
    name = f"{spec.name}-{init}-lr{learning_rate:g}-seed{seed}"  # as finetune_task names the trial
    kind = get_kind(spec)
    model = set_unpad(kind.build_model(spec, source_dir, init=init, seed=seed), settings.unpad)
    n_train = len(data.train.features)
    config = settings.train_config(n_train, learning_rate=learning_rate, seed=seed, device=device,
                                   precision=precision)  # fmt: skip
    steps_per_epoch, max_steps = settings.steps_per_epoch(n_train), config.max_steps
    assert max_steps is not None  # fine-tuning runs a number of epochs, never a time budget
    log.info("%s: %d steps (%g epoch(s) of %d steps, batch %d), %d train features", name, max_steps,
             settings.epochs, steps_per_epoch, settings.batch_size, n_train)  # fmt: skip
    progress = Progress(f"{name} train", max_steps, logger=log,
                        detail=lambda step: f"epoch {step / steps_per_epoch:.2f}/{settings.epochs:g}")  # fmt: skip
    loader = make_loader(data.train.features, settings.batch_size, shuffle=True, seed=seed,
                         group_by_length=settings.group_by_length)  # fmt: skip
    eval_seconds: list[float] = []
    last: dict[str, SplitScore] = {}

    def evaluator(m: nn.Module) -> dict[str, float]:
        if train_data.drawn >= max_steps:  # the final evaluation: training is over
            progress.finish(done=max_steps, examples=train_data.examples)
        t0 = time.perf_counter()
        outputs = predict(m, dev.features, batch_size=settings.eval_batch_size,
                          device=next(m.parameters()).device, precision=precision,
                          label=f"{name} {main_split} eval")  # fmt: skip
        result = kind.score(spec, dev.rows, dev.features, outputs, settings)
        last["dev"] = result
        eval_seconds.append(time.perf_counter() - t0)
        return {**{f"dev.{k}": v for k, v in result.metrics.items()},
                **{f"dev.{k}": v for k, v in result.extra.items()}}  # fmt: skip

    def on_metrics(step: int, metrics: dict[str, float]) -> None:
        renamed = {(k if k.startswith("dev.") else f"train.{k}"): float(v) for k, v in metrics.items()}
        recorder.log_metrics(renamed, step=step)

    train_data = _EpochLoader(loader, progress)
    fit = Trainer(model, FinetuneObjective(), train_data, config, evaluator=evaluator,
                  on_metrics=on_metrics).fit()  # fmt: skip
    progress.finish(done=fit.step, examples=train_data.examples)
    history, evals = [], []
    for rec in fit.history:
        epoch = rec["step"] / steps_per_epoch
        if rec["kind"] == "train":
            history.append(
                {"step": rec["step"], "epoch": epoch, "loss": rec["loss"], "learning_rate": rec["lr"]}
            )
        else:
            evals.append({"step": rec["step"], "epoch": epoch,
                          **{k.removeprefix("dev."): v for k, v in rec.items() if k.startswith("dev.")}})  # fmt: skip
    score = last["dev"]
    train_seconds = max(fit.elapsed_s - sum(eval_seconds[:-1]), 1e-9)
    result = TrialResult(
        init=init,
        learning_rate=learning_rate,
        seed=seed,
        dev=dict(score.metrics),
        history=history,
        evals=evals,
        train_examples=n_train,
        train_seconds=train_seconds,
        steps=fit.step,
        epochs=fit.step / steps_per_epoch,
        extra=dict(score.extra),
    )
    recorder.log_metrics({"train.examples_per_second": result.examples_per_second,
                          "train.seconds": train_seconds})  # fmt: skip
    return _TrialOutcome(result, score), model


# ====================================================================== the stage function
def model_info(source_dir: str | Path, **known: Any) -> dict[str, Any]:
    """Shape and provenance of the pretrained model (``known`` adds e.g. the registry version)."""
    from bert_core.hf import read_config

    config = read_config(source_dir)
    info = {
        "source": str(source_dir),
        "num_hidden_layers": config.num_hidden_layers,
        "hidden_size": config.hidden_size,
        "num_attention_heads": config.num_attention_heads,
        "vocab_size": config.vocab_size,
        "max_position_embeddings": config.max_position_embeddings,
        "preset": preset_for(config.num_hidden_layers, config.hidden_size) or "custom",
    }
    info.update({k: v for k, v in known.items() if v is not None})
    return info


def trial_grid(settings: TaskSettings, init: str) -> list[tuple[str, float, int]]:
    """(init, learning rate, seed) of every trial: the main init, then the random-init baseline."""
    inits = [init] + (["random"] if settings.random_init_baseline and init != "random" else [])
    return [(i, lr, s) for i in inits for lr in settings.learning_rates for s in settings.seeds]


def finetune_task(
    task: str,
    params: FinetuneParams,
    model_source: str | Path,
    out_dir: str | Path,
    *,
    model_out: str | Path | None = None,
    data_root: str | Path | None = None,
    tracker: TrialTracker | None = None,
    source_info: Mapping[str, Any] | None = None,
    on_data: Callable[[TrialData], None] | None = None,
    check_report_dir: str | Path | None = None,
    outputs: OutputSet | None = None,
) -> FinetuneResult:
    """Fine-tune ``task`` from the HF model in ``model_source`` and write its outputs.

    Args:
        task: Task name (``sst2``, ``squad_v1``, ``conll2003`` ...).
        params: The stage params; ``params.for_task(task)`` gives the settings.
        model_source: Local Hugging Face BERT directory with tokenizer files (resolve MLflow URIs first,
            :func:`bert_core.tracking.resolve_model_source`).
        out_dir: Predictions, submission files and ``summary.json`` (replaced atomically).
        model_out: The selected model in HF format (default ``out_dir/model``; replaced atomically).
        data_root: Local data root (default ``BERT_DATA_ROOT``; unset = Hugging Face Hub).
        tracker: Opens a recorder per trial (nested MLflow runs in the flow).
        source_info: Provenance of the pretrained model to record (registry name/version, URI).
        on_data: Called with the loaded :class:`TrialData` (the flow logs the data-check reports).
        check_report_dir: Where the data checks' HTML reports go (one folder per suite), kept after the
            run so that a failed check's message points at a report that exists; default: a temporary
            directory (no lasting report).
        outputs: Stage ``out_dir`` and ``model_out`` in this :class:`~bert_core.atomic.OutputSet` (the
            flow adds its metrics and plots files, so that all are committed together); default: a set of
            their own, committed when this function returns.

    Returns:
        The :class:`FinetuneResult` (also written as ``out_dir/summary.json``).
    """
    from bert_core.tasks import get_task
    from bert_core.tasks.datasource import split_tags

    spec = get_task(task)
    settings = params.for_task(spec.name)
    source_dir = Path(model_source)
    out_dir, model_out = Path(out_dir), Path(model_out) if model_out is not None else Path(out_dir) / "model"
    info = model_info(source_dir, **dict(source_info or {}))
    max_len = max_seq_length(spec, settings)
    if max_len > info["max_position_embeddings"]:  # else: an index error only once a long enough batch comes
        raise ValueError(
            f"{spec.name}: max_seq_length={max_len} is longer than the model's position table "
            f"(max_position_embeddings={info['max_position_embeddings']} in {source_dir}/config.json); set "
            f"finetune.tasks.{spec.name}.max_seq_length to at most {info['max_position_embeddings']}"
        )
    check_writable(out_dir, model_out)  # fail fast, before hours of training
    check_checkpoint(source_dir)  # tokenizer files present, vocab sizes agree (released checkpoints)
    tokenizer = load_tokenizer(source_dir, info["vocab_size"])
    with tempfile.TemporaryDirectory(prefix=f"finetune-{spec.name}-") as tmp_name:
        tmp = Path(tmp_name)
        reports = Path(check_report_dir) if check_report_dir is not None else tmp / "data_checks"
        data = load_task_data(spec, settings, tokenizer, data_root=data_root, data_checks=params.data_checks,
                              check_report_dir=reports)  # fmt: skip
        if on_data is not None:
            on_data(data)
        log.info("%s: %d train features, dev %s", spec.name, len(data.train.features),
                 {s: len(d.features) for s, d in data.dev.items()})  # fmt: skip
        trials: list[TrialResult] = []
        best: dict[str, _TrialOutcome] = {}
        open_trial = tracker.trial if tracker is not None else _no_tracking
        grid = trial_grid(settings, params.model.init)
        for number, (init, lr, seed) in enumerate(grid, 1):
            name = f"{spec.name}-{init}-lr{lr:g}-seed{seed}"
            log.info("trial %d/%d: %s", number, len(grid), name)
            trial_params = {
                **settings.model_dump(mode="json"),
                "learning_rate": lr,
                "seed": seed,
                "init": init,
            }
            tags = {"task": spec.name, "init": init, "trial": name, "pretrained_source": info["source"],
                    **split_tags(data.split_info)}  # fmt: skip
            provenance = ("model", "model_version", "uri", "sha")
            tags.update({f"pretrained_{k}": str(v) for k, v in info.items() if k in provenance})
            with open_trial(name, trial_params, tags) as recorder:
                outcome, model = run_trial(spec, data, settings, source_dir, init=init, learning_rate=lr,
                                           seed=seed, device=params.device, precision=params.precision,
                                           recorder=recorder)  # fmt: skip
            trials.append(outcome.result)
            main = outcome.result.dev.get(spec.main_metric, math.nan)
            log.info("%s: %s = %.3f", name, spec.main_metric, main)
            current = best.get(init)
            if current is None or _rank(main) > _rank(current.result.dev.get(spec.main_metric)):
                best[init] = outcome
                target = tmp / f"best-{init}"
                if target.exists():
                    shutil.rmtree(target)
                model.save_pretrained(target)
            del model
        trials += run_reference_trials(
            spec, settings, params, info=info, run_trial=run_trial, open_trial=open_trial,
            load_data=lambda tok: load_task_data(spec, settings, tok, data_root=data_root, data_checks=False),
        )  # fmt: skip
        # trivial baselines: fitted on the same (capped) training rows, scored on the same evaluated rows
        baselines = get_kind(spec).baselines(spec, data.dev[spec.main_dev_split].rows, train_rows=data.train.rows)  # fmt: skip
        log.info("%s: trivial baselines %s", spec.name, baselines)
        result = FinetuneResult(spec.name, spec.kind, spec.main_metric, info, trials, data_split=data.split_info,
                                baselines=baselines)  # fmt: skip
        selected_init = result.selected.init
        best_dir = tmp / f"best-{selected_init}"
        with contextlib.ExitStack() as stack:
            if outputs is None:
                outputs = stack.enter_context(atomic_outputs([out_dir, model_out], dirs=[out_dir]))
            _write_outputs(spec, data, settings, params, result, best[selected_init], best_dir, tokenizer,
                           out_dir, model_out, outputs)  # fmt: skip
    return result


def _rank(value: Any) -> float:
    v = float(value) if value is not None else math.nan
    return -math.inf if math.isnan(v) else v


def _write_outputs(
    spec: TaskSpec,
    data: TrialData,
    settings: TaskSettings,
    params: FinetuneParams,
    result: FinetuneResult,
    selected: _TrialOutcome,
    best_dir: Path,
    tokenizer: Any,
    out_dir: Path,
    model_out: Path,
    staged: OutputSet,
) -> None:
    """Predictions of the selected model (dev, other dev splits, test) + summary + model, staged in
    ``staged`` (committed together by its owner)."""
    kind = get_kind(spec)
    model = kind.model_class.from_pretrained(best_dir)
    device = torch.device("cuda" if params.device != "cpu" and torch.cuda.is_available() else "cpu")
    model.to(device)
    threshold = selected.dev_score.extra.get("null_threshold")
    tmp_out = staged[out_dir]
    paths = kind.write_predictions(spec, spec.dev_splits[0], data.dev[spec.dev_splits[0]].rows,
                                   selected.dev_score, tmp_out)  # fmt: skip
    details = {spec.dev_splits[0]: selected.dev_score.details}
    for split in spec.dev_splits[1:]:
        d = data.dev[split]
        outputs = predict(model, d.features, batch_size=settings.eval_batch_size, device=device,
                          precision=params.precision, label=f"{spec.name} {split} predict")  # fmt: skip
        score = kind.score(spec, d.rows, d.features, outputs, settings, null_threshold=threshold)
        result.selected.other_splits[split] = dict(score.metrics)
        details[split] = score.details
        paths.update(kind.write_predictions(spec, split, d.rows, score, tmp_out))
    for split, d in data.test.items():
        outputs = predict(model, d.features, batch_size=settings.eval_batch_size, device=device,
                          precision=params.precision, label=f"{spec.name} {split} predict")  # fmt: skip
        score = kind.score(spec, d.rows, d.features, outputs, settings, null_threshold=threshold)
        paths.update(kind.write_predictions(spec, split, d.rows, score, tmp_out))
    rel = {k: str(Path(out_dir) / Path(v).relative_to(tmp_out)) for k, v in paths.items()}
    result.outputs = {"model": str(model_out), **rel}
    summary = result.to_json()
    summary["details"] = details
    summary["data"] = {
        "train": {"rows": len(data.train.rows), "features": len(data.train.features), "source": data.train.source},
        **{s: {"rows": len(d.rows), "features": len(d.features), "source": d.source} for s, d in data.dev.items()},
        **{s: {"rows": len(d.rows), "source": d.source} for s, d in data.test.items()},
    }  # fmt: skip
    summary["notes"] = data.notes
    write_json_atomic(tmp_out / "summary.json", summary)
    tmp_model = staged[model_out]
    shutil.copytree(best_dir, tmp_model)
    tokenizer.save_pretrained(str(tmp_model))
    # The serving task JSON beside the weights: the directory then serves as its registered version does.
    write_json_atomic(tmp_model / "task.json", serving_task(spec, settings, null_threshold=threshold))
