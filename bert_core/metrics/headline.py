"""The headline metric of every task: one table, one lookup.

:data:`MAIN_METRIC` names the key of each task's headline number in the metric dict of
:mod:`bert_core.metrics` (BERT paper, Table 1: F1 for QQP and MRPC, Spearman for STS-B, Matthews
correlation for CoLA and the diagnostic set AX, F1 for SQuAD and CoNLL-2003, accuracy elsewhere).
Fine-tuning selects models on it, the task registry's ``TaskSpec.main_metric`` reads it, and reports
headline it.
"""

from __future__ import annotations

#: Headline (model-selection) metric key per task name of :mod:`bert_core.tasks` (and ``ax``).
MAIN_METRIC: dict[str, str] = {
    "cola": "matthews_corr",
    "sst2": "accuracy",
    "mrpc": "f1",
    "stsb": "spearman",
    "qqp": "f1",
    "mnli": "accuracy",
    "qnli": "accuracy",
    "rte": "accuracy",
    "wnli": "accuracy",
    "ax": "matthews_corr",
    "swag": "accuracy",
    "squad_v1": "f1",
    "squad_v2": "f1",
    "conll2003": "f1",
}

# Names people use for the MNLI dev/test halves and STS-B; they are scored exactly like the task.
ALIASES: dict[str, str] = {"mnli_m": "mnli", "mnli_mm": "mnli", "sts_b": "stsb"}


def main_metric(task: str) -> str:
    """The key of ``task``'s headline metric (e.g. ``"matthews_corr"`` for ``cola``).

    Accepts the spellings ``MNLI-m``/``mnli_mm``/``STS-B`` as well.

    Raises:
        ValueError: an unknown task, naming the valid ones.
    """
    key = task.lower().replace("-", "_")
    key = ALIASES.get(key, key)
    if key not in MAIN_METRIC:
        raise ValueError(f"unknown task {task!r}; valid tasks: {', '.join(sorted(MAIN_METRIC))}")
    return MAIN_METRIC[key]
