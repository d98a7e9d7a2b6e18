"""The reference side of the SQuAD benchmark: transformers' ``run_qa.py`` pre- and post-processing.

Written after ``examples/pytorch/question-answering/run_qa.py`` (``prepare_train_features``,
``prepare_validation_features``) and ``utils_qa.py`` (``postprocess_qa_predictions``, SQuAD v1.1 path) of
the transformers repository, on plain lists instead of ``datasets.Dataset.map`` (same tokenizer call,
same labelling and the same n-best search). Windows: ``truncation="only_second"`` with
``stride=doc_stride`` (transformers' stride is the *overlap* of two windows, Google's ``doc_stride`` the
step between their starts: the same nominal setting gives slightly different windows, and the bench
reports both feature counts). Padding is dynamic (run_qa's ``--pad_to_max_length False``), the faster
of run_qa's two modes.
"""

from __future__ import annotations

import collections
from collections.abc import Sequence
from typing import Any

import numpy as np


def _encode(rows: Sequence[dict[str, Any]], tokenizer: Any, max_seq_length: int, doc_stride: int) -> Any:
    return tokenizer(
        [str(r["question"]).lstrip() for r in rows],  # run_qa strips leading whitespace of questions
        [str(r["context"]) for r in rows],
        truncation="only_second",
        max_length=max_seq_length,
        stride=doc_stride,
        return_overflowing_tokens=True,
        return_offsets_mapping=True,
        padding=False,
    )


def prepare_train_features(
    rows: Sequence[dict[str, Any]], tokenizer: Any, max_seq_length: int, doc_stride: int
) -> list[dict[str, Any]]:
    """run_qa's training features: windows labelled with the answer's tokens, or [CLS] when outside."""
    enc = _encode(rows, tokenizer, max_seq_length, doc_stride)
    out = []
    for i, offsets in enumerate(enc["offset_mapping"]):
        input_ids = enc["input_ids"][i]
        cls_index = input_ids.index(tokenizer.cls_token_id)
        seq_ids = enc.sequence_ids(i)
        answers = rows[enc["overflow_to_sample_mapping"][i]]["answers"]
        start = end = cls_index
        if answers["answer_start"]:
            start_char = answers["answer_start"][0]
            end_char = start_char + len(answers["text"][0])
            first = 0
            while seq_ids[first] != 1:
                first += 1
            last = len(input_ids) - 1
            while seq_ids[last] != 1:
                last -= 1
            if offsets[first][0] <= start_char and offsets[last][1] >= end_char:
                while first < len(offsets) and offsets[first][0] <= start_char:
                    first += 1
                start = first - 1
                while offsets[last][1] >= end_char:
                    last -= 1
                end = last + 1
        out.append(
            {
                "input_ids": input_ids,
                "token_type_ids": enc["token_type_ids"][i],
                "attention_mask": enc["attention_mask"][i],
                "start_positions": start,
                "end_positions": end,
            }
        )
    return out


def prepare_validation_features(
    rows: Sequence[dict[str, Any]], tokenizer: Any, max_seq_length: int, doc_stride: int
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """run_qa's evaluation features: (model inputs, per feature ``example_id`` + ``offset_mapping``
    with ``None`` outside the context)."""
    enc = _encode(rows, tokenizer, max_seq_length, doc_stride)
    inputs, meta = [], []
    for i in range(len(enc["input_ids"])):
        seq_ids = enc.sequence_ids(i)
        inputs.append({k: enc[k][i] for k in ("input_ids", "token_type_ids", "attention_mask")})
        meta.append(
            {
                "example_id": rows[enc["overflow_to_sample_mapping"][i]]["id"],
                "offset_mapping": [
                    o if seq_ids[k] == 1 else None for k, o in enumerate(enc["offset_mapping"][i])
                ],
            }
        )
    return inputs, meta


def postprocess_qa_predictions(
    rows: Sequence[dict[str, Any]],
    meta: Sequence[dict[str, Any]],
    start_logits: np.ndarray,
    end_logits: np.ndarray,
    n_best_size: int = 20,
    max_answer_length: int = 30,
) -> dict[str, str]:
    """utils_qa's ``postprocess_qa_predictions`` for SQuAD v1.1: the best-scoring valid span per question.

    ``start_logits`` / ``end_logits`` are (features, T) as ``Trainer.predict`` returns them (batches padded
    with -100 to a common T); positions past a feature's ``offset_mapping`` are never chosen.
    """
    by_example = collections.defaultdict(list)
    index = {r["id"]: i for i, r in enumerate(rows)}
    for fi, m in enumerate(meta):
        by_example[index[m["example_id"]]].append(fi)
    answers = {}
    for ei, row in enumerate(rows):
        prelim = []
        for fi in by_example[ei]:
            s_log, e_log, offsets = start_logits[fi], end_logits[fi], meta[fi]["offset_mapping"]
            starts = np.argsort(s_log)[-1 : -n_best_size - 1 : -1].tolist()
            ends = np.argsort(e_log)[-1 : -n_best_size - 1 : -1].tolist()
            for s in starts:
                for e in ends:
                    if s >= len(offsets) or e >= len(offsets) or offsets[s] is None or offsets[e] is None:
                        continue
                    if e < s or e - s + 1 > max_answer_length:
                        continue
                    prelim.append((float(s_log[s] + e_log[e]), offsets[s][0], offsets[e][1]))
        best = sorted(prelim, key=lambda p: p[0], reverse=True)[:n_best_size]
        # utils_qa answers "empty" when no valid span exists (a string that scores 0)
        answers[row["id"]] = row["context"][best[0][1] : best[0][2]] if best else "empty"
    return answers
