"""The fine-tuning stages one at a time and ``--jobs`` at a time, on the same pretrained model.

A throw-away copy of the project (its code, params and ``dvc.yaml``, git + DVC initialised, ``--profile``
applied) is built up to ``pretrain`` once (not timed). Two copies of that workspace (hard links) then run
every ``finetune@<task>`` stage through ``python -m flows.pipeline <stages>``: one with ``--jobs 1`` (one
``dvc repro``), one with ``--jobs N`` (the stages at once, each its own ``dvc repro --single-item``). Both
report to one Prefect server the bench starts, so neither pays for a temporary one.

Threads: each of the N concurrent stages gets ``cores // N`` torch threads; the sequential run is given the
same (``--threads``, default ``cores // N``), so a trial computes the same thing in both and the task
metrics must be identical; the bench says whether they are (timing figures left out). Printed: each run's
wall seconds, the ratio (sequential / concurrent) and the metrics check. Nothing is written into the
repository: everything is under ``--work``.

    .venv/bin/python bench/bench_parallel_finetune.py --data-root ../shared/data --jobs 2
    .venv/bin/python bench/bench_parallel_finetune.py --data-root ../shared/data --profile tiny  # a dry run
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # run as a script: this checkout's flows and bert_core
PROJECT = ("bert_core", "flows", "params", "dvc.yaml", "pyproject.toml")
#: Metrics that measure time or speed, not the model: left out of the comparison.
TIMING = re.compile(r"(seconds|_s$|per_s|per_second|time|throughput|elapsed)", re.I)


def run(cmd: list[str], cwd: Path, env: dict[str, str], log: Path) -> float:
    """Wall seconds of ``cmd``; its output goes to ``log``; raises naming the log when it fails."""
    started = time.perf_counter()
    with open(log, "wb") as out:
        code = subprocess.run(cmd, cwd=cwd, env=env, stdout=out, stderr=subprocess.STDOUT).returncode
    if code != 0:
        raise SystemExit(f"{' '.join(cmd)} failed (exit {code}) in {cwd}; see {log}")
    return time.perf_counter() - started


def build_base(work: Path, profile: str | None, env: dict[str, str]) -> Path:
    """The project copied to ``work/base``, ``profile`` applied, built up to ``pretrain``."""
    from flows import profiles

    base = work / "base"
    for rel in PROJECT:
        src = REPO / rel
        copy = shutil.copytree if src.is_dir() else shutil.copy2
        copy(src, base / rel, **({"ignore": shutil.ignore_patterns("__pycache__")} if src.is_dir() else {}))
    if profile:
        profiles.apply(profiles.resolve(profiles.load(profile, base), lambda current: {}, base), base)
    git = ["git", "-c", "user.name=bench", "-c", "user.email=bench@localhost"]
    for cmd in (
        ["git", "init", "-q"],
        [sys.executable, "-m", "dvc", "init", "-q"],
        [*git, "add", "-A"],
        [*git, "commit", "-qm", "bench"],
    ):
        subprocess.run(cmd, cwd=base, env=env, check=True, capture_output=True)
    seconds = run([sys.executable, "-m", "dvc", "repro", "pretrain"], base, env, work / "base.log")
    print(f"built up to pretrain in {seconds:.0f}s ({work / 'base.log'})", flush=True)
    return base


def finetune_metrics(root: Path, tasks: list[str]) -> dict[str, Any]:
    """Each task's metrics (``metrics/finetune/details/<task>.json``, flat), timing figures left out."""
    from bert_core.params import flatten

    out = {}
    for task in tasks:
        details = json.loads((root / "metrics" / "finetune" / "details" / f"{task}.json").read_text())
        out[task] = {k: v for k, v in flatten(details).items() if not TIMING.search(k)}
    return out


def main() -> int:
    from flows import _dvc, _fanout, profiles
    from flows.serve import DEFAULT_HOST, prefect_env, start_server, stop_process

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--profile", default=profiles.DEFAULT_PROFILE, help="params profile (default: %(default)s)"
    )
    parser.add_argument("--jobs", type=int, default=2, help="stages at once in the concurrent run")
    parser.add_argument(
        "--threads", type=int, help="torch threads per trial in both runs (default: cores // jobs)"
    )
    parser.add_argument("--data-root", help="BERT_DATA_ROOT for the stages (default: the environment's)")
    parser.add_argument("--work", type=Path, help="work directory (default: a new temporary one)")
    args = parser.parse_args()
    work = (args.work or Path(tempfile.mkdtemp(prefix="bench-parallel-"))).resolve()
    work.mkdir(parents=True, exist_ok=True)
    threads = str(args.threads or max(1, _fanout.cpu_cores() // args.jobs))
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    if args.data_root:
        env["BERT_DATA_ROOT"] = str(Path(args.data_root).resolve())
    env = prefect_env(work / "prefect", DEFAULT_HOST, _free_port(), base=env)
    server = start_server(env, work / "prefect.log", timeout_s=300)
    try:
        base = build_base(work, args.profile, {**env, "MLFLOW_TRACKING_URI": f"sqlite:///{work / 'base.db'}"})
        tasks = [i.name for i in _dvc.stage_infos(base) if i.name.startswith("finetune@")]
        seconds, metrics = {}, {}
        for name, jobs in (("sequential", 1), (f"jobs={args.jobs}", args.jobs)):
            ws = work / name.replace("=", "")
            shutil.copytree(base, ws, symlinks=True, copy_function=_link, ignore=_dvc_tmp)
            shutil.copy2(work / "base.db", ws / "mlflow.db")  # the store as the earlier stages left it
            run_env = {**env, "MLFLOW_TRACKING_URI": f"sqlite:///{ws / 'mlflow.db'}"}
            if jobs == 1:  # the threads each concurrent stage gets (flows._fanout.slot_envs)
                run_env.update(OMP_NUM_THREADS=threads, MKL_NUM_THREADS=threads, RAYON_NUM_THREADS=threads)
            cmd = [sys.executable, "-m", "flows.pipeline", "--jobs", str(jobs), *tasks]
            seconds[name] = run(cmd, ws, run_env, work / f"{ws.name}.log")
            metrics[name] = finetune_metrics(ws, [t.split("@", 1)[1] for t in tasks])
            print(
                f"{name:12s} {seconds[name]:8.1f}s  ({len(tasks)} stages, {threads} thread(s) per trial)",
                flush=True,
            )
    finally:
        stop_process(server)
    (seq, s_seq), (par, s_par) = seconds.items()
    print(f"ratio sequential / {par}: {s_seq / s_par:.2f}x")
    same = metrics[seq] == metrics[par]
    print(f"task metrics identical: {'yes' if same else 'NO'}")
    for task in [] if same else metrics[seq]:
        diff = {
            k: (v, metrics[par][task].get(k))
            for k, v in metrics[seq][task].items()
            if metrics[par][task].get(k) != v
        }
        print(f"  {task}: {diff}")
    print(f"work directory: {work}")
    return 0 if same else 1


def _link(src: str, dst: str) -> None:
    """Hard link (DVC and the stages write new files, never into existing ones), else copy."""
    try:
        os.link(src, dst)
    except OSError:
        shutil.copy2(src, dst)


def _dvc_tmp(directory: str, names: list[str]) -> set[str]:
    """DVC's own state (locks, databases written in place) is not shared between the copies."""
    return {"tmp"} & set(names) if Path(directory).name == ".dvc" else set()


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


if __name__ == "__main__":
    sys.exit(main())
