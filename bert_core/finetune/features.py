"""Examples -> model features, one encoder per task kind (BERT paper §4, Figure 4).

Every encoder takes examples in the canonical schemas of :mod:`bert_core.tasks` and returns a list of
:class:`dict` features holding *unpadded* Python lists; :mod:`bert_core.finetune.collate` pads each batch
to its own longest sequence. Shapes below are per feature (``L`` = its own length <= ``max_seq_length``).

- ``classification`` / ``regression``: ``[CLS] A [SEP] (B [SEP])``; ``input_ids`` (L,), ``token_type_ids``
  (L,), ``labels`` an int class id (float for regression), absent for unlabelled (test) examples.
- ``span_qa`` (SQuAD): ``[CLS] question [SEP] context-window [SEP]`` with Google's sliding windows: the
  question is cut to ``max_query_length`` tokens, a window starts every ``doc_stride`` context tokens, and
  each token remembers whether this window gives it the most context (``token_is_max_context`` in
  Google's ``run_squad.py``). ``offsets`` (L,) maps context tokens to ``(char_start, char_end)`` of the
  original context (``None`` elsewhere), so answers are sliced from the original text, not re-detokenised.
  Training targets ``start_positions`` / ``end_positions`` point at the answer's tokens, or at ``[CLS]``
  (index 0) when the window does not contain the whole answer or the question is unanswerable.
- ``multiple_choice`` (SWAG): four ``[CLS] context [SEP] start + ending [SEP]`` rows; ``input_ids`` (4, L).
- ``token_classification`` (CoNLL NER): words are split into sub-tokens; only the first sub-token of a
  word carries its tag id, the others and the special tokens carry ``-100`` (ignored by the loss).
  ``word_ids`` (L,) maps every position back to its word (``None`` for specials).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any

log = logging.getLogger(__name__)

IGNORE_INDEX = -100
Feature = dict[str, Any]


class FeatureError(ValueError):
    """An example cannot be turned into features; the message names the example and what is wrong."""


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


def encode_token_classification(
    examples: Sequence[Mapping[str, Any]],
    tokenizer: Any,
    *,
    max_seq_length: int,
    label2id: Mapping[str, int],
) -> list[Feature]:
    """Encode pre-split sentences for NER with first-sub-token labelling (BERT paper §5.3).

    Words beyond ``max_seq_length`` are cut (their predicted tag is ``O``, see
    :func:`bert_core.finetune.postprocess.ner_word_tags`); words that tokenise to nothing (e.g. a lone
    zero-width space) get no position either.

    Args:
        examples: ``{"id", "tokens": [words], "tags": [tag strings]}``.
        label2id: Tag string -> class id.

    Returns:
        One feature per example: ``input_ids`` (L,), ``token_type_ids`` (L,), ``labels`` (L,) with the tag
        id on first sub-tokens and ``-100`` elsewhere, ``word_ids`` (L,).
    """
    if not examples:
        return []
    words = [[str(w) for w in ex["tokens"]] for ex in examples]
    enc = tokenizer(
        words,
        is_split_into_words=True,
        truncation=True,
        max_length=max_seq_length,
        padding=False,
        return_attention_mask=False,
        return_token_type_ids=True,
    )
    features = []
    for i, ex in enumerate(examples):
        tags = ex.get("tags")
        if tags is not None and len(tags) != len(words[i]):
            raise FeatureError(f"example {ex.get('id')!r} has {len(words[i])} tokens but {len(tags)} tags")
        word_ids = enc.word_ids(i)
        labels, previous = [], None
        for w in word_ids:
            if w is None or w == previous or tags is None:
                labels.append(IGNORE_INDEX)
            else:
                tag = str(tags[w])
                if tag not in label2id:
                    raise FeatureError(
                        f"example {ex.get('id')!r}: tag {tag!r} of word {w} is not one of {sorted(label2id)}"
                    )
                labels.append(label2id[tag])
            previous = w
        feat: Feature = {
            "input_ids": enc["input_ids"][i],
            "token_type_ids": enc["token_type_ids"][i],
            "word_ids": word_ids,
        }
        if tags is not None:
            feat["labels"] = labels
        features.append(feat)
    return features


def _windows(num_tokens: int, max_tokens: int, doc_stride: int) -> list[tuple[int, int]]:
    """Google's ``doc_spans``: (start, length) windows, a new one every ``doc_stride`` tokens."""
    spans, start = [], 0
    while start < num_tokens:
        length = min(num_tokens - start, max_tokens)
        spans.append((start, length))
        if start + length == num_tokens:
            break
        start += min(length, doc_stride)
    return spans or [(0, 0)]


