"""The ``evaluate`` stage: one summary of every fine-tuned task, as DVC metrics and a report with plots.

- ``params``: :class:`EvaluateParams`.
- ``references``: the published scores by model size and the paper's GLUE average.
- ``summary``: the finetune stages' ``summary.json`` files (contract:
  :mod:`bert_core.finetune.results`) as rows next to the references, and the flat metrics.
- ``crosscheck``: each summary must be its directory's task, with the registry's kind, and all from the
  same pretrained model (:class:`SummaryCheckError` otherwise, naming the file and the stage to re-run).
- ``plots`` / ``report``: the PNG plots, the Markdown/HTML report and :func:`evaluate_results`, the stage
  function.
"""

from bert_core.evaluate.crosscheck import SummaryCheckError
from bert_core.evaluate.params import EvaluateParams
from bert_core.evaluate.references import (
    HF_BASE_CASED_DEV,
    REFERENCES,
    Reference,
    glue_average,
    reference_for,
)
from bert_core.evaluate.report import evaluate_results, render_report
from bert_core.evaluate.summary import EvaluationSummary, Row, load_results, summarize

__all__ = [
    "HF_BASE_CASED_DEV",
    "REFERENCES",
    "EvaluateParams",
    "EvaluationSummary",
    "Reference",
    "Row",
    "SummaryCheckError",
    "evaluate_results",
    "glue_average",
    "load_results",
    "reference_for",
    "render_report",
    "summarize",
]
