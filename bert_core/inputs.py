"""What a stage reads from outside the repository, recorded so that DVC sees it change.

DVC re-runs a stage when a file listed in its ``deps`` changes. The files a stage reads under the data root
(``BERT_DATA_ROOT``), an own task's files and a checkpoint directory named in the params cannot be listed
there: the data root is an environment variable, and DVC's templating gives a ``foreach`` stage no list of
its own per task. So the first DVC stage, ``inputs`` (``always_changed``: it runs on every ``dvc repro``),
writes one record per stage that reads such files (``data/inputs/corpus.json``,
``data/inputs/finetune/<task>.json``, ...): each file by its path, size and XXH3-128 digest, or the Hub
dataset it loads. The stage depends on its record. An edited corpus file re-runs the corpus stage (and
what follows it), an edited task file that task alone, another data root with other files every stage that
reads them; with nothing edited the records come out byte for byte the same, and DVC runs nothing else.

A file whose size and modification time are those the last run saw is not read again (:class:`StatCache`,
kept in DVC's own ``.dvc/tmp``: never pushed to a remote, and no stage depends on it). What cannot be
resolved (a path matching no file) is recorded as ``missing: <why>``, not refused: the stage that reads it
refuses it with its own message, in its own place in the pipeline.

Each stage's ``reads`` function (named in the stage table, ``flows/stages``; in its own package) says what
it reads: :data:`Reads`.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import xxhash

from bert_core.atomic import write_json_atomic, write_text_atomic
from bert_core.constants import REPO_ROOT
from bert_core.integrity import HASH_NAME, file_digest

#: What a stage reads: label -> a file or directory, files, or a string (``hub:<dataset>``, ``missing: <why>``).
Reads = dict[str, "Path | list[Path] | str"]
#: A label of more files is recorded as its file count, bytes and one digest (the record stays small).
LISTED_FILES = 1000


class StatCache:
    """Digests of files by (size, modification time), kept between runs in ``path``."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        try:
            self._old = json.loads(self.path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            self._old = {}
        self._new: dict[str, list[Any]] = {}

    def entry(self, path: Path) -> dict[str, Any]:
        st = path.stat()
        key = os.fspath(path.absolute())
        known = self._old.get(key)
        if isinstance(known, list) and known[:2] == [st.st_size, st.st_mtime_ns]:
            digest = known[2]
        else:
            digest = file_digest(path)
        self._new[key] = [st.st_size, st.st_mtime_ns, digest]
        return {"size": st.st_size, HASH_NAME: digest}

    def save(self) -> None:
        write_json_atomic(self.path, self._new, indent=0)


def _shown(path: Path, data_root: Path | None) -> str:
    """``path`` as a record names it: under the data root ``<data root>/...`` (so a copy of the same files
    elsewhere records the same), under the repository relative to it, else absolute."""
    path = path.absolute()
    for base, prefix in ((data_root, "<data root>/"), (REPO_ROOT, "")):
        if base is not None and path.is_relative_to(base):
            return prefix + path.relative_to(base).as_posix()
    return path.as_posix()


def record(reads: Reads, data_root: Path | None, cache: StatCache) -> dict[str, Any]:
    """The record of ``reads``: a string as it is; files (and every file under a directory) by path, size
    and digest; a path that does not exist, ``missing: <path>``."""
    out: dict[str, Any] = {}
    for label, what in reads.items():
        if isinstance(what, str):
            out[label] = what
            continue
        files: list[Path] = []
        for path in [what] if isinstance(what, Path) else what:
            files += sorted(p for p in path.rglob("*") if p.is_file()) if path.is_dir() else [path]
        if missing := [p for p in files if not p.is_file()]:
            out[label] = f"missing: {_shown(missing[0], data_root)}"
            continue
        listing = {_shown(p, data_root): cache.entry(p) for p in files}
        if len(listing) > LISTED_FILES:  # a corpus of many files: its size and one digest of the listing
            text = json.dumps(listing, sort_keys=True).encode()
            listing = {
                "files": len(files),
                "bytes": sum(e["size"] for e in listing.values()),
                HASH_NAME: xxhash.xxh3_128(text).hexdigest(),
            }
        out[label] = listing
    return out


def write_record(path: str | os.PathLike[str], content: dict[str, Any]) -> bool:
    """Write ``content`` to ``path`` unless it holds it already; whether it changed."""
    path = Path(path)
    text = json.dumps(content, indent=1, sort_keys=True) + "\n"
    if path.is_file() and path.read_text(encoding="utf-8") == text:
        return False
    write_text_atomic(path, text)
    return True


def local_path(value: str | None) -> Path | None:
    """A checkpoint named in the params as a local path (relative: to the repository), else ``None`` (a Hub
    id or a ``models:/`` URI, whose params value says where it comes from)."""
    if not value or value.startswith("models:/"):
        return None
    path = Path(value).expanduser()
    path = path if path.is_absolute() else REPO_ROOT / path
    return path if path.exists() else None
