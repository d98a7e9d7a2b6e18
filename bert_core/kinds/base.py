"""What every task kind provides (:class:`TaskKind`), and the small pieces the kinds share.

A task kind is how the model reads and answers a task: its head (a class of :mod:`bert_core.model`), how
canonical rows (:mod:`bert_core.tasks`) become features, how outputs become predictions and scores
(:mod:`bert_core.metrics`), which files the predictions are written to, and which data checks the rows
must pass. One module per kind implements it; :data:`bert_core.kinds.KINDS` maps ``TaskSpec.kind`` to it.

Features are dicts of *unpadded* Python lists (:mod:`bert_core.finetune.collate` pads each batch to its
own longest sequence); ``L`` below is a feature's own length <= ``max_seq_length``.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from bert_core.checks import Check
from bert_core.tasks.registry import TaskSpec

if TYPE_CHECKING:
    import numpy as np
    from torch import nn

    from bert_core.config import BertConfig

Feature = dict[str, Any]
Row = dict[str, Any]

#: Counts and id lists in the metric dicts are not metrics to log or compare.
NOT_METRICS = frozenset(
    {"total", "missing", "n_gold", "n_pred", "n_correct", "n_tokens", "HasAns_total", "NoAns_total"}
)
#: ``mostly`` for the non-empty-text expectations: real training sets carry the odd empty text.
EMPTY_TEXT_TOLERANCE = 0.999


class FeatureError(ValueError):
    """An example cannot be turned into features; the message names the example and what is wrong."""


class ServingInputError(ValueError):
    """A prediction request's record cannot be answered; the message names the record and the field.

    :mod:`bert_core.serving` turns it into a 400 answer of the served model (never a server error).
    """


#: A column of a served model's input or output: ``(name, type, required)``. Types: ``string``, ``long``,
#: ``double``, ``string[]``, ``double[]``, ``string[][]``, ``double[][]`` (lists; MLflow ``Array`` types).
ServingColumn = tuple[str, str, bool]
#: Runs the model over features and returns one output per feature (:func:`bert_core.finetune.inference.predict`).
Runner = Any


class KindSettings(Protocol):
    """The fine-tuning settings a kind reads (:class:`bert_core.finetune.TaskSettings` has them)."""

    max_seq_length: int | None
    doc_stride: int
    max_query_length: int
    n_best_size: int
    max_answer_length: int


def max_seq_length(spec: TaskSpec, settings: KindSettings) -> int:
    """The task's input length in WordPiece tokens: the params' ``max_seq_length`` or the task's default."""
    return settings.max_seq_length or spec.max_seq_length


@dataclass
class SplitScore:
    """Metrics and predictions of one split.

    Attributes:
        metrics: Numeric metrics (0-100), flat.
        details: Non-scalar results worth keeping (NER per-type scores).
        predictions: What :meth:`TaskKind.write_predictions` writes (kind specific).
        extra: Recorded settings, e.g. the tuned ``null_threshold`` (SQuAD v2.0).
    """

    metrics: dict[str, float]
    details: dict[str, Any] = field(default_factory=dict)
    predictions: Any = None
    extra: dict[str, float] = field(default_factory=dict)


def softmax(logits: Any, axis: int = -1) -> np.ndarray:
    """Numerically stable softmax (float64)."""
    import numpy as np

    z = np.asarray(logits, dtype=np.float64)
    z = np.exp(z - z.max(axis=axis, keepdims=True))
    return z / z.sum(axis=axis, keepdims=True)


def numeric_metrics(metrics: dict[str, Any]) -> dict[str, float]:
    """The metrics worth logging: numbers, without counts (:data:`NOT_METRICS`)."""
    return {
        k: float(v)
        for k, v in metrics.items()
        if k not in NOT_METRICS and isinstance(v, int | float) and not isinstance(v, bool)
    }


