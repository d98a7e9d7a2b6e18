"""Official task metrics: GLUE (and SWAG accuracy), SQuAD v1.1/v2.0, CoNLL-2003 NER.

Every score is on the 0-100 scale (as the BERT paper, the GLUE leaderboard, the SQuAD scripts and conlleval
report them). ``python -m bert_core.metrics`` scores files like the official scripts do.

Metric keys per task (the headline key first; which key is the headline is the task registry's fact,
:attr:`bert_core.tasks.TaskSpec.main_metric`, and this package never decides it):

=============================  ==================================================================
cola, ax                       ``matthews_corr``
sst2, mnli, qnli, rte, wnli    ``accuracy``
mrpc, qqp                      ``f1``, ``accuracy``
stsb                           ``spearman``, ``pearson`` (main: spearman)
swag                           ``accuracy``
squad_v1                       ``f1``, ``exact_match`` (+ ``total``, ``missing``)
squad_v2                       ``f1``, ``exact`` = ``exact_match``, ``HasAns_*``, ``NoAns_*``, ``best_*``
conll2003                      ``f1``, ``precision``, ``recall``, ``accuracy``, ``per_type``
an own task                    its ``TaskSpec.metric_keys`` (:mod:`bert_core.tasks.own`): accuracy,
                               F1, macro F1, Matthews; Spearman, Pearson; NER as conll2003
=============================  ==================================================================
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from bert_core.metrics.glue import METRIC_KEYS as GLUE_METRIC_KEYS
from bert_core.metrics.glue import glue_metrics, label_metrics
from bert_core.metrics.ner import ConllFormatError, conll_file_metrics, ner_metrics, read_conll_eval_file
from bert_core.metrics.squad import (
    SquadGold,
    gold_from_json,
    gold_from_rows,
    normalize_answer,
    squad_metrics,
    squad_v1_evaluate,
    squad_v2_evaluate,
)


def task_metrics(task: str, predictions: Any, references: Any, **kwargs: Any) -> dict[str, Any]:
    """Score one task's predictions with its official metric, dispatching on the task name.

    Args:
        task: A task name of :mod:`bert_core.tasks` (``cola`` ... ``swag``, ``squad_v1``, ``squad_v2``,
            ``conll2003``).
        predictions: Label indices (GLUE, SWAG), floats (STS-B), tag sequences (CoNLL) or a
            ``{question id: answer text}`` mapping (SQuAD).
        references: Gold labels / tag sequences, or for SQuAD the canonical span-QA rows.
        **kwargs: ``na_probs`` for SQuAD v2.0.
    """
    name = task.lower()
    if name in ("squad_v1", "squad_v2"):
        if not isinstance(predictions, Mapping):
            raise TypeError("SQuAD predictions must map question id -> answer text")
        return squad_metrics(references, predictions, version=name, **kwargs)
    if name == "conll2003":
        return ner_metrics(references, predictions)
    return glue_metrics(name, predictions, references)


def spec_metrics(spec: Any, predictions: Any, references: Any) -> dict[str, float]:
    """Score a classification, regression or multiple-choice task (:class:`bert_core.tasks.TaskSpec`): the
    official metrics of the paper's tasks, an own task's :attr:`~bert_core.tasks.TaskSpec.metric_keys`."""
    if spec.own:
        regression = spec.kind == "regression"
        return label_metrics(spec.name, predictions, references, spec.metric_keys, regression=regression)
    return glue_metrics(spec.name, predictions, references)


__all__ = [
    "GLUE_METRIC_KEYS",
    "ConllFormatError",
    "SquadGold",
    "conll_file_metrics",
    "glue_metrics",
    "gold_from_json",
    "gold_from_rows",
    "label_metrics",
    "ner_metrics",
    "normalize_answer",
    "read_conll_eval_file",
    "spec_metrics",
    "squad_metrics",
    "squad_v1_evaluate",
    "squad_v2_evaluate",
    "task_metrics",
]
