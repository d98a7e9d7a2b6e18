"""Content checksums of every directory output, and their check before a later stage reads one.

When a staged directory is committed (:func:`bert_core.owned.mark_output`), its marker file
:data:`OUTPUT_MARK` receives a manifest of every file in it::

    {"files": {"sub/name.bin": {"size": 123, "xxh3_128": "9f..."}, ...}, "written_by": "bert-pipeline ..."}

The manifest is deterministic (sorted keys, no timestamps, paths with ``/``), so the same output hashes the
same in DVC on every run. A reader calls :func:`verify_output` on the files it is about to use, once per open:
a file whose size or checksum differs from the manifest (a bit flip, an in-place edit, a truncated copy) is
refused with :class:`CorruptOutputError` naming the file, what was expected and found, and how to get a good
copy back. A directory without a manifest (an output written before manifests existed, a user's own
checkpoint) is accepted; its readers range-check what they read instead.

Why XXH3-128: this is an integrity check against accidental damage, not a defence against an attacker
(DVC's own md5 and the lock file cover provenance), so a non-cryptographic hash is enough; XXH3 hashes about
5.7 GB per CPU-second, four times sha256 and eight times md5 (``bench/bench_verify.py``, docs/benchmarks.md),
which keeps the check of the default profile's 590 MB of pretraining data at about 0.2 CPU-seconds per open,
and 128 bits make an accidental collision negligible. ``xxhash`` was already installed (``datasets`` needs
it); ``pyproject.toml`` now names it too.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import xxhash

#: The marker file in every directory output (:mod:`bert_core.owned`), which holds its manifest. Defined here
#: so that this module imports nothing of the project's; ``bert_core.owned`` re-exports it.
OUTPUT_MARK = ".bert-output"
#: Name of the checksum in each manifest entry.
HASH_NAME = "xxh3_128"
_WRITTEN_BY = "bert-pipeline (bert_core.owned); a later run of the same output may replace it"
#: Files already verified in this process, by (path, size, mtime, inode): a reader opened twice hashes once.
_verified: set[tuple[str, int, int, int]] = set()


class CorruptOutputError(ValueError):
    """A stored output file differs from the checksum its writer recorded (or is out of range)."""


def file_digest(path: str | os.PathLike[str]) -> str:
    """The XXH3-128 hex digest of a file's bytes."""
    with open(path, "rb") as fh:
        return hashlib.file_digest(fh, xxhash.xxh3_128).hexdigest()


def file_entry(path: str | os.PathLike[str]) -> dict[str, Any]:
    """A manifest entry of the file ``path``: its size and checksum."""
    return {"size": Path(path).stat().st_size, HASH_NAME: file_digest(path)}


def checked_entry(path: str | os.PathLike[str]) -> dict[str, Any]:
    """``path``'s entry in its output's manifest, once the file is checked against it (:func:`check_file`:
    a file checked before in this process is not read again); computed when no manifest lists it."""
    path = Path(path).absolute()
    found = find_manifest(path.parent)
    entry = found[1]["files"].get(path.relative_to(found[0]).as_posix()) if found else None
    if entry is None:
        return file_entry(path)
    check_file(path, entry)
    return entry


def _entries(directory: Path) -> dict[str, dict[str, Any]]:
    """Size and checksum of every regular file under ``directory`` (markers excluded, links not followed)."""
    files: dict[str, dict[str, Any]] = {}
    for root, dirs, names in os.walk(directory):
        dirs.sort()
        for name in sorted(names):
            path = Path(root, name)
            if (
                name.startswith(OUTPUT_MARK) or path.is_symlink() or not path.is_file()
            ):  # markers, their temps
                continue
            rel = path.relative_to(directory).as_posix()
            files[rel] = file_entry(path)
    return files


def _manifest_text(files: dict[str, dict[str, Any]]) -> str:
    return json.dumps({"written_by": _WRITTEN_BY, "files": files}, sort_keys=True, indent=1) + "\n"


def _write_marker(directory: Path, files: dict[str, dict[str, Any]]) -> Path:
    """Replace ``directory``'s marker atomically (a reader never sees half a manifest)."""
    mark = directory / OUTPUT_MARK
    tmp = directory / f"{OUTPUT_MARK}.tmp-{os.getpid()}"
    tmp.write_text(_manifest_text(files), encoding="utf-8")
    os.replace(tmp, mark)
    return mark


def write_manifest(directory: str | os.PathLike[str]) -> Path:
    """Write the manifest of ``directory`` into its marker file and return the marker's path.

    Markers of nested outputs (a model directory saved inside a stage's output) are rewritten from the
    same checksums, so no marker below describes an older state of its files.
    """
    directory = Path(directory)
    files = _entries(directory)
    for mark in sorted(directory.rglob(OUTPUT_MARK), key=lambda p: len(p.parts), reverse=True):
        inner = mark.parent
        if inner != directory and mark.is_file():
            prefix = inner.relative_to(directory).as_posix() + "/"
            _write_marker(inner, {k[len(prefix) :]: v for k, v in files.items() if k.startswith(prefix)})
    return _write_marker(directory, files)


