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


SUFFIXES = ("ing", "ed", "s", "er", "ly")


def synthetic_vocab(path: str | Path, n_words: int = 400) -> list[str]:
    """Write a small BERT-layout ``vocab.txt`` (specials, letters, ``w0..wN`` words, ``##`` suffixes);
    return the whole words. A word plus a suffix (``w12ing``) tokenises to two pieces (``w12 ##ing``)."""
    words = [f"w{i}" for i in range(n_words)]
    letters = [chr(c) for c in range(ord("a"), ord("z") + 1)] + [str(d) for d in range(10)]
    tokens = ["[PAD]", *[f"[unused{i}]" for i in range(10)], "[UNK]", "[CLS]", "[SEP]", "[MASK]", ".", ","]
    tokens += letters + [f"##{c}" for c in letters] + words + [f"##{s}" for s in SUFFIXES]
    tokens = list(dict.fromkeys(tokens))  # "##s" is both a letter and a suffix
    Path(path).write_text("\n".join(tokens) + "\n", encoding="utf-8")
    return words


def make_synthetic_inputs(
    root: str | Path,
    *,
    n_train: int = 600,
    n_heldout: int = 120,
    docs_per_shard: int = 200,
    seed: int = 0,
    sentences: tuple[int, int] = (1, 20),
    tokenizer_json: bool = True,
) -> tuple[Path, Path]:
    """A generated corpus (``<root>/corpus``) and vocabulary (``<root>/vocab``) in the stages' formats.

    Sentences are 3-25 words; a quarter of the words carry a ``##`` suffix piece.

    Returns:
        ``(corpus_dir, vocab_dir)``.
    """
    root = Path(root)
    vocab_dir = root / "vocab"
    vocab_dir.mkdir(parents=True, exist_ok=True)
    words = synthetic_vocab(vocab_dir / "vocab.txt")
    if tokenizer_json:
        from tokenizers import BertWordPieceTokenizer

        BertWordPieceTokenizer(str(vocab_dir / "vocab.txt"), lowercase=True).save(
            str(vocab_dir / "tokenizer.json")
        )
    rng = np.random.default_rng(seed)

    def docs(n: int) -> list[list[str]]:
        out = []
        for _ in range(n):
            doc = []
            for _ in range(int(rng.integers(sentences[0], sentences[1] + 1))):
                k = int(rng.integers(3, 26))
                ws = [words[i] for i in rng.integers(0, len(words), k)]
                ws = [
                    w + SUFFIXES[int(rng.integers(len(SUFFIXES)))] if rng.random() < 0.25 else w for w in ws
                ]
                doc.append(" ".join(ws) + " .")
            out.append(doc)
        return out

    corpus = root / "corpus"
    write_corpus(corpus, "train", docs(n_train), docs_per_shard)
    write_corpus(corpus, "heldout", docs(n_heldout), docs_per_shard)
    return corpus, vocab_dir


def real_subset_corpus(shared_data: str | Path, out_dir: str | Path, *, books: int, wiki_files: int) -> Path:
    """Run the corpus stage, caps lifted, on the first ``books`` Gutenberg books and the first
    ``wiki_files`` Wikipedia files (file-name order) of ``shared_data/corpus``; return the corpus directory.

    The inputs are picked through a data root of symlinks, so the corpus stage reads them exactly as it
    reads the full data root.
    """
    from bert_core.constants import REPO_ROOT
    from bert_core.corpus.build import build_corpus
    from bert_core.corpus.params import CorpusParams
    from bert_core.params import read_yaml

    src = Path(shared_data) / "corpus"
    out_dir = Path(out_dir)
    root = out_dir / "data_root" / "corpus"
    for kind, pattern, n in (("gutenberg", "pg*.txt", books), ("wikipedia", "*.jsonl", wiki_files)):
        (root / kind).mkdir(parents=True, exist_ok=True)
        for f in sorted((src / kind).glob(pattern))[:n]:
            (root / kind / f.name).symlink_to(f)
    raw = read_yaml(REPO_ROOT / "params" / "corpus.yaml")["corpus"]
    for s in raw["local_sources"]:
        s["max_bytes"] = None
    raw["cap"] = {"max_documents": None, "max_bytes": None}
    build_corpus(CorpusParams.model_validate(raw), out_dir / "corpus", data_root=root.parent)
    return out_dir / "corpus"
