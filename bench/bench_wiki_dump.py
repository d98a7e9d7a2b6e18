"""Corpus stage on one multistream Wikipedia dump: the file read in pieces (the stage's way) vs one reader.

The dump is built from the shared data's real dump fragment (``wikipedia_dump/enwiki-20250201-tiny.xml.bz2``,
70 pages, 6 articles): ``--copies`` copies of its pages, each copy's page ids shifted so that none repeats,
written as dumps.wikimedia.org writes a multistream file (a stream for the header, one per 100 pages, one for
the closing tag). Both ways run in fresh child processes with the same workers, interleaved (one reader,
pieces, pieces, one reader ...); de-duplication is off, as the copies' text repeats. "One reader" is the
dump as one work unit, as a file too small to cut is read; "pieces" cuts it every ``--piece-mb`` MB of the
file (the stage's default is 64 MB, sized for real dumps). The two outputs must be byte-identical.

    .venv/bin/python -m bench.bench_wiki_dump --data-root ../shared/data --out /tmp/bench_wiki_dump
"""

from __future__ import annotations

import argparse
import bz2
import json
import os
import re
import resource
import subprocess
import sys
import time
from pathlib import Path

from bench._common import median

DUMP = "wikipedia_dump/enwiki-20250201-tiny.xml.bz2"
PAGE_ID = re.compile(rb"(<ns>\d+</ns>\s*<id>)(\d+)(</id>)")


def make_dump(data_root: Path, out: Path, copies: int) -> Path:
    """The multistream dump of ``copies`` copies of the fragment's pages, under ``out/root``."""
    path = out / "root" / f"enwiki-x{copies}-multistream.xml.bz2"
    if path.exists():
        return path
    xml = bz2.decompress((data_root / DUMP).read_bytes())
    first, close = xml.index(b"<page>"), xml.rindex(b"</mediawiki>")
    pages = [b"<page>" + p for p in xml[first:close].split(b"<page>")[1:]]
    shifted = [
        PAGE_ID.sub(lambda m, c=c: m[1] + str(int(m[2]) + c * 10**8).encode() + m[3], page, count=1)
        for c in range(copies)
        for page in pages
    ]
    streams = [
        xml[:first],
        *(b"".join(shifted[i : i + 100]) for i in range(0, len(shifted), 100)),
        xml[close:],
    ]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"".join(bz2.compress(s) for s in streams))
    return path


def child(args: argparse.Namespace) -> None:
    """One build in this fresh process; its figures as JSON on stdout."""
    from bert_core.corpus import CorpusParams, build_corpus, wiki

    wiki.DUMP_UNIT_BYTES = args.unit_bytes
    params = CorpusParams.model_validate(
        {
            "sources": [{"name": "hub", "kind": "hf", "path": "x"}],
            "local_sources": [{"name": "enwiki", "kind": "wikipedia_xml", "path": Path(args.dump).name}],
            "clean": {"dedup": False},
            "heldout": {"fraction": 0.01, "max_documents": 50},
        }
    )
    t0 = time.perf_counter()
    stats = build_corpus(params, Path(args.out_dir), data_root=Path(args.dump).parent, workers=args.workers)
    wall = time.perf_counter() - t0
    me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime
    print(json.dumps({"wall_s": wall, "cpu_s": cpu, "documents": stats.documents}))


def files(out: Path) -> dict[str, bytes]:
    return {p.relative_to(out).as_posix(): p.read_bytes() for p in sorted(out.rglob("*")) if p.is_file()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--data-root", type=Path, default=Path(os.environ.get("BERT_DATA_ROOT", "../shared/data"))
    )
    ap.add_argument("--out", type=Path, default=Path("/tmp/bench_wiki_dump"))
    ap.add_argument("--copies", type=int, default=40, help="copies of the fragment's 70 pages")
    ap.add_argument("--piece-mb", type=float, default=0.5, help="file MB per piece")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--dump", help=argparse.SUPPRESS)
    ap.add_argument("--out-dir", help=argparse.SUPPRESS)
    ap.add_argument("--unit-bytes", type=int, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        child(args)
        return
    dump = make_dump(args.data_root.resolve(), args.out, args.copies)
    ways = {"one reader": 1 << 62, "pieces": int(args.piece_mb * 1e6)}
    from bert_core.corpus.wiki import dump_spans

    pieces = len(dump_spans(dump, ways["pieces"]))
    runs: dict[str, list[dict]] = {way: [] for way in ways}
    order = [w for r in range(args.rounds) for w in (list(ways) if r % 2 == 0 else list(ways)[::-1])]
    for i, way in enumerate(order):
        out_dir = args.out / f"corpus-{way.replace(' ', '-')}-{i}"
        cmd = [sys.executable, "-m", "bench.bench_wiki_dump", "--child", "--dump", str(dump)]
        cmd += ["--out-dir", str(out_dir), "--unit-bytes", str(ways[way]), "--workers", str(args.workers)]
        proc = subprocess.run(cmd, check=True, stdout=subprocess.PIPE, text=True)
        runs[way].append(json.loads(proc.stdout.strip().splitlines()[-1]))
        print(f"{way}: {runs[way][-1]}", file=sys.stderr, flush=True)
    outputs = [files(args.out / f"corpus-{w.replace(' ', '-')}-{i}") for i, w in enumerate(order)]
    same = all(o == outputs[0] for o in outputs)
    size = dump.stat().st_size / 1e6
    print(f"dump: {size:.1f} MB ({args.copies * 70:,} pages), {pieces} pieces; workers {args.workers}")
    print("| way | work units | wall s (median) | CPU s (median) |")
    print("|---|---|---|---|")
    for way, units in (("one reader", 1), ("pieces", pieces)):
        wall = median([r["wall_s"] for r in runs[way]])
        cpu = median([r["cpu_s"] for r in runs[way]])
        print(f"| {way} | {units} | {wall:.1f} | {cpu:.1f} |")
    ratio = median([r["wall_s"] for r in runs["one reader"]]) / median([r["wall_s"] for r in runs["pieces"]])
    print(f"wall-time ratio one reader / pieces: {ratio:.2f}x; outputs byte-identical: {same}")
    if not same:
        raise SystemExit("the outputs differ")


if __name__ == "__main__":
    main()
