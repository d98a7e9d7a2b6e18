"""Multiple choice (SWAG): pick the ending that continues a sentence (BERT paper §4.4).

Encoding: four ``[CLS] context [SEP] start + ending [SEP]`` rows per example; ``input_ids`` and
``token_type_ids`` are (num_choices, L) nested lists. The head scores each row with one output; a soft-max
over the four scores gives the choice. Scored by accuracy; predictions are an ``id,pred,prob0,...`` CSV.
"""

from __future__ import annotations

import csv
import io
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
    softmax,
    strip_len,
)
from bert_core.tasks.registry import TaskSpec

if TYPE_CHECKING:
    from torch import nn

    from bert_core.config import BertConfig


def encode_multiple_choice(
    examples: Sequence[Mapping[str, Any]],
    tokenizer: Any,
    *,
    max_seq_length: int,
) -> list[Feature]:
    """Encode SWAG-style examples as four ``(context, start + ending)`` pairs each.

    Args:
        examples: ``{"id", "context", "start", "endings": [4 strings], "label"}``.

    Returns:
        One feature per example: ``input_ids`` and ``token_type_ids`` as (num_choices, L_c) nested lists
        (rows may differ in length), ``labels`` the gold choice (when labelled).
    """
    if not examples:
        return []
    first, second = [], []
    num_choices = len(examples[0]["endings"])
    for ex in examples:
        if len(ex["endings"]) != num_choices:
            raise FeatureError(
                f"example {ex.get('id')!r} has {len(ex['endings'])} endings, the others {num_choices}"
            )
        start = str(ex.get("start") or "").strip()
        for ending in ex["endings"]:
            first.append(str(ex["context"]))
            second.append(f"{start} {ending}".strip())
    enc = tokenizer(
        first,
        second,
        truncation="longest_first",
        max_length=max_seq_length,
        padding=False,
        return_attention_mask=False,
        return_token_type_ids=True,
    )
    features = []
    for i, ex in enumerate(examples):
        rows = slice(i * num_choices, (i + 1) * num_choices)
        feat: Feature = {"input_ids": enc["input_ids"][rows], "token_type_ids": enc["token_type_ids"][rows]}
        label = ex.get("label")
        if label is not None and label != "" and int(label) >= 0:
            if not 0 <= int(label) < num_choices:
                raise FeatureError(
                    f"example {ex.get('id')!r}: label {label!r} is not in 0..{num_choices - 1}"
                )
            feat["labels"] = int(label)
        features.append(feat)
    return features


