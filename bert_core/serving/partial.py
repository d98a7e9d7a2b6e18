"""A batch prediction's finished rows, kept across a crash, so that the same command continues after them.

:func:`bert_core.serving.batch.predict_file` writes its rows to ``.<output>.partial`` beside the output
(:class:`PartialOutput`) and renames that file onto the output once every row is there: the output still
appears whole or not at all. Beside it, ``.<output>.partial.json`` records how far the rows are good and
what they were predicted from:

- the rows and bytes written and the bytes' XXH3-128 (checked before the rows are used), saved
  (atomically, after an fsync of the rows) at most every ``save_interval_s`` and whenever the run stops on
  an error or a signal, so a SIGKILL or a power cut loses the rows since the last save at most;
- the run's identity (:func:`run_identity`): the input file (path, size, XXH3-128 of its bytes), the model
  (its MLflow ``model_uuid``; for a stage's Hugging Face directory, a digest of its files), the batch size
  and the id field.

A later run with the same identity cuts the file back to the recorded bytes and predicts only the rows after
them, in the same chunks, so its output is the one an uninterrupted run writes. The rows of any other
unfinished run, and those discarded by ``restart``, are dropped with a log line. While a run holds the
partial file it has an exclusive ``flock`` on it: a second run on the same output fails at once instead of
mixing its rows in.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import json
import logging
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, BinaryIO

import xxhash

from bert_core.atomic import DiskFullError, commit_file, looks_like_disk_full, write_json_atomic

log = logging.getLogger("bert_core.serving.batch")

#: Seconds between two saves of the record (rows written since then are what a SIGKILL can cost).
SAVE_INTERVAL_S = 10.0
_STATE_VERSION = 1


class OutputInUseError(RuntimeError):
    """Another batch prediction is writing the same output."""


def _model_identity(model_uri: str, model: Any) -> str | None:
    """What predicted the rows: a stage's Hugging Face directory by its files' digests (its MLflow Model is
    written afresh on every load, with a new ``model_uuid``); any other model by its ``model_uuid``
    (``None`` when it has none: such a run is never continued)."""
    from bert_core.integrity import file_digest
    from bert_core.serving.local import is_local_model
    from bert_core.tracking.fingerprint import json_fingerprint

    if is_local_model(model_uri):
        directory = Path(model_uri.removeprefix("file://")).expanduser()
        if not (directory / "MLmodel").is_file():
            files = {p.name: file_digest(p) for p in sorted(directory.iterdir()) if p.is_file()}
            return "files:" + json_fingerprint(files)
    uuid = getattr(getattr(model, "metadata", None), "model_uuid", None)
    return f"mlflow:{uuid}" if isinstance(uuid, str) and uuid else None


def run_identity(
    src: Path, model_uri: str, model: Any, batch_size: int, id_field: str, input_xxh3_128: str | None = None
) -> dict[str, Any]:
    """What a batch prediction's rows depend on; a partial output is continued only under the same.
    ``input_xxh3_128``: the input's checksum when the caller has read it already."""
    from bert_core.integrity import file_digest

    return {
        "input": str(src.resolve()),
        "input_bytes": src.stat().st_size,
        "input_xxh3_128": input_xxh3_128 or file_digest(src),
        "model": _model_identity(model_uri, model),
        "batch_size": batch_size,
        "id_field": id_field,
    }


