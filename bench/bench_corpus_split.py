"""Corpus stage on one large input read in pieces (the stage's way) vs as one work unit (one reader).

Two inputs, each run both ways in fresh child processes with the same workers, interleaved (one reader,
pieces, pieces, one reader ...); the two outputs must be byte-identical.

- ``dump``: one multistream Wikipedia dump built from the shared data's real fragment
  (``wikipedia_dump/enwiki-20250201-tiny.xml.bz2``, 70 pages, 6 articles): ``--copies`` copies of its pages,
  each copy's page ids shifted so that none repeats, written as dumps.wikimedia.org writes a multistream file
  (a stream for the header, one per 100 pages, one for the closing tag), cut every ``--piece-mb`` MB of the
  file (the stage's default is 64 MB, sized for real dumps). De-duplication is off, as the copies' text
  repeats.
- ``hub``: a Hub dataset with ids (a local dataset folder, as ``BERT_DATA_ROOT`` holds one) of ``--hub-files``
  Parquet data files, each the shared corpus's 11,570 Wikipedia articles (19.7 MB of text) with its ids
  suffixed by the file's number; one work unit per file. De-duplication is off here too.

    .venv/bin/python -m bench.bench_corpus_split --data-root ../shared/data --out /tmp/bench_corpus_split
"""

from __future__ import annotations

import argparse
import bz2
import functools
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


def make_hub(data_root: Path, out: Path, files: int) -> Path:
    """A local dataset folder of ``files`` Parquet data files of the shared corpus's articles, under
    ``out/root``."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    folder = out / "root" / f"hub-wikipedia-x{files}"
    if not folder.exists():
        folder.mkdir(parents=True)
        rows = [
            json.loads(line)
            for path in sorted((data_root / "corpus" / "wikipedia").glob("*.jsonl"))
            for line in path.read_text(encoding="utf-8").splitlines()
            if line.strip()
        ]
        for k in range(files):
            table = pa.Table.from_pylist([{**row, "id": f"{row['id']}/{k}"} for row in rows])
            pq.write_table(table, folder / f"train-{k:05d}-of-{files:05d}.parquet")
    return folder


def child(args: argparse.Namespace) -> None:
    """One build in this fresh process; its figures as JSON on stdout."""
    from bert_core.corpus import CorpusParams, build, build_corpus, readers, wiki

    wiki.DUMP_UNIT_BYTES = args.unit_bytes
    if args.one_reader:
        build.plan_units = functools.partial(readers.plan_units, split=False)
    source = (
        {"name": "enwiki", "kind": "wikipedia_xml", "path": Path(args.input).name}
        if args.case == "dump"
        else {
            "name": "wiki",
            "kind": "hf",
            "path": Path(args.input).name,
            "id_field": "id",
            "title_field": "title",
        }
    )
    params = CorpusParams.model_validate(
        {
            "sources": [{"name": "hub", "kind": "hf", "path": "x"}],
            "local_sources": [source],
            "clean": {"dedup": False},
            "heldout": {"fraction": 0.01, "max_documents": 50},
        }
    )
    t0 = time.perf_counter()
    stats = build_corpus(params, Path(args.out_dir), data_root=Path(args.input).parent, workers=args.workers)
    wall = time.perf_counter() - t0
    me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime
    print(json.dumps({"wall_s": wall, "cpu_s": cpu, "documents": stats.documents}))


def files(out: Path) -> dict[str, bytes]:
    return {p.relative_to(out).as_posix(): p.read_bytes() for p in sorted(out.rglob("*")) if p.is_file()}


def run_case(args: argparse.Namespace, case: str) -> bool:
    """Both ways on ``case``'s input; prints its table; whether the outputs are byte-identical."""
    from bert_core.corpus.readers import plan_units
    from bert_core.corpus.wiki import dump_spans

    if case == "dump":
        path = make_dump(args.data_root.resolve(), args.out, args.copies)
        pieces = len(dump_spans(path, int(args.piece_mb * 1e6)))
        what = f"{path.stat().st_size / 1e6:.1f} MB multistream dump ({args.copies * 70:,} pages)"
    else:
        from bert_core.corpus import CorpusParams

        path = make_hub(args.data_root.resolve(), args.out, args.hub_files)
        spec = {"name": "wiki", "kind": "hf", "path": path.name, "id_field": "id"}
        params = CorpusParams.model_validate({"sources": [spec], "local_sources": [spec]})
        pieces = len(plan_units(params.active_sources(path.parent), path.parent))
        mb = sum(f.stat().st_size for f in path.iterdir()) / 1e6
        what = f"Hub dataset of {pieces} Parquet data files ({mb:.1f} MB)"
    runs: dict[str, list[dict]] = {"one reader": [], "pieces": []}
    order = [w for r in range(args.rounds) for w in (list(runs) if r % 2 == 0 else list(runs)[::-1])]
    outputs = []
    for i, way in enumerate(order):
        out_dir = args.out / f"corpus-{case}-{way.replace(' ', '-')}-{i}"
        cmd = [
            sys.executable,
            "-m",
            "bench.bench_corpus_split",
            "--child",
            "--case",
            case,
            "--input",
            str(path),
        ]
        cmd += [
            "--out-dir",
            str(out_dir),
            "--unit-bytes",
            str(int(args.piece_mb * 1e6)),
            "--workers",
            str(args.workers),
        ]
        cmd += ["--one-reader"] if way == "one reader" else []
        proc = subprocess.run(cmd, check=True, stdout=subprocess.PIPE, text=True)
        runs[way].append(json.loads(proc.stdout.strip().splitlines()[-1]))
        outputs.append(files(out_dir))
        print(f"{case}, {way}: {runs[way][-1]}", file=sys.stderr, flush=True)
    same = all(o == outputs[0] for o in outputs)
    print(f"\n{case}: {what}, workers {args.workers}")
    print("| way | work units | wall s (median) | CPU s (median) |")
    print("|---|---|---|---|")
    for way, units in (("one reader", 1), ("pieces", pieces)):
        wall = median([r["wall_s"] for r in runs[way]])
        cpu = median([r["cpu_s"] for r in runs[way]])
        print(f"| {way} | {units} | {wall:.1f} | {cpu:.1f} |")
    ratio = median([r["wall_s"] for r in runs["one reader"]]) / median([r["wall_s"] for r in runs["pieces"]])
    print(f"wall-time ratio one reader / pieces: {ratio:.2f}x; outputs byte-identical: {same}")
    return same


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--data-root", type=Path, default=Path(os.environ.get("BERT_DATA_ROOT", "../shared/data"))
    )
    ap.add_argument("--out", type=Path, default=Path("/tmp/bench_corpus_split"))
    ap.add_argument("--cases", nargs="*", default=["dump", "hub"], choices=["dump", "hub"])
    ap.add_argument("--copies", type=int, default=40, help="dump: copies of the fragment's 70 pages")
    ap.add_argument("--piece-mb", type=float, default=0.5, help="dump: file MB per piece")
    ap.add_argument("--hub-files", type=int, default=8, help="hub: data files")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--case", help=argparse.SUPPRESS)
    ap.add_argument("--input", help=argparse.SUPPRESS)
    ap.add_argument("--out-dir", help=argparse.SUPPRESS)
    ap.add_argument("--unit-bytes", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--one-reader", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        child(args)
        return
    if not all([run_case(args, case) for case in args.cases]):
        raise SystemExit("the outputs differ")


if __name__ == "__main__":
    main()
