"""A pretraining-data build's finished tasks, kept across a crash: the same build continues after them.

:func:`.build.build_pretrain_data` writes every task's shards into its work directory, ``.<output>.partial/``
beside the output (:class:`PartialBuild`, a :class:`bert_core.kept_work.KeptWork`: the lock, the identity,
what is kept when), and moves them into the output only once every task is built, balanced and checked. The
work directory holds:

- ``identity.json``: what the shards are built from (:func:`build_identity`): the package's code, the
  params that decide the output's bytes, the vocabulary files, every corpus shard (name, size, XXH3-128)
  and the format version;
- ``tasks/<split>-<index>.json``, one per finished task: the worker's result and the size and XXH3-128 of
  each of the task's files.

A later build with the same identity keeps every task whose files still match their record and runs the
others, so its output is the one an uninterrupted build writes, byte for byte (the plan and every seed
depend on the inputs and the params alone). NSP balancing runs a few tasks again after the first pass and
rewrites their shards: resumed, those no longer match their record and are built again, then balanced as
before. A refused input (a bad corpus, a failed data check: :data:`REFUSED`) keeps nothing.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from bert_core.checks import DataCheckError
from bert_core.integrity import checked_entry
from bert_core.kept_work import BuildInUseError, KeptWork, code_fingerprint, partial_dir
from bert_core.pretrain_data.params import PretrainDataParams
from bert_core.pretrain_data.storage import FORMAT_VERSION
from bert_core.pretrain_data.worker import Job

__all__ = ["REFUSED", "BuildInUseError", "PartialBuild", "build_identity", "partial_dir"]

#: Errors of the inputs themselves: the same build fails the same way, so its finished tasks are not kept.
REFUSED = (ValueError, DataCheckError)


def build_identity(
    params: PretrainDataParams, corpus_dir: str | Path, vocab_dir: str | Path, splits: tuple[str, ...]
) -> dict[str, Any]:
    """What a build's bytes depend on: the format version, the package's code, the params that decide them,
    the vocabulary files and every corpus shard by name, size and XXH3-128 (from the corpus output's manifest,
    against which the shards were checked as the build planned its tasks; computed, at about 5 GB/s, where
    there is none)."""
    vocab_files = [Path(vocab_dir) / n for n in ("vocab.txt", "tokenizer.json")]
    corpus = {
        split: [[f.name, checked_entry(f)] for f in sorted((Path(corpus_dir) / split).glob("part-*.parquet"))]
        for split in splits
    }
    return {
        "format_version": FORMAT_VERSION,
        "code": code_fingerprint(Path(__file__).parent),
        "params": params.data_params(),
        "vocab": {f.name: checked_entry(f) for f in vocab_files if f.is_file()},
        "corpus": corpus,
    }


class PartialBuild(KeptWork):
    """The work directory of one build (:class:`bert_core.kept_work.KeptWork`, one record per task under
    ``tasks/``); a context manager holding its lock. :meth:`finished` gives a task's recorded result when its
    files still match, and :meth:`record` keeps a task as it finishes."""

    def __init__(self, directory: str | os.PathLike[str], identity: dict[str, Any], total: int) -> None:
        super().__init__(
            directory, identity, total, build="pretrain_data", piece="task", records="tasks", refused=REFUSED
        )

    @staticmethod
    def _name(job: Job) -> str:
        return f"{job.task.split}-{job.task.index:05d}"

    def _files(self, job: Job, phases: Any) -> list[Path]:
        split, name = job.task.split, f"shard-{job.task.index:05d}"
        return [f for phase in phases for f in sorted((self.dir / phase / split).glob(f"{name}.*.bin"))]

    def finished(self, job: Job) -> dict[str, Any] | None:  # type: ignore[override]
        """The task's recorded result, when it is recorded for these corpus rows and its files match."""
        record = super().finished(self._name(job), lambda r: self._files(job, r["result"]["phases"]))
        if record is None or record.get("segments") != job.task.rows():
            return None
        return record["result"]

    def record(self, job: Job, result: dict[str, Any]) -> None:  # type: ignore[override]
        """Keep a finished task: its record, with the size and checksum of each of its files."""
        files = self._files(job, result["phases"])
        super().record(self._name(job), files, segments=job.task.rows(), result=result)