def score_per_row(
    kind: TaskKind, spec: TaskSpec, rows: Sequence[Row], outputs: Sequence[np.ndarray], predict: Any
) -> SplitScore:
    """One prediction per row, scored with the task's GLUE-style metric (classification, regression, SWAG).

    ``predict`` maps the stacked ``(N, num_labels)`` outputs to ``(predictions, probabilities or None)``.
    """
    import numpy as np

    from bert_core.metrics import spec_metrics

    stacked = np.stack(outputs) if outputs else np.zeros((0, max(kind.num_labels(spec), 1)))
    preds, probs = predict(stacked)
    metrics = {}
    if kind.labelled(rows):
        metrics = spec_metrics(spec, preds.tolist(), [r["label"] for r in rows])
    return SplitScore(numeric_metrics(metrics), predictions={"preds": preds, "probs": probs})


# ---------------------------------------------------------------------- data-check helpers
def expectations() -> Any:
    """``great_expectations.expectations`` (imported on first use: GE is slow to import)."""
    import great_expectations as gx

    return gx.expectations


def strip_len(value: Any) -> int:
    """Length of a text without surrounding whitespace (0 for a non-string)."""
    return len(value.strip()) if isinstance(value, str) else 0


def nonempty(column: str) -> Check:
    """Almost every value of a ``*_len`` column is >= 1 (:data:`EMPTY_TEXT_TOLERANCE`)."""
    E = expectations()
    return Check(E.ExpectColumnValuesToBeBetween(column=column, min_value=1, mostly=EMPTY_TEXT_TOLERANCE))


def all_true(column: str) -> Check:
    """Every value of a derived boolean column is true."""
    return Check(expectations().ExpectColumnValuesToBeInSet(column=column, value_set=[True]))


def label_checks(labelled: bool, value_set: Sequence[Any]) -> list[Check]:
    """``label`` is null on unlabelled splits, else present and one of ``value_set``."""
    E = expectations()
    if not labelled:
        return [Check(E.ExpectColumnValuesToBeNull(column="label"))]
    return [
        Check(E.ExpectColumnValuesToNotBeNull(column="label")),
        Check(E.ExpectColumnValuesToBeInSet(column="label", value_set=list(value_set))),
    ]


