"""Typed params of the ``finetune`` stage (``params/finetune.yaml``, section ``finetune``).

The paper's protocol is the default (BERT §4, Appendix A.3): batch 32, 3 epochs, the best learning rate of
{5e-5, 4e-5, 3e-5, 2e-5} on dev, warmup over 10% of the steps then linear decay, weight decay 0.01, and
several restarts (seeds) for the small tasks (RTE, MRPC, STS-B, CoLA, WNLI), whose dev scores are noisy.

``tasks`` maps each task to run to its overrides of ``defaults`` (any :class:`TaskSettings` field), so
DVC's ``foreach`` makes one stage per task whose params are ``finetune.tasks.<task>`` plus the shared
sections: changing one task's settings re-runs only that task.
"""

from __future__ import annotations

import dataclasses
import math
import os
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal

from pydantic import ConfigDict, Field, create_model, field_validator, model_validator

from bert_core.finetune.own_task import OwnTask, own_task_keys
from bert_core.inputs import Reads, checkpoint
from bert_core.params import StrictModel, mlflow_alias, mlflow_model_name

if TYPE_CHECKING:
    from bert_core.tasks import TaskSpec
    from bert_core.tasks.datasource import TaskSource
    from bert_core.training.config import TrainConfig

PAPER_LEARNING_RATES = (5e-5, 4e-5, 3e-5, 2e-5)
SMALL_TASKS = ("rte", "mrpc", "stsb", "cola", "wnli")
#: Settings that name one task's data (:mod:`bert_core.tasks.datasource`): allowed under ``tasks.<task>`` only.
PER_TASK_DATA_KEYS = ("dev_split", "train_file", "dev_file", "test_file", "hub_revision", "define")
#: The pretrain stage's output, the default starting checkpoint (its lineage is the upstream stages').
PRETRAINED_DIR = "models/pretrained"