class PartialOutput:
    """The rows of one batch prediction's output, written to ``.<output>.partial`` (see the module docstring).

    Use as a context manager (the ``flock`` is taken on entry), call :meth:`resume` once the run's identity
    is known, :meth:`write` each chunk's rows, and :meth:`commit` at the end. Leaving the block with an
    exception after rows were written saves them for the next run (logged); otherwise nothing is left.
    """

    def __init__(
        self,
        final: Path,
        *,
        save_interval_s: float = SAVE_INTERVAL_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.final = Path(final)
        self.path = self.final.with_name(f".{self.final.name}.partial")
        self.state_path = self.final.with_name(f".{self.final.name}.partial.json")
        self.save_interval_s, self.clock = save_interval_s, clock
        #: (rows, bytes, XXH3-128 of those bytes) written and good, updated in one assignment (a signal never
        #: splits them).
        self.mark: tuple[int, int, Any] = (0, 0, xxhash.xxh3_128())
        self.resumed_rows = self.saved_rows = 0
        self.identity: dict[str, Any] | None = None
        self._fh: BinaryIO | None = None
        self._created = self._committed = False
        self._saved_at = 0.0

    @property
    def rows(self) -> int:
        return self.mark[0]

    # -- the lock
    def __enter__(self) -> PartialOutput:
        self.final.parent.mkdir(parents=True, exist_ok=True)
        for _ in range(10):
            self._created = not self.path.exists()
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o666)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                raise OutputInUseError(
                    f"{self.final}: another batch prediction is writing this output (it holds {self.path}); "
                    "wait for it to finish, or choose another output path"
                ) from None
            try:
                same = os.fstat(fd).st_ino == os.stat(self.path).st_ino
            except FileNotFoundError:
                same = False
            if same:
                self._fh = os.fdopen(fd, "r+b")
                return self
            os.close(fd)  # the run that held it finished and renamed it onto the output meanwhile
        raise OutputInUseError(f"{self.final}: {self.path} keeps being replaced; is another run writing it?")

    def __exit__(self, exc_type: Any, exc: BaseException | None, tb: Any) -> None:
        try:
            if self._committed or self._fh is None:
                return
            # Stopped before the run knew what it predicts: an earlier run's rows are left as they are.
            if self.identity is None:
                if self._created:
                    self._discard()
                return
            if exc is not None and self.rows and self.identity.get("model") is not None:
                with contextlib.suppress(Exception):  # a full disk: the last saved record still holds
                    self.save()
            if self.saved_rows:
                log.warning(
                    "stopped after %d row(s); they are kept in %s, and the same command continues after them "
                    "(--restart predicts every row again)",
                    self.saved_rows,
                    self.path,
                )
            else:
                self._discard()
        finally:
            if self._fh is not None:
                with contextlib.suppress(OSError):  # rows past the record that no longer fit: cut on resume
                    self._fh.close()
                self._fh = None
        # The rows' file or their record (then a DiskFullError naming the record) did not fit.
        if isinstance(exc, Exception) and looks_like_disk_full(exc, self.final.parent):
            kept = (
                f"the {self.saved_rows} row(s) saved before are kept in {self.path}"
                if self.saved_rows
                else ""
            )
            raise DiskFullError(
                errno.ENOSPC,
                f"no space left on the device while writing {self.final} ({type(exc).__name__}: {exc}); "
                f"{kept or 'nothing was kept'}. Free space there and run the same command again"
                + (" to continue" if kept else ""),
            ) from exc

    def _discard(self) -> None:
        self.path.unlink(missing_ok=True)
        self.state_path.unlink(missing_ok=True)

    # -- the rows
    def resume(self, identity: dict[str, Any], total: int, *, restart: bool = False) -> int:
        """Continue an earlier run's rows when its identity is ``identity`` and they end where a chunk of
        ``identity["batch_size"]`` rows does, at most at ``total`` (else start empty); return the rows
        already written."""
        assert self._fh is not None, "use PartialOutput as a context manager"
        self.identity = identity
        size = os.fstat(self._fh.fileno()).st_size
        state = self._read_state()
        keep = (
            not restart
            and state is not None
            and identity.get("model") is not None
            and state.get("identity") == identity
            and isinstance(state.get("rows"), int)
            and isinstance(state.get("bytes"), int)
            and 0 <= state["bytes"] <= size
            and 0 <= state["rows"] <= total
            and (state["rows"] % identity["batch_size"] == 0 or state["rows"] == total)
            and (digest := self._digest(state["bytes"])).hexdigest() == state.get("xxh3_128")
        )
        if keep:
            assert state is not None
            self.mark = (state["rows"], state["bytes"], digest)
            self.resumed_rows = self.saved_rows = state["rows"]
            log.info(
                "continuing %s after the %d row(s) an earlier run of the same input and model wrote (%s)",
                self.final,
                self.rows,
                self.path,
            )
        elif size or state is not None:
            why = (
                "--restart"
                if restart
                else "an earlier run of other input, model or settings, or a damaged record"
            )
            log.info("discarding the unfinished rows in %s (%s)", self.path, why)
            self.state_path.unlink(missing_ok=True)
        self._fh.truncate(self.mark[1])
        self._fh.seek(self.mark[1])
        self._saved_at = self.clock()
        return self.rows

    def _digest(self, size: int) -> Any:
        """XXH3-128 of the partial file cut to the ``size`` bytes a record claims (checked before use; a torn
        tail after them goes whether they are kept or not)."""
        assert self._fh is not None
        self._fh.truncate(size)
        self._fh.seek(0)
        return hashlib.file_digest(self._fh, xxhash.xxh3_128)

    def _read_state(self) -> dict[str, Any] | None:
        try:
            state = json.loads(self.state_path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return None
        return state if isinstance(state, dict) and state.get("version") == _STATE_VERSION else None

    def write(self, text: str, rows: int) -> None:
        """Append ``rows`` finished rows (``text``, whole lines); save the record when it is due."""
        assert self._fh is not None and self.identity is not None, "resume() first"
        data = text.encode("utf-8")
        self._fh.write(data)
        digest = self.mark[2].copy()
        digest.update(data)
        self.mark = (self.mark[0] + rows, self.mark[1] + len(data), digest)
        if self.clock() - self._saved_at >= self.save_interval_s:
            self.save()

    def save(self) -> None:
        """Make the rows written so far durable, then record them (in that order: the record never claims
        rows the disk lacks)."""
        assert self._fh is not None
        rows, size, digest = self.mark
        self._fh.flush()
        os.fsync(self._fh.fileno())
        state = {
            "version": _STATE_VERSION,
            "identity": self.identity,
            "rows": rows,
            "bytes": size,
            "xxh3_128": digest.hexdigest(),
        }
        write_json_atomic(self.state_path, state)
        self.saved_rows, self._saved_at = rows, self.clock()

    def commit(self) -> None:
        """Every row is written: move the file onto the output (replacing an old one only now)."""
        assert self._fh is not None
        self._fh.flush()
        commit_file(self.path, self.final)
        self.state_path.unlink(missing_ok=True)
        self._committed = True
