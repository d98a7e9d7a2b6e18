"""The corpus on disk: sharded Parquet, one document per row, read and written as a stream.

Layout of a corpus directory (the contract with the ``vocab`` and ``pretrain_data`` stages)::

    manifest.json                    shards, row counts, params hash, statistics
    train/part-00000.parquet ...     columns doc_id, source, title, sentences (list<string>)
    heldout/part-00000.parquet ...   a small split of whole documents

Documents stay documents (next-sentence prediction needs document boundaries); sentences are in order.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from bert_core.integrity import verify_output

SCHEMA = pa.schema(
    [
        pa.field("doc_id", pa.string(), nullable=False),
        pa.field("source", pa.string(), nullable=False),
        pa.field("title", pa.string(), nullable=False),
        pa.field("sentences", pa.list_(pa.string()), nullable=False),
    ]
)
MANIFEST = "manifest.json"
SPLITS = ("train", "heldout")


class DocumentShardWriter:
    """Append documents to ``<dir>/part-NNNNN.parquet`` files, rolling over at ``max_bytes`` of text.

    Rows are buffered only up to ``row_group_bytes`` before they are written as a row group, so memory is
    bounded by that buffer (plus one document), not by the corpus.
    """

    def __init__(self, directory: Path, *, max_bytes: int, row_group_bytes: int = 4_000_000, schema=SCHEMA):
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self.max_bytes = max_bytes
        self.row_group_bytes = min(row_group_bytes, max_bytes)
        self.schema = schema
        self.shards: list[dict[str, Any]] = []
        self._writer: pq.ParquetWriter | None = None
        self._rows: dict[str, list] = {name: [] for name in schema.names}
        self._buf_bytes = 0
        self._cur: dict[str, Any] | None = None

    def _open(self) -> None:
        name = f"part-{len(self.shards):05d}.parquet"
        self._writer = pq.ParquetWriter(self.directory / name, self.schema, compression="zstd")
        self._cur = {"file": name, "documents": 0, "sentences": 0, "bytes": 0}
        self.shards.append(self._cur)

    def _flush(self) -> None:
        if not self._rows[self.schema.names[0]]:
            return
        if self._writer is None:
            self._open()
        self._writer.write_table(pa.Table.from_pydict(self._rows, schema=self.schema))
        self._rows = {name: [] for name in self.schema.names}
        self._buf_bytes = 0

    def write(self, row: dict[str, Any], n_bytes: int) -> None:
        """Append one row (a dict with the schema's columns) holding ``n_bytes`` of text."""
        if self._writer is None and self._cur is None:
            self._open()
        for name in self.schema.names:
            self._rows[name].append(row[name])
        self._buf_bytes += n_bytes
        self._cur["documents"] += 1
        self._cur["bytes"] += n_bytes
        if "sentences" in row:
            self._cur["sentences"] += len(row["sentences"])
        if self._buf_bytes >= self.row_group_bytes:
            self._flush()
        if self._cur["bytes"] >= self.max_bytes:
            self._roll()

    def _roll(self) -> None:
        self._flush()
        if self._writer is not None:
            self._writer.close()
        self._writer, self._cur = None, None

    def close(self) -> list[dict[str, Any]]:
        """Flush and close; return the shard list (file, documents, sentences, bytes)."""
        self._roll()
        return self.shards


class CorpusShardError(ValueError):
    """A corpus shard cannot be read (truncated, corrupt, not Parquet); the message names it and the fix."""


def shard_error(path: Path, err: Exception) -> CorpusShardError:
    """The error for an unreadable shard: names the file, a short excerpt of the cause, and the fix."""
    detail = str(err).splitlines()[0][:200] if str(err) else type(err).__name__
    return CorpusShardError(
        f"corpus shard {path} cannot be read ({type(err).__name__}: {detail}); it is truncated or corrupt. "
        "Rebuild the corpus (`dvc repro -f corpus`, or `python -m flows.corpus`), then re-run this stage"
    )


def open_shard(path: str | Path) -> pq.ParquetFile:
    """Open one Parquet shard, first checking it against its output's checksums.

    Raises:
        CorruptOutputError: the file differs from what the corpus stage wrote (naming it).
        CorpusShardError: the file cannot be read as Parquet (naming it).
    """
    path = Path(path)
    try:
        verify_output(path.parent, [path])
        return pq.ParquetFile(path)
    except (pa.ArrowException, OSError) as err:
        if isinstance(err, FileNotFoundError):
            raise FileNotFoundError(
                f"corpus shard {path} is missing; rebuild the corpus (`dvc repro -f corpus`)"
            ) from err
        raise shard_error(path, err) from err


def iter_shard_batches(pf: pq.ParquetFile, path: str | Path, **kwargs: Any) -> Iterator[pa.RecordBatch]:
    """``pf.iter_batches(**kwargs)``, turning a decoding error half-way (a damaged page) into
    :class:`CorpusShardError` naming ``path``."""
    try:
        yield from pf.iter_batches(**kwargs)
    except (pa.ArrowException, OSError) as err:
        raise shard_error(Path(path), err) from err


def read_manifest(corpus_dir: str | Path) -> dict[str, Any]:
    """The corpus manifest; raises FileNotFoundError naming the directory when it is not a built corpus."""
    path = Path(corpus_dir) / MANIFEST
    if not path.is_file():
        raise FileNotFoundError(f"{corpus_dir} is not a built corpus (no {MANIFEST}); run the corpus stage")
    verify_output(path.parent, [path])
    return json.loads(path.read_text(encoding="utf-8"))


def shard_paths(corpus_dir: str | Path, split: str = "train") -> list[Path]:
    """The shard files of ``split`` in order, as listed in the manifest."""
    if split not in SPLITS:
        raise ValueError(f"unknown split {split!r}; use one of {SPLITS}")
    manifest = read_manifest(corpus_dir)
    return [Path(corpus_dir) / split / s["file"] for s in manifest["splits"][split]["shards"]]


def iter_documents(
    corpus_dir: str | Path, split: str = "train", *, columns: list[str] | None = None, batch_size: int = 64
) -> Iterator[dict[str, Any]]:
    """Stream the documents of one split in order, one dict per document (memory: one batch)."""
    for path in shard_paths(corpus_dir, split):
        pf = open_shard(path)
        for batch in iter_shard_batches(pf, path, batch_size=batch_size, columns=columns):
            yield from batch.to_pylist()
