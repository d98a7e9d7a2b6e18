"""What the corpus build passes around: a worker's :class:`UnitResult` and the stage's :class:`CorpusStats`.

Kept apart from :mod:`.build` (the workers and the driver) and :mod:`.merge` (the parent's in-order merge),
which both use them, so neither imports the other's module for them.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from bert_core.corpus.readers import UnitStats


@dataclass
class UnitResult:
    """One work unit's output: its index, the temporary Parquet file of its documents and its statistics."""

    index: int
    path: str | None
    documents: int
    stats: UnitStats


@dataclass
class CorpusStats:
    """What the stage produced; ``as_metrics()`` is the DVC/MLflow metrics dict."""

    documents: int = 0
    documents_train: int = 0
    documents_heldout: int = 0
    sentences: int = 0
    words: int = 0
    bytes: int = 0
    input_files: int = 0
    input_bytes: int = 0
    records: int = 0
    duplicates: int = 0
    dropped: Counter = field(default_factory=Counter)
    utf8_replacements: int = 0
    files_with_utf8_errors: int = 0
    gutenberg_stripped: int = 0
    units_stopped_early: int = 0
    bad_record_examples: list[str] = field(default_factory=list)
    utf8_error_files: list[str] = field(default_factory=list)  # the first 20 files with bytes replaced
    per_source: dict[str, dict[str, int]] = field(default_factory=dict)
    capped: bool = False
    shards_train: int = 0
    shards_heldout: int = 0
    workers: int = 1
    elapsed_s: float = 0.0
    params_hash: str = ""
    data_root: str = "hub"
    check_report: Any = None

    def summary(self) -> str:
        """One log line a reader takes in at a glance (every figure is also in :meth:`as_metrics`)."""
        dropped = sum(self.dropped.values())
        line = (
            f"{self.documents:,} documents ({self.documents_train:,} train, {self.documents_heldout:,} held out), "
            f"{self.sentences:,} sentences, {self.words:,} words, {self.bytes / 1e6:.3g} MB "
            f"from {self.input_files:,} file(s) ({self.input_bytes / 1e6:.3g} MB read) in {self.elapsed_s:.1f} s"
        )
        notes = ["stopped at corpus.cap"] if self.capped else []
        if dropped:
            kinds = ", ".join(f"{k} {v:,}" for k, v in sorted(self.dropped.items()))
            notes.append(f"{dropped:,} documents dropped ({kinds})")
        if self.utf8_replacements:
            notes.append(
                f"{self.utf8_replacements:,} bad UTF-8 sequences replaced in {self.files_with_utf8_errors:,} "
                "file(s) (logged above, listed in the manifest)"
            )
        return "; ".join([line, *notes])

    def as_metrics(self) -> dict[str, Any]:
        mb_s = self.input_bytes / 1e6 / self.elapsed_s if self.elapsed_s > 0 else 0.0
        return {
            "documents": self.documents,
            "documents_train": self.documents_train,
            "documents_heldout": self.documents_heldout,
            "sentences": self.sentences,
            "words": self.words,
            "bytes": self.bytes,
            "input_files": self.input_files,
            "input_bytes": self.input_bytes,
            "records_read": self.records,
            "duplicates": self.duplicates,
            "documents_dropped": dict(sorted(self.dropped.items())),
            "documents_dropped_total": sum(self.dropped.values()),
            "utf8_replacements": self.utf8_replacements,
            "files_with_utf8_errors": self.files_with_utf8_errors,
            "gutenberg_boilerplate_removed": self.gutenberg_stripped,
            "capped": int(self.capped),
            "units_stopped_early": self.units_stopped_early,
            "sources": self.per_source,
            "shards_train": self.shards_train,
            "shards_heldout": self.shards_heldout,
            "elapsed_s": round(self.elapsed_s, 3),
            "input_mb_per_s": round(mb_s, 3),
            "checks_failed": len(self.check_report.failed) if self.check_report is not None else 0,
        }
