"""Params of the ``evaluate`` stage (``params/evaluate.yaml``, section ``evaluate``)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from bert_core.params import StrictModel


class EvaluateParams(StrictModel):
    """The ``evaluate`` section (``params/evaluate.yaml``).

    Attributes:
        results_dir: Directory of ``<task>/summary.json`` files written by the finetune stages.
        report_dir: Where ``evaluate.md``, ``evaluate.html`` and ``evaluate/*.png`` go.
        reference_size: Published scores to compare with: ``auto`` (the pretrained model's size), a preset
            name, or ``none``.
        dpi: Plot resolution.
    """

    results_dir: str = "results/finetune"
    report_dir: str = "reports"
    reference_size: Literal["auto", "none", "tiny", "mini", "small", "medium", "base", "large"] = "auto"
    dpi: int = Field(110, ge=50, le=400)
