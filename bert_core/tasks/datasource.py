"""Where a task's training and evaluation rows come from: the official splits, a dev split, or own files.

Chosen per task (``finetune.tasks.<task>`` in ``params/finetune.yaml``; :func:`resolve_task_source`):

* **official** (the default): :func:`~bert_core.tasks.load_task_split` -- the Hugging Face Hub, or the
  official files under the data root (``BERT_DATA_ROOT``).
* **dev split** (``dev_split: true``; SQuAD v1.1 and v2.0, whose train files are sometimes unobtainable):
  train on the first articles of the official dev file and evaluate on the last ones
  (:class:`~bert_core.tasks.registry.DevSplit`: 24 / 24 of ``dev-v1.1.json``, 17 / 18 of
  ``dev-v2.0.json``). The halves share no article; the scores are labelled as such (summary, report,
  MLflow) and are not official dev scores. When the official train data is there (the Hub, or the data
  root has the train file) the option is an error: the official splits are the ones to use, and silently
  preferring either would make a run's scores mean something else than its params say.
* **own files** (``train_file`` / ``dev_file`` / ``test_file``): files in the task's official format (a
  SQuAD JSON, a GLUE TSV, ...), absolute or relative to the repository root; each replaces only its split
  (the others come from the official source). ``dev_file`` is the task's main dev split (MNLI: matched),
  ``test_file`` its split ``test``. An own task (:mod:`bert_core.tasks.own`) has its files, and nothing else.

DVC cannot list these files as a stage's deps (the data root is an environment variable, and each task has
its own): the ``inputs`` stage records them (:meth:`TaskSource.files`, :mod:`bert_core.inputs`), and the
task's stage depends on that record, so an edited file re-runs it. The rows' digest is logged to MLflow.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bert_core.constants import REPO_ROOT
from bert_core.inputs import Hub
from bert_core.tasks.base import TaskDataError, TaskRows, resolve_data_root
from bert_core.tasks.loader import load_task_split, local_split_file, read_local
from bert_core.tasks.registry import TaskSpec


@dataclass
class TaskSource:
    """How one task's splits are read (build it with :func:`resolve_task_source`).

    Attributes:
        spec: The task.
        origin: ``official``, ``dev_split`` or ``own_files``.
        key: The params key of the task's settings (``finetune.tasks.squad_v1``), for messages.
        data_root: The local data root (``None``: the Hub).
        train_file: The file the train split is read from, when not the official source.
        dev_file: The file the main dev split is read from (for a dev split: the official dev file).
        test_file: The file the split ``test`` is read from, when not the official source.
    """

    spec: TaskSpec
    origin: str
    key: str
    data_root: Path | None = None
    train_file: Path | None = None
    dev_file: Path | None = None
    test_file: Path | None = None
    _articles: list[Any] | None = field(default=None, repr=False)

    def load(self, split: str, limit: int | None = None) -> TaskRows:
        """The rows of ``split`` (the first ``limit``), read as this source says."""
        rows = self._load(split, limit)
        rows.limit = limit
        return rows

    def _load(self, split: str, limit: int | None) -> TaskRows:
        spec = self.spec
        if self.origin == "dev_split" and split in ("train", spec.main_dev_split):
            return self._dev_split_rows(split, limit)
        own = self._own_files().get(split)
        if self.origin == "own_files" and own is not None:
            name = {"train": "train_file", "test": "test_file"}.get(split, "dev_file")
            try:
                return read_local(spec, split, own, limit)
            except TaskDataError as err:
                raise TaskDataError(f"{self.key}.{name}: {err}") from None
        try:
            return load_task_split(spec, split, data_root=self.data_root, limit=limit)
        except TaskDataError as err:
            raise self._missing(split, err) from None

    def check_files(self) -> None:
        """Refuse, without reading a row, what :meth:`load` would refuse first: a local file of the train or a
        dev split that is not there (the command line checks this before Prefect starts).

        Raises:
            TaskDataError: as :meth:`load` raises it, naming the file and the fix.
        """
        for split in ("train", *self.spec.dev_splits):
            self.split_file(split)

    def split_file(self, split: str) -> Path | Hub | None:
        """The file ``split`` is read from; the Hub dataset (and revision) when it comes from the Hub;
        ``None`` when it is not read (an own task's split without its file, a split the task has no file for).

        Raises:
            TaskDataError: an official file that is not under the data root, as :meth:`load` raises it.
        """
        spec, own = self.spec, self._own_files()
        if split in own:
            return own[split]
        if self.origin == "dev_split" and split in ("train", spec.main_dev_split):
            return self.dev_file
        if self.data_root is None:
            return Hub(spec.hub_path, spec.hub_revision) if spec.hub_path and split in spec.splits else None
        if split not in spec.local_files:
            return None
        try:
            return local_split_file(spec, split, self.data_root)
        except TaskDataError as err:
            raise self._missing(split, err) from None

    def files(self) -> dict[str, Path | Hub | str]:
        """Split -> :meth:`split_file`, or why not (``missing: <message>``): what the ``inputs`` DVC stage
        records (:mod:`bert_core.inputs`). The split ``test`` only where a file holds it (labelled, or the
        official unlabelled one predicted)."""
        out: dict[str, Path | Hub | str] = {}
        for split in dict.fromkeys(("train", *self.spec.dev_splits, "test")):
            try:
                found = self.split_file(split)
            except TaskDataError as err:
                found = None if split == "test" else f"missing: {err}"
            if found is not None:
                out[split] = found
        return out

    def _own_files(self) -> dict[str, Path]:
        """Split -> the own file it is read from."""
        own = {"train": self.train_file, self.spec.main_dev_split: self.dev_file, "test": self.test_file}
        return {split: path for split, path in own.items() if path is not None}

    def _missing(self, split: str, err: TaskDataError) -> TaskDataError:
        """``err`` of a missing split; SQuAD's train file: with the data-limited alternative."""
        spec = self.spec
        if split == "train" and spec.dev_split is not None and self.data_root is not None:
            return TaskDataError(
                f"{err} For a data-limited run without it, set {self.key}.dev_split: true (train on "
                f"articles 1-{spec.dev_split.train_articles} of {spec.local_files[spec.main_dev_split]}, "
                f"evaluate on the last {spec.dev_split.eval_articles}; not official dev scores)."
            )
        return err

    def _dev_split_rows(self, split: str, limit: int | None) -> TaskRows:
        from bert_core.tasks.squad import read_squad_articles, squad_rows

        spec, plan, path = self.spec, self.spec.dev_split, self.dev_file
        assert plan is not None and path is not None
        if self._articles is None:
            articles = read_squad_articles(spec, path)
            if len(articles) != plan.total:
                raise TaskDataError(
                    f"{path}: {len(articles)} articles, but {self.key}.dev_split needs the official "
                    f"{path.name} ({plan.total} articles: {plan.train_articles} to train on, "
                    f"{plan.eval_articles} to evaluate); use the official file, or point {self.key}.train_file "
                    "and dev_file at your own split"
                )
            self._articles = articles
        indices = self.article_range(split)
        rows = squad_rows(spec, split, path, self._articles, indices, limit)
        rows.source = f"{path} articles {indices.start + 1}-{indices.stop}"
        return rows

    def article_range(self, split: str) -> range:
        """0-based article indices of ``split`` in the dev file (dev split only)."""
        plan = self.spec.dev_split
        assert plan is not None
        return range(plan.train_articles) if split == "train" else range(plan.train_articles, plan.total)

    def describe(
        self,
        train: TaskRows | None = None,
        dev: TaskRows | None = None,
        others: Mapping[str, TaskRows] | None = None,
    ) -> dict[str, Any]:
        """What the summary, the report and MLflow say about the data: ``origin``, ``label`` (empty for
        the whole official dev split), ``eval_set`` (the scored rows alone: scores are comparable only on
        the same one; empty for the whole official dev split), the sources (``train_source``,
        ``eval_source``, with row counts) and, for each further evaluated split of ``others`` that a limit
        cut, ``<split>_set`` (``first 1000 of 3453 rows``)."""
        info: dict[str, Any] = {"origin": self.origin, "label": "", "eval_set": ""}
        for split, rows in (others or {}).items():
            if rows.cut:
                counted = f" of {rows.available}" if rows.available is not None else ""
                info[f"{split}_set"] = f"first {len(rows)}{counted} rows"
        for name, rows in (("train", train), ("eval", dev)):
            if rows is not None:
                info[f"{name}_source"] = rows.source
                info[f"{name}_rows"] = len(rows)
        if self.origin == "dev_split":
            assert self.dev_file is not None
            ev, tr = self.article_range(self.spec.main_dev_split), self.article_range("train")
            scored = f"articles {ev.start + 1}-{ev.stop} of {self.dev_file.stem}{_cut(dev, 'questions')}"
            label = f"dev split: {scored}, trained on {tr.start + 1}-{tr.stop}{_cut(train, 'questions')}"
            info.update(label=label, eval_set=f"dev split: {scored}", file=str(self.dev_file))
        elif self.origin == "own_files":
            if self.dev_file is not None:
                info["eval_set"] = f"own dev file {self.dev_file}{_cut(dev)}"
            files = (
                ("train", self.train_file, ""),
                ("dev", self.dev_file, _cut(dev)),
                ("test", self.test_file, ""),
            )
            if not self.spec.own:  # an own task has no official splits to tell its files from
                info["label"] = "own files: " + ", ".join(f"{n} {p}{c}" for n, p, c in files if p is not None)
        if not info["eval_set"] and dev is not None and dev.cut:  # the official dev split, cut short
            info["eval_set"] = f"official dev split{_cut(dev)}"
            info["label"] = "; ".join(x for x in (info["label"], info["eval_set"]) if x)
        return info


def split_tags(info: dict[str, Any]) -> dict[str, str]:
    """MLflow tags of :meth:`TaskSource.describe`'s ``info``: ``data_split`` (the origin) and, unless the
    splits are the official ones, ``data_split_label``."""
    label = str(info.get("label") or "")
    return {
        "data_split": str(info.get("origin", "official")),
        **({"data_split_label": label} if label else {}),
    }


def _cut(rows: TaskRows | None, unit: str = "rows") -> str:
    """`` (first N of M questions)`` (uncounted: `` (first N rows only: a row limit)``) when a limit cut the
    rows, else empty."""
    if rows is None or not rows.cut:
        return ""
    if rows.available is None:
        return f" (first {len(rows)} {unit} only: a row limit)"
    return f" (first {len(rows)} of {rows.available} {unit})"


def resolve_task_source(
    spec: TaskSpec,
    *,
    dev_split: bool = False,
    train_file: str | os.PathLike[str] | None = None,
    dev_file: str | os.PathLike[str] | None = None,
    test_file: str | os.PathLike[str] | None = None,
    data_root: str | os.PathLike[str] | None = None,
    base_dir: str | os.PathLike[str] = REPO_ROOT,
    key: str | None = None,
) -> TaskSource:
    """Decide where ``spec``'s rows come from, and fail early (naming the key and the fix) when that is wrong.

    Args:
        spec: The task.
        dev_split: Train and evaluate on two halves of the official dev file (``spec.dev_split``).
        train_file, dev_file, test_file: Own files in the task's official format (relative paths: to
            ``base_dir``).
        data_root: Local data root (default ``BERT_DATA_ROOT``; unset: the Hub).
        base_dir: What relative own-file paths are relative to (the repository root, where DVC runs).
        key: The params key named in errors (default ``finetune.tasks.<task>``).

    Raises:
        ValueError: ``dev_split`` on a task without one, or together with own files.
        TaskDataError: ``dev_split`` while the official train data is available, a missing dev file, or a
            missing own file.
    """
    key = key or f"finetune.tasks.{spec.name}"
    root = None if spec.own else resolve_data_root(data_root)  # an own task: its files, else the Hub
    if dev_split:
        plan = spec.dev_split
        if plan is None:
            raise ValueError(
                f"{key}.dev_split: {spec.name} has no dev split (only squad_v1, squad_v2); remove it"
            )
        if train_file is not None or dev_file is not None or test_file is not None:
            raise ValueError(
                f"{key}: dev_split and train_file/dev_file/test_file exclude each other; keep one"
            )
        train_rel, dev_rel = spec.local_files["train"], spec.local_files[spec.main_dev_split]
        if root is None:
            raise TaskDataError(
                f"{key}.dev_split: true, but {spec.name}'s official train split is available (BERT_DATA_ROOT is "
                f"unset, so data comes from the Hugging Face Hub, {spec.hub_path}): remove dev_split to use "
                "the official train and dev splits, or set BERT_DATA_ROOT to a local data root"
            )
        if (root / train_rel).is_file():
            raise TaskDataError(
                f"{key}.dev_split: true, but the official train file {root / train_rel} is present: remove "
                f"dev_split, so {spec.name} trains on it and is scored on the official dev set"
            )
        path = root / dev_rel
        if not path.is_file():
            raise TaskDataError(
                f"{key}.dev_split: the official dev file {path} does not exist; put {dev_rel} under the data root"
            )
        return TaskSource(spec, "dev_split", key, root, dev_file=path)
    own = {
        name: own_file(value, base_dir, f"{key}.{name}")
        for name, value in (("train_file", train_file), ("dev_file", dev_file), ("test_file", test_file))
        if value is not None
    }
    if own:
        return TaskSource(
            spec, "own_files", key, root, own.get("train_file"), own.get("dev_file"), own.get("test_file")
        )
    return TaskSource(spec, "official", key, root)


def own_file(value: str | os.PathLike[str], base_dir: str | os.PathLike[str], key: str) -> Path:
    """The own file ``value`` (relative: to ``base_dir``); :class:`TaskDataError` naming ``key`` when absent."""
    path = Path(value).expanduser()
    path = path if path.is_absolute() else Path(base_dir) / path
    if not path.is_file():
        raise TaskDataError(
            f"{key}: {path} does not exist (relative paths are taken from the repository root); point it at a "
            "file in the task's official format"
        )
    return path
