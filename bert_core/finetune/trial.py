"""One fine-tuning trial: the task's data, the objective, and one run of the shared :class:`Trainer`.

:func:`load_task_data` reads and encodes a task's splits once; :func:`run_trial` fine-tunes one (init,
learning rate, seed) on them with :class:`bert_core.training.Trainer` (AdamW, warmup + linear decay,
clipping) and a thin :class:`FinetuneObjective`, scoring dev after each epoch. Tracking is pluggable
(:class:`TrialTracker`): the flow opens a nested MLflow run per trial; tests pass none.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import shutil
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import torch
from torch import nn

from bert_core.finetune.collate import make_loader, width_multiple
from bert_core.finetune.inference import MODEL_INPUTS, TARGETS, predict
from bert_core.finetune.params import TaskSettings
from bert_core.finetune.results import TrialResult
from bert_core.kinds import SplitScore, get_kind
from bert_core.progress import Progress
from bert_core.tasks import TaskSpec
from bert_core.training import FitResult, Objective, StepOutput, Trainer
from bert_core.training.checkpoint import TrainingCheckpointError
from bert_core.training.distributed import resolve_device
from bert_core.unpad import set_unpad

log = logging.getLogger(__name__)


# ====================================================================== tracking protocol
#: The tag of a trial's tracking run that continued from a checkpoint: the step it continued from.
RESUMED_TAG = "trial_resumed_from_step"


class TrialRecorder(Protocol):
    """Receives one trial's metrics (``dev.*`` and ``train.*`` keys) and tags set once it has trained."""

    def log_metrics(self, metrics: Mapping[str, float], step: int | None = None) -> None: ...

    def set_tags(self, tags: Mapping[str, str]) -> None: ...


class TrialTracker(Protocol):
    """Opens a recorder per trial (the flow: a nested MLflow run)."""

    def trial(
        self, name: str, params: Mapping[str, Any], tags: Mapping[str, str]
    ) -> contextlib.AbstractContextManager[TrialRecorder]: ...


class _NullRecorder:
    def log_metrics(self, metrics: Mapping[str, float], step: int | None = None) -> None:
        pass

    def set_tags(self, tags: Mapping[str, str]) -> None:
        pass


@contextlib.contextmanager
def no_tracking(*_: Any, **__: Any) -> Iterator[TrialRecorder]:
    yield _NullRecorder()


# ====================================================================== the objective
class FinetuneObjective(Objective):
    """The loss of a task head on a batch; drops the bookkeeping keys the collator adds."""

    def step(self, model: nn.Module, batch: dict[str, Any]) -> StepOutput:
        inputs = {k: batch[k] for k in (*MODEL_INPUTS, *TARGETS) if k in batch}
        out = model(**inputs)
        n = batch["input_ids"].shape[0]
        # filled on the loss's device: a host tensor would be copied over, with a wait for the device, each step
        examples = torch.full((), float(n), device=out.loss.device)
        return StepOutput(
            loss=out.loss, stats={"loss_sum": out.loss.detach().float() * n, "examples": examples}
        )

    def summarize(self, sums: dict[str, torch.Tensor]) -> dict[str, float]:
        n = float(sums.get("examples", torch.tensor(0.0)))
        return {"train_loss": float(sums["loss_sum"]) / n} if n else {}

    def count(self, batch: dict[str, Any]) -> tuple[int, int]:
        """(examples, real tokens): padding does not count as throughput."""
        return int(batch["input_ids"].shape[0]), int(batch["attention_mask"].sum())


