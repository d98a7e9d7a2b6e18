"""Prediction files in the tasks' official formats, each written atomically.

- SQuAD: ``predictions.json`` ``{question id: answer text}`` (what the official ``evaluate-v1.1.py`` /
  ``evaluate-v2.0.py`` read), for v2.0 also ``null_odds.json`` (the ``--na-prob-file``), and optionally
  ``nbest_predictions.json`` as Google's ``run_squad.py`` writes it.
- CoNLL-2003: one ``token gold predicted`` line per word, an empty line between sentences (conlleval's
  input; ``python -m bert_core.metrics conll FILE`` scores it).
- GLUE: ``index<TAB>prediction`` with the official label strings (the leaderboard submission format;
  dev predictions use the same layout so any of them can be diffed or re-scored).
- SWAG: ``id,pred`` CSV plus the four choice probabilities.
"""

from __future__ import annotations

import csv
import io
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from bert_core.atomic import write_json_atomic, write_text_atomic


def write_squad_predictions(
    out_dir: str | Path,
    predictions: Mapping[str, str],
    *,
    null_odds: Mapping[str, float] | None = None,
    nbest: Mapping[str, Any] | None = None,
) -> dict[str, Path]:
    """Write ``predictions.json`` (+ ``null_odds.json``, ``nbest_predictions.json``) into ``out_dir``."""
    out_dir = Path(out_dir)
    paths = {"predictions": write_json_atomic(out_dir / "predictions.json", dict(predictions))}
    if null_odds is not None:
        # JSON has no infinity: a question without any valid span gets a large finite odds value.
        finite = {k: (v if np.isfinite(v) else 1e9) for k, v in null_odds.items()}
        paths["null_odds"] = write_json_atomic(out_dir / "null_odds.json", finite)
    if nbest is not None:
        paths["nbest"] = write_json_atomic(out_dir / "nbest_predictions.json", dict(nbest))
    return paths


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
    """Write :func:`conll_text` to ``path``."""
    return write_text_atomic(path, conll_text(examples, predicted))


def write_glue_predictions(
    path: str | Path, spec: Any, ids: Sequence[str], predictions: Sequence[Any]
) -> Path:
    """Write a GLUE ``index<TAB>prediction`` file (label strings; STS-B scores clipped to [0, 5])."""
    from bert_core.tasks.glue import glue_submission_text

    return write_text_atomic(path, glue_submission_text(spec, list(ids), list(predictions)))


def write_multiple_choice_predictions(
    path: str | Path, ids: Sequence[str], choices: Sequence[int], probabilities: np.ndarray
) -> Path:
    """Write SWAG predictions: ``id,pred,prob0,...`` CSV."""
    probabilities = np.asarray(probabilities)
    n = probabilities.shape[1] if probabilities.ndim == 2 else 0
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow(["id", "pred", *(f"prob{i}" for i in range(n))])
    for qid, choice, probs in zip(ids, choices, probabilities):
        writer.writerow([str(qid), int(choice), *(f"{p:.6f}" for p in probs)])
    return write_text_atomic(path, buf.getvalue())
