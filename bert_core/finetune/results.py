"""What one task's fine-tuning produced: its trials, the selected model and a flat metrics view.

:class:`FinetuneResult` is written as ``summary.json`` next to the task's predictions (the ``evaluate``
stage reads it) and flattened by :meth:`FinetuneResult.metrics` into the stage's details file
``metrics/finetune/details/<task>.json`` and MLflow (the DVC metrics file ``metrics/finetune/<task>.json``
holds a headline of them under task-independent names, ``flows/stages/__init__.py``). The flat keys are
stable so that runs compare key by key:

- ``dev.<metric>``: the selected model on the main dev split (best trial on the main metric);
  ``<split>.<metric>`` for further dev splits (``dev_mismatched.accuracy`` for MNLI);
- ``dev.<main>_mean`` / ``dev.<main>_std`` / ``seeds``: spread over the seeds of the selected learning rate;
- ``selected.learning_rate`` / ``selected.seed``;
- ``random_init.dev.<metric>`` and ``gap.dev.<main>`` (pretrained - random) when the baseline ran;
- ``train.examples_per_second`` / ``train.seconds`` / ``train.examples``;
- ``dev.null_threshold`` (SQuAD v2.0: the tuned null-answer threshold);
- ``baseline.<name>.<metric>``: trivial baselines, fitted on the same training rows, scored on the same
  evaluated rows (:meth:`bert_core.kinds.base.TaskKind.baselines`); ``<split>.baseline.<name>.<metric>``
  on a further dev split (``test.baseline.lexicon.f1`` for CoNLL-2003);
- ``dev_split`` = 1 where the task trained and was scored on halves of the official dev file (a data-limited
  run, ``finetune.tasks.<task>.dev_split``): its ``dev.*`` scores are not official dev scores.
"""

from __future__ import annotations

import json
import math
import statistics
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any


@dataclass
class TrialResult:
    """One (init, learning rate, seed) trial.

    Attributes:
        init: ``"pretrained"``, ``"random"`` or ``"reference"`` (a released checkpoint, never selected).
        learning_rate: Peak learning rate.
        seed: Seed of the head init, dropout and data order.
        dev: Metrics of the main dev split (numbers only, 0-100).
        other_splits: Further dev splits -> metrics.
        history: Training log rows (``step``, ``epoch``, ``loss``, ``learning_rate``).
        evals: Dev evaluations during training (``step``, ``epoch`` and the metrics).
        train_examples: Training features seen per epoch.
        train_seconds: Wall time of the training loop (evaluation excluded).
        steps: Optimizer steps.
        epochs: Epochs trained.
        extra: Task specifics (e.g. ``null_threshold`` for SQuAD v2.0).
    """

    init: str
    learning_rate: float
    seed: int
    dev: dict[str, float]
    other_splits: dict[str, dict[str, float]] = field(default_factory=dict)
    history: list[dict[str, float]] = field(default_factory=list)
    evals: list[dict[str, float]] = field(default_factory=list)
    train_examples: int = 0
    train_seconds: float = 0.0
    steps: int = 0
    epochs: float = 0.0
    extra: dict[str, float] = field(default_factory=dict)

    @property
    def name(self) -> str:
        return f"{self.init}-lr{self.learning_rate:g}-seed{self.seed}"

    @property
    def examples_per_second(self) -> float:
        """Training throughput (features per second of the training loop)."""
        return self.train_examples * self.epochs / self.train_seconds if self.train_seconds > 0 else 0.0


def _score(value: Any) -> float:
    """A metric for ranking: NaN (an undefined correlation) ranks below everything."""
    v = float(value) if value is not None else math.nan
    return -math.inf if math.isnan(v) else v


def best_of_baselines(baselines: Mapping[str, Mapping[str, Any]], metric: str) -> tuple[str, float] | None:
    """``(name, score)`` of the highest trivial baseline on ``metric`` (of equal scores, the first);
    ``None`` if none scored it."""
    scored = [
        (name, float(scores[metric]))
        for name, scores in baselines.items()
        if metric in scores and math.isfinite(float(scores[metric]))
    ]
    return max(scored, key=lambda s: s[1]) if scored else None  # max keeps the first of equal scores