class EpochLoader:
    """The training batches, epoch after epoch, in an order that depends on the seed and the epoch alone; it
    tells ``progress`` the steps done (one batch per step: when batch k+1 is drawn, k steps are done).

    Its position (``state_dict``) goes into the trial's checkpoints: a resumed trial draws the batches an
    uninterrupted one would have drawn next. Each ``iter()`` continues where the last one stopped.
    """

    def __init__(self, loader: torch.utils.data.DataLoader, progress: Progress | None = None) -> None:
        self.loader, self.progress = loader, progress
        self.epoch = self.in_epoch = 0  # the position: the epoch, and the batches drawn from it
        self.drawn = 0  # batches drawn in all (over resumed processes)
        self.examples = 0  # examples drawn by this process (its throughput)
        self._started = False

    def state_dict(self) -> dict[str, int]:
        return {"epoch": self.epoch, "in_epoch": self.in_epoch, "drawn": self.drawn}

    def load_state_dict(self, state: Mapping[str, int]) -> None:
        self.epoch, self.in_epoch, self.drawn = (
            int(state["epoch"]),
            int(state["in_epoch"]),
            int(state["drawn"]),
        )

    def __iter__(self) -> Iterator[dict[str, Any]]:
        batches = self.loader.batch_sampler
        for sampler in (batches, getattr(batches, "sampler", None)):  # grouped by length, or a plain shuffle
            if hasattr(sampler, "set_epoch"):
                sampler.set_epoch(self.epoch)
        if self.in_epoch >= len(self.loader):  # resumed at the end of an epoch
            loader: Iterator[dict[str, Any]] = iter(())
        elif self.in_epoch:  # resumed inside an epoch, whose loader drew from the RNG before the checkpoint
            with torch.random.fork_rng(devices=[]):
                loader = iter(self.loader)
        else:  # a new epoch: its loader draws a seed from torch's RNG, as in an uninterrupted run
            loader = iter(self.loader)
        for batch in itertools.islice(loader, self.in_epoch, None):
            if self.progress is not None and not self._started:
                self.progress.reset(self.drawn)  # the clock starts with training, not with the model's setup
            elif self.progress is not None:
                self.progress.update(self.drawn, examples=self.examples)
            self._started = True
            self.in_epoch += 1
            self.drawn += 1
            self.examples += int(batch["input_ids"].shape[0])
            yield batch
        self.epoch, self.in_epoch = self.epoch + 1, 0

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

    kind = get_kind(spec)
    source = settings.data_source(spec, data_root)
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
        log.info(
            "%s %s: %d rows -> %d features in %.1fs",
            spec.name,
            split,
            len(rows),
            len(features),
            time.perf_counter() - t0,
        )
        return SplitData(list(rows), features, rows.source)

    data = TrialData(train=SplitData([], []), dev={})
    data.train = load("train", settings.train_limit)
    if not data.train.features:
        raise ValueError(f"{spec.name}: the training split is empty")
    for split in spec.dev_splits:
        data.dev[split] = load(split, settings.eval_limit)
    others = {split: loaded[split] for split in spec.dev_splits[1:]}
    data.split_info = source.describe(loaded["train"], loaded[spec.main_dev_split], others)
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
def trial_params(settings: TaskSettings, init: str, learning_rate: float, seed: int) -> dict[str, Any]:
    """A trial's params as its tracking run records them: the task settings, its learning rate, seed, init."""
    return {**settings.model_dump(mode="json"), "learning_rate": learning_rate, "seed": seed, "init": init}