# ---------------------------------------------------------------------- the interface
class TaskKind(ABC):
    """One kind of downstream task: head, encoding, post-processing, scoring, prediction files, checks.

    Attributes:
        name: The ``TaskSpec.kind`` it serves (its key in :data:`bert_core.kinds.KINDS`).
    """

    name: str

    # -- the model
    @property
    @abstractmethod
    def model_class(self) -> type[nn.Module]:
        """The :mod:`bert_core.model` head class (a mirror of the transformers class of the same name)."""

    def num_labels(self, spec: TaskSpec) -> int:
        """Output size of the task head per input (default: one per label)."""
        return len(spec.labels)

    def id2label(self, spec: TaskSpec) -> dict[int, str] | None:
        """The label names the saved model config carries (none by default)."""
        return None

    def head_config(self, spec: TaskSpec, config: BertConfig) -> BertConfig:
        """``config`` with this kind's head size and label names."""
        return config.replace(
            num_labels=self.num_labels(spec), id2label=self.id2label(spec), problem_type=None
        )

    def build_model(self, spec: TaskSpec, source_dir: str | Path, *, init: str, seed: int) -> nn.Module:
        """The task's head on the encoder in ``source_dir`` (HF format), or on a random encoder of its shape.

        Args:
            spec: The task.
            source_dir: Hugging Face BERT directory (a pretraining or any BERT checkpoint).
            init: ``"pretrained"`` (load the encoder weights; the head is new) or ``"random"``.
            seed: Seeds the head (and, for ``random``, the encoder) initialisation.
        """
        import torch

        from bert_core.hf import read_config

        config = self.head_config(spec, read_config(source_dir))
        cls = self.model_class
        torch.manual_seed(seed)
        if init == "random":
            return cls(config)
        model = cls.from_pretrained(source_dir, config=config, ignore_mismatched_sizes=True, new_head=True)
        model.train()
        return model

    # -- data in
    @abstractmethod
    def encode(
        self,
        spec: TaskSpec,
        rows: Sequence[Row],
        tokenizer: Any,
        settings: KindSettings,
        *,
        training: bool = False,
    ) -> list[Feature]:
        """Features for canonical rows (``training=True`` leaves out what only post-processing needs)."""

    def labelled(self, rows: Sequence[Row]) -> bool:
        """Whether rows carry gold labels (test splits do not)."""
        return bool(rows) and rows[0].get("label") is not None

    # -- results out
    @abstractmethod
    def score(
        self,
        spec: TaskSpec,
        rows: Sequence[Row],
        features: Sequence[Feature],
        outputs: Sequence[np.ndarray],
        settings: KindSettings,
        *,
        null_threshold: float | None = None,
    ) -> SplitScore:
        """Post-process model outputs into predictions and score them (no metrics for unlabelled rows).

        ``outputs`` holds one array per feature, padding cut off (:func:`bert_core.finetune.inference.predict`).
        ``null_threshold`` is SQuAD v2.0's (``None``: tune it on these rows); other kinds ignore it.
        """

    @abstractmethod
    def write_predictions(
        self, spec: TaskSpec, split: str, rows: Sequence[Row], result: SplitScore, out_dir: str | Path
    ) -> dict[str, str]:
        """Write one split's predictions in the task's official format under ``out_dir``; return the paths."""

    def baselines(
        self, spec: TaskSpec, rows: Sequence[Row], *, train_rows: Sequence[Row]
    ) -> dict[str, dict[str, float]]:
        """Trivial baselines scored on the evaluated ``rows`` like the model (name -> metrics, 0-100).

        Those that learn (a majority label, a bag-of-words model) learn from ``train_rows``, the very rows
        the fine-tuning trained on, so the report compares like with like (:mod:`bert_core.kinds.baselines`).
        None by default.
        """
        return {}

    # -- serving (bert_core.serving: the registered MLflow Model's predict)
    def serving_inputs(self, spec: TaskSpec) -> list[ServingColumn]:
        """The input columns of the served model (its MLflow signature's inputs)."""
        raise NotImplementedError(f"task kind {self.name!r} cannot be served")

    def serving_outputs(self, spec: TaskSpec) -> list[ServingColumn]:
        """The output columns of the served model, one row per input record."""
        raise NotImplementedError(f"task kind {self.name!r} cannot be served")

    def serving_example(self, spec: TaskSpec) -> list[dict[str, Any]]:
        """A small input example (records), logged with the model."""
        raise NotImplementedError(f"task kind {self.name!r} cannot be served")

    def serve(
        self,
        spec: TaskSpec,
        records: Sequence[dict[str, Any]],
        tokenizer: Any,
        run: Runner,
        settings: KindSettings,
        options: dict[str, Any],
    ) -> list[dict[str, Any]]:
        """Answer validated input records (one output dict per record, in order) with this kind's encoding
        and post-processing; ``run(features)`` runs the model; ``options`` holds the served model's task
        settings (e.g. ``null_threshold``) and the request's params. Every record is checked before the
        first call of ``run``: :meth:`bert_core.serving.predictor.Predictor.check_record` relies on it to
        check the rows of a batch prediction without running the model.

        Raises:
            ServingInputError: a record this kind cannot answer (naming the record and the field).
        """
        raise NotImplementedError(f"task kind {self.name!r} cannot be served")

    # -- data checks (bert_core.kinds.checks)
    @abstractmethod
    def frame_columns(self, spec: TaskSpec, row: Row) -> dict[str, Any]:
        """Scalar columns derived from one canonical row, for the expectations of :meth:`checks`."""

    @abstractmethod
    def checks(self, spec: TaskSpec, labelled: bool) -> list[Check]:
        """The expectations on the :meth:`frame_columns` of one split (``labelled``: not a test split)."""
