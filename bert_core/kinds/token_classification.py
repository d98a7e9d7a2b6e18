"""Token classification (CoNLL-2003 NER): a tag per word, read from its first sub-token (BERT paper §5.3).

Encoding: words are split into sub-tokens; only the first sub-token of a word carries its tag id, the
others and the special tokens carry :data:`~bert_core.constants.IGNORE_INDEX` (ignored by the loss);
``word_ids`` (L,) maps every position back to its word (``None`` for specials). Scored with conlleval's
entity-level precision/recall/F1; predictions are conlleval's ``token gold predicted`` file.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from bert_core.checks import Check
from bert_core.constants import IGNORE_INDEX
from bert_core.kinds.base import (
    Feature,
    FeatureError,
    KindSettings,
    Row,
    SplitScore,
    TaskKind,
    all_true,
    expectations,
    max_seq_length,
    numeric_metrics,
    strip_len,
)
from bert_core.tasks.registry import TaskSpec

if TYPE_CHECKING:
    from torch import nn


def encode_token_classification(
    examples: Sequence[Mapping[str, Any]],
    tokenizer: Any,
    *,
    max_seq_length: int,
    label2id: Mapping[str, int],
) -> list[Feature]:
    """Encode pre-split sentences for NER with first-sub-token labelling (BERT paper §5.3).

    Words beyond ``max_seq_length`` are cut (their predicted tag is ``O``, see :func:`ner_word_tags`);
    words that tokenise to nothing (e.g. a lone zero-width space) get no position either.

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


def ner_word_tags(
    features: Sequence[Mapping[str, Any]],
    logits: Sequence[np.ndarray],
    id2label: Mapping[int, str],
    num_words: Sequence[int],
    *,
    outside: str = "O",
) -> list[list[str]]:
    """Word-level tags from sub-token logits: each word takes the prediction of its first sub-token.

    Args:
        features: From :func:`encode_token_classification` (``word_ids``).
        logits: Per feature, a (L_f, num_labels) array (longer rows are cut to L_f).
        id2label: Class id -> tag.
        num_words: Words in each example; words with no sub-token (cut by ``max_seq_length``) get
            ``outside``.

    Returns:
        One list of tags per example, as long as its words.
    """
    out = []
    for feat, row, n in zip(features, logits, num_words):
        tags = [outside] * n
        arg = np.asarray(row)[: len(feat["word_ids"])].argmax(-1)
        previous = None
        for pos, w in enumerate(feat["word_ids"]):
            if w is not None and w != previous:
                tags[w] = id2label[int(arg[pos])]
            previous = w
        out.append(tags)
    return out


def conll_text(examples: Sequence[Mapping[str, Any]], predicted: Sequence[Sequence[str]]) -> str:
    """conlleval input: ``token gold predicted`` per word, sentences separated by an empty line."""
    lines = []
    for ex, tags in zip(examples, predicted):
        for token, gold, pred in zip(ex["tokens"], ex["tags"], tags):
            lines.append(f"{token} {gold} {pred}")
        lines.append("")
    return "\n".join(lines) + ("\n" if lines else "")


def write_conll_predictions(
    path: str | Path, examples: Sequence[Mapping[str, Any]], predicted: Sequence[Sequence[str]]
) -> Path:
    """Write :func:`conll_text` to ``path`` (``python -m bert_core.metrics conll FILE`` scores it)."""
    from bert_core.atomic import write_text_atomic

    return write_text_atomic(path, conll_text(examples, predicted))


