"""Small corpora in the corpus stage's format, for tests and benchmarks (not used by the stage itself).

The corpus contract: ``<root>/<split>/part-NNNNN.parquet`` with columns ``doc_id`` (str), ``source`` (str),
``title`` (str), ``sentences`` (list<str>), one document per row.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Iterator
from pathlib import Path

import numpy as np

_SENT_END = re.compile(r"(?<=[.!?])\s+(?=[\"'(\[]?[A-Z0-9])")


def naive_sentences(text: str) -> list[str]:
    """Split text into sentences at ``.!?`` followed by a capital (and at blank lines): good enough for
    tests and benchmarks; the corpus stage has a real splitter."""
    out = []
    for para in re.split(r"\n\s*\n", text):
        para = " ".join(para.split())
        out.extend(s for s in _SENT_END.split(para) if s)
    return out


def write_corpus(
    root: str | Path, split: str, docs: Iterable[list[str]], docs_per_shard: int = 1000, source: str = "test"
) -> list[Path]:
    """Write documents (lists of sentences) as Parquet shards; return the shard paths."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    d = Path(root) / split
    d.mkdir(parents=True, exist_ok=True)
    paths: list[Path] = []
    schema = pa.schema(
        [
            ("doc_id", pa.string()),
            ("source", pa.string()),
            ("title", pa.string()),
            ("sentences", pa.list_(pa.string())),
        ]
    )
    buf: list[list[str]] = []
    count = 0

    def flush() -> None:
        path = d / f"part-{len(paths):05d}.parquet"
        ids = [f"{split}-{count - len(buf) + i}" for i in range(len(buf))]
        table = pa.table(
            {"doc_id": ids, "source": [source] * len(buf), "title": ids, "sentences": buf}, schema=schema
        )
        pq.write_table(table, path, row_group_size=256)
        paths.append(path)
        buf.clear()

    for doc in docs:
        buf.append(list(doc))
        count += 1
        if len(buf) == docs_per_shard:
            flush()
    if buf or not paths:
        flush()
    return paths


def real_documents(
    shared_data: str | Path, *, wikipedia: bool = True, gutenberg: bool = True
) -> Iterator[list[str]]:
    """Documents of ``shared/data/corpus`` (Wikipedia articles, Gutenberg books), naively sentence-split."""
    corpus = Path(shared_data) / "corpus"
    if wikipedia:
        for f in sorted((corpus / "wikipedia").glob("*.jsonl")):
            for line in f.open(encoding="utf-8"):
                sents = naive_sentences(json.loads(line)["text"])
                if sents:
                    yield sents
    if gutenberg:
        for f in sorted((corpus / "gutenberg").glob("*.txt")):
            sents = naive_sentences(f.read_text(encoding="utf-8"))
            if sents:
                yield sents


def synthetic_documents(
    n_docs: int,
    vocab_words: list[str],
    *,
    seed: int = 0,
    sentences: tuple[int, int] = (1, 30),
    words: tuple[int, int] = (3, 40),
) -> list[list[str]]:
    """Random documents of random vocabulary words (sentence and word counts uniform in the ranges)."""
    rng = np.random.default_rng(seed)
    docs = []
    for _ in range(n_docs):
        doc = []
        for _ in range(rng.integers(sentences[0], sentences[1] + 1)):
            n = rng.integers(words[0], words[1] + 1)
            doc.append(" ".join(vocab_words[i] for i in rng.integers(0, len(vocab_words), n)))
        docs.append(doc)
    return docs
