"""The work directory of a long build whose finished pieces are kept across a crash (:class:`KeptWork`).

A build (the corpus's work units, the pretraining data's tasks) writes each piece into a work directory
beside its output, ``.<output>.partial/`` (:func:`partial_dir`), with a record per finished piece, and builds
its output from them only once every piece is there: the output still appears whole or not at all. The
directory holds ``identity.json`` (what the pieces are built from; a build of anything else empties the
directory first, saying so) and ``<records>/<name>.json``, one per finished piece, written atomically as the
piece finishes, with the size and XXH3-128 of each of its files. A later build with the same identity takes
every piece whose files still match their record and builds the others. The directory is kept when a build
stops on a signal, a crash or a system error; it is removed when the build succeeds or its input is refused
(``refused``: the same inputs fail the same way). A second build on the same output fails at once.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bert_core.atomic import staged_final, write_json_atomic
from bert_core.integrity import check_file, file_digest, file_entry
from bert_core.tracking.fingerprint import json_fingerprint


class BuildInUseError(RuntimeError):
    """Another build is writing the same output (it holds the work directory's lock)."""


def code_fingerprint(package: str | os.PathLike[str]) -> str:
    """A fingerprint of the Python sources of ``package`` (a directory), for a build's identity: pieces that
    another version of the code built are not taken."""
    files = sorted(Path(package).rglob("*.py"))
    return json_fingerprint({f.relative_to(package).as_posix(): file_digest(f) for f in files})


def partial_dir(output_dir: str | os.PathLike[str]) -> Path:
    """The work directory of a build of ``output_dir``: its hidden sibling ``.<name>.partial``; for a stage's
    staged temporary (:func:`bert_core.atomic.staged_final`), the sibling of the output it stands for, so
    that the next run finds it."""
    output_dir = Path(output_dir)
    output_dir = staged_final(output_dir) or output_dir
    return output_dir.parent / f".{output_dir.name}.partial"


class KeptWork:
    """One build's work directory (see the module docstring); a context manager holding its lock.

    ``build`` names the build in messages (``pretrain_data``), ``piece`` one piece (``task``), ``records``
    the folder of records. :meth:`finished` gives a piece's record when its files still match, and
    :meth:`record` keeps a piece as it finishes.
    """

    def __init__(
        self,
        directory: str | os.PathLike[str],
        identity: dict[str, Any],
        total: int,
        *,
        build: str,
        piece: str,
        records: str,
        refused: tuple[type[BaseException], ...],
    ) -> None:
        self.dir, self.identity, self.total = Path(directory), identity, total
        self.build, self.piece, self.records, self.refused = build, piece, records, refused
        self._lock: Any = None
        self.log = logging.getLogger(f"bert_core.{build}.build")  # the build's own logger

    def __enter__(self) -> KeptWork:
        from filelock import FileLock, Timeout

        ours = not self.dir.is_dir() or (self.dir / "identity.json").exists()
        if not ours and (foreign := sorted(e.name for e in self.dir.iterdir() if e.name != ".lock")):
            raise ValueError(
                f"{self.dir} is not the work directory of a {self.build} build (it holds {foreign[:3]} and "
                "no identity.json), and a build empties its work directory: choose a new or empty one"
            )
        self.dir.mkdir(parents=True, exist_ok=True)
        self._lock = FileLock(self.dir / ".lock", blocking=False)
        try:
            self._lock.acquire()
        except Timeout:
            raise BuildInUseError(
                f"another {self.build} build is writing {self.dir} (it holds {self.dir / '.lock'}); wait for "
                "it to finish, or build into another output directory"
            ) from None
        try:
            self._adopt()
        except BaseException:
            self._lock.release()
            raise
        return self

    def _adopt(self) -> None:
        """Keep the directory's pieces when it was built from the same identity, else empty it."""
        try:
            recorded = json.loads((self.dir / "identity.json").read_text(encoding="utf-8"))
        except (OSError, ValueError):
            recorded = None
        if recorded != self.identity:
            if old := self._records():
                self.log.info(
                    "%s: discarding the %d finished %s(s) in %s: they were built from other inputs or params",
                    self.build,
                    len(old),
                    self.piece,
                    self.dir,
                )
            for entry in self.dir.iterdir():
                if entry.name != ".lock":
                    shutil.rmtree(entry) if entry.is_dir() else entry.unlink()
            write_json_atomic(self.dir / "identity.json", self.identity)
        (self.dir / self.records).mkdir(exist_ok=True)

    def __exit__(self, exc_type: Any, exc: BaseException | None, tb: Any) -> None:
        try:
            kept = len(self._records()) if exc is not None and not isinstance(exc, self.refused) else 0
            if not kept:
                shutil.rmtree(self.dir, ignore_errors=True)
            else:
                self.log.warning(
                    "%s: %d of %d %s(s) are built and kept in %s: the same command continues after them "
                    "(delete the directory to start afresh)",
                    self.build,
                    kept,
                    self.total,
                    self.piece,
                    self.dir,
                )
        finally:
            self._lock.release()

    def _records(self) -> list[Path]:
        return sorted((self.dir / self.records).glob("*.json")) if (self.dir / self.records).is_dir() else []

    def finished(self, name: str, files: Callable[[dict[str, Any]], list[Path]]) -> dict[str, Any] | None:
        """The record ``name``, when it exists and the piece's files now (``files(record)``) are the ones it
        lists, each with its recorded size and checksum; else ``None`` (the piece is built again)."""
        try:
            record = json.loads((self.dir / self.records / f"{name}.json").read_text(encoding="utf-8"))
            found = {f.relative_to(self.dir).as_posix(): f for f in files(record)}
            if set(found) != set(record["files"]):
                return None
            for rel, entry in record["files"].items():
                check_file(found[rel], entry)
        except (OSError, ValueError, KeyError, TypeError):  # CorruptOutputError is a ValueError
            return None
        return record

    def record(self, name: str, files: list[Path], **fields: Any) -> None:
        """Keep a finished piece: its record ``fields``, with the size and checksum of each of its ``files``.

        Neither the files nor the record are fsynced: files a power cut lost or cut short no longer match
        the record, a torn record does not parse, and the piece is built again (an fsync per piece cost 5% of
        a pretraining-data build). The record goes into place by a rename of its own temporary, which nothing
        else reads and the directory's removal clears, with no scan of the folder per record (which would grow
        quadratically with the number of pieces)."""
        entries = {f.relative_to(self.dir).as_posix(): file_entry(f) for f in files}
        path = self.dir / self.records / f"{name}.json"
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        tmp.write_text(
            json.dumps({**fields, "files": entries}, indent=2, sort_keys=True) + "\n", encoding="utf-8"
        )
        os.replace(tmp, path)
