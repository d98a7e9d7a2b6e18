"""Span question answering (SQuAD v1.1 / v2.0): the answer is a span of the context (BERT paper §4.2-4.3).

Encoding follows Google's ``run_squad.py``: ``[CLS] question [SEP] context-window [SEP]`` with sliding
windows: the question is cut to ``max_query_length`` tokens, a window starts every ``doc_stride`` context
tokens, and each token remembers whether this window gives it the most context (``token_is_max_context``).
``offsets`` (L,) maps context tokens to ``(char_start, char_end)`` of the original context (``None``
elsewhere), so answers are sliced from the original text, not re-detokenised. Training targets
``start_positions`` / ``end_positions`` point at the answer's tokens, or at ``[CLS]`` (index 0) when the
window does not contain the whole answer or the question is unanswerable.

Post-processing follows ``write_predictions`` of the same script: for every window of an example, the
``n_best_size`` highest start and end logits are paired; a pair is kept when both ends are context tokens,
the start token has its maximal context in that window, ``end >= start`` and the span has at most
``max_answer_length`` tokens. For SQuAD v2.0 the null score is the smallest ``start[CLS] + end[CLS]`` over
the windows, and the answer is empty when ``null_score - best_span_score`` (the *null odds*) exceeds a
threshold tuned on dev (:func:`tune_null_threshold`, the official ``find_best_thresh``) and recorded with
the metrics: a fixed threshold gives wrong scores.

Scores are the official SQuAD scripts'; predictions are ``predictions.json`` (what ``evaluate-v1.1.py`` /
``evaluate-v2.0.py`` read) and, for v2.0, ``null_odds.json`` (their ``--na-prob-file``).
"""

from __future__ import annotations

import logging
import math
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
    all_true,
    max_seq_length,
    nonempty,
    numeric_metrics,
    strip_len,
)
from bert_core.kinds.squad_post import (
    answer_f1,
    squad_predictions,
    tune_null_threshold,
    write_squad_predictions,
)
from bert_core.progress import Progress
from bert_core.tasks.registry import TaskSpec

if TYPE_CHECKING:
    from torch import nn

log = logging.getLogger(__name__)


# ---------------------------------------------------------------------- encoding
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
    label: str | None = None,
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
        label: Log the progress of a long encoding under this name (examples done / total, ETA).

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
    # Whole contexts (and questions) are longer than the model's limit by design, cut into windows below:
    # verbose=False spares transformers' warning that such a sequence "will result in indexing errors".
    q_enc = tokenizer(
        questions,
        add_special_tokens=False,
        return_attention_mask=False,
        return_token_type_ids=False,
        verbose=False,
    )["input_ids"]
    # Many questions share a paragraph: tokenise each distinct context once.
    unique = list(dict.fromkeys(contexts))
    c_enc = tokenizer(
        unique,
        add_special_tokens=False,
        return_offsets_mapping=True,
        return_attention_mask=False,
        return_token_type_ids=False,
        verbose=False,
    )
    by_context = {c: (ids, offs) for c, ids, offs in zip(unique, c_enc["input_ids"], c_enc["offset_mapping"])}
    features: list[Feature] = []
    progress = (
        Progress(
            label, len(examples), noun="example", logger=log, detail=lambda _: f"{len(features)} features"
        )
        if label
        else None
    )
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
        if progress is not None:
            progress.advance(1)
    if progress is not None:
        progress.finish()
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
        log.warning(
            "example %r: answer %r not found in its context tokens; trained as no-answer",
            example.get("id"),
            texts[0],
        )
        return None
    return first, last