def _is_max_context(spans: list[tuple[int, int]], index: int, position: int) -> bool:
    """Whether window ``index`` gives token ``position`` the most context (min of left/right + 0.01 len)."""
    best_score, best_index = None, None
    for i, (start, length) in enumerate(spans):
        end = start + length - 1
        if position < start or position > end:
            continue
        score = min(position - start, end - position) + 0.01 * length
        if best_score is None or score > best_score:
            best_score, best_index = score, i
    return best_index == index


def encode_squad(
    examples: Sequence[Mapping[str, Any]],
    tokenizer: Any,
    *,
    max_seq_length: int = 384,
    doc_stride: int = 128,
    max_query_length: int = 64,
    with_offsets: bool = True,
) -> list[Feature]:
    """Encode SQuAD examples into sliding-window features (Google's ``convert_examples_to_features``).

    Args:
        examples: ``{"id", "context", "question", "answers": {"text", "answer_start"}, "is_impossible"}``.
            The first answer is the training target.
        max_seq_length: Window length including ``[CLS]``, the question, and two ``[SEP]``.
        doc_stride: Context tokens between the starts of two windows.
        max_query_length: The question is cut to this many tokens.
        with_offsets: Keep ``offsets`` and ``max_context`` (needed to post-process predictions; training
            features leave them out, which saves several GB on the full SQuAD train set).

    Returns:
        Features (one or more per example): ``input_ids`` (L,), ``token_type_ids`` (L,), ``example_index``,
        ``offsets`` (L,) (``(start_char, end_char)`` for context tokens, else ``None``), ``max_context``
        (L,) bools, ``start_positions`` / ``end_positions`` (token indices; 0 = no answer in window).
    """
    if not examples:
        return []
    cls_id, sep_id = tokenizer.cls_token_id, tokenizer.sep_token_id
    questions = [str(e["question"]).lstrip() for e in examples]
    contexts = [str(e["context"]) for e in examples]
    q_enc = tokenizer(questions, add_special_tokens=False, return_attention_mask=False,
                      return_token_type_ids=False)["input_ids"]  # fmt: skip
    # Many questions share a paragraph: tokenise each distinct context once.
    unique = list(dict.fromkeys(contexts))
    c_enc = tokenizer(unique, add_special_tokens=False, return_offsets_mapping=True,
                      return_attention_mask=False, return_token_type_ids=False)  # fmt: skip
    by_context = {c: (ids, offs) for c, ids, offs in zip(unique, c_enc["input_ids"], c_enc["offset_mapping"])}
    features: list[Feature] = []
    for ei, ex in enumerate(examples):
        q_ids = q_enc[ei][:max_query_length]
        c_ids, c_offs = by_context[contexts[ei]]
        max_tokens = max_seq_length - len(q_ids) - 3
        if max_tokens < 1:
            raise FeatureError(
                f"max_seq_length={max_seq_length} leaves no room for the context after a question of "
                f"{len(q_ids)} tokens (max_query_length={max_query_length}): raise max_seq_length"
            )
        answer_tokens = _answer_token_span(ex, c_offs)
        spans = _windows(len(c_ids), max_tokens, doc_stride)
        for si, (start, length) in enumerate(spans):
            head = [cls_id, *q_ids, sep_id]
            window = list(range(start, start + length))
            input_ids = head + [c_ids[t] for t in window] + [sep_id]
            start_pos = end_pos = 0
            if answer_tokens is not None:
                a_start, a_end = answer_tokens
                if start <= a_start and a_end <= start + length - 1:
                    start_pos = a_start - start + len(head)
                    end_pos = a_end - start + len(head)
            feature: Feature = {
                "input_ids": input_ids,
                "token_type_ids": [0] * len(head) + [1] * (length + 1),
                "example_index": ei,
                "start_positions": start_pos,
                "end_positions": end_pos,
            }
            if with_offsets:
                feature["offsets"] = [None] * len(head) + [tuple(c_offs[t]) for t in window] + [None]
                feature["max_context"] = (
                    [False] * len(head) + [_is_max_context(spans, si, t) for t in window] + [False]
                )
            features.append(feature)
    return features


def _answer_token_span(
    example: Mapping[str, Any], offsets: Sequence[Sequence[int]]
) -> tuple[int, int] | None:
    """Token indices (first, last) of the example's first answer in its context; None if unanswerable."""
    answers = example.get("answers") or {}
    texts, starts = list(answers.get("text") or []), list(answers.get("answer_start") or [])
    if example.get("is_impossible") or not texts:
        return None
    char_start = int(starts[0])
    char_end = char_start + len(texts[0])  # exclusive
    first = last = None
    for t, (s, e) in enumerate(offsets):
        if first is None and e > char_start:
            first = t
        if s < char_end:
            last = t
    if first is None or last is None or last < first:
        log.warning("example %r: answer %r not found in its context tokens; trained as no-answer",
                    example.get("id"), texts[0])  # fmt: skip
        return None
    return first, last
