"""Shared pieces of the task loaders: the error type, the row container, and where data comes from."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

#: The longest quote of file content in an error message (characters).
EXCERPT_CHARS = 200
#: The longest message of a :class:`TaskDataError` (a safety net behind the excerpts).
MAX_MESSAGE_CHARS = 2000


def excerpt(value: Any, limit: int = EXCERPT_CHARS) -> str:
    """``repr(value)``, cut to ``limit`` characters with a note of the full length (quotes in messages)."""
    text = repr(value)
    if len(text) <= limit:
        return text
    return f"{text[:limit]}... ({len(text)} characters in all)"


def bound_message(message: str, limit: int = MAX_MESSAGE_CHARS) -> str:
    """``message`` cut to ``limit`` characters, saying so."""
    if len(message) <= limit:
        return message
    return f"{message[:limit]} ... [message truncated: {len(message)} characters in all]"


class TaskDataError(ValueError):
    """Task data that cannot be used as it is; the message names the file (and line or id) and the fix.

    The message is bounded (:data:`MAX_MESSAGE_CHARS`): a loader quotes at most a short excerpt of the
    file, and a longer message is cut, so a bad file never becomes a megabyte-long error line or log.
    """

    def __init__(self, message: str = "", *args: Any) -> None:
        super().__init__(bound_message(str(message)), *args)


def check_line_endings(path: Path, sample_bytes: int = 1 << 16) -> None:
    """Raise :class:`TaskDataError` when ``path`` uses CR-only (old Mac) line endings.

    Such a file reads as one huge line: the loader would otherwise report a malformed (whole-file) row.
    """
    with path.open("rb") as f:
        head = f.read(sample_bytes)
    if b"\r" in head and b"\n" not in head:
        raise TaskDataError(
            f"{path}: file uses CR-only line endings; convert to LF (e.g. `tr '\\r' '\\n' < "
            f"{path.name} > fixed && mv fixed {path.name}`, or save it with Unix line endings) and run again"
        )


class TaskRows(list):
    """The rows of one task split: a plain ``list`` of canonical dicts, plus where they came from.

    Attributes:
        task: Task name (``"mrpc"``).
        split: Split name (``"dev"``).
        source: The local file read, or ``hf://<dataset id>[/<config>]:<split>``.
        skipped: Rows left out on purpose, by reason (``{"malformed row": 3}``): only rows that the official
            format is known to contain (e.g. QQP's broken lines), never silently anything else.
        available: Rows the source holds before a ``limit`` was applied, when the loader counted them
            (the SQuAD reader does); ``None`` otherwise.
        limit: The row limit the rows were read with (``train_limit``, ``eval_limit``), if any.
    """

    def __init__(
        self, rows: Any = (), *, task: str, split: str, source: str, skipped: dict[str, int] | None = None
    ):
        super().__init__(rows)
        self.task = task
        self.split = split
        self.source = source
        self.skipped: dict[str, int] = dict(skipped or {})
        self.available: int | None = None
        self.limit: int | None = None

    @property
    def cut(self) -> bool:
        """Whether a ``limit`` left rows of the source out (when uncounted: the limit was reached)."""
        if self.available is not None:
            return len(self) < self.available
        return self.limit is not None and len(self) >= self.limit

    @property
    def n_skipped(self) -> int:
        """Total number of rows skipped."""
        return sum(self.skipped.values())

    def __repr__(self) -> str:
        return (
            f"TaskRows(task={self.task!r}, split={self.split!r}, rows={len(self)}, "
            f"skipped={self.skipped!r}, source={self.source!r})"
        )


def resolve_data_root(data_root: str | os.PathLike[str] | None) -> Path | None:
    """The local data root to read from: the argument, else ``BERT_DATA_ROOT``; ``None`` means the Hub."""
    if data_root is not None:
        root = Path(data_root).expanduser()
        if not root.is_dir():
            raise FileNotFoundError(f"data root {root} is not a directory")
        return root
    from bert_core.sources import data_root as env_root

    return env_root()


def require_file(root: Path, relative: str, task: str, split: str) -> Path:
    """``root / relative`` if it is a file, else a :class:`TaskDataError` that says what to do."""
    path = root / relative
    if not path.is_file():
        raise TaskDataError(
            f"{task}/{split}: {path} does not exist. Put the official file there (layout of shared/data: "
            f"{relative} under the data root), or unset BERT_DATA_ROOT to load {task} from the Hugging Face Hub."
        )
    return path


def hub_split(
    path: str, config: str | None, split: str, limit: int | None, revision: str | None = None
) -> Any:
    """``datasets.load_dataset(path, config, split=..., revision=...)``, the first ``limit`` rows when given
    (``revision``: a commit, tag or branch of the dataset's Hub repository; ``None``: its newest)."""
    import datasets

    spec = split if limit is None else f"{split}[:{int(limit)}]"
    return datasets.load_dataset(path, config, split=spec, revision=revision)


def hub_source(path: str, config: str | None, split: str, revision: str | None = None) -> str:
    """``hf://<path>[/<config>][@<revision>]:<split>``: where a split's rows came from, as logged."""
    at = f"@{revision}" if revision else ""
    return f"hf://{path}" + (f"/{config}" if config else "") + f"{at}:{split}"


def not_utf8(path: Path) -> TaskDataError:
    """The error for a task file that is not UTF-8, naming the line and byte offset of the first bad byte."""
    raw = path.read_bytes()
    try:
        raw.decode("utf-8")
    except UnicodeDecodeError as err:
        line = raw.count(b"\n", 0, err.start) + 1
        bad = raw[err.start : err.start + 1]
        return TaskDataError(
            f"{path}:{line}: not UTF-8 (byte {bad!r} at offset {err.start}); the official files are UTF-8: "
            "re-encode the file (e.g. iconv -f latin1 -t utf-8) or fetch it again"
        )
    return TaskDataError(f"{path}: not UTF-8; re-encode the file or fetch it again")  # pragma: no cover
