"""A pretraining-data build's finished tasks, kept across a crash: the same build continues after them.

:func:`.build.build_pretrain_data` writes every task's shards into a work directory beside the output,
``.<output>.partial/`` (:class:`PartialBuild`), and moves them into the output only once every task is
built, balanced and checked: the output still appears whole or not at all. The work directory holds:

- ``identity.json``: what the shards are built from (:func:`build_identity`): the params that decide the
  output's bytes, the vocabulary files, every corpus shard (name, size, XXH3-128) and the format version.
  A build of anything else empties the directory first, saying so;
- ``tasks/<split>-<index>.json``, one per finished task, written (atomically) as the task finishes: the
  worker's result and the size and XXH3-128 of each of the task's files.

A later build with the same identity keeps every task whose files still match their record and runs the
others, so its output is the one an uninterrupted build writes, byte for byte (the plan and every seed
depend on the inputs and the params alone). NSP balancing runs a few tasks again after the first pass and
rewrites their shards: resumed, those no longer match their record and are built again, then balanced as
before. The directory is kept when a build stops on a signal, a crash or a system error (a full disk, a
worker killed for memory); it is removed when the build succeeds or its input is refused (a bad corpus, a
failed data check: the same inputs fail the same way). A second build on the same output fails at once.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
from pathlib import Path
from typing import Any

from bert_core.atomic import staged_final, write_json_atomic
from bert_core.checks import DataCheckError
from bert_core.integrity import check_file, checked_entry, file_entry
from bert_core.pretrain_data.params import PretrainDataParams
from bert_core.pretrain_data.storage import FORMAT_VERSION
from bert_core.pretrain_data.worker import Job

log = logging.getLogger("bert_core.pretrain_data.build")

#: Errors of the inputs themselves: the same build fails the same way, so its finished tasks are not kept.
REFUSED = (ValueError, DataCheckError)


class BuildInUseError(RuntimeError):
    """Another build is writing the same output (it holds the work directory's lock)."""


def partial_dir(output_dir: str | os.PathLike[str]) -> Path:
    """The work directory of a build of ``output_dir``: its hidden sibling ``.<name>.partial``; for a stage's
    staged temporary (:func:`bert_core.atomic.staged_final`), the sibling of the output it stands for, so
    that the next run finds it."""
    output_dir = Path(output_dir)
    output_dir = staged_final(output_dir) or output_dir
    return output_dir.parent / f".{output_dir.name}.partial"


def build_identity(
    params: PretrainDataParams, corpus_dir: str | Path, vocab_dir: str | Path, splits: tuple[str, ...]
) -> dict[str, Any]:
    """What a build's bytes depend on: the format version, the params that decide them, the vocabulary files
    and every corpus shard by name, size and XXH3-128 (from the corpus output's manifest, against which the
    shards were checked as the build planned its tasks; computed, at about 5 GB/s, where there is none)."""
    vocab_files = [Path(vocab_dir) / n for n in ("vocab.txt", "tokenizer.json")]
    corpus = {
        split: [[f.name, checked_entry(f)] for f in sorted((Path(corpus_dir) / split).glob("part-*.parquet"))]
        for split in splits
    }
    return {
        "format_version": FORMAT_VERSION,
        "params": params.data_params(),
        "vocab": {f.name: checked_entry(f) for f in vocab_files if f.is_file()},
        "corpus": corpus,
    }


class PartialBuild:
    """The work directory of one build (see the module docstring); a context manager holding its lock.

    :meth:`finished` gives a task's recorded result when its files still match, and :meth:`record` keeps a
    task as it finishes. Leaving the block removes the directory, unless the build stopped on anything but
    :data:`REFUSED` after some task was kept.
    """

    def __init__(self, directory: str | os.PathLike[str], identity: dict[str, Any], total: int) -> None:
        self.dir, self.identity, self.total = Path(directory), identity, total
        self._lock: Any = None

    def __enter__(self) -> PartialBuild:
        from filelock import FileLock, Timeout

        ours = not self.dir.is_dir() or (self.dir / "identity.json").exists()
        if not ours and (foreign := sorted(e.name for e in self.dir.iterdir() if e.name != ".lock")):
            raise ValueError(
                f"{self.dir} is not the work directory of a pretrain_data build (it holds {foreign[:3]} and "
                "no identity.json), and a build empties its work directory: choose a new or empty one"
            )
        self.dir.mkdir(parents=True, exist_ok=True)
        self._lock = FileLock(self.dir / ".lock", blocking=False)
        try:
            self._lock.acquire()
        except Timeout:
            raise BuildInUseError(
                f"another pretrain_data build is writing {self.dir} (it holds {self.dir / '.lock'}); wait for "
                "it to finish, or build into another output directory"
            ) from None
        try:
            self._adopt()
        except BaseException:
            self._lock.release()
            raise
        return self

    def _adopt(self) -> None:
        """Keep the directory's tasks when it was built from the same identity, else empty it."""
        try:
            recorded = json.loads((self.dir / "identity.json").read_text(encoding="utf-8"))
        except (OSError, ValueError):
            recorded = None
        if recorded != self.identity:
            if old := self._records():
                log.info(
                    "pretrain_data: discarding the %d finished task(s) in %s: they were built from other "
                    "inputs or params",
                    len(old),
                    self.dir,
                )
            for entry in self.dir.iterdir():
                if entry.name != ".lock":
                    shutil.rmtree(entry) if entry.is_dir() else entry.unlink()
            write_json_atomic(self.dir / "identity.json", self.identity)
        (self.dir / "tasks").mkdir(exist_ok=True)

    def __exit__(self, exc_type: Any, exc: BaseException | None, tb: Any) -> None:
        try:
            kept = len(self._records()) if exc is not None and not isinstance(exc, REFUSED) else 0
            if not kept:
                shutil.rmtree(self.dir, ignore_errors=True)
            else:
                log.warning(
                    "pretrain_data: %d of %d task(s) are built and kept in %s: the same command continues "
                    "after them (delete the directory to start afresh)",
                    kept,
                    self.total,
                    self.dir,
                )
        finally:
            self._lock.release()

    def _records(self) -> list[Path]:
        return sorted((self.dir / "tasks").glob("*.json")) if (self.dir / "tasks").is_dir() else []

    def _record_path(self, job: Job) -> Path:
        return self.dir / "tasks" / f"{job.task.split}-{job.task.index:05d}.json"

    def _files(self, job: Job, phases: Any) -> list[Path]:
        split, name = job.task.split, f"shard-{job.task.index:05d}"
        return [f for phase in phases for f in sorted((self.dir / phase / split).glob(f"{name}.*.bin"))]

    def finished(self, job: Job) -> dict[str, Any] | None:
        """The task's recorded result, when it is recorded for these corpus rows and its files match."""
        try:
            record = json.loads(self._record_path(job).read_text(encoding="utf-8"))
            if record["segments"] != job.task.rows():
                return None
            files = self._files(job, record["result"]["phases"])
            found = {f.relative_to(self.dir).as_posix(): f for f in files}
            if set(found) != set(record["files"]):
                return None
            for rel, entry in record["files"].items():
                check_file(found[rel], entry)
        except (OSError, ValueError, KeyError, TypeError):  # CorruptOutputError is a ValueError
            return None
        return record["result"]

    def record(self, job: Job, result: dict[str, Any]) -> None:
        """Keep a finished task: its record, with the size and checksum of each of its files. The files are
        not fsynced: shards a power cut lost or cut short no longer match the record, and the task is built
        again (an fsync per task cost 5% of a build)."""
        files = {
            f.relative_to(self.dir).as_posix(): file_entry(f) for f in self._files(job, result["phases"])
        }
        record = {"segments": job.task.rows(), "result": result, "files": files}
        write_json_atomic(self._record_path(job), record)
