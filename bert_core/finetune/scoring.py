"""Task heads, prediction and official scoring, per task kind.

- :func:`build_model` makes the paper's head for a task on top of a pretrained (or randomly initialised)
  encoder; the head is seeded so restarts differ only by their seed.
- :func:`encode` turns canonical rows into features (:mod:`bert_core.finetune.features`).
- :func:`predict` runs the model over features in length-sorted, dynamically padded batches and returns
  one unpadded output array per feature, in feature order.
- :func:`score` post-processes outputs into predictions and scores them with :mod:`bert_core.metrics`;
  :func:`write_predictions` writes them in the task's official format.
"""

from __future__ import annotations

import contextlib
import logging
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from bert_core.finetune import formats, postprocess
from bert_core.finetune.collate import make_loader
from bert_core.finetune.features import (
    encode_multiple_choice,
    encode_sequence_pairs,
    encode_squad,
    encode_token_classification,
)
from bert_core.finetune.params import TaskSettings

log = logging.getLogger(__name__)

MODEL_INPUTS = ("input_ids", "attention_mask", "token_type_ids")
TARGETS = ("labels", "start_positions", "end_positions")
TOKENIZER_FILES = ("tokenizer.json", "vocab.txt")
# Counts and id lists in the metric dicts are not metrics to log or compare.
_NOT_METRICS = {
    "total",
    "missing",
    "n_gold",
    "n_pred",
    "n_correct",
    "n_tokens",
    "HasAns_total",
    "NoAns_total",
}


def model_class(kind: str) -> type[nn.Module]:
    """The ``bert_core.model`` head class for a task kind."""
    from bert_core import model as m

    classes = {
        "classification": m.BertForSequenceClassification,
        "regression": m.BertForSequenceClassification,
        "span_qa": m.BertForQuestionAnswering,
        "multiple_choice": m.BertForMultipleChoice,
        "token_classification": m.BertForTokenClassification,
    }
    return classes[kind]


def build_model(spec: Any, source_dir: str | Path, *, init: str, seed: int) -> nn.Module:
    """The task's head on the encoder in ``source_dir`` (HF format), or on a random encoder of its shape.

    Args:
        spec: The :class:`~bert_core.tasks.TaskSpec`.
        source_dir: Hugging Face BERT directory (a pretraining or any BERT checkpoint).
        init: ``"pretrained"`` (load the encoder weights; the head is new) or ``"random"``.
        seed: Seeds the head (and, for ``random``, the encoder) initialisation.
    """
    from bert_core.hf import read_config

    config = read_config(source_dir)
    id2label = (
        dict(enumerate(spec.labels)) if spec.kind in ("classification", "token_classification") else None
    )
    config = config.replace(num_labels=spec.num_labels if spec.kind != "multiple_choice" else 2,
                            id2label=id2label, problem_type=None)  # fmt: skip
    cls = model_class(spec.kind)
    torch.manual_seed(seed)
    if init == "random":
        return cls(config)
    model = cls.from_pretrained(source_dir, config=config, ignore_mismatched_sizes=True)
    model.train()
    return model


def load_tokenizer(model_dir: str | Path, vocab_size: int | None = None) -> Any:
    """The fast WordPiece tokenizer saved with a model (``tokenizer.json`` or ``vocab.txt``).

    Raises:
        FileNotFoundError: the directory has no tokenizer files (transformers would silently build an
            empty tokenizer that maps everything to ``[UNK]``).
        ValueError: the vocabulary is larger than the model's embedding table.
    """
    from transformers import BertTokenizerFast

    model_dir = Path(model_dir)
    if not any((model_dir / name).is_file() for name in TOKENIZER_FILES):
        raise FileNotFoundError(
            f"{model_dir} has no tokenizer files ({' or '.join(TOKENIZER_FILES)}); the pretrain stage copies "
            f"them into its model directory - copy the vocab.txt the model was trained with there"
        )
    tokenizer = BertTokenizerFast.from_pretrained(str(model_dir))
    if vocab_size is not None and len(tokenizer) > vocab_size:
        raise ValueError(
            f"{model_dir}: the tokenizer has {len(tokenizer)} tokens but the model's vocab_size is {vocab_size}; "
            "use the vocab the model was pretrained with"
        )
    return tokenizer


def max_seq_length(spec: Any, settings: TaskSettings) -> int:
    """The task's input length in WordPiece tokens: the params' ``max_seq_length`` or the task's default."""
    return settings.max_seq_length or spec.max_seq_length


