"""Published scores to put next to ours, by model size.

Sources: the BERT paper (Devlin et al., 2019), Table 1 (GLUE test) and §4.2-4.4 / §5.3 (SQuAD, SWAG and
CoNLL-2003 dev; CoNLL-2003 test, Table 7, is the row ``conll2003_test``); Turc et al. (2019), "Well-Read
Students Learn Better", GLUE test scores of the compact models. Scores are on the 0-100 scale and keyed by
our task names and metric keys; ``mnli_mm`` is MNLI's mismatched half. Most GLUE numbers are *test* scores while the pipeline reports *dev* scores, so every
reference says which split it is; the report labels charts accordingly.

The paper's GLUE average is the plain mean of nine headline numbers (MNLI-m and MNLI-mm counted separately;
F1 for QQP and MRPC, Spearman for STS-B, Matthews correlation for CoLA, accuracy elsewhere), WNLI excluded:
BERT-Base (84.6 + 83.4 + 71.2 + 90.5 + 93.5 + 52.1 + 85.8 + 88.9 + 66.4) / 9 = 79.6.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from bert_core.tasks import TASKS, get_task

#: Tasks (chart rows) of the GLUE average, in the paper's column order; WNLI is excluded as in the paper.
GLUE_AVERAGE_ROWS: tuple[str, ...] = ("mnli", "mnli_mm", "qqp", "qnli", "sst2", "cola", "stsb", "mrpc", "rte")
#: Chart rows that are a second split of a task, not a task: the row -> its task (scored like it).
ROW_TASK: dict[str, str] = {"mnli_mm": "mnli"}
#: The row of a further evaluated split whose name is the paper's: (task, split) -> row.
_SPLIT_ROWS = {("mnli", "dev_mismatched"): "mnli_mm"}


def split_row(task: str, split: str) -> str:
    """The chart row of ``task``'s further evaluated ``split``: ``mnli_mm``, else ``<task>_<split>``
    (``conll2003_test``)."""
    return _SPLIT_ROWS.get((task, split), f"{task}_{split}")


@dataclass(frozen=True)
class Reference:
    """Published scores of one model size.

    Attributes:
        model: What was measured (``"BERT-Base"``, ``"BERT-Tiny (Turc et al. 2019)"``).
        scores: Row (task) -> metric key -> value (0-100).
        splits: Row -> ``"test"`` or ``"dev"``.
        glue_average: The published GLUE score, when there is one.
    """

    model: str
    scores: dict[str, dict[str, float]]
    splits: dict[str, str] = field(default_factory=dict)
    glue_average: float | None = None


def _glue_test(cola, sst2, mrpc, stsb, qqp, mnli, mnli_mm, qnli, rte) -> tuple[dict, dict]:
    """Turc et al. column order; MRPC and QQP as (F1, acc), STS-B as (Pearson, Spearman)."""
    scores = {
        "cola": {"matthews_corr": cola},
        "sst2": {"accuracy": sst2},
        "mrpc": {"f1": mrpc[0], "accuracy": mrpc[1]},
        "stsb": {"pearson": stsb[0], "spearman": stsb[1]},
        "qqp": {"f1": qqp[0], "accuracy": qqp[1]},
        "mnli": {"accuracy": mnli},
        "mnli_mm": {"accuracy": mnli_mm},
        "qnli": {"accuracy": qnli},
        "rte": {"accuracy": rte},
    }
    return scores, dict.fromkeys(scores, "test")


def _compact(name: str, score: float, *row) -> Reference:
    scores, splits = _glue_test(*row)
    return Reference(f"BERT-{name} (Turc et al. 2019)", scores, splits, score)


_BASE_SCORES = {
    "mnli": {"accuracy": 84.6},
    "mnli_mm": {"accuracy": 83.4},
    "qqp": {"f1": 71.2},
    "qnli": {"accuracy": 90.5},
    "sst2": {"accuracy": 93.5},
    "cola": {"matthews_corr": 52.1},
    "stsb": {"spearman": 85.8},
    "mrpc": {"f1": 88.9},
    "rte": {"accuracy": 66.4},
    "squad_v1": {"exact_match": 80.8, "f1": 88.5},
    "swag": {"accuracy": 81.6},
    "conll2003": {"f1": 96.4},
    "conll2003_test": {"f1": 92.4},
}
_LARGE_SCORES = {
    "mnli": {"accuracy": 86.7},
    "mnli_mm": {"accuracy": 85.9},
    "qqp": {"f1": 72.1},
    "qnli": {"accuracy": 92.7},
    "sst2": {"accuracy": 94.9},
    "cola": {"matthews_corr": 60.5},
    "stsb": {"spearman": 86.5},
    "mrpc": {"f1": 89.3},
    "rte": {"accuracy": 70.1},
    "squad_v1": {"exact_match": 84.1, "f1": 90.9},
    "squad_v2": {"exact": 78.7, "f1": 81.9},
    "swag": {"accuracy": 86.6},
    "conll2003": {"f1": 96.6},
    "conll2003_test": {"f1": 92.8},
}
_PAPER_DEV = ("squad_v1", "squad_v2", "swag", "conll2003")

#: Published scores by preset name (``bert_core.config.PRESETS``).
REFERENCES: dict[str, Reference] = {
    "tiny": _compact(
        "Tiny", 64.2, 0.0, 83.2, (81.1, 71.1), (74.3, 73.6), (62.2, 83.4), 70.2, 70.3, 81.5, 57.2
    ),
    "mini": _compact(
        "Mini", 65.8, 0.0, 85.9, (81.1, 71.8), (75.4, 73.3), (66.4, 86.2), 74.8, 74.3, 84.1, 57.9
    ),
    "small": _compact(
        "Small", 71.2, 27.8, 89.7, (83.4, 76.2), (78.8, 77.0), (68.1, 87.0), 77.6, 77.0, 86.4, 61.8
    ),
    "medium": _compact(
        "Medium", 73.5, 38.0, 89.6, (86.6, 81.6), (80.4, 78.4), (69.6, 87.9), 80.0, 79.1, 87.7, 62.2
    ),
    "base": Reference(
        "BERT-Base (Devlin et al. 2019)",
        _BASE_SCORES,
        {k: ("dev" if k in _PAPER_DEV else "test") for k in _BASE_SCORES},
        79.6,
    ),
    "large": Reference(
        "BERT-Large (Devlin et al. 2019)",
        _LARGE_SCORES,
        {k: ("dev" if k in _PAPER_DEV else "test") for k in _LARGE_SCORES},
        82.1,
    ),
}

#: GLUE *dev* scores of Hugging Face's ``run_glue`` example with bert-base-cased (dev-to-dev comparisons).
HF_BASE_CASED_DEV: dict[str, dict[str, float]] = {
    "cola": {"matthews_corr": 56.5},
    "sst2": {"accuracy": 92.3},
    "mrpc": {"f1": 88.9, "accuracy": 84.1},
    "stsb": {"pearson": 88.6, "spearman": 88.5},
    "qqp": {"accuracy": 90.7, "f1": 87.5},
    "mnli": {"accuracy": 83.9},
    "mnli_mm": {"accuracy": 84.1},
    "qnli": {"accuracy": 90.7},
    "rte": {"accuracy": 65.7},
    "wnli": {"accuracy": 56.3},
}


def headline_metric(row: str, default: str) -> str:
    """The headline metric key of a chart row (a task name, ``mnli_mm`` for MNLI's mismatched half, or
    ``<task>_<split>`` for a further split: ``conll2003_test``).

    It is the task's main metric, :attr:`bert_core.tasks.TaskSpec.main_metric` (BERT paper Table 1), so the
    report and model selection never disagree; ``default`` (the summary's own main metric) for a row that
    names no registered task.
    """
    task, _, split = row.rpartition("_")
    if task in TASKS and split in TASKS[task].dev_splits[1:]:  # conll2003_test
        return TASKS[task].main_metric
    try:
        return get_task(ROW_TASK.get(row, row)).main_metric
    except KeyError:
        return default


def reference_for(preset: str | None) -> Reference | None:
    """Published scores for a preset (``None`` when there are none)."""
    return REFERENCES.get(preset) if preset else None


def glue_average(scores: dict[str, float]) -> tuple[float | None, list[str]]:
    """The paper's GLUE average over the rows present (WNLI excluded).

    Args:
        scores: Row -> headline score (rows of :data:`GLUE_AVERAGE_ROWS`; others are ignored).

    Returns:
        ``(average, rows used)``; the average is ``None`` when no GLUE row is present.
    """
    rows = [r for r in GLUE_AVERAGE_ROWS if r in scores and scores[r] is not None]
    if not rows:
        return None, []
    return sum(float(scores[r]) for r in rows) / len(rows), rows
