"""Sequence classification and regression (GLUE): one label (or score) per sentence or sentence pair.

Encoding (BERT paper §4.1, Figure 4a/b): ``[CLS] A [SEP] (B [SEP])``; a feature has ``input_ids`` (L,),
``token_type_ids`` (L,) and ``labels``, an int class id (a float score for regression), absent for
unlabelled (test) rows. The head reads ``[CLS]``; the prediction is the argmax class (classification) or
the single output (regression, STS-B). Scores are GLUE's official metrics; predictions are written as
``index<TAB>prediction`` files, the leaderboard's format for test splits.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from bert_core.checks import Check
from bert_core.kinds.base import (
    Feature,
    FeatureError,
    KindSettings,
    Row,
    SplitScore,
    TaskKind,
    expectations,
    label_checks,
    max_seq_length,
    nonempty,
    score_per_row,
    strip_len,
)
from bert_core.tasks.registry import TaskSpec

if TYPE_CHECKING:
    from torch import nn


def _label_id(example: Mapping[str, Any], label2id: Mapping[str, int] | None) -> int | float | None:
    label = example.get("label")
    if label is None or label == "" or (isinstance(label, int) and label < 0):
        return None  # unlabelled (test split)
    if label2id is None:  # regression
        return float(label)
    if isinstance(label, int) and 0 <= label < len(label2id):
        return label  # already an index into the task's label list
    key = str(label)
    if key in label2id:
        return label2id[key]
    raise FeatureError(
        f"example {example.get('id')!r}: label {label!r} is not one of the task's labels {sorted(label2id)}"
    )


def encode_sequence_pairs(
    examples: Sequence[Mapping[str, Any]],
    tokenizer: Any,
    *,
    max_seq_length: int,
    label2id: Mapping[str, int] | None,
) -> list[Feature]:
    """Encode single sentences or sentence pairs for ``[CLS]`` classification or regression.

    Args:
        examples: ``{"id", "text_a", "text_b" (None for single-sentence tasks), "label"}``.
        tokenizer: A fast BERT tokenizer.
        max_seq_length: Longest sequence, special tokens included; pairs are cut longest-first.
        label2id: Label string -> class id; ``None`` for regression (labels become floats).

    Returns:
        One feature per example: ``input_ids`` (L,), ``token_type_ids`` (L,), ``labels`` (when labelled).
    """
    if not examples:
        return []
    text_a = [str(e["text_a"]) for e in examples]
    pairs = any(e.get("text_b") not in (None, "") for e in examples)
    text_b = [str(e.get("text_b") or "") for e in examples] if pairs else None
    enc = tokenizer(
        text_a,
        text_b,
        truncation="longest_first" if pairs else True,
        max_length=max_seq_length,
        padding=False,
        return_attention_mask=False,
        return_token_type_ids=True,
    )
    features = []
    for i, ex in enumerate(examples):
        feat: Feature = {"input_ids": enc["input_ids"][i], "token_type_ids": enc["token_type_ids"][i]}
        label = _label_id(ex, label2id)
        if label is not None:
            feat["labels"] = label
        features.append(feat)
    return features


def classification_predictions(logits: np.ndarray, *, regression: bool) -> np.ndarray:
    """GLUE: class ids (argmax) from (N, num_labels) logits, or scores (N,) for regression (STS-B)."""
    logits = np.asarray(logits)
    if regression:
        return logits.reshape(logits.shape[0], -1)[:, 0].astype(np.float64)
    return logits.argmax(-1)


def write_glue_predictions(
    path: str | Path, spec: TaskSpec, ids: Sequence[str], predictions: Sequence[Any]
) -> Path:
    """Write a GLUE ``index<TAB>prediction`` file (label strings; STS-B scores clipped to [0, 5])."""
    from bert_core.atomic import write_text_atomic
    from bert_core.tasks.glue import glue_submission_text

    return write_text_atomic(path, glue_submission_text(spec, list(ids), list(predictions)))


class SequenceClassification(TaskKind):
    """``classification``: a class per sentence (pair), read from ``[CLS]`` (CoLA, SST-2, MNLI, ...)."""

    name = "classification"
    regression = False

    @property
    def model_class(self) -> type[nn.Module]:
        from bert_core.model import BertForSequenceClassification

        return BertForSequenceClassification

    def id2label(self, spec: TaskSpec) -> dict[int, str] | None:
        return dict(enumerate(spec.labels))

    def label2id(self, spec: TaskSpec) -> dict[str, int] | None:
        """Label name -> class id (``None``: the label is a score)."""
        return {lab: i for i, lab in enumerate(spec.labels)}

    def encode(
        self,
        spec: TaskSpec,
        rows: Sequence[Row],
        tokenizer: Any,
        settings: KindSettings,
        *,
        training: bool = False,
    ) -> list[Feature]:
        return encode_sequence_pairs(
            rows, tokenizer, max_seq_length=max_seq_length(spec, settings), label2id=self.label2id(spec)
        )

    def predictions(self, stacked: np.ndarray) -> tuple[np.ndarray, np.ndarray | None]:
        """(predictions, choice probabilities or None) from the (N, num_labels) outputs."""
        return classification_predictions(stacked, regression=self.regression), None

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
        return score_per_row(self, spec, rows, outputs, self.predictions)

    def write_predictions(
        self, spec: TaskSpec, split: str, rows: Sequence[Row], result: SplitScore, out_dir: str | Path
    ) -> dict[str, str]:
        out_dir = Path(out_dir)
        ids = [r["id"] for r in rows]
        preds = result.predictions["preds"].tolist()
        if split in spec.submission_files:  # a test split: the leaderboard's file name and format
            path = write_glue_predictions(
                out_dir / "submission" / spec.submission_files[split], spec, ids, preds
            )
            return {f"{split}.submission": str(path)}
        path = write_glue_predictions(out_dir / f"{split}_predictions.tsv", spec, ids, preds)
        return {f"{split}.predictions": str(path)}

    def baselines(
        self, spec: TaskSpec, rows: Sequence[Row], *, train_rows: Sequence[Row]
    ) -> dict[str, dict[str, float]]:
        """``majority`` and ``tfidf_logreg`` (regression: ``mean`` and ``tfidf_ridge``), fitted on
        ``train_rows`` (:func:`bert_core.kinds.baselines.sequence_baselines`)."""
        from bert_core.kinds.baselines import sequence_baselines

        label2id = self.label2id(spec)
        return sequence_baselines(
            spec, train_rows, rows, label_of=lambda r: _label_id(r, label2id), regression=self.regression
        )

    # -- serving
    def serving_inputs(self, spec: TaskSpec) -> list[tuple[str, str, bool]]:
        return [("text", "string", True), ("text_pair", "string", False)]

    def serving_outputs(self, spec: TaskSpec) -> list[tuple[str, str, bool]]:
        if self.regression:
            return [("score", "double", True)]
        return [("label", "string", True), ("score", "double", True), ("probabilities", "double[]", True)]

    def serving_example(self, spec: TaskSpec) -> list[dict[str, Any]]:
        if spec.single_sentence:
            return [{"text": "a gripping, beautifully acted film."}]
        return [{"text": "A man is playing a guitar.", "text_pair": "Someone plays an instrument."}]

    def serve(
        self,
        spec: TaskSpec,
        records: Sequence[dict[str, Any]],
        tokenizer: Any,
        run: Any,
        settings: KindSettings,
        options: dict[str, Any],
    ) -> list[dict[str, Any]]:
        """``text`` (+ ``text_pair``) -> ``label``, ``score`` (its probability), ``probabilities`` (in the
        order of the task's labels); regression (STS-B): ``score``."""
        from bert_core.kinds.base import softmax

        rows = [
            {"id": i, "text_a": r["text"], "text_b": r.get("text_pair") or None}
            for i, r in enumerate(records)
        ]
        out: list[dict[str, Any]] = [{} for _ in rows]
        # Single texts and pairs are encoded apart: a batch's pairs must not turn its single texts into pairs.
        for group in ([r for r in rows if r["text_b"] is None], [r for r in rows if r["text_b"] is not None]):
            if not group:
                continue
            outputs = run(self.encode(spec, group, tokenizer, settings))
            for row, logits in zip(group, outputs):
                if self.regression:
                    out[row["id"]] = {"score": float(np.asarray(logits).reshape(-1)[0])}
                    continue
                probs = softmax(logits)
                best = int(probs.argmax())
                out[row["id"]] = {
                    "label": str(spec.labels[best]),
                    "score": float(probs[best]),
                    "probabilities": [float(p) for p in probs],
                }
        return out

    def frame_columns(self, spec: TaskSpec, row: Row) -> dict[str, Any]:
        return {
            "text_a_len": strip_len(row["text_a"]),
            "text_b_len": None if row["text_b"] is None else strip_len(row["text_b"]),
            "label": row["label"],
        }

    def checks(self, spec: TaskSpec, labelled: bool) -> list[Check]:
        checks = [nonempty("text_a_len")]
        if not spec.single_sentence:
            checks.append(nonempty("text_b_len"))
        return checks + self.label_checks(spec, labelled)

    def label_checks(self, spec: TaskSpec, labelled: bool) -> list[Check]:
        """The expectations on the ``label`` column."""
        return label_checks(labelled, range(len(spec.labels)))


class SequenceRegression(SequenceClassification):
    """``regression``: a real-valued score per sentence pair from one output on ``[CLS]`` (STS-B)."""

    name = "regression"
    regression = True

    def num_labels(self, spec: TaskSpec) -> int:
        return 1

    def id2label(self, spec: TaskSpec) -> dict[int, str] | None:
        return None

    def label2id(self, spec: TaskSpec) -> dict[str, int] | None:
        return None

    def label_checks(self, spec: TaskSpec, labelled: bool) -> list[Check]:
        if not labelled:
            return label_checks(labelled, ())
        E = expectations()
        checks = [Check(E.ExpectColumnValuesToNotBeNull(column="label"))]
        if spec.score_range is not None:
            low, high = spec.score_range
            checks.append(
                Check(E.ExpectColumnValuesToBeBetween(column="label", min_value=low, max_value=high))
            )
        return checks
