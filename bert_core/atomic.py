"""Atomic outputs: a stage's output appears complete or not at all.

Everything is written to a temporary sibling of the final path (same filesystem, so the final step is a
``rename``) and moved into place only when the ``with`` block exits without an exception. A crash, a
``SIGKILL`` or a full disk leaves at most a ``.<name>.tmp-*`` sibling that no later stage reads (and that
:func:`clean_stale_temps` removes), never a half-written file at the final path. Temporaries are named
after the writing host and process, and the next write of the same output removes those whose process is
dead.

Which existing paths an output may replace, and the marker every directory output carries, is
:mod:`bert_core.owned`.

A write that fails for lack of space (``ENOSPC``, a quota, or a library that reports it in its own words,
like ``torch.save``'s "unexpected pos") raises :class:`DiskFullError` naming the output, after the partial
output was removed.
"""

from __future__ import annotations

import contextlib
import csv
import errno
import glob
import io
import json
import os
import shutil
import socket
import tempfile
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any, NoReturn

from bert_core.integrity import refresh
from bert_core.owned import check_replaceable, dir_mode, mark_output

TEMP_MARKER = ".tmp-"
_LOW_SPACE_BYTES = 1 << 20


class DiskFullError(OSError):
    """An output could not be written for lack of disk space; the partial output was removed."""


def looks_like_disk_full(err: Exception, directory: Path) -> bool:
    """Whether ``err``, raised while writing under ``directory``, means the device (or a quota) is full."""
    if isinstance(err, OSError) and err.errno in (errno.ENOSPC, errno.EDQUOT):
        return True
    text = str(err)
    if "No space left on device" in text or "os error 28" in text or "Disk quota exceeded" in text:
        return True
    if not (isinstance(err, OSError) or type(err) is RuntimeError):
        return False
    try:  # libraries that hide the errno (torch.save: "unexpected pos ..."): is the disk (nearly) full?
        st = os.statvfs(directory)
    except OSError:
        return False
    return st.f_bavail * st.f_frsize < _LOW_SPACE_BYTES


def _owner_tag() -> str:
    host = "".join(c for c in socket.gethostname() if c.isalnum())[:32] or "host"
    return f"{host}_{os.getpid()}"


_OWNER = _owner_tag()


def _remove_dead_writers_temps(directory: Path, prefix: str) -> None:
    """Remove ``<prefix><host>_<pid>-*`` temporaries of this host whose writer process is dead.

    A killed stage leaves its temporary output behind (possibly gigabytes); the next write of the same
    output removes it. Temporaries of live processes, of other hosts (a shared filesystem) and of an
    unknown layout are left alone.
    """
    if not directory.is_dir():
        return
    host = _OWNER.rsplit("_", 1)[0]
    for child in directory.glob(glob.escape(prefix) + "*"):
        owner = child.name[len(prefix) :].removeprefix("old-").split("-", 1)[0]
        child_host, _, pid = owner.rpartition("_")
        if child_host == host and pid.isdigit() and writer_gone(int(pid), child):
            _remove(child)


#: How much later than a temporary's last change a process must have started to be taken for another one
#: with its writer's number (a process's start time is known to about a second).
_START_SLACK_S = 1.5


def writer_gone(pid: int, temporary: Path) -> bool:
    """Whether the process ``pid`` that wrote ``temporary`` is gone: no such process on this host, a killed
    one not yet reaped, or one that started after the temporary last changed (the number reused by another
    process; a temporary's change time is never before its writer started). A process we may not inspect
    counts as its writer. The ``old-`` sibling of a replaced output is judged by the number alone: it is
    the earlier output renamed, and not every filesystem counts a rename as a change."""
    import psutil  # here, not at import: a served model carries this module without psutil

    try:
        process = psutil.Process(pid)
        if process.status() == psutil.STATUS_ZOMBIE:  # killed, not yet reaped by its parent
            return True
        started, changed = process.create_time(), temporary.lstat().st_ctime
    except psutil.NoSuchProcess:
        return True
    except (psutil.Error, OSError):
        return False
    return f"{TEMP_MARKER}old-" not in temporary.name and started > changed + _START_SLACK_S


def _fsync_dir(path: Path) -> None:
    with contextlib.suppress(OSError):
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    elif path.exists() or path.is_symlink():
        path.unlink(missing_ok=True)


