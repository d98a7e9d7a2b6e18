"""A large text file of documents separated by blank lines (the layout of Google's
``create_pretraining_data.py`` input) is read in pieces (several work units), each starting after blank lines,
and a WikiText file in pieces starting at an article's title: the same corpus as one reader, its documents
numbered (in ids) as in the whole file. A compressed one is cut in its decompressed text."""

from __future__ import annotations

import gzip
import io
import itertools
import logging
import re
import sys
from pathlib import Path

import pytest
from corpus_builds import COMPRESS, continued, corpus_files, crashed_build, one_reader_build

from bert_core.corpus import CorpusParams, build_corpus
from bert_core.corpus import pieces as corpus_pieces
from bert_core.corpus.compressed import SUFFIX
from bert_core.corpus.pieces import article_spans, document_spans, most_pieces
from bert_core.corpus.readers import _wikitext_docs
from bert_core.corpus.units import plan_units

UNIT = 3_000


def _blank(raw: bytes) -> bool:
    """The readers' blank line: empty once decoded (invalid bytes replaced) and stripped."""
    return not raw.decode("utf-8", "replace").strip()


def _documents_before(data: bytes, start: int) -> int:
    """Documents that end before ``start``, counted line by line as the reader numbers them."""
    n, after_blank = 0, True
    for raw in io.BytesIO(data[:start]):
        blank = _blank(raw)
        n += blank and not after_blank
        after_blank = blank
    return n


def _corpus(root: Path, name: str = "books.txt") -> Path:
    """400 documents of hard-wrapped lines, separated by one to three blank lines of several kinds (spaces,
    CR, no-break space, ideographic space, a lone invalid byte that is not blank), with bytes that are not
    UTF-8 in two documents far apart, documents too long to keep, and no newline at the end."""
    separators = [b"\n", b"\n\n", b"  \n\t\n", b"\r\n", "\u00a0\n".encode(), "\u3000 \n\n".encode()]
    parts = [b"\n \n"]  # blank lines before the first document
    for i in range(400):
        lines = [f"Book {i} tells of fact {j}, which is number {i * 10 + j}.".encode() for j in range(6)]
        if i in (30, 350):
            lines[2] += b" \xff\xfe."
        if i % 61 == 11:
            lines = lines * 200  # over max_doc_chars
        body = b"\n".join(lines)
        if i % 89 == 5:
            body += b"\n\x85"  # a line of one invalid byte: not blank, part of the document
        parts.append(body + b"\n" + (separators[i % len(separators)] if i < 399 else b""))
    path = root / name
    path.write_bytes(b"".join(parts)[:-1])  # the last document ends without a newline
    return path


def _wikitext(root: Path) -> Path:
    """A WikiText file of 150 titles: paragraphs before the first, titles without paragraphs (not articles),
    sub-headings, escapes, a title line ending in CR (a paragraph, then), bytes that are not UTF-8."""
    parts = [b" \n", b" Words before any title make an article of their own , with no title .\n"]
    for i in range(150):
        parts += [b" \n", f" = Article {i} = \n".encode() if i % 41 != 9 else b" = Article CR = \r\n", b" \n"]
        if i % 17 == 3:
            continue
        for j in range(3):
            parts += [f" = = Section {j} = = \n \n".encode()]
            line = (
                f" Article {i} , paragraph {j} : the number {i} @,@ {j}00 is a long @-@ term fact .".encode()
            )
            parts += [line + (b" \xff\xfe .\n" if (i, j) == (70, 1) else b"\n"), b" \n"]
    path = root / "wiki.train.tokens"
    path.write_bytes(b"".join(parts))
    return path


def _params(**source: object) -> CorpusParams:
    spec = {"name": "books", "kind": "text", "path": "books.txt", "doc_split": "blank_lines", **source}
    return CorpusParams.model_validate(
        {
            "sources": [spec],
            "local_sources": [spec],
            "clean": {"max_doc_chars": 20_000},
            "heldout": {"fraction": 0.1, "max_documents": 20},
        }
    )