@dataclass
class TrialOutcome:
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
    checkpoint_dir: Path | None = None,
    checkpoint_every_s: float | None = None,
) -> tuple[TrialOutcome, nn.Module]:
    """Train one model and score it on the main dev split; return the outcome and the trained model.

    With ``checkpoint_dir`` the trial writes a checkpoint every ``checkpoint_every_s`` seconds of training
    and when SIGTERM or SIGINT stops it; run again with the same directory, it continues from the newest
    one, its earlier metrics passed to ``recorder`` again, and ends as an uninterrupted trial would.
    """
    recorder = recorder or _NullRecorder()
    main_split = spec.dev_splits[0]
    dev = data.dev[main_split]
    name = f"{spec.name}-{init}-lr{learning_rate:g}-seed{seed}"  # as finetune_task names the trial
    kind = get_kind(spec)

    def fresh_model() -> nn.Module:
        return set_unpad(kind.build_model(spec, source_dir, init=init, seed=seed), settings.unpad)

    model = fresh_model()
    n_train = len(data.train.features)
    config = settings.train_config(
        n_train,
        learning_rate=learning_rate,
        seed=seed,
        device=device,
        precision=precision,
        checkpoint_every_s=checkpoint_every_s,
    )
    steps_per_epoch, max_steps = settings.steps_per_epoch(n_train), config.max_steps
    assert max_steps is not None  # fine-tuning runs a number of epochs, never a time budget
    log.info(
        "%s: %d steps (%g epoch(s) of %d steps, batch %d), %d train features",
        name,
        max_steps,
        settings.epochs,
        steps_per_epoch,
        settings.batch_size,
        n_train,
    )
    progress = Progress(
        f"{name} train",
        max_steps,
        logger=log,
        detail=lambda step: f"epoch {step / steps_per_epoch:.2f}/{settings.epochs:g}",
    )
    loader = make_loader(
        data.train.features,
        settings.batch_size,
        shuffle=True,
        seed=seed,
        pad_to_multiple_of=width_multiple(resolve_device(device)),
        group_by_length=settings.group_by_length,
    )
    last: dict[str, SplitScore] = {}

    def evaluator(m: nn.Module) -> dict[str, float]:
        if train_data.drawn >= max_steps:  # the final evaluation: training is over
            progress.finish(done=max_steps, examples=train_data.examples)
        outputs = predict(
            m,
            dev.features,
            batch_size=settings.eval_batch_size,
            device=next(m.parameters()).device,
            precision=precision,
            label=f"{name} {main_split} eval",
        )
        result = kind.score(spec, dev.rows, dev.features, outputs, settings)
        last["dev"] = result
        return {
            **{f"dev.{k}": v for k, v in result.metrics.items()},
            **{f"dev.{k}": v for k, v in result.extra.items()},
        }

    def on_metrics(step: int, metrics: dict[str, float]) -> None:
        renamed = {(k if k.startswith("dev.") else f"train.{k}"): float(v) for k, v in metrics.items()}
        recorder.log_metrics(renamed, step=step)

    def fit_trial() -> FitResult:
        return Trainer(
            model,
            FinetuneObjective(),
            train_data,
            config,
            checkpoint_dir=checkpoint_dir,
            evaluator=evaluator,
            on_metrics=on_metrics,
            fingerprint=name,  # the directory is the trial's own; the name guards against a mix-up
            replay_to=on_metrics,  # the recorder is a new tracking run: it gets the whole curve
        ).fit()

    train_data = EpochLoader(loader, progress)
    try:
        fit = fit_trial()
    except TrainingCheckpointError as err:  # damaged, or unreadable: it only saves time, so start over
        if checkpoint_dir is None:
            raise
        log.warning("%s: %s; the trial trains from its start", name, err)
        shutil.rmtree(checkpoint_dir, ignore_errors=True)
        model = fresh_model()
        train_data = EpochLoader(loader, progress)
        fit = fit_trial()
    if "dev" not in last:  # resumed from a complete checkpoint: the stopped process ran the final evaluation
        evaluator(model)
    if fit.resumed_from_step is not None:  # the run shows that part of its curve is an earlier process's
        recorder.set_tags({RESUMED_TAG: str(fit.resumed_from_step)})
    progress.finish(done=fit.step, examples=train_data.examples)
    history, evals = [], []
    for rec in fit.history:
        epoch = rec["step"] / steps_per_epoch
        if rec["kind"] == "train":
            history.append(
                {"step": rec["step"], "epoch": epoch, "loss": rec["loss"], "learning_rate": rec["lr"]}
            )
        else:
            evals.append(
                {
                    "step": rec["step"],
                    "epoch": epoch,
                    **{k.removeprefix("dev."): v for k, v in rec.items() if k.startswith("dev.")},
                }
            )
    score = last["dev"]
    train_seconds = max(fit.elapsed_s - fit.paused_s, 1e-9)  # without the evaluations between steps
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
    recorder.log_metrics(
        {"train.examples_per_second": result.examples_per_second, "train.seconds": train_seconds}
    )
    return TrialOutcome(result, score), model


# ====================================================================== the stage function
