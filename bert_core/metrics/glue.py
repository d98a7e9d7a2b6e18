"""GLUE metrics with their official definitions, plus SWAG accuracy.

Each GLUE task is scored the way the GLUE benchmark scores it (Wang et al., 2019): Matthews correlation for
CoLA (and the diagnostic set AX), F1 and accuracy for MRPC and QQP (positive class = label index 1,
"equivalent"/"duplicate"), Pearson and Spearman correlation for STS-B, accuracy for everything else. All
values are on the 0-100 scale used by the BERT paper's tables and the GLUE leaderboard.

The computations are scikit-learn's ``matthews_corrcoef``/``f1_score``/``accuracy_score`` and SciPy's
``pearsonr``/``spearmanr``, the same functions GLUE's own evaluation uses.

The headline key of each task (fine-tuning selects models on it) is the task registry's
:attr:`bert_core.tasks.TaskSpec.main_metric`.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Sequence
from typing import Any

import numpy as np

#: Metric keys returned by :func:`glue_metrics` per task, in a stable order.
METRIC_KEYS: dict[str, tuple[str, ...]] = {
    "cola": ("matthews_corr",),
    "sst2": ("accuracy",),
    "mrpc": ("f1", "accuracy"),
    "stsb": ("pearson", "spearman"),
    "qqp": ("f1", "accuracy"),
    "mnli": ("accuracy",),
    "qnli": ("accuracy",),
    "rte": ("accuracy",),
    "wnli": ("accuracy",),
    "ax": ("matthews_corr",),
    "swag": ("accuracy",),
}

# Names people use for the MNLI dev/test halves; they are scored exactly like "mnli".
_ALIASES = {"mnli_m": "mnli", "mnli_mm": "mnli", "mnli-m": "mnli", "mnli-mm": "mnli", "sts-b": "stsb"}


def _canonical(task: str) -> str:
    name = _ALIASES.get(task.lower(), task.lower())
    if name not in METRIC_KEYS:
        raise ValueError(f"unknown GLUE/SWAG task {task!r}; valid tasks: {', '.join(sorted(METRIC_KEYS))}")
    return name


def _as_array(values: Sequence[Any], what: str, task: str, *, regression: bool) -> np.ndarray:
    if any(v is None for v in values):
        raise ValueError(
            f"{task}: {what} contain None (an unlabeled test set?); metrics need gold labels for every example"
        )
    arr = np.asarray(values, dtype=np.float64 if regression else None)
    if arr.ndim != 1:
        raise ValueError(f"{task}: {what} must be a flat sequence, got shape {arr.shape}")
    if regression:
        if not np.all(np.isfinite(arr)):
            raise ValueError(f"{task}: {what} contain NaN or infinite values")
    elif arr.dtype.kind not in "iub":
        if arr.dtype.kind == "f" and np.all(arr == np.round(arr)):
            arr = arr.astype(np.int64)
        else:
            raise ValueError(
                f"{task}: {what} must be label indices (integers), got dtype {arr.dtype} "
                f"(first value {values[0]!r}); map label names through the TaskSpec label list first"
            )
    return arr


def glue_metrics(task: str, predictions: Sequence[Any], references: Sequence[Any]) -> dict[str, float]:
    """Score predictions for a GLUE task (or SWAG) with the official metric definitions.

    Args:
        task: ``cola``, ``sst2``, ``mrpc``, ``stsb``, ``qqp``, ``mnli`` (also ``mnli_m``/``mnli_mm``),
            ``qnli``, ``rte``, ``wnli``, ``ax`` or ``swag``.
        predictions: Predicted label indices, shape (N,); floats for ``stsb``.
        references: Gold label indices (floats for ``stsb``), shape (N,), same order.

    Returns:
        ``{key: value}`` on the 0-100 scale, with exactly the keys ``METRIC_KEYS[task]``. Pearson/Spearman
        are NaN when either side is constant (the correlation is undefined).

    Raises:
        ValueError: unknown task, length mismatch, empty input, missing gold labels or non-index labels.
    """
    name = _canonical(task)
    return label_metrics(task, predictions, references, METRIC_KEYS[name], regression=name == "stsb")


def label_metrics(
    task: str, predictions: Sequence[Any], references: Sequence[Any], keys: Sequence[str], *, regression: bool
) -> dict[str, float]:
    """Score predictions with the metrics ``keys``, defined as GLUE defines them (:func:`glue_metrics` is this
    with a GLUE task's keys; an own task names its own): ``accuracy``, ``f1`` (binary, positive class 1),
    ``macro_f1`` (the unweighted mean of the classes' F1), ``matthews_corr`` (multi-class too); ``pearson``
    and ``spearman`` of scores (``regression``).

    Raises:
        ValueError: as :func:`glue_metrics`, naming ``task``.
    """
    if len(predictions) != len(references):
        raise ValueError(f"{task}: {len(predictions)} predictions but {len(references)} references")
    if len(references) == 0:
        raise ValueError(f"{task}: no examples to score")
    preds = _as_array(predictions, "predictions", task, regression=regression)
    refs = _as_array(references, "references", task, regression=regression)

    from scipy import stats
    from sklearn import metrics as skm

    out: dict[str, float] = {}
    if regression:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # constant input: SciPy warns and returns NaN
            constant = np.all(preds == preds[0]) or np.all(refs == refs[0])
            for key in keys:
                correlation = {"pearson": stats.pearsonr, "spearman": stats.spearmanr}[key]
                out[key] = math.nan if constant else 100.0 * float(correlation(preds, refs)[0])
        return out
    for key in keys:
        if key == "accuracy":
            out[key] = 100.0 * float(skm.accuracy_score(refs, preds))
        elif key == "f1":
            out[key] = 100.0 * float(
                skm.f1_score(refs, preds, pos_label=1, average="binary", zero_division=0)
            )
        elif key == "macro_f1":
            out[key] = 100.0 * float(skm.f1_score(refs, preds, average="macro", zero_division=0))
        elif key == "matthews_corr":
            out[key] = 100.0 * float(skm.matthews_corrcoef(refs, preds))
        else:  # pragma: no cover - METRIC_KEYS and this switch are kept in sync
            raise AssertionError(key)
    return out