def test_a_blank_line_in_bytes_is_a_blank_line_of_the_reader():
    blank = re.compile(corpus_pieces._BLANK_LINE)
    for code in itertools.chain(range(0xD800), range(0xE000, sys.maxunicode + 1)):
        c = chr(code)
        if c != "\n":
            line = (c + " " + c + "\n").encode()
            assert bool(blank.fullmatch(line)) == _blank(line), hex(code)
    for raw in (b"\x85\n", b"\xc2\n", b"\xe3\x80\n", b"\xa0\n", b"\xe2\x80\n", b" \xff \n"):
        assert not blank.fullmatch(raw) and not _blank(raw)


@pytest.mark.parametrize("read_bytes", [5, 64, 1_000, 1 << 24])
def test_document_spans_cut_after_blank_lines_and_count_the_documents_before(
    tmp_path, monkeypatch, read_bytes
):
    data = _corpus(tmp_path).read_bytes()
    monkeypatch.setattr(corpus_pieces, "_READ_BYTES", read_bytes)
    for unit in (1, 700, UNIT, len(data) - 10, len(data)):
        pieces = document_spans(tmp_path / "books.txt", unit)
        assert pieces[0][0] == 0 and pieces[-1][1] == len(data)
        assert all(a[1] == b[0] for a, b in itertools.pairwise(pieces))
        for start, end, before in pieces:
            if start:
                line_before = data[data.rindex(b"\n", 0, start - 1) + 1 : start]
                assert data[start - 1 : start] == b"\n" and _blank(line_before)
            assert before == _documents_before(data, start)
            assert end - start >= unit or end == len(data)
        assert len(pieces) > 1 or unit >= len(data) - 10


def test_a_large_text_file_read_in_pieces_gives_the_corpus_of_one_reader(tmp_path, monkeypatch, caplog):
    path = _corpus(tmp_path)
    one_reader_build(_params(), tmp_path / "whole", tmp_path, monkeypatch)
    whole = build_corpus(_params(), tmp_path / "again", data_root=tmp_path, workers=1)  # the stats, one unit
    monkeypatch.setattr(corpus_pieces, "UNIT_BYTES", UNIT)
    caplog.set_level(logging.INFO, logger="bert_core.corpus")
    stats = build_corpus(_params(), tmp_path / "pieces", data_root=tmp_path, workers=2)
    pieces = len(document_spans(path, UNIT))
    assert pieces > 20
    assert any(f"read in {pieces} pieces (work units)" in r.getMessage() for r in caplog.records)
    assert stats.input_files == 1 and stats.input_bytes == path.stat().st_size
    assert stats.files_with_utf8_errors == 1 and stats.utf8_replacements == whole.utf8_replacements > 0
    assert stats.dropped == whole.dropped and stats.dropped["too_long"] == 7
    assert corpus_files(tmp_path / "pieces") == corpus_files(tmp_path / "whole")  # ids books.txt#<n> included


def test_a_crashed_build_keeps_the_pieces_it_finished(tmp_path, monkeypatch, caplog):
    _corpus(tmp_path)
    one_reader_build(_params(), tmp_path / "whole", tmp_path, monkeypatch)
    monkeypatch.setattr(corpus_pieces, "UNIT_BYTES", 60_000)
    pieces = len(plan_units(_params().active_sources(tmp_path), tmp_path))
    assert pieces > 4
    crashed_build(_params(), tmp_path / "out", tmp_path, monkeypatch, index=2)
    caplog.set_level(logging.INFO, logger="bert_core.corpus")
    build_corpus(_params(), tmp_path / "out", data_root=tmp_path, workers=2)
    assert continued(caplog) == [f"corpus: continuing an unfinished build: 3 of {pieces} work unit(s) kept"]
    assert corpus_files(tmp_path / "out") == corpus_files(tmp_path / "whole")


