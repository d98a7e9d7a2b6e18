"""Following one DVC process from the pipeline flow: each stage DVC announces becomes a Prefect task run.

:func:`drive` runs DVC (``start_dvc``; the tests script a fake), parses its output with
:func:`flows._dvc.parse_line`, and hands each stage's log lines to a :func:`follow_stage` task run named
after the stage, whose state is ``Completed``, ``Cached`` (DVC skipped it) or ``Failed``, and whose
artifact shows the stage's metrics (its ``metrics:`` files in ``dvc.yaml``). :func:`fan_out` runs stages at
once, each its own ``dvc repro --single-item`` followed by :func:`drive` in a worker thread.
"""

from __future__ import annotations

import logging
import queue
import re
import signal
import threading
import time
from collections.abc import Callable, Collection, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from prefect import get_run_logger, task
from prefect.cache_policies import NO_CACHE
from prefect.states import Cancelled, Completed
from tabulate import tabulate

from flows import _dvc, _fanout
from flows._stage import metrics_artifact


class PipelineFailed(RuntimeError):
    """DVC exited non-zero; the message names the failed stage and DVC's last lines."""


# ------------------------------------------------------------------------------------ per-stage tasks


_END = object()


class StageFeed:
    """The log lines of one running stage, handed from the flow (reading DVC) to the stage's task."""

    def __init__(self) -> None:
        self._queue: queue.Queue[Any] = queue.Queue()
        self.outcome: str | None = None

    def put(self, line: str) -> None:
        self._queue.put(line)

    def close(self, outcome: str) -> None:
        self.outcome = outcome
        self._queue.put(_END)

    def __iter__(self) -> Iterator[str]:
        while (item := self._queue.get()) is not _END:
            yield item


def read_stage_metrics(root: Path, files: tuple[str, ...]) -> dict[str, Any]:
    """The stage's DVC metrics files merged into one mapping (file stem as prefix when several)."""
    import json

    import yaml

    out: dict[str, Any] = {}
    for rel in files:
        path = root / rel
        if not path.is_file():
            continue
        try:
            text = path.read_text(encoding="utf-8")
            data = json.loads(text) if path.suffix == ".json" else yaml.safe_load(text)
        except (ValueError, OSError):
            continue
        if isinstance(data, dict):
            out.update(data if len(files) == 1 else {Path(rel).stem: data})
    return out


#: The stamp a stage's console line starts with: Prefect's console format (``21:43:43.399 | INFO    | ``) or
#: :func:`flows._cli.configure_logging`'s (the same), Python's default ``logging.basicConfig`` with a date
#: (``2026-11-24 21:43:43,399 INFO ``), or MLflow's own handler's (``2026/11/24 21:43:43 INFO ``).
_STAMP = re.compile(
    r"^(?:\d{4}[-/]\d{2}[-/]\d{2} )?\d{2}:\d{2}:\d{2}(?:[.,]\d{3})?(?: \| | )"
    r"(?P<level>DEBUG|INFO|WARNING|ERROR|CRITICAL)\s*(?:\| )?"
)


def relayed(line: str) -> tuple[int, str]:
    """The level and the text of a stage's console line, without its own time stamp and level.

    The pipeline's ``follow_stage`` task logs each line of the stage again, through Prefect's task-run
    logger, which adds its own time, level and run name: the stage's stamp, left in, gave every line two
    times and two prefixes. The stage's level is kept (a warning stays a warning); a line without a
    stamp (DVC's own, a traceback) is INFO as it is.
    """
    match = _STAMP.match(line)
    if match is None:
        return logging.INFO, line
    return logging.getLevelName(match["level"]), line[match.end() :]


@task(name="dvc-stage", task_run_name="{stage}", cache_policy=NO_CACHE, retries=0)
def follow_stage(stage: str, feed: StageFeed, root: str, metrics_files: tuple[str, ...]) -> Any:
    """One DVC stage as seen from the pipeline: its log lines, then its outcome and metrics."""
    logger = get_run_logger()
    for line in feed:
        if line.strip():  # DVC ends each stage with an empty line
            logger.log(*relayed(line))
    metrics = read_stage_metrics(Path(root), metrics_files)
    if metrics:
        metrics_artifact(f"pipeline-{stage}", stage, metrics)
    result = {"stage": stage, "outcome": feed.outcome, "metrics": metrics}
    if feed.outcome == "interrupted":
        return Cancelled(
            message="the pipeline run was interrupted (Ctrl-C or SIGTERM): DVC and the stage were stopped"
        )
    if feed.outcome == "failed":
        raise PipelineFailed(f"stage '{stage}' failed; its log above shows why")
    if feed.outcome == "cached":
        return Completed(name="Cached", message="unchanged since the last run: DVC skipped it", data=result)
    return result


# ----------------------------------------------------------------------------------------- the driver


@dataclass
class StageReport:
    stage: str
    outcome: str  # ran | cached | failed | interrupted | not run | not started (DVC failed before it ran)
    seconds: float = 0.0
    metrics: dict[str, Any] = field(default_factory=dict)


