"""What a stage reads from outside the repository, recorded so that DVC sees it change.

DVC re-runs a stage when a file listed in its ``deps`` changes. The files a stage reads under the data root
(``BERT_DATA_ROOT``), an own task's files and a checkpoint directory named in the params cannot be listed
there: the data root is an environment variable, and DVC's templating gives a ``foreach`` stage no list of
its own per task. So the first DVC stage, ``inputs`` (``always_changed``: it runs on every ``dvc repro``),
writes one record per stage that reads such files (``data/inputs/corpus.json``,
``data/inputs/finetune/<task>.json``, ...): each file by its path, size and XXH3-128 digest, a Hugging Face
Hub dataset or checkpoint by its id and the commit its revision resolves to (:class:`Hub`). The stage
depends on its record. An edited corpus file re-runs the corpus stage (and what follows it), an edited task
file that task alone, another data root with other files every stage that reads them, a new commit on the
Hub the stages that load it; with nothing changed the records come out byte for byte the same, and DVC
runs nothing else.

A file whose size and modification time are those the last run saw is not read again (:class:`StatCache`,
kept in DVC's own ``.dvc/tmp``: never pushed to a remote, and no stage depends on it). What cannot be
resolved (a path matching no file) is recorded as ``missing: <why>``, not refused: the stage that reads it
refuses it with its own message, in its own place in the pipeline. A Hub repository whose commit cannot be
resolved (offline, ``HF_HUB_OFFLINE=1``) keeps the commit the last record named for the same revision, so a
run without the network re-runs nothing; with none known it is recorded as unresolved (``commit: null``).

Each stage's ``reads`` function (named in the stage table, ``flows/stages``; in its own package) says what
it reads: :data:`Reads`.
"""

from __future__ import annotations

import json
import logging
import os
import re
from pathlib import Path
from typing import Any, NamedTuple

import xxhash

from bert_core.atomic import write_json_atomic, write_text_atomic
from bert_core.constants import REPO_ROOT
from bert_core.integrity import HASH_NAME, file_digest
from bert_core.sources import is_hub_id, split_hub_id

log = logging.getLogger(__name__)


class Hub(NamedTuple):
    """A Hugging Face Hub repository a stage loads: its id, the revision asked for (``None``: the newest) and
    its type (``dataset``; ``model``: a checkpoint named in the params)."""

    repo: str
    revision: str | None = None
    type: str = "dataset"


#: What a stage reads: label -> a file or directory, files, a Hub repository, or ``missing: <why>``.
Reads = dict[str, "Path | list[Path] | Hub | str"]
#: A label of more files is recorded as its file count, bytes and one digest (the record stays small).
LISTED_FILES = 1000
#: Seconds the Hub has to say a repository's commit.
HUB_TIMEOUT_S = 10.0
_COMMIT = re.compile(r"[0-9a-f]{40}")


class HubCommits:
    """The commit each Hub repository's revision resolves to, asked once per run; after one failure to reach
    the Hub, not asked again (every repository would wait for the same timeout)."""

    def __init__(self) -> None:
        self._known: dict[Hub, str | None] = {}
        self._unreachable: str | None = None

    def commit(self, hub: Hub) -> str | None:
        """The commit ``hub`` resolves to; ``None`` when the Hub does not say (logged once, with why)."""
        if hub.revision is not None and _COMMIT.fullmatch(hub.revision):
            return hub.revision  # a commit is what is read, wherever the Hub is
        if hub not in self._known:
            self._known[hub] = self._ask(hub)
        return self._known[hub]

    def _ask(self, hub: Hub) -> str | None:
        if self._unreachable is not None:
            return None
        from huggingface_hub import HfApi
        from huggingface_hub.errors import RepositoryNotFoundError, RevisionNotFoundError

        try:
            info = getattr(HfApi(), f"{hub.type}_info")  # dataset_info, model_info
            return str(info(hub.repo, revision=hub.revision, timeout=HUB_TIMEOUT_S).sha)
        except (RepositoryNotFoundError, RevisionNotFoundError) as err:  # the stage names it when it loads
            why = _first_line(err)
        except Exception as err:  # offline, HF_HUB_OFFLINE, a timeout: the same for every dataset
            why = self._unreachable = _first_line(err)
        log.warning("inputs: the Hub did not give the commit of %s (%s)", _hub_name(hub), why)
        return None


def _first_line(err: BaseException) -> str:
    return f"{type(err).__name__}: {(str(err).splitlines() or [''])[0]}"


def _hub_name(hub: Hub) -> str:
    return hub.repo + (f"@{hub.revision}" if hub.revision else "")


def _hub_record(hub: Hub, commits: HubCommits, previous: Any) -> dict[str, Any]:
    """``{"hub": <id>, ["type": "model",] ["revision": <asked>,] "commit": <sha or None>}``; unresolved, the
    commit the previous record named for the same repository and revision."""
    out: dict[str, Any] = {"hub": hub.repo, **({"type": hub.type} if hub.type != "dataset" else {})}
    out.update({"revision": hub.revision} if hub.revision else {})
    commit = commits.commit(hub)
    if (
        commit is None
        and isinstance(previous, dict)
        and {**previous, "commit": None} == {**out, "commit": None}
    ):
        commit = previous.get("commit")
    return {**out, "commit": commit}


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


def record(
    reads: Reads,
    data_root: Path | None,
    cache: StatCache,
    commits: HubCommits | None = None,
    previous: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The record of ``reads``: a string as it is; files (and every file under a directory) by path, size
    and digest; a path that does not exist, ``missing: <path>``; a Hub repository by the commit its revision
    resolves to (``commits``), or, unresolved, the one ``previous`` (the last record) named."""
    out: dict[str, Any] = {}
    commits = commits or HubCommits()  # one for the whole record: each repository asked once
    for label, what in reads.items():
        if isinstance(what, Hub):
            out[label] = _hub_record(what, commits, (previous or {}).get(label))
            continue
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


def read_record(path: str | os.PathLike[str]) -> dict[str, Any]:
    """The record at ``path`` as the last run wrote it; ``{}`` when there is none (or it is not one)."""
    try:
        content = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return content if isinstance(content, dict) else {}


def write_record(path: str | os.PathLike[str], content: dict[str, Any]) -> bool:
    """Write ``content`` to ``path`` unless it holds it already; whether it changed."""
    path = Path(path)
    text = json.dumps(content, indent=1, sort_keys=True) + "\n"
    if path.is_file() and path.read_text(encoding="utf-8") == text:
        return False
    write_text_atomic(path, text)
    return True


def checkpoint(value: str | None) -> Path | Hub | None:
    """A checkpoint named in the params: its directory (relative: to the repository), or the Hub model it
    names (recorded by its commit); ``None`` for a ``models:/`` URI (the params value names the version) or
    a path that does not exist (the stage refuses it)."""
    if not value or value.startswith("models:/"):
        return None
    path = Path(value).expanduser()
    path = path if path.is_absolute() else REPO_ROOT / path
    if path.exists():
        return path
    return Hub(*split_hub_id(value), type="model") if is_hub_id(value) else None