@contextlib.contextmanager
def atomic_path(final: str | os.PathLike[str], *, is_dir: bool | None = None) -> Iterator[Path]:
    """Yield a temporary path next to ``final``; move it into place when the block succeeds.

    Args:
        final: Where the finished file or directory must end up.
        is_dir: Create the temporary path as an (empty) directory first. By default it is not created:
            the caller writes a file there, or creates a directory itself.

    Yields:
        The temporary path to write to.

    An existing ``final`` is replaced only after the new output is complete (renamed aside first, then
    removed), so readers see either the old or the new output.
    """
    final = Path(final)
    outer = staged_final(final)
    if outer is not None:  # already a temporary of atomic_outputs, which commits it: write it in place
        yield from _write_in_place(final, outer, is_dir)
        return
    check_replaceable(final, is_dir=is_dir)
    final.parent.mkdir(parents=True, exist_ok=True)
    prefix = f".{final.name}{TEMP_MARKER}"
    _remove_dead_writers_temps(final.parent, prefix)
    tmp = Path(tempfile.mkdtemp(prefix=f"{prefix}{_OWNER}-", dir=final.parent))
    tmp.rmdir()
    yield from _filled(tmp, final, is_dir)
    try:
        check_replaceable(final, is_dir=tmp.is_dir())  # the kind is known now: a file never replaces a dir
        if tmp.is_file():
            with open(tmp, "rb+") as fh:
                os.fsync(fh.fileno())
        old = None
        if final.exists() or final.is_symlink():
            old = final.with_name(f"{prefix}old-{_OWNER}")
            _remove(old)
            os.replace(final, old)
        os.replace(tmp, final)
        _fsync_dir(final.parent)
        if old is not None:
            _remove(old)
    except BaseException as err:
        _discard_and_reraise(err, tmp, final)
    refresh(final)  # replaced inside an already marked output: its manifest records the new content


def commit_file(tmp: Path, final: Path) -> None:
    """Move the finished file ``tmp`` (a sibling of ``final``) onto ``final``: fsynced first, one ``rename``,
    never onto a directory or another thing :func:`bert_core.owned.check_replaceable` refuses. For a file
    written over a long time that a crash must not discard (:mod:`bert_core.serving.partial`);
    :func:`atomic_path` does the same for a temporary it made."""
    check_replaceable(final, is_dir=False)
    with open(tmp, "rb+") as fh:
        os.fsync(fh.fileno())
    os.replace(tmp, final)
    _fsync_dir(final.parent)
    refresh(final)


def _discard_and_reraise(err: BaseException, tmp: Path, final: Path) -> NoReturn:
    """Remove the partial output ``tmp``; re-raise ``err``, as :class:`DiskFullError` naming ``final`` when
    the device is full (one that already is names the inner output)."""
    full = (
        isinstance(err, Exception)
        and not isinstance(err, DiskFullError)
        and looks_like_disk_full(err, tmp.parent)
    )
    _remove(tmp)
    if full:
        raise DiskFullError(
            errno.ENOSPC,
            f"no space left on the device while writing {final} ({type(err).__name__}: {err}); the "
            "partial output was removed. Free space there, or write the output to another disk, and "
            "run again",
        ) from err
    raise err


def staged_final(path: Path) -> Path | None:
    """The output a temporary of :func:`atomic_outputs` / :func:`atomic_path` stands for, else ``None``
    (``.corpus.tmp-<owner>-<random>`` -> ``corpus``)."""
    name = path.name
    if name.startswith(".") and TEMP_MARKER in name:
        return path.with_name(name[1 : name.index(TEMP_MARKER)])
    return None


def _write_in_place(tmp: Path, final: Path, is_dir: bool | None) -> Iterator[Path]:
    """:func:`atomic_path` on a path that is already a staged temporary (a stage's builder called with
    ``staged[out]``): no second temporary inside the first; errors name the real output ``final``."""
    if tmp.is_dir() and not tmp.is_symlink() and not any(tmp.iterdir()):
        tmp.rmdir()  # the caller may create the directory itself, as with a fresh temporary
    elif tmp.exists() or tmp.is_symlink():
        _remove(tmp)
    tmp.parent.mkdir(parents=True, exist_ok=True)
    yield from _filled(tmp, final, is_dir)


def _filled(tmp: Path, final: Path, is_dir: bool | None) -> Iterator[Path]:
    """Hand ``tmp`` (created as a directory when ``is_dir``) to the caller to write ``final``'s new output
    into; afterwards it must exist. On any error the partial output is removed (:func:`_discard_and_reraise`)."""
    if is_dir:
        tmp.mkdir(mode=dir_mode())
    try:
        yield tmp
        if not tmp.exists():
            raise FileNotFoundError(f"atomic_path: nothing was written to {tmp} for {final}")
        if tmp.is_dir() and not tmp.is_symlink():
            mark_output(tmp)
    except BaseException as err:
        _discard_and_reraise(err, tmp, final)


