"""Corpus stage on inputs planned as the stage plans them (a large file cut into pieces, small files read
together) vs a work unit per input (a large file read by one reader, a small file a unit of its own).

Each input is run both ways in fresh child processes with the same workers, interleaved (a unit an input,
planned, planned, a unit an input ...); the two outputs must be byte-identical. De-duplication is off, as
the inputs repeat real text; ids never repeat. Pieces are :data:`PIECE_BYTES` (the stage's own are 64 MB);
small files are grouped as in the stage (4 MB a unit).

- ``dump``: one multistream Wikipedia dump built from the shared data's real fragment
  (``wikipedia_dump/enwiki-20250201-tiny.xml.bz2``, 70 pages, 6 articles): ``--copies`` copies of its pages,
  each copy's page ids shifted, written as dumps.wikimedia.org writes a multistream file (a stream for the
  header, one per 100 pages, one for the closing tag).
- ``dump.bz2``: the same dump as one bz2 stream (as ``*-pages-articles.xml.bz2``, not multistream), cut in
  its decompressed text.
- ``jsonl``: one JSONL file of ``--jsonl-copies`` copies of the shared corpus's 11,570 Wikipedia articles
  (19.7 MB of text), ids suffixed by the copy's number.
- ``jsonl.gz``, ``jsonl.zst``, ``jsonl.xz``, ``jsonl.bz2``: that JSONL file compressed (gzip, zstd, xz and
  bzip2 at their default levels), cut in its decompressed text (at most :func:`bert_core.corpus.pieces.most_pieces`).
- ``parquet``: the same rows as one Parquet file, in row groups of 1,000 rows (as ``datasets`` writes them).
- ``text``: the same articles as one text file of documents separated by blank lines, a paragraph a line (the
  layout of Google's ``create_pretraining_data.py`` input); ids number the documents.
- ``wikitext``: the same articles as one file in WikiText's layout (``" = Title = "`` lines, a paragraph a
  line, blank lines between); ids number the articles.
- ``files``: a folder of ``--files-copies`` copies of the same articles, a one-document text file each.
- ``hub``: a Hub dataset with ids (a local dataset folder, as ``BERT_DATA_ROOT`` holds one) of ``--hub-files``
  Parquet data files, each those articles with ids suffixed by the file's number; one work unit per file.

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
from unittest import mock

from bench._common import median

DUMP = "wikipedia_dump/enwiki-20250201-tiny.xml.bz2"
PAGE_ID = re.compile(rb"(<ns>\d+</ns>\s*<id>)(\d+)(</id>)")
#: The file bytes of a piece, per input: small enough for the benchmark's inputs to give several pieces (the
#: stage's own is 64 MB); a Hub dataset is cut at its data files whatever this is.
PIECE_BYTES = {
    "dump": 500_000,
    "dump.bz2": 2_000_000,
    "jsonl": 8_000_000,
    "jsonl.gz": 8_000_000,
    "jsonl.zst": 8_000_000,
    "jsonl.xz": 8_000_000,
    "jsonl.bz2": 8_000_000,
    "parquet": 8_000_000,
    "text": 8_000_000,
    "wikitext": 8_000_000,
    "files": 8_000_000,
    "hub": 8_000_000,
}


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


def make_single_stream(dump: Path) -> Path:
    """The multistream dump's text as one bz2 stream beside it."""
    path = dump.with_name(dump.name.replace("-multistream", ""))
    if not path.exists():
        path.write_bytes(bz2.compress(bz2.decompress(dump.read_bytes())))
    return path


def make_hub(data_root: Path, out: Path, files: int) -> Path:
    """A local dataset folder of ``files`` Parquet data files of the shared corpus's articles, under
    ``out/root``."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    folder = out / "root" / f"hub-wikipedia-x{files}"
    if not folder.exists():
        folder.mkdir(parents=True)
        rows = [json.loads(line) for line in wiki_lines(data_root)]
        for k in range(files):
            table = pa.Table.from_pylist([{**row, "id": f"{row['id']}/{k}"} for row in rows])
            pq.write_table(table, folder / f"train-{k:05d}-of-{files:05d}.parquet")
    return folder


def make_files(data_root: Path, out: Path, copies: int) -> Path:
    """A folder of ``copies`` copies of the shared corpus's articles, a text file each (its title, a blank
    line, its text), under ``out/root``."""
    folder = out / "root" / f"articles-x{copies}"
    if not folder.exists():
        folder.mkdir(parents=True)
        rows = [json.loads(line) for line in wiki_lines(data_root)]
        for k in range(copies):
            for i, row in enumerate(rows):
                text = f"{row['title']}\n\n{row['text']}\n"
                (folder / f"{k}-{i:05d}.txt").write_text(text, encoding="utf-8")
    return folder


def make_jsonl(data_root: Path, out: Path, copies: int) -> Path:
    """One JSONL file of ``copies`` copies of the shared corpus's articles (ids suffixed), under
    ``out/root``."""
    path = out / "root" / f"wikipedia-x{copies}.jsonl"
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        rows = [json.loads(line) for line in wiki_lines(data_root)]
        with path.open("w", encoding="utf-8") as fh:
            for k in range(copies):
                fh.writelines(json.dumps({**row, "id": f"{row['id']}/{k}"}) + "\n" for row in rows)
    return path


def make_packed(jsonl: Path, suffix: str) -> Path:
    """The JSONL file compressed beside it, the compression by ``suffix``."""
    import bz2
    import gzip
    import lzma

    try:
        from compression import zstd
    except ImportError:
        from backports import zstd

    path = jsonl.with_name(jsonl.name + suffix)
    if not path.exists():
        pack = {".gz": gzip.compress, ".zst": zstd.compress, ".xz": lzma.compress, ".bz2": bz2.compress}[
            suffix
        ]
        path.write_bytes(pack(jsonl.read_bytes()))
    return path


def make_parquet(jsonl: Path) -> Path:
    """The JSONL file's rows as one Parquet file beside it, in row groups of 1,000 rows."""
    import pyarrow.json as pj
    import pyarrow.parquet as pq

    path = jsonl.with_suffix(".parquet")
    if not path.exists():
        pq.write_table(pj.read_json(jsonl), path, row_group_size=1000)
    return path