def encode(
    spec: Any, rows: list[dict[str, Any]], tokenizer: Any, settings: TaskSettings, *, training: bool = False
) -> list[dict[str, Any]]:
    """Features for canonical rows of ``spec``'s kind (see :mod:`bert_core.finetune.features`).

    ``training=True`` leaves out what only post-processing needs (SQuAD offsets).
    """
    max_len = max_seq_length(spec, settings)
    if spec.kind == "classification":
        return encode_sequence_pairs(rows, tokenizer, max_seq_length=max_len,
                                     label2id={lab: i for i, lab in enumerate(spec.labels)})  # fmt: skip
    if spec.kind == "regression":
        return encode_sequence_pairs(rows, tokenizer, max_seq_length=max_len, label2id=None)
    if spec.kind == "span_qa":
        return encode_squad(rows, tokenizer, max_seq_length=max_len, doc_stride=settings.doc_stride,
                            max_query_length=settings.max_query_length, with_offsets=not training)  # fmt: skip
    if spec.kind == "multiple_choice":
        return encode_multiple_choice(rows, tokenizer, max_seq_length=max_len)
    if spec.kind == "token_classification":
        return encode_token_classification(rows, tokenizer, max_seq_length=max_len,
                                           label2id={lab: i for i, lab in enumerate(spec.labels)})  # fmt: skip
    raise ValueError(f"unknown task kind {spec.kind!r}")


def autocast(device: torch.device, precision: str) -> contextlib.AbstractContextManager:
    """bf16 autocast on a CUDA device that has it (``precision`` auto/bf16), else nothing."""
    if device.type == "cuda" and precision in ("auto", "bf16") and torch.cuda.is_bf16_supported():
        return torch.autocast("cuda", dtype=torch.bfloat16)
    return contextlib.nullcontext()


@torch.no_grad()
def predict(
    model: nn.Module,
    features: list[dict[str, Any]],
    *,
    batch_size: int,
    device: torch.device | str = "cpu",
    precision: str = "auto",
) -> list[np.ndarray]:
    """Run the model over features; one float32 output per feature, in feature order, padding cut off.

    Returns:
        Per feature: (num_labels,) for sequence classification/regression, (num_choices,) for multiple
        choice, (L, num_labels) for token classification, (L, 2) start/end logits for span QA.
    """
    device = torch.device(device)
    was_training = model.training
    model.eval()
    out: list[np.ndarray | None] = [None] * len(features)
    try:
        for batch in make_loader(features, batch_size, shuffle=False):
            index = batch.pop("feature_index").tolist()
            inputs = {k: batch[k].to(device) for k in MODEL_INPUTS}
            with autocast(device, precision):
                result = model(**inputs)
            if hasattr(result, "start_logits"):
                logits = torch.stack([result.start_logits, result.end_logits], dim=-1)  # (B, T, 2)
            else:
                logits = result.logits  # (B, C) or (B, T, C)
            logits = logits.float().cpu().numpy()
            per_token = logits.ndim == 3
            lengths = batch["attention_mask"].sum(-1).tolist()
            for j, i in enumerate(index):
                out[i] = logits[j][: lengths[j]] if per_token else logits[j]
    finally:
        model.train(was_training)
    return out  # type: ignore[return-value]


@dataclass
class SplitScore:
    """Metrics and predictions of one split.

    Attributes:
        metrics: Numeric metrics (0-100), flat.
        details: Non-scalar results worth keeping (NER per-type scores).
        predictions: What :func:`write_predictions` writes (kind specific).
        extra: Recorded settings, e.g. the tuned ``null_threshold`` (SQuAD v2.0).
    """

    metrics: dict[str, float]
    details: dict[str, Any] = field(default_factory=dict)
    predictions: Any = None
    extra: dict[str, float] = field(default_factory=dict)


def _numeric(metrics: dict[str, Any]) -> dict[str, float]:
    return {
        k: float(v)
        for k, v in metrics.items()
        if k not in _NOT_METRICS and isinstance(v, int | float) and not isinstance(v, bool)
    }


def labelled(rows: list[dict[str, Any]], kind: str) -> bool:
    """Whether rows carry gold labels (test splits do not)."""
    if not rows:
        return False
    if kind == "span_qa":
        return True
    if kind == "token_classification":
        return rows[0].get("tags") is not None
    return rows[0].get("label") is not None


