"""Merging unit results in input order: exact de-duplication, caps, the held-out split, shard writing.

Runs in the parent process of :func:`bert_core.corpus.build_corpus`, so its decisions depend only on the
order of the work units, never on which worker finished first.
"""

from __future__ import annotations

import hashlib
import logging
import random
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.parquet as pq

from bert_core.corpus.params import CorpusParams, SourceSpec
from bert_core.corpus.readers import MAX_BAD_RECORD_EXAMPLES
from bert_core.corpus.shards import SCHEMA, DocumentShardWriter
from bert_core.corpus.stats import CorpusStats, UnitResult
from bert_core.corpus.units import WorkUnit

log = logging.getLogger(__name__)

CHECK_SAMPLE = 50_000
#: A file with more undecodable bytes than this share is named in a warning (likely not UTF-8 text at all).
BINARY_SHARE = 0.01


class HashSet64:
    """A set of 64-bit hashes at ~8 bytes per entry (sorted numpy array + a small Python set buffer)."""

    def __init__(self, buffer_size: int = 1 << 18) -> None:
        self._sorted = np.empty(0, dtype=np.uint64)
        self._buf: set[int] = set()
        self._buffer_size = buffer_size

    def add(self, h: int) -> bool:
        """Insert ``h``; return False when it was already present."""
        if h in self._buf:
            return False
        if self._sorted.size:
            i = int(np.searchsorted(self._sorted, np.uint64(h)))
            if i < self._sorted.size and int(self._sorted[i]) == h:
                return False
        self._buf.add(h)
        if len(self._buf) >= self._buffer_size:
            merged = np.fromiter(self._buf, dtype=np.uint64, count=len(self._buf))
            self._sorted = np.union1d(self._sorted, merged)
            self._buf.clear()
        return True

    def __len__(self) -> int:
        return int(self._sorted.size) + len(self._buf)


def h64(data: bytes, key: bytes = b"") -> int:
    """64-bit BLAKE2b of ``data`` (keyed: a seeded hash). Collisions: ~1e-7 at 2 million documents."""
    return int.from_bytes(hashlib.blake2b(data, digest_size=8, key=key).digest(), "little")


