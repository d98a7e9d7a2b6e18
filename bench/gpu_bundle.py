"""Fill ``.gpu/`` (ignored by git) with what the GPU machine lacks, for ``bench.gpu_check`` and ``bench.gpu_smoke``.

Run on a machine with pip's network access and the data root (``make gpu-bundle``), then carry ``.gpu``
with the working tree to the GPU machine (see ``docs/benchmarks.md``, GPU):

- ``.gpu/wheels/``: :data:`WHEELS`, pinned to ``requirements/lock.txt``, for CPython ``--python-version``
  on manylinux x86-64 (binary wheels only, no dependencies: the GPU image already has the rest: numpy,
  pandas, scipy, jinja2, requests, attrs, ...). About 16 MB.
- ``.gpu/data/``: a data root laid out like ``../shared/data``, the few files the smoke and the
  benchmarks read: a corpus sample (whole Gutenberg books and Wikipedia files up to ``--corpus-mb``),
  SST-2 (train, dev), bert-base-uncased's ``vocab.txt``. About 10 MB.

Usage::

    python -m bench.gpu_bundle [--python-version 3.12] [--data-root ../shared/data] [--corpus-mb 6]
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
from pathlib import Path

from bench._gpu_env import BUNDLE, DATA, REPO, WHEELS

# What the GPU image lacks on the path of the library's stage entries: pydantic (every params model),
# mwparserfromhell and backports.zstd (the corpus's wiki reader and .zst files, imported with the package;
# zstd is in the standard library from Python 3.14) and Great Expectations (the
# data checks of every data stage and of fine-tuning) with the dependencies the image does not have.
# blingfire (a 42 MB wheel) stays behind: the smoke segments with `lines` when it is missing.
WHEELS_LIST = (
    "pydantic",
    "pydantic_core",
    "annotated-types",
    "typing-inspection",
    "typing_extensions",
    "mwparserfromhell",
    "backports.zstd",
    "great_expectations",
    "altair",
    "narwhals",
    "cryptography",
    "cffi",
    "pycparser",
    "jsonschema",
    "jsonschema-specifications",
    "referencing",
    "rpds-py",
    "marshmallow",
    "mistune",
    "ruamel.yaml",
    "ruamel.yaml.clib",
    "tzlocal",
)
PLATFORMS = (
    "manylinux_2_17_x86_64",
    "manylinux2014_x86_64",
    "manylinux_2_24_x86_64",
    "manylinux_2_27_x86_64",
    "manylinux_2_28_x86_64",
    "manylinux_2_31_x86_64",
    "manylinux_2_34_x86_64",
    "manylinux1_x86_64",
)
SST2_FILES = ("glue/SST-2/train.tsv", "glue/SST-2/dev.tsv")
VOCAB_FILE = "checkpoints/bert-base-uncased/vocab.txt"


def _norm(name: str) -> str:
    return name.lower().replace("_", "-").replace(".", "-")


def pinned(lock: Path = REPO / "requirements" / "lock.txt") -> list[str]:
    """``name==version`` for every wheel of :data:`WHEELS_LIST`, from the lock file."""
    versions = {}
    for line in lock.read_text(encoding="utf-8").splitlines():
        if "==" in line and not line.startswith("#"):
            name, version = line.split("==", 1)
            versions[_norm(name)] = version.split(";")[0].strip()
    missing = [n for n in WHEELS_LIST if _norm(n) not in versions]
    if missing:
        sys.exit(
            f"{lock}: no pinned version for {', '.join(missing)}; add them (make lock) or edit WHEELS_LIST"
        )
    return [f"{n}=={versions[_norm(n)]}" for n in WHEELS_LIST]


def download_wheels(python_version: str) -> None:
    if WHEELS.is_dir():
        shutil.rmtree(WHEELS)
    WHEELS.mkdir(parents=True)
    cmd = [
        sys.executable,
        "-m",
        "pip",
        "download",
        "-q",
        "--no-deps",
        "--only-binary=:all:",
        "--implementation",
        "cp",
        "--python-version",
        python_version,
        "-d",
        str(WHEELS),
    ]
    for platform in PLATFORMS:
        cmd += ["--platform", platform]
    subprocess.run([*cmd, *pinned()], check=True)


def copy_data(root: Path, corpus_mb: float) -> None:
    if not root.is_dir():
        sys.exit(f"data root {root} not found: pass --data-root (a folder laid out like ../shared/data)")
    if DATA.is_dir():
        shutil.rmtree(DATA)
    budget = int(corpus_mb * 1e6)
    # Half the budget each: whole Wikipedia files, then whole books (sorted, so the sample is stable).
    for sub, pattern in (("corpus/wikipedia", "*.jsonl"), ("corpus/gutenberg", "*.txt")):
        used = 0
        for f in sorted((root / sub).glob(pattern)):
            if used + f.stat().st_size > budget // 2:
                continue
            (DATA / sub).mkdir(parents=True, exist_ok=True)
            shutil.copyfile(f, DATA / sub / f.name)
            used += f.stat().st_size
    for rel in (*SST2_FILES, VOCAB_FILE):
        (DATA / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(root / rel, DATA / rel)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.gpu_bundle", description=__doc__.split("\n\n")[0])
    ap.add_argument("--python-version", default="3.12", help="the GPU machine's Python (major.minor)")
    default_root = os.environ.get("BERT_DATA_ROOT") or REPO.parent / "shared" / "data"
    ap.add_argument("--data-root", type=Path, default=Path(default_root))
    ap.add_argument("--corpus-mb", type=float, default=6.0, help="corpus sample size")
    ap.add_argument("--no-wheels", action="store_true")
    ap.add_argument("--no-data", action="store_true")
    args = ap.parse_args(argv)
    if not args.no_wheels:
        download_wheels(args.python_version)
    if not args.no_data:
        copy_data(args.data_root, args.corpus_mb)
    size = sum(f.stat().st_size for f in BUNDLE.rglob("*") if f.is_file() and "site-py" not in str(f))
    print(f"{BUNDLE}: {size / 2**20:.1f} MiB (carry '.gpu' with the working tree)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
