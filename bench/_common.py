"""Small timing helpers shared by the benchmarks: interleaved timing, medians, a results table.

Benchmarks compare two implementations *in one process, interleaved* (A, B, B, A, A, B, ...), so
that slow drift of a shared machine (other processes, thermal state, memory) hits both alike, and
report medians, which a few disturbed repetitions do not move.
"""

from __future__ import annotations

import contextlib
import json
import os
import platform
import statistics
import subprocess
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from tabulate import tabulate


def median(values: Sequence[float]) -> float:
    """Median of a non-empty sequence."""
    if not values:
        raise ValueError("median of an empty sequence")
    return float(statistics.median(values))


CLOCKS: dict[str, Callable[[], float]] = {
    # Wall time: what a user waits for; right on a quiet machine.
    "wall": time.perf_counter,
    # CPU time of this process: the work done, far less sensitive to other processes competing for
    # the cores of a shared machine (use with one thread: idle-spinning worker threads count too).
    "cpu": time.process_time,
}


def time_call(
    fn: Callable[[], Any],
    sync: Callable[[], None] | None = None,
    clock: Callable[[], float] = time.perf_counter,
) -> float:
    """Seconds one call of ``fn`` takes on ``clock`` (``sync`` runs before the clock is read, e.g. CUDA sync)."""
    start = clock()
    fn()
    if sync is not None:
        sync()
    return clock() - start


def interleaved_timing(
    fns: dict[str, Callable[[], Any]],
    repeats: int,
    warmup: int = 1,
    sync: Callable[[], None] | None = None,
    clock: Callable[[], float] = time.perf_counter,
) -> dict[str, list[float]]:
    """Time several callables in alternation; returns seconds per call for each name.

    Each repetition runs every callable once; the order alternates between repetitions (forward,
    then reversed) so none always runs first. ``warmup`` untimed rounds are run the same way.
    """
    if repeats < 1:
        raise ValueError(f"repeats must be >= 1, got {repeats}")
    names = list(fns)
    times: dict[str, list[float]] = {name: [] for name in names}
    for rep in range(warmup + repeats):
        order = names if rep % 2 == 0 else names[::-1]
        for name in order:
            elapsed = time_call(fns[name], sync, clock)
            if rep >= warmup:
                times[name].append(elapsed)
    return times


def paired_ratios(numerator: Sequence[float], denominator: Sequence[float]) -> list[float]:
    """Per-repetition ratios ``numerator[i] / denominator[i]`` (e.g. theirs / ours = our speed-up)."""
    return [n / d for n, d in zip(numerator, denominator, strict=True)]


def cpu_model() -> str:
    """The CPU model name (lscpu, falling back to /proc/cpuinfo and platform)."""
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, timeout=10, check=False).stdout
        for line in out.splitlines():
            if line.startswith("Model name:"):
                return line.split(":", 1)[1].strip()
    except (OSError, subprocess.SubprocessError):
        pass
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as fh:
            for line in fh:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def machine_info() -> dict[str, Any]:
    """CPU, core count, torch threads and library versions, for the benchmark record."""
    import torch

    info: dict[str, Any] = {
        "cpu": cpu_model(),
        "cores": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "loadavg_1m": round(os.getloadavg()[0], 2),  # other processes on a shared machine skew timings
    }
    try:
        import transformers

        info["transformers"] = transformers.__version__
    except ImportError:
        pass
    if torch.cuda.is_available():
        info["gpu"] = torch.cuda.get_device_name(0)
    return info


def format_table(rows: Sequence[dict[str, Any]], columns: Sequence[str] | None = None) -> str:
    """A Markdown table of ``rows`` (floats to 3 significant decimals)."""
    if not rows:
        return ""
    columns = list(columns or rows[0])

    def cell(value: Any) -> str:
        if isinstance(value, float):
            return f"{value:.3f}" if abs(value) < 1000 else f"{value:,.0f}"
        return str(value)

    body = [[cell(row.get(c, "")) for c in columns] for row in rows]
    return tabulate(body, columns, tablefmt="pipe", disable_numparse=True)


def print_table(rows: Sequence[dict[str, Any]], columns: Sequence[str] | None = None) -> None:
    """Print :func:`format_table`."""
    print(format_table(rows, columns))


def run_monitored(proc: subprocess.Popen) -> dict[str, Any]:
    """Wait for a benchmark child that prints its result as JSON on its last stdout line.

    Samples the resident memory of the child and all its descendants every 50 ms and adds to the result
    ``peak_rss_mb`` (peak of the sum), ``processes_at_peak``, ``peak_single_process_rss_mb`` and
    ``rss_at_peak_mb`` (each process's RSS in the peak sample, the child first, then its descendants).
    """
    import psutil

    peak: dict[str, Any] = {"rss": 0, "procs": 0, "single": 0, "each": []}
    ps = psutil.Process(proc.pid)

    def sample() -> None:
        while proc.poll() is None:
            with contextlib.suppress(psutil.Error):
                procs = [ps, *ps.children(recursive=True)]
                each = []
                for p in procs:
                    with contextlib.suppress(psutil.Error):
                        each.append(p.memory_info().rss)
                        peak["single"] = max(peak["single"], each[-1])
                if sum(each) > peak["rss"]:
                    peak["rss"], peak["procs"], peak["each"] = sum(each), len(procs), each
            time.sleep(0.05)

    t = threading.Thread(target=sample, daemon=True)
    t.start()
    out, _ = proc.communicate()
    t.join()
    if proc.returncode:
        raise SystemExit(f"benchmark child failed with exit code {proc.returncode}")
    result = json.loads(out.strip().splitlines()[-1])
    result["peak_rss_mb"] = peak["rss"] / 2**20
    result["processes_at_peak"] = peak["procs"]
    result["peak_single_process_rss_mb"] = peak["single"] / 2**20
    result["rss_at_peak_mb"] = [one / 2**20 for one in peak["each"]]
    return result