class Merger:
    """Consumes unit results in order: de-dup, caps, split, shard writing, statistics."""

    def __init__(self, params: CorpusParams, sources: tuple[SourceSpec, ...], out: Path, stats: CorpusStats):
        self.p = params
        self.sources = sources
        self.stats = stats
        self.train = DocumentShardWriter(out / "train", max_bytes=params.shard_max_bytes)
        self.heldout = DocumentShardWriter(out / "heldout", max_bytes=params.shard_max_bytes)
        self.seen_text = HashSet64()
        self.seen_id = HashSet64()
        self.src_docs = Counter()
        self.src_bytes = Counter()
        self.src_done: set[int] = set()
        self.utf8_error_paths: set[str] = set()
        self.done = False
        self.check_rows: list[dict[str, Any]] = []
        self.pending: tuple[dict[str, Any], int] | None = None
        self._rng = random.Random(params.seed)
        self._key = str(params.seed).encode()[:64]

    def _cap_hit(self, si: int, n_bytes: int) -> bool:
        src, cap = self.sources[si], self.p.cap
        if (src.max_documents is not None and self.src_docs[si] + 1 > src.max_documents) or (
            src.max_bytes is not None and self.src_bytes[si] + n_bytes > src.max_bytes
        ):
            self.src_done.add(si)
            return True
        if (cap.max_documents is not None and self.stats.documents + 1 > cap.max_documents) or (
            cap.max_bytes is not None and self.stats.bytes + n_bytes > cap.max_bytes
        ):
            self.done = True
            return True
        return False

    def consume(self, unit: WorkUnit, result: UnitResult) -> None:
        st = self.stats
        st.input_files += result.stats.input_files
        st.input_bytes += result.stats.input_bytes
        st.records += result.stats.records
        st.utf8_replacements += result.stats.utf8_replacements
        named = st.utf8_error_files
        for path, replaced, read in result.stats.utf8_files:
            first = path not in self.utf8_error_paths  # a file read in several units: once
            if first:
                self.utf8_error_paths.add(path)
                st.files_with_utf8_errors += 1
            binary = replaced > BINARY_SHARE * max(read, 1)
            if binary:
                log.warning(
                    "%s: %d of its %d bytes are not UTF-8 (each replaced by U+FFFD in the corpus): is it a "
                    "text file? Leave it out (the source's exclude) or convert it to UTF-8",
                    path,
                    replaced,
                    read,
                )
            if first and len(named) < MAX_BAD_RECORD_EXAMPLES:
                named.append(str(path))
                if not binary:
                    log.info("%s: bytes that are not UTF-8, each sequence replaced by U+FFFD", path)
        st.gutenberg_stripped += result.stats.gutenberg_stripped
        st.units_stopped_early += int(result.stats.stopped_early)
        st.dropped.update(result.stats.dropped)
        room = MAX_BAD_RECORD_EXAMPLES - len(st.bad_record_examples)
        st.bad_record_examples.extend(result.stats.bad_record_examples[: max(room, 0)])
        if result.path is None:
            return
        si = unit.source_index
        pf = pq.ParquetFile(result.path)
        for batch in pf.iter_batches(batch_size=64):
            for row in batch.to_pylist():
                if si in self.src_done or self.done:
                    st.dropped["over_cap"] += 1
                    st.capped = True
                    continue
                self._add(si, row)

    def _add(self, si: int, row: dict[str, Any]) -> None:
        st = self.stats
        if self.p.clean.dedup and not self.seen_text.add(int(row["hash"])):
            st.duplicates += 1
            st.dropped["duplicate"] += 1
            return
        if not self.seen_id.add(h64(row["doc_id"].encode())):
            st.dropped["duplicate_id"] += 1
            log.warning("dropping document with repeated doc_id %s", row["doc_id"])
            return
        n_bytes = int(row["n_bytes"])
        if self._cap_hit(si, n_bytes):
            st.dropped["over_cap"] += 1
            st.capped = True
            return
        u = h64(row["doc_id"].encode(), self._key) / 2.0**64
        heldout = u < self.p.heldout.fraction and st.documents_heldout < self.p.heldout.max_documents
        doc = {k: row[k] for k in SCHEMA.names}
        if heldout:
            self.heldout.write(doc, n_bytes)
            if self.pending is not None:  # the held-out split is no longer empty: release the reserve
                self.train.write(*self.pending)
                self.pending = None
        elif st.documents_heldout == 0 and self.pending is None:
            self.pending = (doc, n_bytes)  # reserve: goes to held-out if no document hashes there
        else:
            self.train.write(doc, n_bytes)
        self.src_docs[si] += 1
        self.src_bytes[si] += n_bytes
        st.documents += 1
        st.documents_heldout += int(heldout)
        st.documents_train += int(not heldout)
        st.sentences += len(doc["sentences"])
        st.words += int(row["n_words"])
        st.bytes += n_bytes
        lens = [len(s) for s in doc["sentences"]]
        check_row = {
            "doc_id": doc["doc_id"],
            "source": doc["source"],
            "split": "heldout" if heldout else "train",
            "n_sentences": len(lens),
            "min_sentence_chars": min(lens) if lens else 0,
            "max_sentence_chars": max(lens) if lens else 0,
            "n_bytes": n_bytes,
        }
        # Deterministic reservoir sample of per-document statistics for the data checks.
        if len(self.check_rows) < CHECK_SAMPLE:
            self.check_rows.append(check_row)
        else:
            j = self._rng.randrange(st.documents)
            if j < CHECK_SAMPLE:
                self.check_rows[j] = check_row

    def close(self) -> tuple[list[dict], list[dict]]:
        """Finish both splits. On a small corpus where no document hashed into the held-out split, the
        first train document (kept in reserve) becomes the held-out split, when train keeps at least one."""
        if self.pending is not None:
            st = self.stats
            if st.documents_train >= 2:
                doc, n_bytes = self.pending
                self.heldout.write(doc, n_bytes)
                st.documents_train -= 1
                st.documents_heldout += 1
                for row in self.check_rows:
                    if row["doc_id"] == doc["doc_id"]:
                        row["split"] = "heldout"
            else:
                self.train.write(*self.pending)
            self.pending = None
        return self.train.close(), self.heldout.close()


def corpus_checks(params: CorpusParams, names: list[str]):
    import great_expectations as gx

    from bert_core.checks import Check

    E = gx.expectations
    return [
        Check(E.ExpectColumnValuesToBeUnique(column="doc_id")),
        Check(E.ExpectColumnValuesToNotBeNull(column="doc_id")),
        Check(E.ExpectColumnValuesToMatchRegex(column="doc_id", regex=r"^[A-Za-z0-9][A-Za-z0-9_.-]*:.+")),
        Check(E.ExpectColumnValuesToBeInSet(column="source", value_set=names)),
        Check(E.ExpectColumnValuesToBeInSet(column="split", value_set=["train", "heldout"])),
        Check(E.ExpectColumnDistinctValuesToContainSet(column="split", value_set=["train", "heldout"])),
        Check(E.ExpectColumnValuesToBeBetween(column="n_sentences", min_value=params.clean.min_sentences)),
        Check(E.ExpectColumnValuesToBeBetween(column="min_sentence_chars", min_value=1)),
        Check(
            E.ExpectColumnValuesToBeBetween(
                column="max_sentence_chars", min_value=1, max_value=params.clean.max_sentence_chars
            )
        ),
        Check(E.ExpectColumnValuesToBeBetween(column="n_bytes", min_value=1)),
    ]
