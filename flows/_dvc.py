"""DVC plumbing for the pipeline flow: the stage graph, one streamed DVC process, the workspace lock.

The pipeline flow never re-implements DVC's decisions: it runs one ``dvc exp run`` (or ``dvc repro``), or
with stages at once one ``dvc repro --single-item`` per stage, and follows the output, so DVC's caching
decides what reruns (:func:`changed_stages` only spares starting DVC for a stage it would skip). DVC announces each stage with stable lines
(``Running stage 'x':``, ``Stage 'x' didn't change, skipping``, ``ERROR: failed to reproduce 'x'``), which
:func:`parse_line` turns into events.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal, Protocol

from filelock import FileLock, Timeout

LOCK_RELPATH = Path(".dvc") / "tmp" / "bert-pipeline.lock"

_RUNNING = re.compile(r"^Running stage '(?P<stage>[^']+)':")
_SKIPPED = re.compile(r"^Stage '(?P<stage>[^']+)' (?:didn't change, skipping|is cached - skipping run)")
_FAILED = re.compile(r"^ERROR: failed to reproduce(?: stages:)? '(?P<stage>[^']+)'")

EventKind = Literal["running", "skipped", "failed", "line"]


@dataclass(frozen=True)
class Event:
    kind: EventKind
    line: str
    stage: str | None = None


def parse_line(line: str) -> Event:
    """Classify one line of DVC output."""
    for kind, pattern in (("running", _RUNNING), ("skipped", _SKIPPED), ("failed", _FAILED)):
        m = pattern.match(line)
        if m:
            return Event(kind, line, m.group("stage"))  # type: ignore[arg-type]
    return Event("line", line)


@dataclass(frozen=True)
class StageInfo:
    """One stage of ``dvc.yaml`` as DVC resolves it (``foreach`` expanded: ``finetune@sst2``)."""

    name: str
    cmd: str
    metrics: tuple[str, ...] = ()
    params: tuple[tuple[str, str], ...] = field(default=())  # (file, dotted key)
    needs: tuple[str, ...] = ()  # the stages whose outputs it reads
    git_outs: tuple[str, ...] = ()  # outputs kept in git, not DVC's cache (``cache: false``: metrics, plots)
    always_changed: bool = False  # run on every repro (``always_changed: true``: the ``inputs`` records)


def stage_infos(root: str | os.PathLike[str]) -> list[StageInfo]:
    """The pipeline's stages in an order DVC could run them (dependencies first).

    Raises:
        dvc.exceptions.DvcException: ``dvc.yaml`` is invalid (DVC's message names the line).
    """
    import networkx as nx
    from dvc.dependency.param import ParamsDependency
    from dvc.repo import Repo
    from dvc.stage import PipelineStage

    with Repo(os.fspath(root)) as repo:
        graph = repo.index.graph
        ordered = [s for s in reversed(list(nx.topological_sort(graph))) if isinstance(s, PipelineStage)]
        infos = []
        names = {s.name for s in ordered}
        for stage in ordered:
            cmd = stage.cmd if isinstance(stage.cmd, str) else " && ".join(stage.cmd or [])
            params = []
            for dep in stage.deps:
                if isinstance(dep, ParamsDependency):
                    keys = dep.params if isinstance(dep.params, list) else list(dep.params or [])
                    params += [(dep.def_path, k) for k in keys]
            infos.append(
                StageInfo(
                    name=stage.name,
                    cmd=cmd,
                    metrics=tuple(o.def_path for o in stage.outs if o.metric),
                    params=tuple(params),
                    needs=tuple(s.name for s in graph.successors(stage) if s.name in names),
                    git_outs=tuple(o.def_path for o in stage.outs if not o.use_cache),
                    always_changed=bool(stage.always_changed),
                )
            )
    return infos


def changed_stages(root: str | os.PathLike[str]) -> set[str]:
    """The stages ``dvc status`` finds changed: a dependency, param, command or output differs from
    ``dvc.lock``, or an output is missing. (A stage after a changed one may still have to run.)

    Asks each stage (``Stage.status``, what ``dvc status`` does) rather than ``Repo.status``, whose keys are
    paths relative to the current directory.
    """
    from dvc.repo import Repo, lock_repo
    from dvc.stage import PipelineStage

    with Repo(os.fspath(root)) as repo, lock_repo(repo):
        return {s.name for s in repo.index.stages if isinstance(s, PipelineStage) and s.status()}


class DvcRun(Protocol):
    """A running DVC command: its merged stdout/stderr lines, then its exit code."""

    def lines(self) -> Iterator[str]: ...

    def wait(self) -> int: ...

    def stop(self, on_line: Callable[[str], None] | None = None) -> None: ...

    def signal(self, signum: int) -> None: ...


class DvcProcess:
    """``python -m dvc <args>`` in its own process group, output streamed line by line.

    The process group lets :meth:`stop` end DVC *and* the stage command it runs (a cancelled Prefect run
    must not leave a training process behind holding DVC's lock).
    """

    def __init__(self, args: list[str], *, cwd: str | os.PathLike[str], env: dict[str, str]) -> None:
        self.args = [sys.executable, "-m", "dvc", *args]
        self.proc = subprocess.Popen(
            self.args,
            cwd=os.fspath(cwd),
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    def lines(self) -> Iterator[str]:
        assert self.proc.stdout is not None
        for raw in self.proc.stdout:
            # Progress bars redraw with '\r': keep only the last state of such a line.
            text = raw.decode("utf-8", errors="replace").rstrip("\n").split("\r")[-1].rstrip()
            yield text

    def wait(self) -> int:
        return self.proc.wait()

    def stop(self, on_line: Callable[[str], None] | None = None, grace_s: float = 30.0) -> None:
        """SIGTERM the whole process group, SIGKILL what is left after ``grace_s``.

        Waits for the whole group, not just DVC: DVC dies at once on SIGTERM, while the stage it ran may
        still be writing its checkpoint (and reporting to this process's Prefect server). The output that
        is still coming (the stage's own "interrupted" line) goes to ``on_line``; it is read either way, so
        a stage never blocks on a full pipe while it shuts down.
        """
        reader = threading.Thread(target=self._drain, args=(on_line,), daemon=True)
        reader.start()
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        while time.monotonic() < deadline and self._group_alive():
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(timeout=0.1)
        if self._group_alive():
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(timeout=30)
        reader.join(timeout=5)
        if not reader.is_alive() and self.proc.stdout is not None:  # else a straggler still holds the pipe
            self.proc.stdout.close()

    def signal(self, signum: int) -> None:
        """Send ``signum`` to DVC's process group (DVC and the stage it runs), if it is still there."""
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, signum)

    def _drain(self, on_line: Callable[[str], None] | None) -> None:
        with contextlib.suppress(ValueError, OSError):  # the pipe closed under the reader
            for line in self.lines():
                if on_line is not None:
                    on_line(line)

    def _group_alive(self) -> bool:
        if self.proc.poll() is None:
            return True
        try:
            os.killpg(self.proc.pid, 0)
        except (ProcessLookupError, PermissionError):
            return False
        return True


class WorkspaceBusy(RuntimeError):
    """Another pipeline run holds the workspace for longer than this run was willing to wait."""


@contextlib.contextmanager
def workspace_lock(
    root: str | os.PathLike[str],
    *,
    holder: str,
    timeout_s: float,
    on_wait: Callable[[str], None] | None = None,
    poll_s: float = 1.0,
    note_every_s: float = 60.0,
) -> Iterator[None]:
    """Hold the repository's pipeline lock (``.dvc/tmp/bert-pipeline.lock``) for the block.

    Two pipeline runs on one workspace would interleave their params overrides and outputs; DVC itself
    refuses a second ``repro`` outright. Here the second run waits (up to ``timeout_s``), and says who it
    is waiting for. The lock is :class:`filelock.FileLock`, an ``flock`` on Unix: the kernel releases it
    when the holder dies, so a killed run never blocks the next one. ``fallback_to_soft=False`` keeps it
    so on a filesystem without ``flock`` (an error there, not a marker file a killed run would leave).

    Raises:
        WorkspaceBusy: the lock was not free within ``timeout_s``; names the holder.
    """
    path = Path(root) / LOCK_RELPATH
    path.parent.mkdir(parents=True, exist_ok=True)

    def claim(fd: int) -> None:  # the holder's name, for the runs that wait on it
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{holder} (pid {os.getpid()})\n".encode(), 0)

    lock = FileLock(path, mode=0o644, fallback_to_soft=False, poll_interval=poll_s, on_acquired=claim)
    deadline = time.monotonic() + timeout_s
    wait_s = 0.0  # the first attempt does not wait: a busy lock is reported at once
    while True:
        try:
            lock.acquire(timeout=wait_s)
            break
        except Timeout:
            current = path.read_text(encoding="utf-8", errors="replace").strip() or "another run"
            left = deadline - time.monotonic()
            if left <= 0:
                raise WorkspaceBusy(
                    f"{root}: the pipeline workspace is busy ({current}); waited {timeout_s:.0f}s. "
                    "Wait for that run to finish, or cancel it."
                ) from None
            if on_wait is not None:
                on_wait(current)
            wait_s = min(left, note_every_s)
    try:
        yield
    finally:
        with open(path, "r+b") as fh:  # the file outlives the lock: leave no stale holder name in it
            fh.truncate()
        lock.release()
