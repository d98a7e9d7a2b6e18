"""``load_task_split``: one entry point for every task's data, local or from the Hub.

Each official distribution format has a reader module (``glue``, ``squad``, ``swag``, ``conll``) that turns
its files, or its Hub copy, into the canonical rows of the task's kind, and an own task's files are read by
:mod:`bert_core.tasks.table`; :data:`READERS` maps ``TaskSpec.data_format`` to them.
"""

from __future__ import annotations

import csv
import os
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

from bert_core.tasks.base import TaskDataError, TaskRows, not_utf8, require_file, resolve_data_root
from bert_core.tasks.conll import load_conll_file, load_conll_hub
from bert_core.tasks.glue import load_glue_hub, load_glue_tsv
from bert_core.tasks.registry import CONLL_IOB2_FILES, OWN_FORMAT, TaskSpec, get_task
from bert_core.tasks.squad import load_squad_hub, load_squad_json
from bert_core.tasks.swag import load_swag_csv, load_swag_hub
from bert_core.tasks.table import load_table, load_table_hub


class Reader(NamedTuple):
    """How to read one distribution format: ``local(spec, split, path, limit)``, ``hub(spec, split, limit)``."""

    local: Callable[[TaskSpec, str, Path, int | None], TaskRows]
    hub: Callable[[TaskSpec, str, int | None], TaskRows]


#: ``TaskSpec.data_format`` -> its reader.
READERS: dict[str, Reader] = {
    "glue": Reader(load_glue_tsv, load_glue_hub),
    "squad": Reader(load_squad_json, load_squad_hub),
    "swag": Reader(load_swag_csv, load_swag_hub),
    "conll": Reader(load_conll_file, load_conll_hub),
    OWN_FORMAT: Reader(load_table, load_table_hub),
}


def load_task_split(
    task: str | TaskSpec,
    split: str,
    data_root: str | os.PathLike[str] | None = None,
    limit: int | None = None,
) -> TaskRows:
    """Load one split of one task as canonical rows (a list of plain dicts, schema per task kind).

    Where the data comes from: ``data_root`` when given, else ``BERT_DATA_ROOT``
    (:func:`bert_core.sources.data_root`), read in the task's official distribution format (layout of
    ``shared/data``: ``glue/<TASK>/*.tsv``, ``squad/*.json``, ``conll2003/eng.*``, ``swag/*.csv``); with
    neither, the Hugging Face Hub via ``datasets.load_dataset`` (``TaskSpec.hub_path``).

    Schemas (keys exactly these):

    * classification / regression: ``{"id", "text_a", "text_b", "label"}`` -- ``text_b`` ``None`` for
      single-sentence tasks; ``label`` an index into ``TaskSpec.labels`` (float for STS-B), ``None``
      on unlabelled test sets.
    * span_qa: ``{"id", "title", "context", "question", "answers": {"text", "answer_start"},
      "is_impossible"}``.
    * token_classification: ``{"id", "tokens", "tags"}`` -- IOB2 tags (IOB1 input converted).
    * multiple_choice: ``{"id", "context", "start", "endings" (4), "label"}``.

    Args:
        task: Task name (see :func:`bert_core.tasks.get_task`) or its spec.
        split: One of ``TaskSpec.splits`` (``train``, ``dev``, ``test``; MNLI: ``dev_matched``,
            ``dev_mismatched``, ``test_matched``, ``test_mismatched``, ``diagnostic``).
        data_root: Local data root; overrides ``BERT_DATA_ROOT``.
        limit: Keep only the first ``limit`` rows (quick runs and tests).

    Returns:
        :class:`~bert_core.tasks.base.TaskRows`: a ``list`` of dicts with ``.source`` and ``.skipped``
        (rows skipped on purpose, by reason; see each loader).

    Raises:
        KeyError: unknown task or split (the message lists the valid ones).
        TaskDataError: a missing local file, or a malformed row (the message names the file and line).
    """
    spec = task if isinstance(task, TaskSpec) else get_task(task)
    if split not in spec.splits:
        raise KeyError(f"{spec.name} has no split {split!r}; valid splits: {list(spec.splits)}")
    if limit is not None and limit < 1:
        raise ValueError(f"limit must be a positive number of rows, got {limit}")
    reader = READERS[spec.data_format]
    root = None if spec.own else resolve_data_root(data_root)  # an own task's files come as train/dev_file
    if root is None:
        return reader.hub(spec, split, limit)

    return read_local(spec, split, local_split_file(spec, split, root), limit)


def local_split_file(spec: TaskSpec, split: str, root: Path) -> Path:
    """The official file of ``split`` under the data root ``root`` (CoNLL-2003: its IOB2 copy when that is
    the one there); :class:`TaskDataError` saying where to put it when there is none."""
    relative = spec.local_files[split]
    if (
        spec.name == "conll2003"
        and not (root / relative).is_file()
        and (root / CONLL_IOB2_FILES[split]).is_file()
    ):
        relative = CONLL_IOB2_FILES[split]
    return require_file(root, relative, spec.name, split)


def read_local(spec: TaskSpec, split: str, path: Path, limit: int | None = None) -> TaskRows:
    """Read one local file in ``spec``'s official format (errors name the file, and the line where known)."""
    try:
        return READERS[spec.data_format].local(spec, split, path, limit)
    except UnicodeDecodeError:
        raise not_utf8(path) from None
    except csv.Error as err:  # e.g. a field over the csv module's 128 KB limit
        raise TaskDataError(f"{path}: not a valid {spec.name} CSV file ({err}); check the file") from None
