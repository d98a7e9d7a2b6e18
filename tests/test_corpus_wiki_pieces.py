"""A large Wikipedia dump is read in pieces (several work units): the same pages and the same corpus as one
reader of the whole file, in parallel and kept piece by piece after a crash. A multistream ``.bz2`` is cut
at its streams; a dump compressed otherwise, in its decompressed text."""

from __future__ import annotations

import bz2
import gzip
import itertools
import logging
from pathlib import Path

import pytest
from corpus_builds import COMPRESS, continued, corpus_files, crashed_build, kept_of

from bert_core.corpus import CorpusError, CorpusParams, build_corpus, wiki
from bert_core.corpus import pieces as corpus_pieces
from bert_core.corpus.pieces import RENDER_MB_S, dump_spans, most_pieces, multistream
from bert_core.corpus.wiki import iter_pages
from bert_core.kept_work import partial_dir

DUMP = "wikipedia_dump/enwiki-20250201-tiny.xml.bz2"


def _xml(shared_data: Path) -> bytes:
    return bz2.decompress((shared_data / DUMP).read_bytes())


def _multistream(xml: bytes, pages_per_stream: int) -> bytes:
    """The dump as dumps.wikimedia.org writes a multistream file: the header in a stream of its own, then
    ``pages_per_stream`` pages per stream, and the closing tag last."""
    starts, at = [], xml.index(b"<page>")
    while at != -1:
        starts.append(at)
        at = xml.find(b"<page>", at + 1)
    close = xml.rindex(b"</mediawiki>")
    cuts = [0, *starts[::pages_per_stream], close, len(xml)]
    return b"".join(bz2.compress(xml[a:b]) for a, b in itertools.pairwise(cuts))


def _pages(path: Path, spans: list[tuple[int, int]] | None = None) -> list[tuple[str, str, bool, str]]:
    return [
        (p.page_id, p.title, p.redirect, p.text) for span in spans or [None] for p in iter_pages(path, span)
    ]


@pytest.fixture
def dumps(shared_data, tmp_path) -> dict[str, Path]:
    xml = _xml(shared_data)
    files = {
        "multistream": tmp_path / "enwiki-multistream.xml.bz2",
        "xml": tmp_path / "enwiki.xml",
        "gz": tmp_path / "enwiki.xml.gz",
        # cut at every 20,000 bytes of text, as pbzip2 cuts: stream starts that are not page starts
        "cut_anywhere": tmp_path / "enwiki-pbzip2.xml.bz2",
    }
    files["multistream"].write_bytes(_multistream(xml, 3))
    files["xml"].write_bytes(xml)
    files["gz"].write_bytes(gzip.compress(xml))
    cuts = range(0, len(xml), 20_000)
    assert not any(xml[at:].lstrip().startswith(b"<page>") for at in cuts)
    files["cut_anywhere"].write_bytes(b"".join(bz2.compress(xml[at : at + 20_000]) for at in cuts))
    return files


@pytest.mark.parametrize("kind", ["multistream", "xml"])
def test_the_pieces_of_a_dump_hold_its_pages_once_each_in_order(shared_data, dumps, kind):
    whole = _pages(shared_data / DUMP)
    assert len(whole) == 70
    for unit_bytes in (1_000, 30_000):
        spans = dump_spans(dumps[kind], unit_bytes)
        assert len(spans) > 3
        assert spans[0][0] == 0 and spans[-1][1] == dumps[kind].stat().st_size
        assert all(a[1] == b[0] for a, b in itertools.pairwise(spans))  # contiguous
        assert all(b - a >= unit_bytes for a, b in spans[:-1])
        assert _pages(dumps[kind], spans) == whole


def test_a_dump_compressed_otherwise_is_cut_in_its_text(shared_data, dumps, tmp_path):
    xml, whole = _xml(shared_data), _pages(shared_data / DUMP)
    (tmp_path / "enwiki.xml.zst").write_bytes(COMPRESS[".zst"](xml))
    paths = [shared_data / DUMP, dumps["gz"], dumps["cut_anywhere"], tmp_path / "enwiki.xml.zst"]
    assert multistream(dumps["multistream"]) and not any(multistream(path) for path in paths)
    for path, compression in zip(
        paths, ["bz2", "gzip", "bz2", "zstd"], strict=True
    ):  # one stream; pbzip2-like
        spans = dump_spans(path, 1_000)
        assert 3 < len(spans) <= most_pieces(compression, RENDER_MB_S), path.name
        assert spans[0][0] == 0 and spans[-1][1] == len(xml)
        assert all(a[1] == b[0] and xml[b[0] :].startswith(b"<page>") for a, b in itertools.pairwise(spans))
        assert _pages(path, spans) == whole
        assert dump_spans(path, 1_000, decompress=False) == [(0, path.stat().st_size)]
        assert dump_spans(path, path.stat().st_size * 4) == [(0, path.stat().st_size)]  # small: no pass