@pytest.mark.parametrize("compression", sorted(set(SUFFIX) - {"lzma"}))
def test_a_compressed_text_file_is_cut_in_its_decompressed_text(tmp_path, monkeypatch, caplog, compression):
    data = _corpus(tmp_path).read_bytes()
    name = f"books.txt{SUFFIX[compression]}"
    (tmp_path / name).write_bytes(COMPRESS[SUFFIX[compression]](data))
    params = _params(path=name)
    one_reader_build(params, tmp_path / "whole", tmp_path, monkeypatch)
    plain = document_spans(tmp_path / "books.txt", UNIT)
    pieces = document_spans(tmp_path / name, UNIT)
    # where the uncompressed file is cut (the documents before numbered alike), fewer of them for a slow one
    assert 1 < len(pieces) <= min(most_pieces(compression), len(plain))
    assert {(start, before) for start, _, before in pieces} <= {(start, before) for start, _, before in plain}
    assert pieces[-1][1] == len(data) and all(a[1] == b[0] for a, b in itertools.pairwise(pieces))
    monkeypatch.setattr(corpus_pieces, "UNIT_BYTES", UNIT)
    caplog.set_level(logging.INFO, logger="bert_core.corpus")
    stats = build_corpus(params, tmp_path / "pieces", data_root=tmp_path, workers=2)
    assert any(f"{name}: decompressing it once" in r.getMessage() for r in caplog.records)
    assert any(f"read in {len(pieces)} pieces" in r.getMessage() for r in caplog.records)
    assert stats.input_files == 1 and stats.input_bytes == len(data) and stats.utf8_replacements > 0
    assert corpus_files(tmp_path / "pieces") == corpus_files(tmp_path / "whole")  # ids books.txt.<ext>#<n>


def test_a_small_compressed_file_or_other_documents_stay_one_unit(tmp_path, monkeypatch):
    path = _corpus(tmp_path)
    gz = tmp_path / "books.txt.gz"
    gz.write_bytes(gzip.compress(path.read_bytes()))
    monkeypatch.setattr(corpus_pieces, "UNIT_BYTES", 4 * gz.stat().st_size)  # the file is a quarter of it
    assert document_spans(gz, corpus_pieces.UNIT_BYTES) == [(0, gz.stat().st_size, 0)]
    assert len(plan_units(_params(path="books.txt.gz").active_sources(tmp_path), tmp_path, workers=2)) == 1
    monkeypatch.setattr(corpus_pieces, "UNIT_BYTES", UNIT)
    assert len(plan_units(_params(doc_split="file").active_sources(tmp_path), tmp_path)) == 1
    assert len(plan_units(_params().active_sources(tmp_path), tmp_path)) > 20


@pytest.mark.parametrize("unit", [1, 2_000, 7_000])
def test_article_spans_cut_at_titles_and_count_the_articles_before(tmp_path, unit):
    data = _wikitext(tmp_path).read_bytes()
    pieces = article_spans(tmp_path / "wiki.train.tokens", unit)
    assert len(pieces) > 3 and pieces[0][0] == 0 and pieces[-1][1] == len(data)
    assert all(a[1] == b[0] for a, b in itertools.pairwise(pieces))
    for start, end, before in pieces[1:]:
        assert data[start - 1 : start] == b"\n" and data[start:].startswith(b" = Article ")
        lines = (raw.decode("utf-8", "replace") for raw in io.BytesIO(data[:start]))
        assert before == len(list(_wikitext_docs(lines, "")))  # the reader's articles before it
        assert end - start >= unit or end == len(data)


@pytest.mark.parametrize("suffix", ["", ".zst"])
def test_a_large_wikitext_file_read_in_pieces_gives_the_corpus_of_one_reader(tmp_path, monkeypatch, suffix):
    path = _wikitext(tmp_path)
    if suffix:
        path = path.with_name(path.name + suffix)
        path.write_bytes(COMPRESS[suffix](path.with_suffix("").read_bytes()))
        assert article_spans(path, 3_000) == article_spans(path.with_suffix(""), 3_000)
    params = _params(path=path.name, doc_split="wikitext")
    one_reader_build(params, tmp_path / "whole", tmp_path, monkeypatch)
    monkeypatch.setattr(corpus_pieces, "UNIT_BYTES", 3_000)
    assert len(plan_units(params.active_sources(tmp_path), tmp_path, workers=2)) > 5
    stats = build_corpus(params, tmp_path / "pieces", data_root=tmp_path, workers=2)
    size = path.with_suffix("").stat().st_size if suffix else path.stat().st_size
    assert stats.input_files == 1 and stats.input_bytes == size and stats.utf8_replacements == 2
    assert corpus_files(tmp_path / "pieces") == corpus_files(tmp_path / "whole")  # ids wiki.train.tokens#<n>