# ---------------------------------------------------------------------- the kind
class SpanQA(TaskKind):
    """``span_qa``: start/end logits per token; the answer is the best-scoring context span (SQuAD)."""

    name = "span_qa"

    @property
    def model_class(self) -> type[nn.Module]:
        from bert_core.model import BertForQuestionAnswering

        return BertForQuestionAnswering

    def num_labels(self, spec: TaskSpec) -> int:
        return 2  # start and end logits

    def encode(
        self,
        spec: TaskSpec,
        rows: Sequence[Row],
        tokenizer: Any,
        settings: KindSettings,
        *,
        training: bool = False,
    ) -> list[Feature]:
        return encode_squad(
            rows,
            tokenizer,
            max_seq_length=max_seq_length(spec, settings),
            doc_stride=settings.doc_stride,
            max_query_length=settings.max_query_length,
            with_offsets=not training,
            label=f"{spec.name} {'train' if training else 'eval'} features",
        )

    def labelled(self, rows: Sequence[Row]) -> bool:
        return bool(rows)  # every SQuAD split we read is labelled

    @staticmethod
    def version_2(spec: TaskSpec) -> bool:
        """Whether the task allows unanswerable questions (SQuAD v2.0)."""
        return spec.no_answers

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
        """Answers and official scores; for v2.0, ``null_threshold=None`` tunes it on these rows (dev)."""
        from bert_core.metrics import squad_metrics

        version_2 = self.version_2(spec)
        squad = squad_predictions(
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
                f1 = {
                    str(r["id"]): answer_f1(squad.best_non_null[str(r["id"])], r["answers"]["text"])
                    for r in rows
                    if r["answers"]["text"]
                }
                has = {str(r["id"]): bool(r["answers"]["text"]) for r in rows}
                null_threshold, _ = tune_null_threshold(squad.null_odds, f1, has)
                squad = squad.with_threshold(null_threshold)
            extra["null_threshold"] = float(null_threshold)
            odds = {k: (v if math.isfinite(v) else 1e9) for k, v in squad.null_odds.items()}
            result = squad_metrics(rows, squad.predictions, version="squad_v2", na_probs=odds)
        else:
            result = squad_metrics(rows, squad.predictions, version="squad_v1")
        # best_* (the official threshold sweep) equal the tuned scores here: the threshold is tuned on dev.
        metrics = numeric_metrics({k: v for k, v in result.items() if not k.startswith("best_")})
        return SplitScore(metrics, predictions=squad, extra=extra)

    def write_predictions(
        self, spec: TaskSpec, split: str, rows: Sequence[Row], result: SplitScore, out_dir: str | Path
    ) -> dict[str, str]:
        squad = result.predictions
        odds = squad.null_odds if self.version_2(spec) else None
        written = write_squad_predictions(Path(out_dir) / split, squad.predictions, null_odds=odds)
        return {f"{split}.{k}": str(v) for k, v in written.items()}

    def baselines(
        self, spec: TaskSpec, rows: Sequence[Row], *, train_rows: Sequence[Row]
    ) -> dict[str, dict[str, float]]:
        """The overlap-sentence baseline, and for v2.0 the all-empty one (:mod:`bert_core.kinds.squad_baselines`);
        neither learns, so ``train_rows`` is not read."""
        from bert_core.kinds.squad_baselines import squad_baselines

        return squad_baselines(rows, version_2=self.version_2(spec), metric_keys=spec.metric_keys)

    # -- serving
    def serving_inputs(self, spec: TaskSpec) -> list[tuple[str, str, bool]]:
        return [("question", "string", True), ("context", "string", True)]

    def serving_outputs(self, spec: TaskSpec) -> list[tuple[str, str, bool]]:
        return [
            ("answer", "string", True),
            ("start", "long", True),
            ("end", "long", True),
            ("score", "double", True),
        ]

    def serving_example(self, spec: TaskSpec) -> list[dict[str, Any]]:
        return [
            {
                "question": "Which NFL team represented the AFC at Super Bowl 50?",
                "context": "Super Bowl 50 was an American football game. The American Football Conference "
                "(AFC) champion Denver Broncos defeated the National Football Conference (NFC) "
                "champion Carolina Panthers 24-10 to earn their third Super Bowl title.",
            }
        ]

    def serve(
        self,
        spec: TaskSpec,
        records: Sequence[dict[str, Any]],
        tokenizer: Any,
        run: Any,
        settings: KindSettings,
        options: dict[str, Any],
    ) -> list[dict[str, Any]]:
        """``question`` + ``context`` (any length: sliding windows every ``doc_stride`` tokens) -> ``answer``
        (a slice of the context), ``start`` / ``end`` (its character offsets, end exclusive) and ``score``
        (its probability among the n best). SQuAD v2.0 models answer "" (``start`` = ``end`` = -1) when the
        null odds exceed the threshold tuned on dev (``options["null_threshold"]``)."""
        rows = [
            {
                "id": str(i),
                "question": r["question"],
                "context": r["context"],
                "answers": {"text": [], "answer_start": []},
                "is_impossible": False,
            }
            for i, r in enumerate(records)
        ]
        features = self.encode(spec, rows, tokenizer, settings)
        outputs = run(features)
        threshold = options.get("null_threshold")
        squad = squad_predictions(
            rows,
            features,
            [o[:, 0] for o in outputs],
            [o[:, 1] for o in outputs],
            n_best_size=settings.n_best_size,
            max_answer_length=settings.max_answer_length,
            version_2=self.version_2(spec),
            null_threshold=0.0 if threshold is None else float(threshold),
        )
        out = []
        for row in rows:
            answer = squad.predictions[row["id"]]
            best = next((c for c in squad.nbest[row["id"]] if c["text"] == answer), None)
            if best is None or not answer:
                out.append(
                    {
                        "answer": "",
                        "start": -1,
                        "end": -1,
                        "score": float(best["probability"]) if best else 0.0,
                    }
                )
            else:
                out.append(
                    {
                        "answer": answer,
                        "start": best["start_char"],
                        "end": best["end_char"],
                        "score": float(best["probability"]),
                    }
                )
        return out

    def frame_columns(self, spec: TaskSpec, row: Row) -> dict[str, Any]:
        ctx, ans = row["context"], row["answers"]
        return {
            "context_len": strip_len(ctx),
            "question_len": strip_len(row["question"]),
            "answers_at_offsets": len(ans["text"]) == len(ans["answer_start"])
            and all(
                isinstance(s, int) and s >= 0 and ctx[s : s + len(t)] == t
                for t, s in zip(ans["text"], ans["answer_start"])
            ),
            # An answerable question has answers, an impossible one has none.
            "answers_match_is_impossible": bool(ans["text"]) != bool(row["is_impossible"]),
        }

    def checks(self, spec: TaskSpec, labelled: bool) -> list[Check]:
        return [
            nonempty("context_len"),
            nonempty("question_len"),
            all_true("answers_at_offsets"),
            all_true("answers_match_is_impossible"),
        ]
