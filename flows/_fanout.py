"""Independent DVC stages at once: which may run together, each one's share of the machine, the pool.

Each stage runs as its own ``dvc repro --single-item`` (so ``dvc.lock``, the run cache and ``dvc status``
are those of a sequential run), once every stage it needs has succeeded. Each slot gets its own GPUs
(``CUDA_VISIBLE_DEVICES``) and its share of the cores (``OMP_NUM_THREADS`` ...); a stage that can never run
beside another gets the whole machine. The shares follow from the graph, not from timing, so a rerun gives
a stage the same threads and the same numbers.
"""

from __future__ import annotations

import contextvars
import graphlib
import os
from collections import deque
from collections.abc import Callable, Mapping
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait

CPU_JOBS = 2
"""Stages at once on a CPU-only machine (fewer on fewer cores). Small models use a second thread poorly
(one SST-2 trial of the tiny model trains faster on one thread than on two), and most of a fine-tuning
stage is single-threaded start-up, data checks, evaluation and tracking, which two stages overlap;
``bench/bench_parallel_finetune.py`` measures it on the machine at hand."""

_THREAD_VARS = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "RAYON_NUM_THREADS")


def visible_gpus() -> list[str]:
    """The GPUs this process may use: ``CUDA_VISIBLE_DEVICES`` when set, else every one torch sees."""
    given = os.environ.get("CUDA_VISIBLE_DEVICES")
    if given is not None:
        return [d.strip() for d in given.split(",") if d.strip() and d.strip() != "-1"]
    import torch

    return [str(i) for i in range(torch.cuda.device_count())]


def cpu_cores() -> int:
    """The CPU cores this process may run on (its affinity, which containers and ``taskset`` narrow)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def default_jobs(gpus: list[str], cores: int) -> int:
    """One stage per GPU on a GPU machine, else :data:`CPU_JOBS` (at most one per core)."""
    return len(gpus) if gpus else max(1, min(CPU_JOBS, cores))


def slot_envs(jobs: int, gpus: list[str], cores: int, *, share_gpus: bool = False) -> list[dict[str, str]]:
    """The environment of each of ``jobs`` slots: its own GPUs (split evenly) and ``cores // jobs`` threads.

    Raises:
        ValueError: more slots than GPUs while ``share_gpus`` is off (the message says both ways out).
    """
    if gpus and jobs > len(gpus) and not share_gpus:
        raise ValueError(
            f"jobs={jobs} but {len(gpus)} GPU(s) ({','.join(gpus)}): two stages would share a GPU. Give "
            f"jobs <= {len(gpus)}, or share_gpus (--share-gpus) to let them."
        )
    threads = str(max(1, cores // jobs))
    envs = [dict.fromkeys(_THREAD_VARS, threads) for _ in range(jobs)]
    for slot, env in enumerate(envs):
        if gpus:
            env["CUDA_VISIBLE_DEVICES"] = ",".join(gpus[slot::jobs] or [gpus[slot % len(gpus)]])
    return envs


def solo_stages(needs: Mapping[str, tuple[str, ...]]) -> set[str]:
    """The stages that can never run beside another: every other stage comes before or after them."""
    import networkx as nx

    graph = nx.DiGraph()
    graph.add_nodes_from(needs)
    graph.add_edges_from((need, stage) for stage, deps in needs.items() for need in deps)
    everything = set(needs)
    return {s for s in needs if nx.ancestors(graph, s) | nx.descendants(graph, s) | {s} == everything}


def closure(needs: Mapping[str, tuple[str, ...]], targets: list[str]) -> dict[str, tuple[str, ...]]:
    """``needs`` narrowed to ``targets`` and what they need (all of it without targets), order kept.

    A target is a stage's name, or a ``foreach`` stage's (``finetune``: every ``finetune@<task>``).

    Raises:
        ValueError: a target that names no stage of ``dvc.yaml`` (the message lists them).
    """
    chosen = {t: [s for s in needs if s == t or s.startswith(f"{t}@")] for t in targets}
    if unknown := [t for t, stages in chosen.items() if not stages]:
        raise ValueError(
            f"targets {unknown}: no such stage in dvc.yaml; give stage names ({', '.join(needs)}), or "
            "jobs=1 (--jobs 1) to hand other targets to dvc repro as they are"
        )
    keep, todo = set(), [s for stages in chosen.values() for s in stages] if targets else list(needs)
    while todo:
        if (stage := todo.pop()) not in keep:
            keep.add(stage)
            todo += needs[stage]
    return {s: deps for s, deps in needs.items() if s in keep}


def run_graph(
    needs: Mapping[str, tuple[str, ...]],
    jobs: int,
    run: Callable[[str, int], bool],
    *,
    fail_fast: bool = False,
    abort: Callable[[], None] = lambda: None,
) -> dict[str, str]:
    """Run every stage of ``needs`` (in dependency order) once the stages it needs succeeded, ``jobs`` at once.

    Args:
        needs: Stage -> the stages it needs, in an order DVC could run them.
        jobs: How many stages at once; each runs in a slot 0 .. jobs-1 of its own.
        run: Runs one stage in a slot (in a worker thread, in a copy of the caller's context, so Prefect's
            run context comes along) and says whether it succeeded.
        fail_fast: After a failure start nothing more (the running stages finish).
        abort: Called when the caller is interrupted (Ctrl-C, SIGTERM) while stages run: it must make them
            end, since the pool waits for its threads.

    Returns:
        Stage -> ``ok``, ``failed`` or ``not run`` (a stage it needs failed, or ``fail_fast`` stopped).
    """
    order = graphlib.TopologicalSorter(needs)  # a stage becomes ready once order.done() for all it needs
    order.prepare()
    outcome: dict[str, str] = {}
    ready, free = deque[str](), list(range(jobs))
    running: dict[Future[bool], tuple[str, int]] = {}
    with ThreadPoolExecutor(max_workers=jobs, thread_name_prefix="stage") as pool:
        try:
            while True:
                ready += order.get_ready()
                while ready and free and not (fail_fast and "failed" in outcome.values()):
                    stage, slot = ready.popleft(), free.pop(0)
                    running[pool.submit(contextvars.copy_context().run, run, stage, slot)] = (stage, slot)
                if not running:
                    break
                for future in wait(running, return_when=FIRST_COMPLETED).done:
                    stage, slot = running.pop(future)
                    free.append(slot)
                    outcome[stage] = "ok" if future.result() else "failed"
                    if outcome[stage] == "ok":
                        order.done(stage)
        except BaseException:
            abort()
            raise
    return {stage: outcome.get(stage, "not run") for stage in needs}