def start_dvc(args: list[str], *, cwd: Path, env: dict[str, str]) -> _dvc.DvcRun:
    """Start DVC (tests replace this with a scripted fake)."""
    return _dvc.DvcProcess(args, cwd=cwd, env=env)


class _Follow:
    """The stages one DVC process announces, each one's lines handed to its own ``follow_stage`` task."""

    def __init__(self, root: Path, label: str = "") -> None:
        self.root, self.logger, self.label = root, get_run_logger(), label
        self.infos: dict[str, _dvc.StageInfo] | None = None
        self.reports: list[StageReport] = []
        self.futures: list[Any] = []
        self.tail: list[str] = []
        self.current: tuple[StageReport, StageFeed, float] | None = None

    def metrics_files(self, stage: str) -> tuple[str, ...]:
        if self.infos is None or stage not in self.infos:
            try:
                self.infos = {i.name: i for i in _dvc.stage_infos(self.root)}
            except Exception as err:  # the summary still works without metrics
                self.logger.warning("could not read the stage list from dvc.yaml: %s", err)
                self.infos = {}
        info = self.infos.get(stage)
        return info.metrics if info else ()

    def start(self, stage: str, outcome: str) -> StageFeed:
        self.finish("ran")
        report, feed = StageReport(stage, outcome), StageFeed()
        self.reports.append(report)
        self.futures.append(follow_stage.submit(stage, feed, str(self.root), self.metrics_files(stage)))
        self.current = (report, feed, time.monotonic()) if outcome == "running" else None
        return feed

    def finish(self, outcome: str) -> None:
        if self.current is not None:
            report, feed, started = self.current
            report.outcome, report.seconds = outcome, time.monotonic() - started
            feed.close(outcome)
            self.current = None

    def put(self, line: str) -> None:
        if self.current is not None:
            self.current[1].put(line)
        else:
            self.logger.info("%s%s", self.label, line)

    def line(self, line: str) -> None:
        self.tail = [*self.tail[-39:], line]
        event = _dvc.parse_line(line)
        if event.kind == "running":
            self.start(event.stage or "?", "running").put(line)
        elif event.kind == "skipped":
            self.start(event.stage or "?", "cached").close("cached")
        elif event.kind == "failed" and self.current is not None and self.current[0].stage == event.stage:
            self.put(line)
            self.finish("failed")
        else:
            self.put(line)


def drive(
    args: list[str],
    *,
    root: Path,
    env: dict[str, str],
    on_start: Callable[[_dvc.DvcRun], None] = lambda proc: None,
    stopped: threading.Event | None = None,
    label: str = "",
) -> tuple[int, list[StageReport], list[str]]:
    """Run DVC, follow its stage announcements and hand each stage's lines to a ``follow_stage`` task.

    Args:
        args: DVC's arguments.
        root: The repository.
        env: DVC's environment (and its stages').
        on_start: Given the DVC process once it started (the fan-out keeps it, to stop it).
        stopped: Set when the pipeline run was interrupted from another thread: the stage's outcome is
            then ``interrupted``, not ``failed``.
        label: Prefix of DVC's lines outside a stage (the stage's name when stages run at once).

    Returns:
        DVC's exit code, one report per stage DVC mentioned (in order), and DVC's last 40 lines.
    """
    follow = _Follow(root, label)
    proc = start_dvc(args, cwd=root, env=env)
    on_start(proc)
    interrupted = False
    try:
        for line in proc.lines():
            follow.line(line)
        returncode = proc.wait()
    except BaseException as err:  # Ctrl-C / SIGTERM of the pipeline: DVC and its stage are stopped below
        interrupted = not isinstance(err, Exception)
        raise
    finally:
        proc.stop(on_line=follow.put)
        interrupted = interrupted or (stopped is not None and stopped.is_set())
        follow.finish("interrupted" if interrupted else "ran" if proc.wait() == 0 else "failed")
    for future in follow.futures:
        future.wait()
    for report in follow.reports:
        if report.outcome in ("ran", "cached"):
            report.metrics = read_stage_metrics(root, follow.metrics_files(report.stage))
    return returncode, follow.reports, follow.tail


#: DVC's line when another DVC process held a lock file it needed for longer than DVC tries (3 s): the lock
#: of its path-lock table (``.dvc/tmp/rwlock.lock``), which DVC does not wait for; the stage is tried again.
#: (``--wait-for-lock`` makes DVC wait for the repository lock before and after the stage's command.) A path
#: lock held by another DVC process (``... is busy, it is being blocked by (PID n)``) is not retried: our own
#: stages never hold one another's paths (a stage runs only after the stages it reads), so the holder is a
#: ``dvc`` command started beside the pipeline, and the run stops at once naming it, as ``dvc repro`` would.
LOCK_BUSY = ("Unable to acquire lock",)