class TokenClassification(TaskKind):
    """``token_classification``: an IOB2 tag per word (CoNLL-2003 NER)."""

    name = "token_classification"

    @property
    def model_class(self) -> type[nn.Module]:
        from bert_core.model import BertForTokenClassification

        return BertForTokenClassification

    def id2label(self, spec: TaskSpec) -> dict[int, str] | None:
        return dict(enumerate(spec.labels))

    def encode(
        self,
        spec: TaskSpec,
        rows: Sequence[Row],
        tokenizer: Any,
        settings: KindSettings,
        *,
        training: bool = False,
    ) -> list[Feature]:
        return encode_token_classification(
            rows,
            tokenizer,
            max_seq_length=max_seq_length(spec, settings),
            label2id={lab: i for i, lab in enumerate(spec.labels)},
        )

    def labelled(self, rows: Sequence[Row]) -> bool:
        return bool(rows) and rows[0].get("tags") is not None

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
        from bert_core.metrics import ner_metrics

        tags = ner_word_tags(
            features, outputs, dict(enumerate(spec.labels)), [len(r["tokens"]) for r in rows]
        )
        if not self.labelled(rows):
            return SplitScore({}, predictions=tags)
        result = ner_metrics([r["tags"] for r in rows], tags)
        return SplitScore(numeric_metrics(result), {"per_type": result.get("per_type", {})}, predictions=tags)

    def write_predictions(
        self, spec: TaskSpec, split: str, rows: Sequence[Row], result: SplitScore, out_dir: str | Path
    ) -> dict[str, str]:
        path = write_conll_predictions(Path(out_dir) / f"{split}_predictions.conll", rows, result.predictions)
        return {f"{split}.predictions": str(path)}

    def baselines(
        self, spec: TaskSpec, rows: Sequence[Row], *, train_rows: Sequence[Row]
    ) -> dict[str, dict[str, float]]:
        """``majority`` (every word ``O``) and ``lexicon``, CoNLL-2003's own baseline: the training rows'
        unambiguous entity phrases, longest first (:func:`bert_core.kinds.baselines.ner_baselines`)."""
        from bert_core.kinds.baselines import ner_baselines

        return ner_baselines(train_rows, rows)

    # -- serving
    def serving_inputs(self, spec: TaskSpec) -> list[tuple[str, str, bool]]:
        return [("text", "string", False), ("words", "string[]", False)]

    def serving_outputs(self, spec: TaskSpec) -> list[tuple[str, str, bool]]:
        return [("words", "string[]", True), ("tags", "string[]", True)]

    def serving_example(self, spec: TaskSpec) -> list[dict[str, Any]]:
        return [{"text": "EU rejects German call to boycott British lamb."}]

    def serve(
        self,
        spec: TaskSpec,
        records: Sequence[dict[str, Any]],
        tokenizer: Any,
        run: Any,
        settings: KindSettings,
        options: dict[str, Any],
    ) -> list[dict[str, Any]]:
        """``text`` (split into words as BERT's pre-tokenizer does: whitespace and punctuation) or ``words``
        (pre-split) -> ``words`` and their IOB2 ``tags`` (one per word)."""
        from bert_core.kinds.base import ServingInputError
        from bert_core.tasks.conll import iob1_to_iob2

        pre_tokenize = tokenizer.backend_tokenizer.pre_tokenizer.pre_tokenize_str
        rows = []
        for i, r in enumerate(records):
            text, words = r.get("text"), r.get("words")
            if (text is None) == (words is None):
                raise ServingInputError(f"record {i}: give exactly one of the fields 'text' and 'words'")
            tokens = [w for w, _ in pre_tokenize(text)] if text is not None else list(words)
            if not tokens:
                raise ServingInputError(f"record {i}: field 'text' has no words")
            rows.append({"id": i, "tokens": tokens})
        features = self.encode(spec, rows, tokenizer, settings)
        tags = ner_word_tags(
            features, run(features), dict(enumerate(spec.labels)), [len(r["tokens"]) for r in rows]
        )
        # A model can start a chunk with I-X; the answer is valid IOB2 (conlleval reads both the same way).
        return [{"words": r["tokens"], "tags": iob1_to_iob2(t)} for r, t in zip(rows, tags)]

    def frame_columns(self, spec: TaskSpec, row: Row) -> dict[str, Any]:
        return {
            "n_tokens": len(row["tokens"]),
            "tags_match_tokens": len(row["tags"]) == len(row["tokens"]),
            "min_token_len": min((strip_len(t) for t in row["tokens"]), default=0),
            "tags_in_label_set": all(t in spec.labels for t in row["tags"]),
        }

    def checks(self, spec: TaskSpec, labelled: bool) -> list[Check]:
        E = expectations()
        return [
            Check(E.ExpectColumnValuesToBeBetween(column="n_tokens", min_value=1)),
            all_true("tags_match_tokens"),
            all_true("tags_in_label_set"),
            Check(E.ExpectColumnValuesToBeBetween(column="min_token_len", min_value=1)),
        ]