def make_text(jsonl: Path) -> Path:
    """The JSONL file's articles as one text file beside it: a paragraph a line, a blank line after each."""
    path = jsonl.with_suffix(".txt")
    if not path.exists():
        with jsonl.open(encoding="utf-8") as src, path.open("w", encoding="utf-8") as fh:
            fh.writelines(json.loads(line)["text"] + "\n\n" for line in src)
    return path


def make_wikitext(jsonl: Path) -> Path:
    """The JSONL file's articles as one file in WikiText's layout beside it."""
    path = jsonl.with_suffix(".tokens")
    if not path.exists():
        with jsonl.open(encoding="utf-8") as src, path.open("w", encoding="utf-8") as fh:
            for line in src:
                row = json.loads(line)
                fh.write(f" \n = {row['title']} = \n \n")
                fh.writelines(f" {para} \n \n" for para in row["text"].split("\n"))
    return path


def wiki_lines(data_root: Path) -> list[str]:
    return [
        line
        for path in sorted((data_root / "corpus" / "wikipedia").glob("*.jsonl"))
        for line in path.read_text(encoding="utf-8").splitlines()
        if line.strip()
    ]


def child(args: argparse.Namespace) -> None:
    """One build in this fresh process; its figures as JSON on stdout."""
    from bert_core.corpus import CorpusParams, build, build_corpus, units
    from bert_core.corpus import pieces as corpus_pieces

    corpus_pieces.UNIT_BYTES = args.unit_bytes
    if args.one_reader:
        build.plan_units = functools.partial(units.plan_units, split=False)
    source = source_spec(args.case, Path(args.input))
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


def source_spec(case: str, path: Path) -> dict:
    case = case.split(".")[0]  # jsonl.gz: a jsonl source
    kind = {"dump": "wikipedia_xml", "text": "text", "wikitext": "text", "files": "text", "hub": "hf"}
    how = {
        "dump": {},
        "files": {"newlines": "paragraph"},
        "text": {"doc_split": "blank_lines", "newlines": "paragraph"},
        "wikitext": {"doc_split": "wikitext"},
    }.get(case, {"id_field": "id", "title_field": "title"})
    return {"name": "input", "kind": kind.get(case, case), "path": path.name, **how}