def multiple_choice_predictions(logits: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """SWAG: soft-max over the choices' scores (BERT paper §4.4).

    Args:
        logits: (N, C) one score per (context, ending) pair.

    Returns:
        ``(choice, probabilities)``: (N,) argmax and (N, C) probabilities.
    """
    probs = softmax(logits, axis=-1)
    return probs.argmax(-1), probs


def write_multiple_choice_predictions(
    path: str | Path, ids: Sequence[str], choices: Sequence[int], probabilities: np.ndarray
) -> Path:
    """Write SWAG predictions: ``id,pred,prob0,...`` CSV."""
    from bert_core.atomic import write_text_atomic

    probabilities = np.asarray(probabilities)
    n = probabilities.shape[1] if probabilities.ndim == 2 else 0
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow(["id", "pred", *(f"prob{i}" for i in range(n))])
    for qid, choice, probs in zip(ids, choices, probabilities):
        writer.writerow([str(qid), int(choice), *(f"{p:.6f}" for p in probs)])
    return write_text_atomic(path, buf.getvalue())


class MultipleChoice(TaskKind):
    """``multiple_choice``: one score per (context, ending) pair, soft-max over the endings (SWAG)."""

    name = "multiple_choice"

    @property
    def model_class(self) -> type[nn.Module]:
        from bert_core.model import BertForMultipleChoice

        return BertForMultipleChoice

    def head_config(self, spec: TaskSpec, config: BertConfig) -> BertConfig:
        # The head has one output per choice row whatever num_labels says; 2 is transformers' default.
        return config.replace(num_labels=2, id2label=None, problem_type=None)

    def encode(
        self,
        spec: TaskSpec,
        rows: Sequence[Row],
        tokenizer: Any,
        settings: KindSettings,
        *,
        training: bool = False,
    ) -> list[Feature]:
        return encode_multiple_choice(rows, tokenizer, max_seq_length=max_seq_length(spec, settings))

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
        return score_per_row(self, spec, rows, outputs, multiple_choice_predictions)

    def write_predictions(
        self, spec: TaskSpec, split: str, rows: Sequence[Row], result: SplitScore, out_dir: str | Path
    ) -> dict[str, str]:
        path = write_multiple_choice_predictions(
            Path(out_dir) / f"{split}_predictions.csv",
            [r["id"] for r in rows],
            result.predictions["preds"].tolist(),
            result.predictions["probs"],
        )
        return {f"{split}.predictions": str(path)}

    def baselines(
        self, spec: TaskSpec, rows: Sequence[Row], *, train_rows: Sequence[Row]
    ) -> dict[str, dict[str, float]]:
        """``majority`` (the most frequent training label) and ``tfidf_ending`` (a bag-of-words ranker of
        the endings alone), fitted on ``train_rows`` (:func:`bert_core.kinds.baselines.multiple_choice_baselines`)."""
        from bert_core.kinds.baselines import multiple_choice_baselines

        return multiple_choice_baselines(spec, train_rows, rows)

    # -- serving
    def serving_inputs(self, spec: TaskSpec) -> list[tuple[str, str, bool]]:
        return [("context", "string", True), ("endings", "string[]", True), ("start", "string", False)]

    def serving_outputs(self, spec: TaskSpec) -> list[tuple[str, str, bool]]:
        named = [("label", "string", False)] if spec.fields.get("choices") else []  # an own task's positions
        return [("choice", "long", True), *named, ("probabilities", "double[]", True)]

    def serving_example(self, spec: TaskSpec) -> list[dict[str, Any]]:
        """A SWAG row, with as many endings as the task has choices (an own task's: ``len(spec.labels)``)."""
        endings = [
            "pats her shoulder, then saunters toward someone.",
            "turns with two students.",
            "walks slowly towards someone.",
            "wheels around as her dog thunders out.",
        ]
        n = len(spec.labels) or len(endings)
        endings = [*endings, *(f"does choice {k + 1}." for k in range(len(endings), n))][:n]
        return [{"context": "Students lower their eyes nervously.", "start": "She", "endings": endings}]

    def serve(
        self,
        spec: TaskSpec,
        records: Sequence[dict[str, Any]],
        tokenizer: Any,
        run: Any,
        settings: KindSettings,
        options: dict[str, Any],
    ) -> list[dict[str, Any]]:
        """``context`` + ``endings`` (+ ``start``, the ending's first words) -> ``choice`` (index into the
        endings), for an own task with named positions its ``label`` (``C``; ``None`` for a record with
        another number of endings than the task's), and ``probabilities`` (one per ending)."""
        from bert_core.kinds.base import ServingInputError

        rows = []
        for i, r in enumerate(records):
            if len(r["endings"]) < 2:
                raise ServingInputError(
                    f"record {i}: field 'endings' needs at least 2 endings, got {len(r['endings'])}"
                )
            rows.append(
                {
                    "id": i,
                    "context": r["context"],
                    "start": r.get("start") or "",
                    "endings": list(r["endings"]),
                }
            )
        out: list[dict[str, Any]] = [{} for _ in rows]
        for n in sorted({len(r["endings"]) for r in rows}):  # the head scores any number of endings
            group = [r for r in rows if len(r["endings"]) == n]
            outputs = run(self.encode(spec, group, tokenizer, settings))
            _, probs = multiple_choice_predictions(np.stack(outputs))
            for row, p in zip(group, probs):
                choice = int(p.argmax())
                named = {"label": spec.labels[choice] if n == len(spec.labels) else None}
                out[row["id"]] = {
                    "choice": choice,
                    **(named if spec.fields.get("choices") else {}),
                    "probabilities": [float(x) for x in p],
                }
        return out

    def frame_columns(self, spec: TaskSpec, row: Row) -> dict[str, Any]:
        return {
            "context_len": strip_len(row["context"]),
            "n_endings": len(row["endings"]),
            "min_ending_len": min((strip_len(e) for e in row["endings"]), default=0),
            "label": row["label"],
        }

    def checks(self, spec: TaskSpec, labelled: bool) -> list[Check]:
        n = len(spec.labels)  # SWAG's four endings, or an own task's choices
        return [
            nonempty("context_len"),
            Check(expectations().ExpectColumnValuesToBeBetween(column="n_endings", min_value=n, max_value=n)),
            nonempty("min_ending_len"),
            *label_checks(labelled, range(n)),
        ]
