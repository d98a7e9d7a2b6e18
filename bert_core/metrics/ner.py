"""Entity-level NER precision/recall/F1 as CoNLL's ``conlleval`` computes them.

``conlleval`` (Tjong Kim Sang, CoNLL-2000/2003) finds chunks in the gold and the predicted tag streams and
counts a predicted chunk as correct when a gold chunk has the same type, start and end. Its chunk-boundary
rules accept IOB1 (``I-`` starts a chunk after ``O`` or another type; ``B-`` only separates two adjacent
chunks of one type, as in the original ``eng.*`` files) and IOB2 (every chunk starts with ``B-``) alike.
seqeval's default (non-strict) mode ports those rules (``get_entities``), so the chunks come from seqeval.

Precision = correct / predicted chunks, recall = correct / gold chunks, F1 their harmonic mean, all 0-100
and 0 when undefined, overall and per entity type (conlleval's ``FB1``). ``accuracy`` is conlleval's token
accuracy (a token is right when its full tag matches). Tests pin agreement with the Perl script.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any


class ConllFormatError(ValueError):
    """A CoNLL evaluation file that cannot be scored; the message names the file and line."""


def _prf(correct: int, n_pred: int, n_gold: int) -> tuple[float, float, float]:
    precision = 100.0 * correct / n_pred if n_pred else 0.0
    recall = 100.0 * correct / n_gold if n_gold else 0.0
    f1 = 2 * precision * recall / (precision + recall) if precision + recall > 0 else 0.0
    return precision, recall, f1


def ner_metrics(references: Sequence[Sequence[str]], predictions: Sequence[Sequence[str]]) -> dict[str, Any]:
    """conlleval's entity-level scores for tag sequences (IOB1 or IOB2, may be mixed).

    Args:
        references: Gold tags, one list per sentence (e.g. ``["B-PER", "I-PER", "O"]``).
        predictions: Predicted tags, same shapes.

    Returns:
        ``precision``, ``recall``, ``f1``, ``accuracy`` (0-100), ``n_gold``, ``n_pred``, ``n_correct``
        (chunk counts), ``n_tokens``, and ``per_type``: ``{TYPE: {precision, recall, f1, n_gold, n_pred,
        n_correct}}`` for every type seen on either side, sorted by name.

    Raises:
        ValueError: the two sides differ in sentence count or in a sentence's length.
    """
    from seqeval.metrics.sequence_labeling import get_entities

    if len(references) != len(predictions):
        raise ValueError(f"{len(references)} gold sentences but {len(predictions)} predicted sentences")
    n_tokens = 0
    correct_tags = 0
    for i, (gold, pred) in enumerate(zip(references, predictions)):
        if len(gold) != len(pred):
            raise ValueError(f"sentence {i}: {len(gold)} gold tags but {len(pred)} predicted tags")
        n_tokens += len(gold)
        correct_tags += sum(g == p for g, p in zip(gold, pred))
    # get_entities joins sentences with an "O" boundary, as conlleval does with its empty lines.
    gold_chunks = set(get_entities([list(s) for s in references]))
    pred_chunks = set(get_entities([list(s) for s in predictions]))
    right = gold_chunks & pred_chunks
    n_gold = Counter(t for t, _, _ in gold_chunks)
    n_pred = Counter(t for t, _, _ in pred_chunks)
    n_right = Counter(t for t, _, _ in right)

    precision, recall, f1 = _prf(len(right), len(pred_chunks), len(gold_chunks))
    # Counted here, not with seqeval's classification_report(output_dict=True): that report carries
    # precision, recall, F1 and the gold count only, and the predicted/correct counts per type (conlleval
    # prints them; the report and tests use them) cannot be recovered from it for a type with no gold chunk.
    per_type = {}
    for etype in sorted(set(n_gold) | set(n_pred)):
        p, r, f = _prf(n_right[etype], n_pred[etype], n_gold[etype])
        per_type[etype] = {
            "precision": p,
            "recall": r,
            "f1": f,
            "n_gold": n_gold[etype],
            "n_pred": n_pred[etype],
            "n_correct": n_right[etype],
        }
    return {
        "precision": precision,
        "recall": recall,
        "f1": f1,
        "accuracy": 100.0 * correct_tags / n_tokens if n_tokens else 0.0,
        "n_gold": len(gold_chunks),
        "n_pred": len(pred_chunks),
        "n_correct": len(right),
        "n_tokens": n_tokens,
        "per_type": per_type,
    }


def read_conll_eval_file(path: str | Path, boundary: str = "-X-") -> tuple[list[list[str]], list[list[str]]]:
    """Read a conlleval input file: whitespace-separated columns, gold and predicted tag last.

    Sentences end at empty lines or at lines whose first field is ``boundary`` (conlleval's ``-X-``).
    ``-DOCSTART-`` lines are ordinary ``O``/``O`` tokens, as conlleval counts them.

    Returns:
        ``(gold_sentences, predicted_sentences)``.

    Raises:
        ConllFormatError: naming the file and line: fewer than 3 fields (token, gold, prediction), or a
            field count that differs from the first line's (conlleval rejects both).
    """
    path = Path(path)
    if not path.is_file():
        raise ConllFormatError(f"{path}: no such file")
    gold: list[list[str]] = []
    pred: list[list[str]] = []
    cur_g: list[str] = []
    cur_p: list[str] = []
    n_fields = None
    with path.open(encoding="utf-8", newline="\n") as f:
        for lineno, line in enumerate(f, start=1):
            fields = line.rstrip("\r\n").split()
            if not fields or fields[0] == boundary:
                if cur_g:
                    gold.append(cur_g)
                    pred.append(cur_p)
                    cur_g, cur_p = [], []
                continue
            if len(fields) < 3:
                raise ConllFormatError(
                    f"{path}:{lineno}: expected a token followed by gold and predicted tags (at least 3 "
                    f"whitespace-separated fields), got {len(fields)}: {line.rstrip()!r}"
                )
            if n_fields is None:
                n_fields = len(fields)
            elif len(fields) != n_fields:
                raise ConllFormatError(
                    f"{path}:{lineno}: {len(fields)} fields but earlier lines have {n_fields}: {line.rstrip()!r}"
                )
            cur_g.append(fields[-2])
            cur_p.append(fields[-1])
    if cur_g:
        gold.append(cur_g)
        pred.append(cur_p)
    if not gold:
        raise ConllFormatError(f"{path}: no tokens found")
    return gold, pred


def conll_file_metrics(path: str | Path) -> dict[str, Any]:
    """Score a conlleval-format file (last two columns gold, predicted) with :func:`ner_metrics`."""
    gold, pred = read_conll_eval_file(path)
    return ner_metrics(gold, pred)
