"""pretrain_data stage: throughput (instances/s, tokens/s) and peak memory (RSS incl. workers) as the corpus grows.

1. Builds the real corpus once with the corpus stage's own code (:func:`bert_core.corpus.build_corpus`:
   ``corpus/gutenberg`` + ``corpus/wikipedia`` under the data root, no caps, held-out 1%) into
   ``<out>/corpus-x1`` (reused when present), and ``<out>/corpus-x4``: the same shards symlinked four times.
2. Runs :func:`bert_core.pretrain_data.build.build_pretrain_data` with the stage's params
   (``params/pretrain_data.yaml``) except for the overrides below, on x1 with 1 and 2 workers and on x4
   with 1 and 2 workers. Each run is a fresh child process; the parent samples the RSS of the child and all
   its descendants every 50 ms and reports the peak of the sum. Data checks are off (they are timed by the
   stage, not here).

Vocabulary: the released bert-base-uncased ``vocab.txt`` (30,522 entries) from the data root, tokenised
with ``tokenizers.BertWordPieceTokenizer`` (uncased), so figures compare across machines.

    .venv/bin/python bench/bench_pretrain_data.py --data-root ../shared/data --out /tmp/bench_pretrain_data
    .venv/bin/python bench/bench_pretrain_data.py --loader data/pretrain_data/seq128/train   # loader only

Throughput is reported per wall-clock second and per CPU-second (parent + workers): on a shared machine the
second is the steadier figure.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # run as a script: make `bench` importable

from bench._common import run_monitored  # noqa: E402

CONFIGS = [("x1-w1", 1, 1), ("x1-w2", 1, 2), ("x4-w1", 4, 1), ("x4-w2", 4, 2)]  # (name, copies, workers)


def build_real_corpus(data_root: Path, out: Path) -> Path:
    """The real corpus in the corpus stage's format (no caps), built once."""
    target = out / "corpus-x1"
    if (target / "manifest.json").is_file():
        return target
    from bert_core.corpus import CorpusParams, build_corpus

    params = CorpusParams.model_validate(
        {
            "sources": [{"name": "hub", "kind": "hf", "path": "Salesforce/wikitext"}],
            "local_sources": [
                {
                    "name": "gutenberg",
                    "kind": "text",
                    "path": "corpus/gutenberg/*.txt",
                    "exclude": ["MANIFEST.tsv"],
                },
                {
                    "name": "wikipedia",
                    "kind": "jsonl",
                    "path": "corpus/wikipedia/*.jsonl",
                    "id_field": "id",
                    "title_field": "title",
                },
            ],
            "heldout": {"fraction": 0.01, "max_documents": 500},
        }
    )
    build_corpus(params, target, data_root=data_root, workers=2)
    return target


def replicate(corpus: Path, out: Path, copies: int) -> Path:
    """``copies`` symlinked copies of every shard, renumbered (``part-NNNNN``) per split."""
    if copies == 1:
        return corpus
    target = out / f"corpus-x{copies}"
    shutil.rmtree(target, ignore_errors=True)
    for split in ("train", "heldout"):
        files = sorted((corpus / split).glob("part-*.parquet"))
        (target / split).mkdir(parents=True)
        for c in range(copies):
            for i, f in enumerate(files):
                (target / split / f"part-{c * len(files) + i:05d}.parquet").symlink_to(f.resolve())
    return target


def vocab_dir(data_root: Path, out: Path) -> Path:
    d = out / "vocab"
    d.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(data_root / "checkpoints" / "bert-base-uncased" / "vocab.txt", d / "vocab.txt")
    return d


def child(args: argparse.Namespace) -> None:
    """One build in a fresh process; prints its figures as JSON."""
    from bert_core.params import load_params
    from bert_core.pretrain_data.build import build_pretrain_data
    from bert_core.pretrain_data.params import PretrainDataParams

    params = load_params(REPO / "params" / "pretrain_data.yaml", "pretrain_data", PretrainDataParams)
    params = params.model_copy(update=json.loads(args.overrides))
    params = PretrainDataParams.model_validate(params.model_dump())  # re-validate the overrides
    t0 = time.perf_counter()
    result = build_pretrain_data(
        params, corpus_dir=args.corpus, vocab_dir=args.vocab, output_dir=args.out_dir, run_checks=False
    )
    dt = time.perf_counter() - t0
    out = {"seconds": dt, "phases": {}}
    for phase, splits in result.metrics.items():
        m = splits["train"]
        out["phases"][phase] = {
            k: m[k] for k in ("instances", "tokens", "corpus_tokens", "corpus_documents", "mean_length")
        }
        out["phases"][phase]["heldout_instances"] = splits["heldout"]["instances"]
    out["instances"] = sum(s[sp]["instances"] for s in result.metrics.values() for sp in s)
    out["tokens"] = sum(s[sp]["tokens"] for s in result.metrics.values() for sp in s)
    out["corpus_tokens"] = sum(result.metrics[p]["train"]["corpus_tokens"] for p in list(result.metrics)[:1])
    out["disk_mb"] = sum(f.stat().st_size for f in Path(args.out_dir).rglob("*") if f.is_file()) / 1e6
    print(json.dumps(out))


