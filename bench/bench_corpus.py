"""Corpus stage: peak memory (RSS incl. worker processes) and throughput as the corpus grows.

Runs :func:`bert_core.corpus.build_corpus` on the real corpus (``corpus/gutenberg`` + ``corpus/wikipedia``
under the data root, no caps) and on the same corpus x4 (four symlinked copies under different source
names), with 1 and 2 worker processes (and 4 on the copies: what a worker adds to memory). Each
configuration runs in a fresh child process; the parent samples the RSS of the child and all its
descendants every 50 ms and reports the peak of the sum.

The x4 copies are byte-identical, so exact de-duplication would drop three of them: the x1/x4 comparison
therefore runs with ``clean.dedup: false`` (marked ``nodedup``); the x1 default (de-dup on) is reported too.

    .venv/bin/python bench/bench_corpus.py --data-root ../shared/data --out /tmp/bench_corpus
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # run as a script: make `bench` importable

from bench._common import run_monitored  # noqa: E402

CONFIGS = [  # (name, copies, dedup, workers)
    ("x1-dedup-w1", 1, True, 1),
    ("x1-dedup-w2", 1, True, 2),
    ("x1-nodedup-w1", 1, False, 1),
    ("x1-nodedup-w2", 1, False, 2),
    ("x4-nodedup-w1", 4, False, 1),
    ("x4-nodedup-w2", 4, False, 2),
    ("x4-nodedup-w4", 4, False, 4),  # more workers than this machine's cores: what a worker adds to memory
]


def make_root(data_root: Path, work: Path, copies: int) -> Path:
    """A data root whose corpus holds ``copies`` symlinked copies of the real corpus."""
    root = work / f"root-x{copies}"
    for c in range(copies):
        for part in ("gutenberg", "wikipedia"):
            d = root / "corpus" / f"{part}{c}"
            d.mkdir(parents=True, exist_ok=True)
            for f in sorted((data_root / "corpus" / part).iterdir()):
                if f.suffix in (".txt", ".jsonl") and not (d / f.name).exists():
                    (d / f.name).symlink_to(f.resolve())
    return root


def params_dict(copies: int, dedup: bool) -> dict:
    local = []
    for c in range(copies):
        local.append({"name": f"gutenberg{c}", "kind": "text", "path": f"corpus/gutenberg{c}/*.txt"})
        local.append(
            {
                "name": f"wikipedia{c}",
                "kind": "jsonl",
                "path": f"corpus/wikipedia{c}/*.jsonl",
                "id_field": "id",
                "title_field": "title",
            }
        )
    return {
        "sources": [{"name": "hub", "kind": "hf", "path": "Salesforce/wikitext"}],
        "local_sources": local,
        "clean": {"dedup": dedup},
        "heldout": {"fraction": 0.01, "max_documents": 500},
    }


def child(args: argparse.Namespace) -> None:
    """Run one build and print its figures as JSON (in a fresh process)."""
    from bert_core.corpus import CorpusParams, build_corpus

    params = CorpusParams.model_validate(json.loads(args.params))
    t0 = time.perf_counter()
    stats = build_corpus(params, Path(args.out_dir), data_root=Path(args.root), workers=args.workers)
    dt = time.perf_counter() - t0
    me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    m = stats.as_metrics()
    print(
        json.dumps(
            {
                "seconds": dt,
                "input_mb": m["input_bytes"] / 1e6,
                "output_mb": m["bytes"] / 1e6,
                "documents": m["documents"],
                "sentences": m["sentences"],
                "duplicates": m["duplicates"],
                "mb_per_s": m["input_bytes"] / 1e6 / dt,
                # CPU of the parent (imports, merge, de-dup, shard writing, checks) vs the workers.
                "parent_cpu_s": me.ru_utime + me.ru_stime,
                "workers_cpu_s": kids.ru_utime + kids.ru_stime,
            }
        )
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--data-root", type=Path, default=Path(os.environ.get("BERT_DATA_ROOT", "../shared/data"))
    )
    ap.add_argument("--out", type=Path, default=Path("/tmp/bench_corpus"))
    ap.add_argument("--only", nargs="*", help="config names to run")
    ap.add_argument("--json", type=Path)
    # child mode
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--params", help=argparse.SUPPRESS)
    ap.add_argument("--root", help=argparse.SUPPRESS)
    ap.add_argument("--out-dir", help=argparse.SUPPRESS)
    ap.add_argument("--workers", type=int, default=1, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        child(args)
        return
    args.out.mkdir(parents=True, exist_ok=True)
    results = {}
    for name, copies, dedup, workers in CONFIGS:
        if args.only and name not in args.only:
            continue
        root = make_root(args.data_root.resolve(), args.out, copies)
        cmd = [
            sys.executable,
            __file__,
            "--child",
            "--params",
            json.dumps(params_dict(copies, dedup)),
            "--root",
            str(root),
            "--out-dir",
            str(args.out / f"corpus-{name}"),
            "--workers",
            str(workers),
        ]
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
        res = run_monitored(proc)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        # CPU time of the child and its (joined) workers: a throughput figure that load on a shared
        # machine distorts much less than wall-clock MB/s.
        res["cpu_s"] = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
        res["mb_per_cpu_s"] = res["input_mb"] / res["cpu_s"]
        if proc.returncode:
            raise SystemExit(f"{name} failed with exit code {proc.returncode}")
        res["load_avg_1m"] = os.getloadavg()[0]
        results[name] = res
        print(f"{name}: {json.dumps(res)}", file=sys.stderr, flush=True)
    print(
        "| run | input MB | documents | wall s | MB/s (wall) | CPU s | MB per CPU-s | peak RSS MB (all processes) |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for name, r in results.items():
        print(
            f"| {name} | {r['input_mb']:.1f} | {r['documents']:,} | {r['seconds']:.1f} | {r['mb_per_s']:.2f} "
            f"| {r['cpu_s']:.1f} | {r['mb_per_cpu_s']:.2f} | {r['peak_rss_mb']:.0f} ({r['processes_at_peak']} procs) |"
        )
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