def write_text_atomic(path: str | os.PathLike[str], text: str) -> Path:
    """Write ``text`` (UTF-8) to ``path`` atomically and return the path."""
    with atomic_path(path) as tmp:
        tmp.write_text(text, encoding="utf-8")
    return Path(path)


def write_json_atomic(path: str | os.PathLike[str], obj: Any, *, indent: int = 2) -> Path:
    """Write ``obj`` as JSON to ``path`` atomically and return the path."""
    return write_text_atomic(path, json.dumps(obj, indent=indent, sort_keys=True, default=str) + "\n")


def write_csv_atomic(
    path: str | os.PathLike[str], header: Sequence[str], rows: Iterable[Sequence[Any]]
) -> Path:
    """Write a CSV table (``csv`` module defaults: comma, ``\\r\\n`` line ends) to ``path`` atomically."""
    buf = io.StringIO(newline="")
    writer = csv.writer(buf)
    writer.writerow(header)
    writer.writerows(rows)
    return write_text_atomic(path, buf.getvalue())


def clean_stale_temps(directory: str | os.PathLike[str]) -> list[Path]:
    """Remove leftovers of interrupted atomic writes directly inside ``directory``; return them."""
    directory = Path(directory)
    removed = []
    if directory.is_dir():
        for child in directory.iterdir():
            if child.name.startswith(".") and TEMP_MARKER in child.name:
                _remove(child)
                removed.append(child)
    return removed


class OutputNotWritableError(OSError):
    """An output location cannot be written; raised before any work starts (the message names it)."""


def _nearest_existing(path: Path) -> Path:
    for candidate in (path, *path.parents):
        if candidate.exists():
            return candidate
    return Path("/")


def check_writable(*finals: str | os.PathLike[str], is_dir: bool | None = None) -> None:
    """Fail fast, before any work, unless every output in ``finals`` can be written and replaced.

    An existing output must be the pipeline's own (:func:`check_replaceable`; ``is_dir`` says which kind
    of output goes there, when the caller knows).

    For each output, the directory its temporary sibling goes to (the nearest existing ancestor when the
    parent does not exist yet) must accept a new file (probed for real: a read-only mount refuses even
    root), and an existing output directory must be writable (it is removed once replaced).

    Raises:
        ForeignOutputError: something the pipeline did not write sits at an output location
            (:mod:`bert_core.owned`).
        OutputNotWritableError: naming the output and the location that refused, and what to do.
    """
    for final in map(Path, finals):
        check_replaceable(final, is_dir=is_dir)
        where = _nearest_existing(final.parent)
        reason = None
        if not where.is_dir():
            reason = f"{where} is not a directory"
        else:
            try:
                fd, probe = tempfile.mkstemp(prefix=f".{final.name}{TEMP_MARKER}probe-", dir=where)
                os.close(fd)
                os.unlink(probe)
            except OSError as err:
                reason = f"{where} is not writable ({err.strerror or err})"
        if reason is None and final.is_dir() and not os.access(final, os.W_OK | os.X_OK):
            reason = f"the existing output directory {final} is not writable"
        if reason is not None:
            raise OutputNotWritableError(
                f"cannot write output {final}: {reason}; nothing was written. Make it writable or choose "
                "another location for this output, then run again"
            )


class OutputSet:
    """The temporaries of several outputs that are committed together (see :func:`atomic_outputs`)."""

    def __init__(self, pairs: dict[Path, Path]) -> None:
        self._pairs = pairs

    def __getitem__(self, final: str | os.PathLike[str]) -> Path:
        """The temporary path to write the output ``final`` to."""
        return self._pairs[Path(final)]

    def __contains__(self, final: object) -> bool:
        return isinstance(final, (str, os.PathLike)) and Path(final) in self._pairs

    @property
    def finals(self) -> list[Path]:
        return list(self._pairs)


