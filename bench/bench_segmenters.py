"""Sentence segmenters compared on the project's real text: speed (MB/s) and boundary quality.

Candidates (all offline): BlingFire (the default), pySBD, syntok and sentencex. Only BlingFire is a project
dependency; install the others anywhere on ``sys.path`` for the measurement, e.g. without touching the
project environment::

    .venv/bin/pip install --target /tmp/segbench_pkgs pysbd syntok sentencex
    SEGBENCH_PATH=/tmp/segbench_pkgs .venv/bin/python bench/bench_segmenters.py \\
        --data-root ../shared/data --speed-mb 2

Quality: ``bench/segmenter_gold.jsonl`` holds 120 paragraphs of the corpus (40 Gutenberg, 40 Wikipedia,
40 chosen for abbreviations/initials/decimals/quotes) with hand-checked sentence boundaries. Each
segmenter's boundaries (character offsets between sentences) are scored by precision/recall/F1, and
the share of paragraphs segmented exactly right. ``--review`` prints paragraphs where segmenters disagree
with the gold (used to check the annotation).
Speed: the first ``--speed-mb`` MB of corpus paragraphs (Gutenberg and Wikipedia interleaved), one call per
paragraph as the corpus stage makes them; slow segmenters are timed on a prefix and reported in MB/s.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path

for extra in filter(None, os.environ.get("SEGBENCH_PATH", "").split(os.pathsep)):
    sys.path.append(extra)

from bert_core.corpus.clean import normalize_text, paragraphs, strip_gutenberg  # noqa: E402

GOLD = Path(__file__).with_name("segmenter_gold.jsonl")


def load_segmenters() -> dict[str, Callable[[str], list[str]]]:
    segs: dict[str, Callable[[str], list[str]]] = {}
    from blingfire import text_to_sentences

    segs["blingfire"] = lambda t: text_to_sentences(t).split("\n")
    try:
        import pysbd

        seg = pysbd.Segmenter(language="en", clean=False)
        segs["pysbd"] = seg.segment
    except ImportError:
        print("pysbd not installed: skipped", file=sys.stderr)
    try:
        import syntok.segmenter as sg

        segs["syntok"] = lambda t: [
            "".join(tok.spacing + tok.value for tok in sent) for para in sg.analyze(t) for sent in para
        ]
    except ImportError:
        print("syntok not installed: skipped", file=sys.stderr)
    try:
        import sentencex

        segs["sentencex"] = lambda t: list(sentencex.segment("en", t))
    except ImportError:
        print("sentencex not installed: skipped", file=sys.stderr)
    return segs


def boundaries(text: str, sentences: list[str]) -> set[int]:
    """Offsets in ``text`` where a sentence (other than the first) starts, ignoring whitespace."""
    out, pos = set(), 0
    for i, s in enumerate(sentences):
        s = s.strip()
        if not s:
            continue
        j = text.find(s[:20], pos)
        if j < 0:  # a segmenter that altered the text: fall back to the running position
            j = pos
        if i and j > 0:
            out.add(j)
        pos = j + len(s)
    return out


def in_quotation(text: str, pos: int) -> bool:
    """True when ``pos`` lies inside an open quotation (curly quotes, or an odd number of straight ones)."""
    before = text[:pos]
    return before.count("“") > before.count("”") or before.count('"') % 2 == 1


def _prf(tp: int, fp: int, fn: int) -> tuple[float, float, float]:
    p = tp / (tp + fp) if tp + fp else 1.0
    r = tp / (tp + fn) if tp + fn else 1.0
    return p, r, (2 * p * r / (p + r) if p + r else 0.0)


def quality(segs: dict[str, Callable], gold: list[dict], review: bool) -> dict[str, dict[str, float]]:
    results = {}
    for name, fn in segs.items():
        tp = fp = fn_ = exact = 0
        otp = ofp = ofn = 0  # boundaries outside quotations only
        for rec in gold:
            t = rec["text"]
            truth = boundaries(t, rec["sentences"])
            got = boundaries(t, fn(t))
            tp += len(truth & got)
            fp += len(got - truth)
            fn_ += len(truth - got)
            exact += int(truth == got)
            out_t = {b for b in truth if not in_quotation(t, b)}
            out_g = {b for b in got if not in_quotation(t, b)}
            otp, ofp, ofn = otp + len(out_t & out_g), ofp + len(out_g - out_t), ofn + len(out_t - out_g)
            if review and truth != got:
                print(f"--- {name} {rec['doc_id']}")
                for b in sorted(got - truth):
                    print(f"   extra  |{t[max(0, b - 40) : b]}||{t[b : b + 30]}|")
                for b in sorted(truth - got):
                    print(f"   missed |{t[max(0, b - 40) : b]}||{t[b : b + 30]}|")
        p, r, f1 = _prf(tp, fp, fn_)
        results[name] = {
            "precision": p,
            "recall": r,
            "f1": f1,
            "f1_outside_quotes": _prf(otp, ofp, ofn)[2],
            "exact_paragraphs": exact / len(gold),
            "boundaries": tp + fn_,
            "boundaries_outside_quotes": otp + ofn,
        }
    return results


def corpus_paragraphs(root: Path, limit_bytes: int) -> list[str]:
    """Interleaved Gutenberg and Wikipedia paragraphs, cleaned as the corpus stage does, up to a size."""
    books = sorted(glob.glob(str(root / "corpus/gutenberg/pg*.txt")))
    wiki = sorted(glob.glob(str(root / "corpus/wikipedia/*.jsonl")))

    def gen_books():
        for f in books:
            text, _ = strip_gutenberg(normalize_text(Path(f).read_text(encoding="utf-8")))
            yield from paragraphs(text, "wrap")

    def gen_wiki():
        for f in wiki:
            with open(f, encoding="utf-8") as fh:
                for line in fh:
                    yield from paragraphs(normalize_text(json.loads(line)["text"]), "paragraph")

    out, size = [], 0
    for a, b in zip(gen_books(), gen_wiki()):
        for p in (a, b):
            out.append(p)
            size += len(p.encode())
        if size >= limit_bytes:
            break
    return out


def speed(segs: dict[str, Callable], paras: list[str], budget_s: float) -> dict[str, dict[str, float]]:
    total = sum(len(p.encode()) for p in paras)
    results = {}
    for name, fn in segs.items():
        fn("Warm up. Now.")
        done = 0
        t0 = time.perf_counter()
        n_sent = 0
        for p in paras:
            n_sent += len(fn(p))
            done += len(p.encode())
            if time.perf_counter() - t0 > budget_s:
                break
        dt = time.perf_counter() - t0
        results[name] = {"mb_per_s": done / 1e6 / dt, "measured_mb": done / 1e6, "sentences": n_sent}
    print(f"speed corpus: {len(paras)} paragraphs, {total / 1e6:.2f} MB", file=sys.stderr)
    return results


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--data-root", type=Path, default=Path(os.environ.get("BERT_DATA_ROOT", "../shared/data"))
    )
    ap.add_argument("--speed-mb", type=float, default=2.0)
    ap.add_argument("--budget-s", type=float, default=60.0, help="max seconds of timing per segmenter")
    ap.add_argument("--review", action="store_true")
    ap.add_argument("--json", type=Path, help="write the results here")
    args = ap.parse_args()
    segs = load_segmenters()
    gold = [json.loads(line) for line in GOLD.read_text(encoding="utf-8").splitlines() if line.strip()]
    q = quality(segs, gold, args.review)
    s = speed(segs, corpus_paragraphs(args.data_root, int(args.speed_mb * 1e6)), args.budget_s)
    print(f"| segmenter | MB/s | boundary P | R | F1 | F1 outside quotes | exact paragraphs ({len(gold)}) |")
    print("|---|---|---|---|---|---|---|")
    for name in segs:
        a, b = s[name], q[name]
        print(
            f"| {name} | {a['mb_per_s']:.2f} | {b['precision']:.3f} | {b['recall']:.3f} | {b['f1']:.3f} "
            f"| {b['f1_outside_quotes']:.3f} | {b['exact_paragraphs']:.1%} |"
        )
    first = next(iter(q.values()))
    print(f"gold boundaries: {first['boundaries']} ({first['boundaries_outside_quotes']} outside quotations)")
    if args.json:
        args.json.write_text(json.dumps({"quality": q, "speed": s}, indent=2))


if __name__ == "__main__":
    main()