@dataclass
class FinetuneResult:
    """All trials of one task and the selected model.

    Attributes:
        task: Task name (``"sst2"``).
        kind: Task kind (see :mod:`bert_core.tasks.registry`).
        main_metric: Selection metric key.
        model: Where the pretrained weights came from and their shape (``source``, ``resolved``,
            ``version``, ``num_hidden_layers``, ``hidden_size``, ``preset``).
        trials: Every trial, pretrained and random-init.
        outputs: Output kind -> path (model dir, predictions, submission files).
        data_split: Where the train and evaluated rows came from (:meth:`bert_core.tasks.datasource.
            TaskSource.describe`): ``origin`` (``official``, ``dev_split``, ``own_files``), ``label``
            (what the report shows beside the task when not the official splits), the sources.
        baselines: Trivial baselines fitted on the same training rows and scored on the same evaluated rows
            (name -> metrics), from :meth:`bert_core.kinds.base.TaskKind.baselines`
            (:mod:`bert_core.kinds.baselines`; SQuAD: :mod:`bert_core.kinds.squad_baselines`).
        split_baselines: The same baselines on each further dev split (split -> name -> metrics).
    """

    task: str
    kind: str
    main_metric: str
    model: dict[str, Any]
    trials: list[TrialResult]
    outputs: dict[str, str] = field(default_factory=dict)
    data_split: dict[str, Any] = field(default_factory=dict)
    baselines: dict[str, dict[str, float]] = field(default_factory=dict)
    split_baselines: dict[str, dict[str, dict[str, float]]] = field(default_factory=dict)

    def _best(self, init: str) -> TrialResult | None:
        pool = [t for t in self.trials if t.init == init]
        return max(pool, key=lambda t: _score(t.dev.get(self.main_metric))) if pool else None

    @property
    def selected(self) -> TrialResult:
        """The best pretrained trial on the main dev metric (the paper: best learning rate and restart)."""
        best = self._best("pretrained") or self._best("random")
        assert best is not None, "a FinetuneResult needs at least one trial"
        return best

    @property
    def selected_random(self) -> TrialResult | None:
        """The best random-init trial, if the baseline ran (and pretrained trials exist too)."""
        return self._best("random") if self._best("pretrained") is not None else None

    @property
    def selected_reference(self) -> TrialResult | None:
        """The best trial of the reference checkpoint (``finetune.reference.source``), if it ran."""
        return self._best("reference")

    def seed_spread(self, trial: TrialResult) -> tuple[float, float, int]:
        """Mean, sample std (0 for one seed) and count of the main metric over ``trial``'s seeds."""
        values = [
            _score(t.dev.get(self.main_metric))
            for t in self.trials
            if t.init == trial.init and t.learning_rate == trial.learning_rate
        ]
        values = [v for v in values if math.isfinite(v)] or [math.nan]
        std = statistics.stdev(values) if len(values) > 1 else 0.0
        return statistics.fmean(values), std, len(values)

    def metrics(self) -> dict[str, float]:
        """The flat DVC metrics view (see the module docstring for the keys)."""
        best = self.selected
        out: dict[str, float] = {f"dev.{k}": float(v) for k, v in best.dev.items()}
        for split, values in best.other_splits.items():
            out.update({f"{split}.{k}": float(v) for k, v in values.items()})
        mean, std, n = self.seed_spread(best)
        out[f"dev.{self.main_metric}_mean"] = mean
        out[f"dev.{self.main_metric}_std"] = std
        out["seeds"] = float(n)
        out["selected.learning_rate"] = best.learning_rate
        out["selected.seed"] = float(best.seed)
        out.update({f"dev.{k}": float(v) for k, v in best.extra.items()})
        baseline = self.selected_random
        if baseline is not None and baseline is not best:
            out.update({f"random_init.dev.{k}": float(v) for k, v in baseline.dev.items()})
            out[f"gap.dev.{self.main_metric}"] = float(best.dev[self.main_metric]) - float(
                baseline.dev[self.main_metric]
            )
        reference = self.selected_reference
        if reference is not None:
            out.update({f"reference.dev.{k}": float(v) for k, v in reference.dev.items()})
        out["train.examples"] = float(best.train_examples)
        out["train.examples_per_second"] = best.examples_per_second
        out["train.seconds"] = float(sum(t.train_seconds for t in self.trials))
        out["trials"] = float(len(self.trials))
        for name, values in self.baselines.items():
            out.update({f"baseline.{name}.{k}": float(v) for k, v in values.items()})
        for split, baselines in self.split_baselines.items():
            for name, values in baselines.items():
                out.update({f"{split}.baseline.{name}.{k}": float(v) for k, v in values.items()})
        if self.data_split.get("origin") == "dev_split":
            out["dev_split"] = 1.0
        return {k: v for k, v in out.items() if isinstance(v, float) and math.isfinite(v)}

    def write_curves(self, out_dir: str | Path) -> tuple[Path, Path]:
        """The selected trial's learning curves as CSV for ``dvc plots``, each written atomically.

        ``train.csv``: ``step, epoch, loss, learning_rate`` per logged step; ``dev.csv``: ``step, epoch`` and
        the dev metrics at each evaluation, the main metric last (DVC's default y axis).
        """
        from bert_core.atomic import write_csv_atomic

        out_dir = Path(out_dir)
        best = self.selected
        metric_keys = sorted({k for e in best.evals for k in e} - {"step", "epoch", self.main_metric})
        tables = (
            (out_dir / "train.csv", ["step", "epoch", "loss", "learning_rate"], best.history),
            (out_dir / "dev.csv", ["step", "epoch", *metric_keys, self.main_metric], best.evals),
        )
        for path, cols, rows in tables:
            write_csv_atomic(path, cols, ([row.get(c, "") for c in cols] for row in rows))
        return tables[0][0], tables[1][0]

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["selected"] = self.selected.name
        data["metrics"] = self.metrics()
        return data

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> FinetuneResult:
        trials = [TrialResult(**t) for t in data["trials"]]
        return cls(
            data["task"],
            data["kind"],
            data["main_metric"],
            data["model"],
            trials,
            data.get("outputs", {}),
            data.get("data_split", {}),
            data.get("baselines", {}),
            data.get("split_baselines", {}),
        )

    @classmethod
    def load(cls, path: str | Path) -> FinetuneResult:
        """Read a ``summary.json``; errors name the file."""
        path = Path(path)
        try:
            return cls.from_json(json.loads(path.read_text(encoding="utf-8")))
        except (OSError, ValueError, KeyError, TypeError) as err:
            raise ValueError(f"{path}: not a fine-tuning summary ({err}); re-run the finetune stage") from err