def run_case(args: argparse.Namespace, case: str) -> bool:
    """Both ways on ``case``'s input; prints its table; whether the outputs are byte-identical."""
    from bert_core.corpus import CorpusParams
    from bert_core.corpus import pieces as corpus_pieces
    from bert_core.corpus.units import plan_units

    data_root = args.data_root.resolve()
    path = {
        "dump": lambda: make_dump(data_root, args.out, args.copies),
        "dump.bz2": lambda: make_single_stream(make_dump(data_root, args.out, args.copies)),
        "jsonl": lambda: make_jsonl(data_root, args.out, args.jsonl_copies),
        "jsonl.gz": lambda: make_packed(make_jsonl(data_root, args.out, args.jsonl_copies), ".gz"),
        "jsonl.zst": lambda: make_packed(make_jsonl(data_root, args.out, args.jsonl_copies), ".zst"),
        "jsonl.xz": lambda: make_packed(make_jsonl(data_root, args.out, args.jsonl_copies), ".xz"),
        "jsonl.bz2": lambda: make_packed(make_jsonl(data_root, args.out, args.jsonl_copies), ".bz2"),
        "parquet": lambda: make_parquet(make_jsonl(data_root, args.out, args.jsonl_copies)),
        "text": lambda: make_text(make_jsonl(data_root, args.out, args.jsonl_copies)),
        "wikitext": lambda: make_wikitext(make_jsonl(data_root, args.out, args.jsonl_copies)),
        "files": lambda: make_files(data_root, args.out, args.files_copies),
        "hub": lambda: make_hub(data_root, args.out, args.hub_files),
    }[case]()
    spec = source_spec(case, path)
    params = CorpusParams.model_validate({"sources": [spec], "local_sources": [spec]})
    with mock.patch.object(corpus_pieces, "UNIT_BYTES", PIECE_BYTES[case]):
        planned = len(plan_units(params.active_sources(path.parent), path.parent, workers=args.workers))
    apart = len(plan_units(params.active_sources(path.parent), path.parent, split=False))
    mb = sum(f.stat().st_size for f in (path.iterdir() if path.is_dir() else [path])) / 1e6
    what = {
        "dump": f"{mb:.1f} MB multistream dump ({args.copies * 70:,} pages)",
        "dump.bz2": f"{mb:.1f} MB single-stream dump ({args.copies * 70:,} pages)",
        "jsonl": f"{mb:.1f} MB JSONL file (the real articles {args.jsonl_copies} times)",
        "jsonl.gz": f"{mb:.1f} MB gzip JSONL file (the real articles {args.jsonl_copies} times)",
        "jsonl.zst": f"{mb:.1f} MB zstd JSONL file (the real articles {args.jsonl_copies} times)",
        "jsonl.xz": f"{mb:.1f} MB xz JSONL file (the real articles {args.jsonl_copies} times)",
        "jsonl.bz2": f"{mb:.1f} MB bzip2 JSONL file (the real articles {args.jsonl_copies} times)",
        "parquet": f"{mb:.1f} MB Parquet file (the real articles {args.jsonl_copies} times)",
        "text": f"{mb:.1f} MB text file (the real articles {args.jsonl_copies} times)",
        "wikitext": f"{mb:.1f} MB WikiText file (the real articles {args.jsonl_copies} times)",
        "files": f"{apart:,} text files, {mb:.1f} MB (the real articles {args.files_copies} times)",
        "hub": f"Hub dataset of {planned} Parquet data files ({mb:.1f} MB, the real articles {planned} times)",
    }[case]
    runs: dict[str, list[dict]] = {"a unit an input": [], "planned": []}
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
            str(PIECE_BYTES[case]),
            "--workers",
            str(args.workers),
        ]
        cmd += ["--one-reader"] if way == "a unit an input" else []
        proc = subprocess.run(cmd, check=True, stdout=subprocess.PIPE, text=True)
        runs[way].append(json.loads(proc.stdout.strip().splitlines()[-1]))
        outputs.append(files(out_dir))
        print(f"{case}, {way}: {runs[way][-1]}", file=sys.stderr, flush=True)
    same = all(o == outputs[0] for o in outputs)
    print(f"\n{case}: {what}, workers {args.workers}")
    print("| way | work units | wall s (median) | CPU s (median) |")
    print("|---|---|---|---|")
    for way, units in (("a unit an input", apart), ("planned", planned)):
        wall = median([r["wall_s"] for r in runs[way]])
        cpu = median([r["cpu_s"] for r in runs[way]])
        print(f"| {way} | {units} | {wall:.1f} | {cpu:.1f} |")
    ratio = median([r["wall_s"] for r in runs["a unit an input"]]) / median(
        [r["wall_s"] for r in runs["planned"]]
    )
    print(f"wall-time ratio a unit an input / planned: {ratio:.2f}x; outputs byte-identical: {same}")
    if "." in case:  # what pieces.DECOMPRESS_MB_S holds for this compression
        print(f"decompression: {decompress_mb_s(path):.0f} MB of text a CPU-second (median of 3)")
    return same


def decompress_mb_s(path: Path) -> float:
    """Decompressed MB a CPU-second of reading ``path`` through, as the stage's readers open it."""
    import fsspec

    speeds = []
    for _ in range(3):
        t0, size = time.process_time(), 0
        with fsspec.open(path, "rb", compression="infer") as fh:
            while data := fh.read(1 << 24):
                size += len(data)
        speeds.append(size / 1e6 / (time.process_time() - t0))
    return median(speeds)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--data-root", type=Path, default=Path(os.environ.get("BERT_DATA_ROOT", "../shared/data"))
    )
    ap.add_argument("--out", type=Path, default=Path("/tmp/bench_corpus_split"))
    ap.add_argument("--cases", nargs="*", default=list(PIECE_BYTES), choices=list(PIECE_BYTES))
    ap.add_argument("--copies", type=int, default=40, help="dump: copies of the fragment's 70 pages")
    ap.add_argument(
        "--jsonl-copies",
        type=int,
        default=4,
        help="jsonl (compressed too), parquet, text, wikitext: copies of the real articles",
    )
    ap.add_argument("--files-copies", type=int, default=2, help="files: copies of the real articles")
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