class TaskSettings(StrictModel):
    """How one task is fine-tuned (every field can be overridden per task).

    Attributes:
        batch_size: Training batch size (examples; SWAG examples hold 4 sequences).
        epochs: Training epochs (may be fractional).
        learning_rates: The grid; the best on the dev main metric is selected.
        seeds: Restarts per learning rate (head init, dropout, data order).
        warmup_ratio: Linear warmup share of the steps, then linear decay to 0.
        weight_decay: AdamW decay (not on biases and LayerNorm).
        max_grad_norm: Gradient clipping.
        max_seq_length: Longest input in WordPiece tokens; ``None`` = the task's default (128; 384 SQuAD).
        train_limit: Use only the first N training rows (small CPU profiles, tests).
        eval_limit: Use only the first N rows of each dev split.
        test_limit: Use only the first N rows of each test split.
        eval_batch_size: Batch size for dev/test prediction.
        evals_per_epoch: Dev evaluations per epoch (the learning curves); the last one is at the end.
        group_by_length: Length-grouped batches (dynamic padding is always on).
        doc_stride, max_query_length, n_best_size, max_answer_length: SQuAD windows and answer search.
        random_init_baseline: Also train the same architecture from random initialisation (same grid).
        reference_baseline: Also fine-tune ``finetune.reference.source`` (same grid and seeds), when that
            checkpoint is on local disk (:mod:`bert_core.finetune.reference`).
        predict_test: Write leaderboard predictions for the task's test splits (GLUE).
        dev_split: Data-limited runs of SQuAD without its train file: train on the first articles of the
            official dev file, evaluate on the last ones (:mod:`bert_core.tasks.datasource`); labelled, never
            official dev scores; an error when the official train data is present. Per task only.
        train_file, dev_file, test_file: Own files in the task's official format instead of the official
            train / main dev / test split (absolute, or relative to the repository root). Per task only. An
            own task's ``test_file`` is labelled, and scored once with the model its dev set selected.
        hub_revision: The commit (or tag, branch) of the task's Hugging Face Hub dataset to read, when its
            rows come from the Hub (no ``BERT_DATA_ROOT``, or an own task's ``define.hub``); ``None``: the
            newest, whose commit the ``inputs`` stage records. Per task only.
        define: An own task's definition (:class:`OwnTask`); its rows are ``train_file``, ``dev_file`` and
            ``test_file``, or its Hub dataset. Per task only.
        unpad: Encode the real tokens only (``bert_core.unpad``; same results, no compute on padding).
            Off by default: length-grouped dynamic padding leaves little padding in fine-tuning batches.
    """

    batch_size: int = Field(32, ge=1)
    epochs: float = Field(3.0, gt=0)
    learning_rates: list[float] = Field(default_factory=lambda: list(PAPER_LEARNING_RATES), min_length=1)
    seeds: list[int] = Field(default_factory=lambda: [1], min_length=1)
    warmup_ratio: float = Field(0.1, ge=0, lt=1)
    weight_decay: float = Field(0.01, ge=0)
    max_grad_norm: float | None = Field(1.0, gt=0)
    max_seq_length: int | None = Field(None, ge=8, le=512)
    train_limit: int | None = Field(None, ge=1)
    eval_limit: int | None = Field(None, ge=1)
    test_limit: int | None = Field(None, ge=1)
    eval_batch_size: int = Field(128, ge=1)
    evals_per_epoch: int = Field(1, ge=1)
    group_by_length: bool = True
    doc_stride: int = Field(128, ge=1)
    max_query_length: int = Field(64, ge=1)
    n_best_size: int = Field(20, ge=1)
    max_answer_length: int = Field(30, ge=1)
    random_init_baseline: bool = False
    reference_baseline: bool = False
    predict_test: bool = True
    dev_split: bool = False
    train_file: str | None = Field(None, min_length=1)
    dev_file: str | None = Field(None, min_length=1)
    test_file: str | None = Field(None, min_length=1, exclude_if=lambda v: v is None)
    hub_revision: str | None = Field(None, min_length=1, exclude_if=lambda v: v is None)
    # Left out of a paper's task's dumps (trial fingerprints, MLflow params), which stay as they were.
    define: OwnTask | None = Field(None, exclude_if=lambda v: v is None)
    unpad: bool = False

    @field_validator("learning_rates")
    @classmethod
    def _positive_lrs(cls, v: list[float]) -> list[float]:
        bad = [x for x in v if not x > 0]
        if bad:
            raise ValueError(f"learning rates must be > 0, got {bad}")
        return v

    @field_validator("seeds")
    @classmethod
    def _distinct_seeds(cls, v: list[int]) -> list[int]:
        if len(set(v)) != len(v):
            raise ValueError(f"seeds must be distinct, got {v}")
        return v

    def data_source(self, spec: TaskSpec, data_root: str | os.PathLike[str] | None = None) -> TaskSource:
        """Where ``spec``'s rows come from, as ``dev_split`` / ``train_file`` / ``dev_file`` / ``test_file``
        say (refused early, naming the key, when that is wrong)."""
        from bert_core.tasks.datasource import resolve_task_source

        return resolve_task_source(
            spec,
            dev_split=self.dev_split,
            train_file=self.train_file,
            dev_file=self.dev_file,
            test_file=self.test_file,
            data_root=data_root,
        )

    def steps_per_epoch(self, n_train: int) -> int:
        """Optimizer steps per epoch over ``n_train`` training features."""
        return math.ceil(n_train / self.batch_size)

    def train_config(
        self,
        n_train: int,
        *,
        learning_rate: float,
        seed: int,
        device: str,
        precision: str,
        checkpoint_every_s: float | None = None,
    ) -> TrainConfig:
        """The :class:`TrainConfig` of one trial over ``n_train`` training features.

        The optimizer settings come from these settings by name (one definition each, bounds checked at
        parse time); the step counts follow from ``epochs``, ``batch_size`` and ``evals_per_epoch``;
        ``checkpoint_every_s``: seconds of training between the trial's checkpoints (None: only when a signal
        stops it, with a checkpoint directory).
        """
        from bert_core.training.config import TrainConfig  # the training package imports torch

        steps_per_epoch = self.steps_per_epoch(n_train)
        max_steps = max(1, math.ceil(self.epochs * steps_per_epoch))
        eval_every = max(1, math.ceil(steps_per_epoch / self.evals_per_epoch))
        return TrainConfig(
            **self.model_dump(include=_TRAIN_CONFIG_FIELDS),
            max_steps=max_steps,
            lr=learning_rate,
            eval_every=eval_every if eval_every < max_steps else 0,
            log_every=max(1, min(50, steps_per_epoch // 4 or 1)),
            seed=seed,
            device=device,
            precision=precision,
            # a trial's checkpoints serve a resume only: the finished trial is kept by the stage
            checkpoint_every_s=checkpoint_every_s,
            final_checkpoint=False,
            keep_last=1,
        )


#: The :class:`TaskSettings` fields that :class:`TrainConfig` takes under the same name.
_TRAIN_CONFIG_FIELDS = {"warmup_ratio", "weight_decay", "max_grad_norm"}


class _PartialSettings(StrictModel):
    """Base of an overrides model: a field left out stays ``None`` and is not validated."""

    model_config = ConfigDict(validate_default=False)


def _overrides_model(settings: type[StrictModel]) -> type[StrictModel]:
    """The per-task overrides of ``settings``: every field optional, with the same type, bounds and
    field validators, so a new :class:`TaskSettings` field can be overridden per task with no second
    declaration.

    A field left out is ``None`` and not validated; :meth:`FinetuneParams.for_task` merges only the keys a
    task sets. A key that is given is validated exactly as under ``defaults`` (same messages, named
    ``finetune.tasks.<task>.<key>``), so an explicit ``null`` is accepted only where the setting itself
    allows it (e.g. ``max_grad_norm``).
    """
    fields: dict[str, Any] = {}
    for name, info in settings.model_fields.items():
        annotation = Annotated[info.annotation, *info.metadata] if info.metadata else info.annotation
        fields[name] = (annotation, Field(None, description=info.description))
    validators = {
        name: field_validator(*dec.info.fields, mode=dec.info.mode)(dec.func.__func__)
        for name, dec in settings.__pydantic_decorators__.field_validators.items()
    }
    return create_model(
        "TaskOverrides",
        __base__=_PartialSettings,
        __module__=__name__,
        __doc__=f"Per-task overrides: any field of :class:`{settings.__name__}`, all optional.",
        __validators__=validators,
        **fields,
    )


TaskOverrides = _overrides_model(TaskSettings)


class ModelSource(StrictModel):
    """Where the pretrained encoder comes from.

    Attributes:
        source: A local Hugging Face BERT directory (default: the ``pretrain`` stage's output), or an
            MLflow registry URI ``models:/<name>@<alias>`` / ``models:/<name>/<version>``.
        init: ``pretrained`` loads the weights; ``random`` trains the same architecture from scratch.
    """

    source: str = PRETRAINED_DIR
    init: Literal["pretrained", "random"] = "pretrained"


class ReferenceSource(StrictModel):
    """A released checkpoint fine-tuned beside ours, for the tasks with ``reference_baseline: true``.

    Attributes:
        source: A local Hugging Face BERT directory, or ``None`` for no reference column. A directory that
            does not exist is reported (not an error), so the default run works offline.
        label: How the report names the column (e.g. ``MiniLM before continued pretraining``);
            ``None``: the directory's name.
    """

    source: str | None = None
    label: str | None = Field(None, min_length=1, max_length=80)


class RegistryParams(StrictModel):
    """MLflow model registry: one registered model per task, an alias on the best version.

    Attributes:
        enabled: Register the selected model of each task.
        name_prefix: Registered model name = prefix + task (``bert-sst2``).
        alias: Alias that moves to a new version only when it beats the current one on the dev metric.
    """

    enabled: bool = True
    name_prefix: str = Field("bert-", min_length=1)
    alias: str = Field("champion", pattern=r"^[A-Za-z][A-Za-z0-9_-]*$")

    @field_validator("name_prefix")
    @classmethod
    def _mlflow_name(cls, v: str) -> str:
        mlflow_model_name(v + "task")  # the names are prefix + task; MLflow's rules, checked before training
        return v

    @field_validator("alias")
    @classmethod
    def _mlflow_alias(cls, v: str) -> str:
        return mlflow_alias(v)


class FinetuneParams(StrictModel):
    """The ``finetune`` section.

    Attributes:
        model: The pretrained encoder to start from.
        reference: A released checkpoint to fine-tune beside it (the report's reference column).
        defaults: Settings of every task.
        small_tasks: Tasks that get ``small_task_seeds`` unless they set ``seeds`` themselves.
        small_task_seeds: Restarts for the small tasks (the paper reports the best of several).
        tasks: Task name -> overrides; the keys are the tasks the pipeline fine-tunes.
        registry: Model registration.
        device: ``auto`` (CUDA when present), ``cpu`` or ``cuda``.
        precision: ``auto`` (bf16 on a GPU that has it, else fp32), ``fp32``, ``bf16``.
        checkpoint_minutes: Minutes of training between a trial's checkpoints, from which a rerun continues
            the trial after a crash (0: only when Ctrl-C or SIGTERM stops it). Not a DVC param: the results
            do not depend on it.
        data_checks: Run the Great Expectations checks on the train and dev rows first.
    """

    model: ModelSource = Field(default_factory=ModelSource)
    reference: ReferenceSource = Field(default_factory=ReferenceSource)
    defaults: TaskSettings = Field(default_factory=TaskSettings)
    small_tasks: list[str] = Field(default_factory=lambda: list(SMALL_TASKS))
    small_task_seeds: list[int] = Field(default_factory=lambda: [1, 2, 3], min_length=1)
    tasks: dict[str, TaskOverrides] = Field(default_factory=dict)
    registry: RegistryParams = Field(default_factory=RegistryParams)
    device: Literal["auto", "cpu", "cuda"] = "auto"
    precision: Literal["auto", "fp32", "bf16"] = "auto"
    checkpoint_minutes: float = Field(10.0, ge=0)
    data_checks: bool = True

    @property
    def checkpoint_every_s(self) -> float | None:
        return self.checkpoint_minutes * 60 if self.checkpoint_minutes else None

    @field_validator("small_task_seeds")
    @classmethod
    def _distinct_small_task_seeds(cls, v: list[int]) -> list[int]:
        return TaskSettings._distinct_seeds(v)

    @model_validator(mode="after")
    def _known_tasks(self) -> FinetuneParams:
        from bert_core.tasks import TASKS

        own = [t for t, o in self.tasks.items() if o.define is not None]
        unknown = [t for t in (*self.tasks, *self.small_tasks) if t not in TASKS and t not in own]
        if unknown:
            raise ValueError(
                f"unknown task(s) {unknown}; valid tasks: {', '.join(TASKS)}, or an own task declared with "
                "tasks.<name>.define"
            )
        return self

    @model_validator(mode="after")
    def _data_keys_per_task(self) -> FinetuneParams:
        """``dev_split`` / ``train_file`` / ``dev_file`` name one task's data: per task, and consistent."""
        from bert_core.tasks import TASKS

        for name in PER_TASK_DATA_KEYS:
            if getattr(self.defaults, name) not in (None, False):
                raise ValueError(f"defaults.{name}: set it per task, under tasks.<task>.{name}")
        for task, overrides in self.tasks.items():
            if overrides.define is not None:
                own_task_keys(task, overrides)
                continue
            if overrides.dev_split and TASKS[task].dev_split is None:
                with_split = [t for t, spec in TASKS.items() if spec.dev_split is not None]
                raise ValueError(
                    f"tasks.{task}.dev_split: {task} has no dev split (tasks with one: {', '.join(with_split)}); "
                    "remove the key"
                )
            if overrides.dev_split and (overrides.train_file or overrides.dev_file or overrides.test_file):
                raise ValueError(
                    f"tasks.{task}: dev_split and train_file/dev_file/test_file exclude each other; keep one"
                )
            if overrides.test_file and "test" not in TASKS[task].splits:
                raise ValueError(
                    f"tasks.{task}.test_file: {task} has no single test split (its splits: "
                    f"{', '.join(TASKS[task].splits)}); remove the key"
                )
        return self

    def task(self, name: str) -> TaskSpec:
        """The :class:`TaskSpec` of task ``name``: its definition under ``tasks.<name>.define``, else the
        paper's task of that name (:func:`bert_core.tasks.get_task`).

        Raises:
            KeyError: an unknown task.
            TaskDataError: an own task whose labels are read from a train file that is not there or holds a
                row without one.
        """
        from bert_core.tasks import get_task

        overrides = self.tasks.get(name)
        if overrides is None or overrides.define is None:
            spec = get_task(name)
            revision = overrides.hub_revision if overrides is not None else None
            return dataclasses.replace(spec, hub_revision=revision) if revision else spec
        from bert_core.constants import REPO_ROOT
        from bert_core.tasks.datasource import own_file

        own, key = overrides.define, f"finetune.tasks.{name}.train_file"
        train = (
            own_file(overrides.train_file, REPO_ROOT, key)
            if own.labels_from_data and overrides.train_file
            else None
        )
        return own.spec(
            name, train, test=overrides.test_file is not None, hub_revision=overrides.hub_revision
        )

    def own_tasks(self) -> dict[str, OwnTask]:
        """The own tasks' definitions, by name."""
        return {name: o.define for name, o in self.tasks.items() if o.define is not None}

    def for_task(self, task: str) -> TaskSettings:
        """The resolved settings of ``task``: defaults, small-task seeds, then the task's overrides."""
        merged = self.defaults.model_dump()
        if task in self.small_tasks:
            merged["seeds"] = list(self.small_task_seeds)
        overrides = self.tasks.get(task)
        if overrides is not None:
            merged.update(overrides.model_dump(exclude_unset=True))
        return TaskSettings(**merged)

    def run_params(self, task: str) -> dict[str, Any]:
        """What the task's MLflow run records as params: the task, its resolved settings, the model, device
        and precision."""
        return {
            "task": task,
            **self.model_dump(mode="json", include={"model", "device", "precision"}),
            "settings": self.for_task(task).model_dump(mode="json"),
        }


def task_reads(params: FinetuneParams, data_root: Path | None, key: str | None = None) -> Reads:
    """What the fine-tuning stage of task ``key`` reads from outside the repository (the ``inputs`` DVC stage
    records it): the file of each split (:meth:`~bert_core.tasks.datasource.TaskSource.files`), and the
    reference checkpoint (``finetune.reference.source``: a directory, or a Hub model by its commit).
    ``finetune.model.source`` is a DVC dep of its own."""
    from bert_core.tasks.base import TaskDataError

    assert key is not None
    reads: Reads = {}
    try:
        source = params.for_task(key).data_source(params.task(key), data_root)
        reads.update(source.files())
    except (KeyError, ValueError, TaskDataError) as err:  # the stage refuses it, by its own message
        reads["task"] = f"missing: {err}"
    if (reference := checkpoint(params.reference.source)) is not None:
        reads["reference"] = reference
    return reads
