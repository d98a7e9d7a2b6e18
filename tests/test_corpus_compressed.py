"""Compressed corpus input: gzip, bzip2, xz and zstd files read as their uncompressed text, a damaged one
named, and a file whose bytes are compressed otherwise than its name says (or are an archive) refused before
any work, naming what it is and what to do."""

from __future__ import annotations

import bz2
import gzip
import io
import json
import lzma
import tarfile
import zipfile
from pathlib import Path

import pytest
from backports import zstd
from corpus_builds import COMPRESS

from bert_core.corpus import CorpusError, CorpusParams, build_corpus, iter_documents
from bert_core.corpus.compressed import check_content
from bert_core.corpus.units import plan_units
from bert_core.corpus.wiki import iter_pages
from bert_core.owned import mark_output

SENT = "The quick brown fox jumps over the lazy dog near the river bank. It was a sunny day in the old town. "


def _jsonl() -> bytes:
    rows = [{"id": f"r{i}", "text": f"Record {i}. " + SENT * 3} for i in range(30)]
    return b"".join(json.dumps(r).encode() + b"\n" for r in rows)


def _text() -> bytes:
    return "\n\n".join(f"Document {i}.\n" + SENT * 2 for i in range(30)).encode()


def _params(kind: str, path: str, **source: object) -> CorpusParams:
    spec = {"name": "mine", "kind": kind, "path": path, **source}
    return CorpusParams.model_validate(
        {
            "sources": [spec],
            "local_sources": [spec],
            "clean": {"min_doc_chars": 20},
            "heldout": {"fraction": 0.2, "max_documents": 5},
            "workers": 1,
        }
    )


def _texts(out: Path) -> list[str]:
    return sorted(
        "\n".join(d["sentences"]) for split in ("train", "heldout") for d in iter_documents(out, split)
    )


@pytest.mark.parametrize("suffix", list(COMPRESS))
def test_each_compression_reads_as_the_uncompressed_file(tmp_path, suffix):
    for kind, name, data, how in (
        ("jsonl", "a.jsonl", _jsonl(), {"id_field": "id"}),
        ("text", "b.txt", _text(), {"doc_split": "blank_lines"}),
    ):
        (tmp_path / name).write_bytes(data)
        (tmp_path / "packed").mkdir(exist_ok=True)
        (tmp_path / "packed" / f"{name}{suffix}").write_bytes(COMPRESS[suffix](data))
        plain = build_corpus(_params(kind, name, **how), tmp_path / f"plain-{kind}", data_root=tmp_path)
        packed = build_corpus(_params(kind, "packed", **how), tmp_path / f"packed-{kind}", data_root=tmp_path)
        assert packed.input_files == 1 and packed.documents == plain.documents == 30  # the folder reads it
        assert _texts(tmp_path / f"packed-{kind}") == _texts(tmp_path / f"plain-{kind}")


def test_a_wikipedia_dump_in_zstd_reads_as_its_xml(shared_data, tmp_path):
    xml = bz2.decompress((shared_data / "wikipedia_dump/enwiki-20250201-tiny.xml.bz2").read_bytes())
    (tmp_path / "dump.xml").write_bytes(xml)
    (tmp_path / "dump.xml.zst").write_bytes(zstd.compress(xml))
    pages = [(p.page_id, p.text) for p in iter_pages(tmp_path / "dump.xml")]
    assert len(pages) == 70 and [(p.page_id, p.text) for p in iter_pages(tmp_path / "dump.xml.zst")] == pages


@pytest.mark.parametrize("suffix", [".zst", ".xz", ".gz"])
def test_a_truncated_or_corrupt_file_is_named(tmp_path, suffix):
    data = COMPRESS[suffix](_jsonl() * 20)
    (tmp_path / f"cut.jsonl{suffix}").write_bytes(data[: len(data) // 2])
    with pytest.raises(CorpusError, match=rf"cut\.jsonl\{suffix}: cannot read .*corrupt or truncated"):
        build_corpus(_params("jsonl", f"cut.jsonl{suffix}"), tmp_path / "out", data_root=tmp_path)
    bad = bytearray(data)
    bad[4:12] = b"\xff" * 8  # the frame or stream header
    (tmp_path / f"bad.jsonl{suffix}").write_bytes(bad)
    with pytest.raises(CorpusError, match=rf"bad\.jsonl\{suffix}: cannot read .*corrupt or truncated"):
        build_corpus(_params("jsonl", f"bad.jsonl{suffix}"), tmp_path / "out", data_root=tmp_path)


def _tar_gz(data: bytes) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        info = tarfile.TarInfo("inside.txt")
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def _zip(data: bytes) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        z.writestr("inside.txt", data)
    return buf.getvalue()


MISNAMED = [
    (
        "corpus.txt",
        gzip.compress(_text()),
        r"its bytes are gzip-compressed \(its name says it is not "
        r"compressed\); name it for what it is \(here: corpus\.txt\.gz\) so that it is decompressed",
    ),
    (
        "corpus.txt.gz",
        zstd.compress(_text()),
        r"its bytes are zstd-compressed \(its name says gzip\); name it "
        r"for what it is \(here: corpus\.txt\.zst\)",
    ),
    (
        "corpus.txt.gz",
        gzip.compress(lzma.compress(_text())),
        r"once decompressed \(gzip\), its bytes are "
        r"xz-compressed again",
    ),
    ("corpus.txt.gz", _tar_gz(_text()), r"is a tar archive; unpack it and give the files inside"),
    ("corpus.txt", _zip(_text()), r"is a zip archive; unpack it"),
    ("corpus.zip", _zip(_text()), r"is a zip archive; unpack it"),
]


@pytest.mark.parametrize(("name", "data", "message"), MISNAMED)
def test_bytes_compressed_otherwise_than_the_name_says_are_refused_before_any_work(
    tmp_path, name, data, message
):
    (tmp_path / name).write_bytes(data)
    out = tmp_path / "out"
    out.mkdir()
    (out / "old.txt").write_text("previous good output")
    mark_output(out)
    params = _params("text", name, doc_split="blank_lines")
    with pytest.raises(CorpusError, match=rf"source 'mine' \(text\): {tmp_path / name}: {message}"):
        plan_units(params.active_sources(tmp_path), tmp_path, split=False)  # the command line's pre-check
    with pytest.raises(CorpusError, match=message):
        build_corpus(params, out, data_root=tmp_path)
    assert (out / "old.txt").read_text() == "previous good output"


def test_text_is_not_taken_for_an_archive_or_compressed(tmp_path):
    near_misses = [
        b"x" * 256 + b"gustar" + SENT.encode(),  # "ustar" where a tar header has it, without its NUL
        b"BZh is how it begins. " + SENT.encode(),
        b"PK is a name. " + SENT.encode(),
    ]
    for i, data in enumerate(near_misses):
        (tmp_path / f"t{i}.txt").write_bytes(data)
        check_content(tmp_path / f"t{i}.txt")
    (tmp_path / "t.txt.zst").write_bytes(zstd.compress(b"x" * 256 + b"gustar"))
    check_content(tmp_path / "t.txt.zst")
