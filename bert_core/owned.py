"""Which existing paths an output may replace: never what the pipeline did not write.

Every directory output carries a small marker file, :data:`OUTPUT_MARK` (which also lists the size and
checksum of each of its files: :mod:`bert_core.integrity`). An existing path at an output location is
replaced only when it is the pipeline's own earlier output of the same kind: a regular file where a file
goes, and, where a directory goes, a directory that holds the marker, is empty, or lies in one of the
repository's own output folders (outputs written before the marker existed). Anything else (a user's
folder, a directory where a file goes, a device or a FIFO) is refused before any work
(:class:`ForeignOutputError`, naming it) and left untouched. Staged directories get the umask's modes, like
every other output (``mkdtemp`` makes them private).
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from bert_core.integrity import OUTPUT_MARK, write_manifest

#: Repository folders whose directories are the pipeline's own outputs (written before the marker existed).
_OWN_ROOTS = ("data", "models", "results", "reports", "metrics", "plots")


class ForeignOutputError(OSError):
    """Something the pipeline did not write sits at an output location; it is refused and left untouched."""


def _own_legacy_dir(path: Path) -> bool:
    """A directory in one of the repository's own output folders (written before the marker existed)."""
    from bert_core.constants import REPO_ROOT

    try:
        rel = path.resolve().relative_to(REPO_ROOT)
    except ValueError:
        return False
    return len(rel.parts) >= 2 and rel.parts[0] in _OWN_ROOTS


def check_replaceable(final: str | os.PathLike[str], *, is_dir: bool | None = None) -> None:
    """Refuse an existing ``final`` that is not the pipeline's own earlier output of the same kind.

    Args:
        final: The output location.
        is_dir: The output is a directory (``True``), a file (``False``), or either (``None``).

    Raises:
        ForeignOutputError: naming what sits there and what to do; nothing is touched.
    """
    final = Path(final)
    try:
        st = final.lstat()
    except (FileNotFoundError, NotADirectoryError):
        return  # nothing there (or a parent is a file: check_writable says so)
    what = None
    if stat.S_ISLNK(st.st_mode):
        return  # replacing a link replaces the link, never what it points to
    if stat.S_ISREG(st.st_mode):
        if is_dir:
            what = "is an existing file, and a directory goes there"
    elif stat.S_ISDIR(st.st_mode):
        if is_dir is False:
            what = "is an existing directory, and a file goes there"
        elif not ((final / OUTPUT_MARK).is_file() or not any(final.iterdir()) or _own_legacy_dir(final)):
            what = (
                f"is an existing directory that this pipeline did not write (it has no {OUTPUT_MARK} marker)"
            )
    else:
        what = "exists and is not a regular file or directory (a device, FIFO or socket)"
    if what is not None:
        raise ForeignOutputError(
            f"output {final} {what}; it was left untouched and nothing was written. Move it away or "
            "choose another output path, then run again"
        )


def _umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def dir_mode() -> int:
    """The mode the umask gives a new directory (0755 under umask 022)."""
    return 0o777 & ~_umask()


def mark_output(directory: str | os.PathLike[str]) -> None:
    """Mark ``directory`` as the pipeline's output (:data:`OUTPUT_MARK`) and give it the umask's mode
    (a staged temporary from ``mkdtemp`` is private, 0700, unlike every other output).

    The marker holds the size and checksum of every file in the directory
    (:func:`bert_core.integrity.write_manifest`), which its readers verify before use.
    """
    directory = Path(directory)
    write_manifest(directory)
    os.chmod(directory, dir_mode())


def share_like_umask(path: str | os.PathLike[str]) -> None:
    """Give a file written by a library that creates it private (safetensors: 0600) the umask's mode (0644).

    Outputs in a shared workspace must be readable by the people the umask allows, like every other file.
    """
    os.chmod(path, 0o666 & ~_umask())
