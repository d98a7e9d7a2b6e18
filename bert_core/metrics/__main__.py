"""Score prediction files like the official scripts: ``python -m bert_core.metrics {squad,conll,glue} ...``.

* ``squad DATASET.json PREDICTIONS.json [--na-prob-file F] [--na-prob-thresh T]``: the official
  ``evaluate-v1.1.py`` / ``evaluate-v2.0.py`` scores (version from the dataset file); prints JSON with
  ``exact_match`` and ``f1`` (0-100), plus the official v2.0 fields for a v2.0 dataset.
* ``conll FILE``: conlleval's entity-level precision/recall/F1 of a file whose last two columns are the
  gold and the predicted tag; prints JSON with ``precision``, ``recall``, ``f1``, ``per_type``.
* ``glue TASK GOLD.tsv PRED.tsv``: GOLD is the task's official labelled TSV (e.g. ``glue/MRPC/dev.tsv``;
  for MNLI ``dev_matched.tsv``/``dev_mismatched.tsv``), PRED a GLUE-submission-style file
  (``index<TAB>prediction`` header, labels spelled as in the official files), matched by id (the file's
  index column, or the 0-based row number where the file has none).

Bad input prints ``error: ...`` naming the file (and line) and exits with status 2.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any


class CliError(Exception):
    """Bad command-line input; printed without a traceback."""


def _load_json(path: str, what: str) -> Any:
    p = Path(path)
    if not p.is_file():
        raise CliError(f"{path}: no such {what} file")
    try:
        with p.open(encoding="utf-8") as f:
            return json.load(f)
    except json.JSONDecodeError as err:
        raise CliError(f"{path}:{err.lineno}: {what} file is not valid JSON ({err.msg})") from None


def _squad(args: argparse.Namespace) -> dict[str, Any]:
    from bert_core.metrics.squad import gold_from_json, is_v2_dataset, squad_v1_evaluate, squad_v2_evaluate

    dataset = _load_json(args.dataset, "dataset")
    if not isinstance(dataset, dict) or not isinstance(dataset.get("data"), list):
        raise CliError(f"{args.dataset}: expected an object with a 'data' list (official SQuAD format)")
    try:
        gold = gold_from_json(dataset["data"])
    except (KeyError, TypeError) as err:
        raise CliError(f"{args.dataset}: malformed SQuAD dataset (missing field {err})") from None
    preds = _load_json(args.predictions, "predictions")
    if not isinstance(preds, dict) or not all(isinstance(v, str) for v in preds.values()):
        raise CliError(
            f"{args.predictions}: predictions must be a JSON object mapping question id -> answer text"
        )
    na_probs = None
    if args.na_prob_file:
        na_probs = _load_json(args.na_prob_file, "no-answer probability")
        if not isinstance(na_probs, dict) or not all(
            isinstance(v, (int, float)) and not isinstance(v, bool) for v in na_probs.values()
        ):
            raise CliError(f"{args.na_prob_file}: must be a JSON object mapping question id -> probability")
    v2 = is_v2_dataset(dataset) if args.version == "auto" else args.version == "v2.0"
    try:
        if v2:
            result = squad_v2_evaluate(gold, preds, na_probs, args.na_prob_thresh)
        else:
            if na_probs is not None:
                raise CliError("--na-prob-file applies to SQuAD v2.0 datasets only")
            result = squad_v1_evaluate(gold, preds)
    except ValueError as err:
        raise CliError(f"{args.dataset}: {err}") from None
    missing = result.pop("missing_ids")
    if missing:
        shown = ", ".join(missing[:5]) + (" ..." if len(missing) > 5 else "")
        print(f"{len(missing)} unanswered question(s) will receive score 0: {shown}", file=sys.stderr)
    return result


def _conll(args: argparse.Namespace) -> dict[str, Any]:
    from bert_core.metrics.ner import ConllFormatError, conll_file_metrics

    try:
        return conll_file_metrics(args.file)
    except ConllFormatError as err:
        raise CliError(str(err)) from None


def _read_glue_predictions(path: str) -> list[tuple[str, str, int]]:
    p = Path(path)
    if not p.is_file():
        raise CliError(f"{path}: no such predictions file")
    out = []
    with p.open(encoding="utf-8-sig", newline="\n") as f:
        for lineno, line in enumerate(f, start=1):
            fields = line.rstrip("\r\n").split("\t")
            if lineno == 1:
                if fields != ["index", "prediction"]:
                    raise CliError(
                        f"{path}:1: expected the header 'index<TAB>prediction', got {line.rstrip()!r}"
                    )
                continue
            if fields == [""]:
                continue
            if len(fields) != 2:
                raise CliError(f"{path}:{lineno}: expected 'index<TAB>prediction', got {line.rstrip()!r}")
            out.append((fields[0], fields[1], lineno))
    return out


def _glue(args: argparse.Namespace) -> dict[str, Any]:
    from bert_core.metrics.glue import glue_metrics
    from bert_core.tasks import GLUE_TASKS, TaskDataError, get_task
    from bert_core.tasks.glue import is_score_task, load_glue_tsv

    try:
        spec = get_task(args.task)
    except KeyError as err:
        raise CliError(str(err.args[0])) from None
    if spec.name not in GLUE_TASKS:
        raise CliError(f"{spec.name} is not a GLUE task")
    gold_path = Path(args.gold)
    if not gold_path.is_file():
        raise CliError(f"{args.gold}: no such gold file")
    try:
        rows = load_glue_tsv(spec, spec.dev_splits[0], gold_path)
    except TaskDataError as err:
        raise CliError(str(err)) from None
    gold = {r["id"]: r["label"] for r in rows}
    by_id: dict[str, Any] = {}
    for idx, value, lineno in _read_glue_predictions(args.predictions):
        if idx not in gold:
            raise CliError(f"{args.predictions}:{lineno}: id {idx!r} is not in {args.gold}")
        if is_score_task(spec):
            try:
                by_id[idx] = float(value)
            except ValueError:
                raise CliError(f"{args.predictions}:{lineno}: {value!r} is not a number") from None
        elif value in spec.submission_labels:
            by_id[idx] = spec.submission_labels.index(value)
        else:
            raise CliError(
                f"{args.predictions}:{lineno}: unknown label {value!r}; valid: {list(spec.submission_labels)}"
            )
    absent = [k for k in gold if k not in by_id]
    if absent:
        raise CliError(f"{args.predictions}: no prediction for {len(absent)} id(s), e.g. {absent[:3]}")
    ids = list(gold)
    return {**glue_metrics(spec.name, [by_id[k] for k in ids], [gold[k] for k in ids]), "total": len(ids)}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m bert_core.metrics", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("squad", help="official SQuAD v1.1 / v2.0 evaluation")
    p.add_argument("dataset", help="official-format dataset JSON (dev-v1.1.json, dev-v2.0.json)")
    p.add_argument("predictions", help="JSON object: question id -> answer text")
    p.add_argument("--na-prob-file", "-n", help="v2.0: JSON object: question id -> no-answer probability")
    p.add_argument(
        "--na-prob-thresh",
        "-t",
        type=float,
        default=1.0,
        help='v2.0: predict "" where the no-answer probability exceeds this (default 1.0)',
    )
    p.add_argument(
        "--version",
        choices=("auto", "v1.1", "v2.0"),
        default="auto",
        help="scoring rules (default: from the dataset file)",
    )
    p.set_defaults(func=_squad)
    p = sub.add_parser("conll", help="conlleval entity-level P/R/F1")
    p.add_argument("file", help="whitespace-separated columns; the last two are the gold and predicted tags")
    p.set_defaults(func=_conll)
    p = sub.add_parser("glue", help="official GLUE metric of a dev-set prediction file")
    p.add_argument("task", help="cola, sst2, mrpc, stsb, qqp, mnli, qnli, rte, wnli")
    p.add_argument("gold", help="the task's official labelled TSV")
    p.add_argument("predictions", help="index<TAB>prediction file (GLUE submission format)")
    p.set_defaults(func=_glue)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        result = args.func(args)
    except CliError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