def score(
    spec: Any,
    rows: list[dict[str, Any]],
    features: list[dict[str, Any]],
    outputs: list[np.ndarray],
    settings: TaskSettings,
    *,
    null_threshold: float | None = None,
) -> SplitScore:
    """Post-process outputs into predictions and score them (no metrics for unlabelled rows).

    For SQuAD v2.0, ``null_threshold=None`` tunes the threshold on these rows (dev) and records it;
    a given threshold is applied as is.
    """
    from bert_core.metrics import glue_metrics, ner_metrics, squad_metrics

    has_gold = labelled(rows, spec.kind)
    if spec.kind in ("classification", "regression", "multiple_choice"):
        stacked = np.stack(outputs) if outputs else np.zeros((0, max(spec.num_labels, 1)))
        if spec.kind == "multiple_choice":
            preds, probs = postprocess.multiple_choice_predictions(stacked)
        else:
            preds = postprocess.classification_predictions(stacked, regression=spec.kind == "regression")
            probs = None
        metrics = {}
        if has_gold:
            refs = [r["label"] for r in rows]
            metrics = glue_metrics(spec.name, preds.tolist(), refs)
        return SplitScore(_numeric(metrics), predictions={"preds": preds, "probs": probs})
    if spec.kind == "token_classification":
        id2label = dict(enumerate(spec.labels))
        tags = postprocess.ner_word_tags(features, outputs, id2label, [len(r["tokens"]) for r in rows])
        if not has_gold:
            return SplitScore({}, predictions=tags)
        result = ner_metrics([r["tags"] for r in rows], tags)
        return SplitScore(_numeric(result), {"per_type": result.get("per_type", {})}, predictions=tags)
    if spec.kind == "span_qa":
        version_2 = spec.name == "squad_v2"
        squad = postprocess.squad_predictions(
            rows,
            features,
            [o[:, 0] for o in outputs],
            [o[:, 1] for o in outputs],
            n_best_size=settings.n_best_size,
            max_answer_length=settings.max_answer_length,
            version_2=version_2,
            null_threshold=null_threshold if null_threshold is not None else 0.0,
        )
        extra = {}
        if version_2:
            if null_threshold is None:
                f1 = {str(r["id"]): postprocess.answer_f1(squad.best_non_null[str(r["id"])], r["answers"]["text"])
                      for r in rows if r["answers"]["text"]}  # fmt: skip
                has = {str(r["id"]): bool(r["answers"]["text"]) for r in rows}
                null_threshold, _ = postprocess.tune_null_threshold(squad.null_odds, f1, has)
                squad = squad.with_threshold(null_threshold)
            extra["null_threshold"] = float(null_threshold)
            odds = {k: (v if math.isfinite(v) else 1e9) for k, v in squad.null_odds.items()}
            result = squad_metrics(rows, squad.predictions, version="squad_v2", na_probs=odds)
        else:
            result = squad_metrics(rows, squad.predictions, version="squad_v1")
        # best_* (the official threshold sweep) equal the tuned scores here: the threshold is tuned on dev.
        metrics = _numeric({k: v for k, v in result.items() if not k.startswith("best_")})
        return SplitScore(metrics, predictions=squad, extra=extra)
    raise ValueError(f"unknown task kind {spec.kind!r}")


def write_predictions(
    spec: Any, split: str, rows: list[dict[str, Any]], result: SplitScore, out_dir: str | Path
) -> dict[str, str]:
    """Write one split's predictions in the task's official format under ``out_dir``; return the paths."""
    out_dir = Path(out_dir)
    paths: dict[str, str] = {}
    ids = [r["id"] for r in rows]
    if spec.kind in ("classification", "regression"):
        preds = result.predictions["preds"].tolist()
        if split in spec.submission_files:  # a test split: the leaderboard's file name and format
            path = formats.write_glue_predictions(
                out_dir / "submission" / spec.submission_files[split], spec, ids, preds
            )
            paths[f"{split}.submission"] = str(path)
        else:
            path = formats.write_glue_predictions(out_dir / f"{split}_predictions.tsv", spec, ids, preds)
            paths[f"{split}.predictions"] = str(path)
    elif spec.kind == "multiple_choice":
        path = formats.write_multiple_choice_predictions(
            out_dir / f"{split}_predictions.csv",
            ids,
            result.predictions["preds"].tolist(),
            result.predictions["probs"],
        )
        paths[f"{split}.predictions"] = str(path)
    elif spec.kind == "token_classification":
        paths[f"{split}.predictions"] = str(
            formats.write_conll_predictions(out_dir / f"{split}_predictions.conll", rows, result.predictions)
        )
    elif spec.kind == "span_qa":
        squad = result.predictions
        written = formats.write_squad_predictions(
            out_dir / split, squad.predictions, null_odds=squad.null_odds if spec.name == "squad_v2" else None
        )
        paths.update({f"{split}.{k}": str(v) for k, v in written.items()})
    return paths
