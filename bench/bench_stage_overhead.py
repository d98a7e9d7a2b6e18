"""The fixed cost of one stage command: ``python -m flows.corpus`` on a 20-document corpus, timed end to end.

The corpus stage does a second or two of real work here (reading 20 Wikipedia articles, the corpus data
checks), so what the command costs beyond that is the fixed cost every stage pays: interpreter and imports,
the Prefect API, the MLflow run, Great Expectations' import, the process's exit. Each repeat runs the
command as DVC does, in a child process; printed per repeat and as medians: wall seconds and CPU seconds
(user + sys of the command and its children, the temporary Prefect server included).

Two cases: ``--api temporary`` (no ``PREFECT_API_URL``: the command starts Prefect's temporary server, as a
stage run on its own does) and ``--api URL`` (a running server, as every stage of ``python -m flows.pipeline``
reports to the pipeline's one API). ``--repo`` picks the checkout whose code runs (another worktree, or an
extracted older commit, to compare). The first run of a fresh ``PREFECT_HOME`` migrates Prefect's database:
``--warmup`` runs are not counted. Nothing is written into the repository: outputs, reports, the MLflow
store and the Prefect home are under ``--work``.

    .venv/bin/python bench/bench_stage_overhead.py --data-root ../shared/data --repeats 3 --api temporary
    .venv/bin/python bench/bench_stage_overhead.py --data-root ../shared/data --repeats 3 \\
        --api http://127.0.0.1:4200/api
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
CORPUS_YAML = """\
corpus:
  sources: [{name: hub, kind: hf, path: Salesforce/wikitext}]
  local_sources:
    - {name: wikipedia, kind: jsonl, path: "corpus/wikipedia/*.jsonl", id_field: id, title_field: title,
       max_documents: 20}
  heldout: {fraction: 0.1, max_documents: 2}
  clean: {min_sentences: 1}
  workers: 1
"""


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def run_once(repo: Path, work: Path, env: dict[str, str], i: int) -> tuple[float, float]:
    """Wall and CPU seconds of one stage command; raises when it fails."""
    out = work / f"run{i}"
    cmd = [
        sys.executable,
        "-m",
        "flows.corpus",
        "--params",
        str(work / "corpus.yaml"),
        "--out",
        str(out / "corpus"),
        "--metrics",
        str(out / "corpus.json"),
    ]
    cpu, wall = _children_cpu(), time.perf_counter()
    proc = subprocess.run(cmd, cwd=repo, env=env, capture_output=True, text=True, timeout=600)
    wall, cpu = time.perf_counter() - wall, _children_cpu() - cpu
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} exited with {proc.returncode}:\n{proc.stderr[-3000:]}")
    return wall, cpu


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data-root", type=Path, required=True, help="laid out like ../shared/data")
    parser.add_argument("--api", default="temporary", help="'temporary' or a PREFECT_API_URL")
    parser.add_argument("--repo", type=Path, default=REPO, help="the checkout whose flows/bert_core run")
    parser.add_argument("--work", type=Path, default=Path("/tmp/bench_stage_overhead"))
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--warmup", type=int, default=1)
    args = parser.parse_args(argv)

    wiki = args.data_root.resolve() / "corpus" / "wikipedia" / "wiki_01.jsonl"
    if not wiki.is_file():
        raise SystemExit(f"{wiki} not found: --data-root must be laid out like ../shared/data")
    args.work.mkdir(parents=True, exist_ok=True)
    root = args.work / "root" / "corpus" / "wikipedia"
    root.mkdir(parents=True, exist_ok=True)
    if not (root / wiki.name).exists():
        (root / wiki.name).symlink_to(wiki)
    (args.work / "corpus.yaml").write_text(CORPUS_YAML)
    env = {
        **os.environ,
        "BERT_DATA_ROOT": str(args.work / "root"),
        "HF_HUB_OFFLINE": "1",
        "HF_DATASETS_OFFLINE": "1",
        "MLFLOW_TRACKING_URI": f"sqlite:///{args.work / 'mlflow.db'}",
        "PREFECT_HOME": str(args.work / "prefect_home"),
    }
    env.pop("PREFECT_API_URL", None)
    if args.api != "temporary":
        env["PREFECT_API_URL"] = args.api

    for i in range(args.warmup):
        run_once(args.repo.resolve(), args.work, env, -1 - i)
    walls, cpus = [], []
    for i in range(args.repeats):
        wall, cpu = run_once(args.repo.resolve(), args.work, env, i)
        walls.append(wall)
        cpus.append(cpu)
        print(f"run {i}: wall {wall:.2f} s, cpu (user+sys, children included) {cpu:.2f} s", flush=True)
    print(
        f"median of {args.repeats} ({args.api}, {args.repo}): wall {statistics.median(walls):.2f} s, "
        f"cpu {statistics.median(cpus):.2f} s"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
