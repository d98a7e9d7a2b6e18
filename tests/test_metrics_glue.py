"""GLUE/SWAG metrics: official definitions on hand-computed cases, stable keys, clear errors."""

from __future__ import annotations

import math

import numpy as np
import pytest

from bert_core.metrics import GLUE_METRIC_KEYS, glue_metrics, task_metrics
from bert_core.tasks import TASKS


def test_cola_matthews_correlation_by_hand():
    # TP=1 FP=1 TN=2 FN=0: MCC = (1*2 - 1*0) / sqrt(2 * 1 * 3 * 2)
    out = glue_metrics("cola", [1, 1, 0, 0], [1, 0, 0, 0])
    assert list(out) == ["matthews_corr"]
    assert out["matthews_corr"] == pytest.approx(100 * 2 / math.sqrt(12))


def test_constant_predictions_give_zero_mcc():
    assert glue_metrics("cola", [1, 1, 1, 1], [1, 0, 0, 1])["matthews_corr"] == 0.0


@pytest.mark.parametrize("task", ["mrpc", "qqp"])
def test_f1_uses_label_one_as_positive(task):
    # TP=2 FP=1 FN=0 -> P=2/3, R=1, F1=0.8; 3 of 4 right.
    out = glue_metrics(task, np.array([1, 1, 0, 1]), [1, 0, 0, 1])
    assert list(out) == ["f1", "accuracy"]
    assert out["f1"] == pytest.approx(80.0)
    assert out["accuracy"] == pytest.approx(75.0)
    # Swapping the classes changes F1 (positive class is 1), not accuracy.
    flipped = glue_metrics(task, [0, 0, 1, 0], [0, 1, 1, 0])
    assert flipped["accuracy"] == pytest.approx(75.0)
    assert flipped["f1"] == pytest.approx(100 * 2 * (1 * 0.5) / 1.5)


def test_stsb_pearson_and_spearman_by_hand():
    out = glue_metrics("stsb", [1.0, 2.0, 3.0, 4.0], [1.0, 2.0, 3.0, 5.0])
    assert set(out) == {"pearson", "spearman"}
    assert out["spearman"] == pytest.approx(100.0)
    assert out["pearson"] == pytest.approx(100 * 6.5 / math.sqrt(5 * 8.75))


def test_stsb_constant_input_is_nan_not_an_exception():
    out = glue_metrics("stsb", [2.5, 2.5, 2.5], [1.0, 2.0, 3.0])
    assert math.isnan(out["pearson"]) and math.isnan(out["spearman"])


@pytest.mark.parametrize("task", ["sst2", "mnli", "mnli_m", "mnli_mm", "qnli", "rte", "wnli", "swag"])
def test_accuracy_tasks(task):
    assert glue_metrics(task, [0, 2, 1, 1, 0], [0, 2, 1, 0, 1]) == {"accuracy": pytest.approx(60.0)}


def test_integral_float_labels_are_accepted():
    assert glue_metrics("sst2", np.array([1.0, 0.0]), [1, 0])["accuracy"] == 100.0


def test_keys_agree_with_the_registry():
    """The keys glue_metrics returns are the ones the registry declares (its headline among them)."""
    for name, spec in TASKS.items():
        if name in GLUE_METRIC_KEYS:
            assert set(spec.metric_keys) == set(GLUE_METRIC_KEYS[name])
            assert spec.main_metric in glue_metrics(name, [0, 1, 1], [0, 1, 0])


def test_task_metrics_dispatches_by_task():
    assert task_metrics("rte", [0, 1], [0, 0]) == {"accuracy": 50.0}
    assert task_metrics("conll2003", [["B-PER"]], [["B-PER"]])["f1"] == 100.0


@pytest.mark.parametrize(
    ("task", "preds", "refs", "message"),
    [
        ("cola", [1, 0], [1], "2 predictions but 1 references"),
        ("cola", [], [], "no examples"),
        ("sst2", [1, 0], [1, None], "contain None"),
        ("mnli", ["entailment"], ["entailment"], "label indices"),
        ("sst2", [0.5], [1], "label indices"),
        ("stsb", [float("nan")], [1.0], "NaN"),
        ("boolq", [1], [1], "valid tasks: ax, cola"),
    ],
)
def test_bad_input_is_rejected_with_a_clear_message(task, preds, refs, message):
    with pytest.raises(ValueError, match=message):
        glue_metrics(task, preds, refs)