def _commit(pairs: dict[Path, Path]) -> None:
    """Move every temporary into place, or (on an error) none: the previous outputs are restored."""
    olds: dict[Path, Path] = {}
    placed: list[Path] = []
    try:
        for final in pairs:  # 1. the previous outputs aside (same directory: cheap renames)
            if final.exists() or final.is_symlink():
                old = final.with_name(f".{final.name}{TEMP_MARKER}old-{_OWNER}")
                _remove(old)
                os.replace(final, old)
                olds[final] = old
        for final, tmp in pairs.items():  # 2. the new outputs in
            os.replace(tmp, final)
            placed.append(final)
    except BaseException:
        for final in reversed(placed):  # roll back: the new ones out, the previous ones back
            with contextlib.suppress(OSError):
                os.replace(final, pairs[final])
        for final, old in olds.items():
            with contextlib.suppress(OSError):
                os.replace(old, final)
        raise
    for final in pairs:
        _fsync_dir(final.parent)
    for old in olds.values():
        _remove(old)


@contextlib.contextmanager
def atomic_outputs(
    finals: Iterable[str | os.PathLike[str]], *, dirs: Iterable[str | os.PathLike[str]] = ()
) -> Iterator[OutputSet]:
    """Stage several outputs in temporaries next to them; commit them all together, or none.

    Every output is checked first (:func:`check_writable`: fail fast, naming the output), then gets a
    temporary sibling (``outputs[final]``; created as an empty directory for those in ``dirs``; an output
    inside a directory output is staged inside that one's temporary). When the
    block succeeds, every temporary must exist; the previous outputs are renamed aside, the new ones
    renamed in, and the previous ones removed. An error anywhere (in the block or while committing)
    removes the temporaries and leaves every previous output as it was: no new output appears next to a
    stale one. Only a crash (``SIGKILL``) in the middle of the final renames can leave some outputs
    missing (never half-written); their previous versions stay as ``.<name>.tmp-old-*`` siblings.
    """
    finals = [Path(f) for f in finals]
    dir_set = {Path(d) for d in dirs}
    if len(set(finals)) != len(finals):
        raise ValueError(f"atomic_outputs: an output is named twice in {[str(f) for f in finals]}")
    for final in finals:
        check_writable(final, is_dir=True if final in dir_set else None)
    pairs: dict[Path, Path] = {}  # committed by renames
    inner: dict[Path, Path] = {}  # outputs inside a directory output: staged inside its temporary
    created: list[Path] = []  # parent directories made here, removed again when nothing is committed
    try:
        for final in finals:
            if any(d != final and d in final.parents for d in dir_set):
                continue
            missing_parents = [p for p in (final.parent, *final.parent.parents) if not p.exists()]
            final.parent.mkdir(parents=True, exist_ok=True)
            created.extend(missing_parents)
            prefix = f".{final.name}{TEMP_MARKER}"
            _remove_dead_writers_temps(final.parent, prefix)
            tmp = Path(tempfile.mkdtemp(prefix=f"{prefix}{_OWNER}-", dir=final.parent))
            if final not in dir_set:
                tmp.rmdir()
            pairs[final] = tmp
        for final in finals:
            if final not in pairs:
                outer = next(d for d in pairs if d in final.parents)
                inner[final] = pairs[outer] / final.relative_to(outer)
                inner[final].parent.mkdir(parents=True, exist_ok=True)
                if final in dir_set:
                    inner[final].mkdir(mode=dir_mode())
        yield OutputSet({f: pairs.get(f) or inner[f] for f in finals})
        missing = [str(f) for f, t in (*pairs.items(), *inner.items()) if not t.exists()]
        if missing:
            raise FileNotFoundError(f"atomic_outputs: nothing was written for {missing}")
        for final, tmp in (*inner.items(), *pairs.items()):
            if tmp.is_dir() and not tmp.is_symlink():
                mark_output(tmp)
            check_replaceable(final, is_dir=tmp.is_dir())
        for tmp in pairs.values():
            if tmp.is_file():
                with open(tmp, "rb+") as fh:
                    os.fsync(fh.fileno())
        _commit(pairs)
    except BaseException as err:
        for tmp in pairs.values():
            _remove(tmp)
        for directory in sorted(created, key=lambda d: len(d.parts), reverse=True):  # deepest first
            with contextlib.suppress(OSError):
                directory.rmdir()  # only if still empty
        full = next(
            (
                f
                for f in pairs
                if isinstance(err, Exception)
                and not isinstance(err, DiskFullError)
                and looks_like_disk_full(err, f.parent)
            ),
            None,
        )
        if full is not None:
            raise DiskFullError(
                errno.ENOSPC,
                f"no space left on the device while writing {full} ({type(err).__name__}: {err}); no "
                f"output of this run was committed ({', '.join(map(str, pairs))}). Free space there, or "
                "write the outputs to another disk, and run again",
            ) from err
        raise