def bench_loader(data_dirs: list[Path], batch_sizes: list[int], batches: int = 50) -> None:
    """Batches/s of :class:`PretrainingLoader` (shuffled, static or dynamic masks as built), one process."""
    import torch

    from bert_core.pretrain_data.loader import PretrainingLoader

    torch.set_num_threads(1)
    print("| data | masking | batch | padding | batches/s | instances/s | ms/batch |")
    print("|---|---|---|---|---|---|---|")
    for d in data_dirs:
        for bs in batch_sizes:
            for pad in (None, 8):
                ld = PretrainingLoader(d, bs, seed=0, pad_to_multiple_of=pad, drop_last=False)
                it = iter(ld)
                next(it)  # warm the page cache / first-touch
                n = min(batches, ld.steps_per_epoch - 1)
                t0 = time.perf_counter()
                for _ in range(n):
                    next(it)
                dt = (time.perf_counter() - t0) / n
                print(
                    f"| {d} | {ld.masking} | {bs} | {'to max' if pad is None else 'longest, x8'} "
                    f"| {1 / dt:,.1f} | {bs / dt:,.0f} | {dt * 1000:.1f} |"
                )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--data-root", type=Path, default=Path(os.environ.get("BERT_DATA_ROOT", "../shared/data"))
    )
    ap.add_argument("--out", type=Path, default=Path("/tmp/bench_pretrain_data"))
    ap.add_argument("--phases", nargs="+", default=["seq128"])
    ap.add_argument("--dupe-factor", type=int, default=1)
    ap.add_argument("--only", nargs="*", help="config names to run (x1-w1 x1-w2 x4-w1 x4-w2)")
    ap.add_argument("--json", type=Path)
    ap.add_argument("--loader", type=Path, nargs="+", help="only time the loader on these output dirs")
    ap.add_argument("--batch-sizes", type=int, nargs="+", default=[32, 256])
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--overrides", help=argparse.SUPPRESS)
    ap.add_argument("--corpus", help=argparse.SUPPRESS)
    ap.add_argument("--vocab", help=argparse.SUPPRESS)
    ap.add_argument("--out-dir", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        child(args)
        return
    if args.loader:
        bench_loader(args.loader, args.batch_sizes)
        return
    args.out.mkdir(parents=True, exist_ok=True)
    root = args.data_root.resolve()
    corpus = build_real_corpus(root, args.out)
    vocab = vocab_dir(root, args.out)
    results = {}
    for name, copies, workers in CONFIGS:
        if args.only and name not in args.only:
            continue
        overrides = {"phases": args.phases, "dupe_factor": args.dupe_factor, "num_workers": workers}
        out_dir = args.out / f"out-{name}"
        cmd = [
            sys.executable,
            __file__,
            "--child",
            "--overrides",
            json.dumps(overrides),
            "--corpus",
            str(replicate(corpus, args.out, copies)),
            "--vocab",
            str(vocab),
            "--out-dir",
            str(out_dir),
        ]
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        load_before = os.getloadavg()[0]
        res = run_monitored(subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True))
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        res["cpu_s"] = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
        res["load_avg_1m"] = [load_before, os.getloadavg()[0]]
        res["overrides"] = overrides
        results[name] = res
        shutil.rmtree(out_dir, ignore_errors=True)
        print(f"{name}: {json.dumps(res)}", file=sys.stderr, flush=True)
    print(f"phases {args.phases}, dupe_factor {args.dupe_factor}; CPU: {os.cpu_count()} cores")
    print(
        "| run | corpus tokens | instances | tokens out | wall s | inst/s | tokens/s | CPU s | inst per CPU-s "
        "| peak RSS MB (all procs) | max RSS MB of one process | load 1m before/after |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for name, r in results.items():
        print(
            f"| {name} | {r['corpus_tokens']:,} | {r['instances']:,} | {r['tokens']:,} | {r['seconds']:.1f} "
            f"| {r['instances'] / r['seconds']:,.0f} | {r['tokens'] / r['seconds']:,.0f} | {r['cpu_s']:.1f} "
            f"| {r['instances'] / r['cpu_s']:,.0f} | {r['peak_rss_mb']:.0f} ({r['processes_at_peak']}) "
            f"| {r['peak_single_process_rss_mb']:.0f} "
            f"| {r['load_avg_1m'][0]:.1f} / {r['load_avg_1m'][1]:.1f} |"
        )
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