def fan_out(
    needs: dict[str, tuple[str, ...]],
    *,
    jobs: int,
    root: Path,
    env: dict[str, str],
    slots: list[dict[str, str]],
    unchanged: Collection[str] = (),
    force: bool = False,
    fail_fast: bool = False,
    attempts: int = 6,
    grace_s: float = 30.0,
) -> tuple[int, list[StageReport], list[str]]:
    """Each stage of ``needs`` as its own ``dvc repro --single-item``, ``jobs`` at once (:mod:`flows._fanout`).

    A stage in ``unchanged`` (``dvc status`` found nothing to do) whose needs were all unchanged too is
    reported ``cached`` without starting DVC for it (it would only say so, a few seconds each); any other
    runs with its slot's environment (``slots``: its GPUs and threads) unless it can never run beside
    another; one DVC refused on a busy lock (:data:`LOCK_BUSY`) is tried again (``attempts``, waiting
    1, 2, 4 ... s). On an interrupt every running stage gets SIGTERM, and SIGKILL after ``grace_s``.

    Returns:
        As :func:`drive`: 0 or the first failed stage's DVC exit code, one report per stage (``not run``
        for those a failed stage kept from running), and the first failed stage's last DVC lines.
    """
    solo, stopped = _fanout.solo_stages(needs), threading.Event()
    procs: dict[str, _dvc.DvcRun] = {}
    skipped: set[str] = set()
    done: dict[str, tuple[int, list[StageReport], list[str]]] = {}

    def run(stage: str, slot: int) -> bool:
        if stage in unchanged and not force and all(n in skipped for n in needs[stage]):
            skipped.add(stage)
            done[stage] = _cached(stage, root)
        else:
            stage_env = env if stage in solo else {**env, **slots[slot]}
            done[stage] = _repro_single(stage, root, stage_env, force, attempts, stopped, procs)
        return done[stage][0] == 0

    def abort() -> None:
        stopped.set()
        for proc in list(procs.values()):
            proc.signal(signal.SIGTERM)
        killer.start()

    killer = threading.Timer(grace_s, lambda: [p.signal(signal.SIGKILL) for p in list(procs.values())])
    killer.daemon = True
    try:
        outcome = _fanout.run_graph(needs, jobs, run, fail_fast=fail_fast, abort=abort)
    finally:
        killer.cancel()
    reports = []
    for stage in needs:  # no report: DVC failed before it announced the stage, or the stage never started
        missing = StageReport(stage, "not started" if outcome.get(stage) == "failed" else "not run")
        reports += done.get(stage, (0, [], []))[1] or [missing]
    failed = [done[s] for s in needs if outcome.get(s) == "failed"]  # in the order of the reports
    return (failed[0][0] or 1, reports, failed[0][2]) if failed else (0, reports, [])


def _repro_single(
    stage: str,
    root: Path,
    env: dict[str, str],
    force: bool,
    attempts: int,
    stopped: threading.Event,
    procs: dict[str, _dvc.DvcRun],
) -> tuple[int, list[StageReport], list[str]]:
    """``dvc --wait-for-lock repro --single-item <stage>`` followed by :func:`drive`, tried again when DVC
    refused it on :data:`LOCK_BUSY`; its DVC process is in ``procs`` while it runs (for an interrupt)."""

    def started(proc: _dvc.DvcRun) -> None:
        procs[stage] = proc
        if stopped.is_set():  # interrupted while it started: the abort may have missed it
            proc.signal(signal.SIGTERM)

    args = ["--wait-for-lock", "repro", "--single-item", *(["--force"] if force else []), stage]
    for attempt in range(attempts):
        code, reports, tail = result = drive(
            args, root=root, env=env, on_start=started, stopped=stopped, label=f"[{stage}] "
        )
        procs.pop(stage, None)  # ended: never signal a process group id the system may reuse
        if code == 0 or reports or stopped.is_set() or not any(b in t for t in tail for b in LOCK_BUSY):
            break
        get_run_logger().info("[%s] DVC's lock is busy: trying again (%d/%d)", stage, attempt + 1, attempts)
        if stopped.wait(2**attempt):
            break
    return result


def _cached(stage: str, root: Path) -> tuple[int, list[StageReport], list[str]]:
    """A stage DVC would skip, shown as :func:`drive` shows one: a ``Cached`` task run with its metrics."""
    follow = _Follow(root)
    follow.start(stage, "cached").close("cached")
    follow.futures[0].wait()
    follow.reports[0].metrics = read_stage_metrics(root, follow.metrics_files(stage))
    return 0, follow.reports, []


def summary_markdown(
    run_id: str, exp_name: str | None, command: list[str], reports: list[StageReport], ok: bool
) -> str:
    lines = [f"## Pipeline run `{run_id}`: {'completed' if ok else 'FAILED'}", ""]
    if exp_name:
        lines += [f"DVC experiment **`{exp_name}`**: restore it with `dvc exp apply {exp_name}`.", ""]
    rows = [(r.stage, r.outcome, f"{r.seconds:.1f}") for r in reports]
    table = tabulate(rows, ["stage", "outcome", "seconds"], tablefmt="pipe", disable_numparse=True)
    lines += [f"Command: `{' '.join(command)}`", "", table]
    lines += [
        "",
        f"MLflow: every stage run is tagged `pipeline_run_id={run_id}`; compare two runs with "
        f"`python -m flows.compare {run_id} <other run id>`.",
    ]
    return "\n".join(lines)