def test_a_damaged_piece_is_named_by_its_bytes(dumps):
    path = dumps["multistream"]
    spans = dump_spans(path, 30_000)
    a, b = spans[1]
    data = bytearray(path.read_bytes())
    data[(a + b) // 2 : (a + b) // 2 + 64] = bytes(64)
    path.write_bytes(bytes(data))
    assert len(_pages(path, spans[:1])) > 0  # the pieces before it read as they are
    with pytest.raises(wiki.WikiDumpError, match=rf"enwiki-multistream\.xml\.bz2 \(bytes {a:,}-{b:,}\): "):
        _pages(path, [spans[1]])
    truncated = path.with_name("cut.xml.bz2")
    truncated.write_bytes(bytes(data[: b - 10]))
    with pytest.raises(wiki.WikiDumpError, match="corrupt or truncated"):
        _pages(truncated, [(a, b - 10)])


def _params(path: str = "enwiki-multistream.xml.bz2") -> CorpusParams:
    return CorpusParams.model_validate(
        {
            "sources": [{"name": "hub", "kind": "hf", "path": "x"}],
            "local_sources": [{"name": "enwiki", "kind": "wikipedia_xml", "path": path}],
            "heldout": {"fraction": 0.2, "max_documents": 2},
        }
    )


def test_a_dump_read_in_pieces_gives_the_corpus_of_one_reader(dumps, tmp_path, monkeypatch, caplog):
    root = dumps["multistream"].parent
    build_corpus(_params(), tmp_path / "whole", data_root=root, workers=1)
    monkeypatch.setattr(corpus_pieces, "UNIT_BYTES", 30_000)
    caplog.set_level(logging.INFO, logger="bert_core.corpus")
    stats = build_corpus(_params(), tmp_path / "pieces", data_root=root, workers=2)
    pieces = len(dump_spans(dumps["multistream"], corpus_pieces.UNIT_BYTES))
    assert pieces > 3
    assert any(f"read in {pieces} pieces (work units)" in r.getMessage() for r in caplog.records)
    assert stats.documents == 6 and stats.input_files == 1
    assert stats.input_bytes == dumps["multistream"].stat().st_size
    assert corpus_files(tmp_path / "pieces") == corpus_files(
        tmp_path / "whole"
    )  # the manifest's statistics included


def test_a_single_stream_dump_read_in_pieces_of_its_text_gives_the_corpus_of_one_reader(
    shared_data, tmp_path, monkeypatch, caplog
):
    root = tmp_path / "root"
    root.mkdir()
    (root / "enwiki.xml.bz2").write_bytes((shared_data / DUMP).read_bytes())
    build_corpus(_params("enwiki.xml.bz2"), tmp_path / "whole", data_root=root, workers=1)
    monkeypatch.setattr(corpus_pieces, "UNIT_BYTES", 30_000)
    caplog.set_level(logging.INFO, logger="bert_core.corpus")
    crashed_build(_params("enwiki.xml.bz2"), tmp_path / "pieces", root, monkeypatch, 2, workers=2)
    stats = build_corpus(_params("enwiki.xml.bz2"), tmp_path / "pieces", data_root=root, workers=2)
    pieces = len(dump_spans(root / "enwiki.xml.bz2", corpus_pieces.UNIT_BYTES))
    assert 3 < pieces <= most_pieces("bz2", RENDER_MB_S)
    assert any(f"read in {pieces} pieces (work units)" in r.getMessage() for r in caplog.records)
    kept, total = kept_of(caplog)
    assert kept >= 3 and total == pieces
    assert stats.documents == 6 and stats.input_bytes == (shared_data / DUMP).stat().st_size
    assert corpus_files(tmp_path / "pieces") == corpus_files(tmp_path / "whole")  # the manifest included

    path = root / "enwiki.xml.gz"  # damaged: its planning stops there (one piece); a piece after it is named
    path.write_bytes(gzip.compress(_xml(shared_data)))
    a, b = dump_spans(path, 30_000)[-1]
    data = bytearray(path.read_bytes())
    data[len(data) // 2 : len(data) // 2 + 64] = bytes(64)
    path.write_bytes(bytes(data))
    assert corpus_pieces.file_pieces(path, _params().local_sources[0]) == [(0, len(data), 0)]
    with pytest.raises(wiki.WikiDumpError, match=rf"enwiki\.xml\.gz \(bytes {a:,}-{b:,} of its text\): "):
        _pages(path, [(a, b)])


def test_a_crashed_build_keeps_the_pieces_it_finished(dumps, tmp_path, monkeypatch, caplog):
    root, out = dumps["multistream"].parent, tmp_path / "out"
    build_corpus(_params(), tmp_path / "whole", data_root=root, workers=1)
    monkeypatch.setattr(corpus_pieces, "UNIT_BYTES", 30_000)
    crashed_build(_params(), out, root, monkeypatch, 2)
    caplog.set_level(logging.INFO, logger="bert_core.corpus.build")
    build_corpus(_params(), out, data_root=root, workers=2)
    pieces = len(dump_spans(dumps["multistream"], corpus_pieces.UNIT_BYTES))
    assert continued(caplog) == [f"corpus: continuing an unfinished build: 3 of {pieces} work unit(s) kept"]
    assert corpus_files(out) == corpus_files(tmp_path / "whole")
    assert not partial_dir(out).exists()

    # other pieces (here: another piece size) are read again, not taken for the ranges they no longer are
    crashed_build(_params(), tmp_path / "again", root, monkeypatch, 2)
    monkeypatch.setattr(corpus_pieces, "UNIT_BYTES", 50_000)
    caplog.clear()
    build_corpus(_params(), tmp_path / "again", data_root=root, workers=1)
    assert not continued(caplog)
    assert corpus_files(tmp_path / "again") == corpus_files(tmp_path / "whole")


def test_a_corrupt_piece_fails_the_build_naming_it(dumps, tmp_path, monkeypatch):
    path = dumps["multistream"]
    monkeypatch.setattr(corpus_pieces, "UNIT_BYTES", 30_000)
    a, b = dump_spans(path, corpus_pieces.UNIT_BYTES)[2]
    data = bytearray(path.read_bytes())
    data[(a + b) // 2 : (a + b) // 2 + 64] = bytes(64)
    path.write_bytes(bytes(data))
    with pytest.raises(CorpusError, match=rf"\(bytes {a:,}-{b:,}\)"):
        build_corpus(_params(), tmp_path / "out", data_root=path.parent, workers=2)
    assert not (tmp_path / "out").exists()
