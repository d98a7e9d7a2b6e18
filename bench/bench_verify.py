"""Cost of the output checksums (:mod:`bert_core.integrity`) on the default profile's pretraining data.

1. Builds the real corpus and the default ``pretrain_data`` output (``params/pretrain_data.yaml``, the
   released bert-base-uncased vocabulary) once into ``<out>`` with :mod:`bench.bench_pretrain_data`'s helpers
   (reused when present).
2. Measures, in CPU-seconds of this process (steady on a shared machine; the files are in the page cache, so
   this is the hashing cost, not the disk's): writing the manifest (XXH3-128 of every file), the same bytes
   with sha256 and md5 for comparison, and opening every split with :class:`InstanceStore` with and without
   the check on open (checksums + range checks).

    .venv/bin/python bench/bench_verify.py --data-root ../shared/data --out /tmp/bench_verify
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # run as a script: make `bench` importable

from bench.bench_pretrain_data import build_real_corpus, vocab_dir  # noqa: E402


def _cpu(fn, repeat: int = 3) -> float:
    """Fewest CPU-seconds of ``repeat`` calls (the least disturbed one)."""
    best = float("inf")
    for _ in range(repeat):
        t0 = time.process_time()
        fn()
        best = min(best, time.process_time() - t0)
    return best


def _hash_all(files: list[Path], make) -> None:
    for f in files:
        h = make()
        with open(f, "rb") as fh:
            while chunk := fh.read(4 << 20):
                h.update(chunk)
        h.hexdigest()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data-root", type=Path, required=True)
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--json", type=Path, default=None)
    args = p.parse_args()

    import xxhash

    from bert_core import integrity
    from bert_core.params import load_params
    from bert_core.pretrain_data.build import build_pretrain_data
    from bert_core.pretrain_data.params import PretrainDataParams
    from bert_core.pretrain_data.storage import InstanceStore

    args.out.mkdir(parents=True, exist_ok=True)
    data = args.out / "pretrain_data"
    if not (data / ".bert-output").is_file():
        corpus = build_real_corpus(args.data_root, args.out)
        params = load_params(REPO / "params" / "pretrain_data.yaml", "pretrain_data", PretrainDataParams)
        build_pretrain_data(
            params,
            corpus_dir=corpus,
            vocab_dir=vocab_dir(args.data_root, args.out),
            output_dir=data,
            run_checks=False,
        )
    files = sorted(f for f in data.rglob("*") if f.is_file() and f.name != ".bert-output")
    mb = sum(f.stat().st_size for f in files) / 1e6
    splits = sorted(d.parent for d in data.rglob("index.json"))

    def open_all(verify: bool) -> None:
        integrity._verified.clear()  # every open hashes again, as a fresh process does
        for d in splits:
            InstanceStore(d, verify=verify)

    res = {
        "files": len(files),
        "mb": round(mb, 1),
        "cpu_s": {
            "manifest_xxh3_128": _cpu(lambda: integrity.write_manifest(data)),
            "xxh3_128": _cpu(lambda: _hash_all(files, xxhash.xxh3_128)),
            "sha256": _cpu(lambda: _hash_all(files, hashlib.sha256)),
            "md5": _cpu(lambda: _hash_all(files, hashlib.md5)),
            "open_all_splits_verified": _cpu(lambda: open_all(True)),
            "open_all_splits_unverified": _cpu(lambda: open_all(False)),
        },
    }
    res["mb_per_cpu_s"] = {k: round(mb / v, 1) for k, v in res["cpu_s"].items() if v > 0 and "open" not in k}
    res["cpu_s"] = {k: round(v, 3) for k, v in res["cpu_s"].items()}
    print(json.dumps(res, indent=1))
    if args.json:
        args.json.write_text(json.dumps(res, indent=1) + "\n")


if __name__ == "__main__":
    main()