def refresh(path: str | os.PathLike[str]) -> None:
    """Record the new content of ``path``, just replaced inside an already marked output, in its manifest.

    Called by :func:`bert_core.atomic.atomic_path` after it replaces a file or directory in place, so a
    later write into a committed output (a model's weights saved again) never leaves a stale checksum. A
    path with no manifest above it is left alone.
    """
    path = Path(path).absolute()
    found = find_manifest(path.parent)
    if found is None:
        return
    root, manifest = found
    rel = path.relative_to(root).as_posix()
    files = {k: v for k, v in manifest["files"].items() if k != rel and not k.startswith(rel + "/")}
    if path.is_dir() and not path.is_symlink():
        files |= {f"{rel}/{k}": v for k, v in _entries(path).items()}
    elif path.is_file() and not path.is_symlink():
        files[rel] = file_entry(path)
    _write_marker(root, dict(sorted(files.items())))


def read_manifest(directory: str | os.PathLike[str]) -> dict[str, Any] | None:
    """The manifest in ``directory``'s marker, or None (no marker, or one written before manifests)."""
    mark = Path(directory) / OUTPUT_MARK
    try:
        data = json.loads(mark.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) and isinstance(data.get("files"), dict) else None


def find_manifest(path: str | os.PathLike[str]) -> tuple[Path, dict[str, Any]] | None:
    """The nearest output directory at or above ``path`` that holds a marker, and its manifest.

    Returns None when the nearest marker has no manifest (an older output) or there is no marker at all.
    """
    path = Path(path).absolute()
    start = path if path.is_dir() else path.parent
    for directory in (start, *start.parents):
        if (directory / OUTPUT_MARK).is_file():
            manifest = read_manifest(directory)
            return (directory, manifest) if manifest is not None else None
    return None


def _what_to_do(path: Path) -> str:
    return (
        f"Re-run the stage that writes it (`dvc repro <stage>`; `dvc status` names it; where DVC calls it "
        "unchanged, as after pulling a copy damaged in the remote: `dvc repro --force --single-item <stage>`), "
        f"or restore the stored copy with `dvc checkout {path}` / `dvc pull`; a checkpoint you downloaded, "
        "unpacked or copied: fetch it again (`python -m flows.checkpoints download|unpack-minilm`)"
    )


def corrupt(path: str | os.PathLike[str], what: str) -> CorruptOutputError:
    """A :class:`CorruptOutputError` for ``path``: ``what`` is wrong with it, and how to get a good copy."""
    return CorruptOutputError(f"{path} is damaged: {what}. {_what_to_do(Path(path))}")


def check_file(path: Path, entry: dict[str, Any]) -> None:
    """Refuse ``path`` (:class:`CorruptOutputError`) unless its size and checksum are those of ``entry``."""
    try:
        st = path.stat()
    except FileNotFoundError:
        raise corrupt(path, f"the file is missing (its writer recorded {entry['size']} bytes)") from None
    key = (str(path), st.st_size, st.st_mtime_ns, st.st_ino)
    if key in _verified:
        return
    if st.st_size != entry["size"]:
        raise corrupt(path, f"expected {entry['size']} bytes as written, found {st.st_size} bytes")
    found = file_digest(path)
    if found != entry[HASH_NAME]:
        raise corrupt(
            path,
            f"its content changed since it was written ({HASH_NAME} {found}, expected {entry[HASH_NAME]}; "
            "same size, so damaged in place)",
        )
    _verified.add(key)


def verify_output(
    directory: str | os.PathLike[str], files: Iterable[str | os.PathLike[str]] | None = None
) -> list[Path]:
    """Check the size and checksum of the files a reader is about to use against their output's manifest.

    Args:
        directory: The directory the files are in; the manifest is the nearest one at or above it.
        files: Paths (absolute, or relative to ``directory``); default every file the manifest lists under
            ``directory``.

    Returns:
        The files verified; empty when there is no manifest (the caller range-checks instead). A file the
        manifest does not list (added later by hand) is not verified and not refused.

    Raises:
        CorruptOutputError: a listed file is missing, or its size or checksum differs; the message names
            it, gives what was expected and found, and how to restore it.
    """
    directory = Path(directory).absolute()
    found = find_manifest(directory)
    if found is None:
        return []
    root, manifest = found
    entries: dict[str, Any] = manifest["files"]
    if files is None:
        prefix = directory.relative_to(root).as_posix()
        prefix = "" if prefix == "." else prefix + "/"
        paths = [root / rel for rel in sorted(entries) if rel.startswith(prefix)]
    else:
        paths = [p if p.is_absolute() else directory / p for p in map(Path, files)]
    checked = []
    for path in paths:
        try:
            rel = path.absolute().relative_to(root).as_posix()
        except ValueError:
            continue
        if rel in entries:
            check_file(path, entries[rel])
            checked.append(path)
    return checked
