"""A large JSONL file is read in pieces (several work units) cut after a newline (a compressed one in its
decompressed text), a large Parquet file cut at row groups: the same corpus as one reader, its line and row
numbers (in ids and bad-record messages) those of the file."""

from __future__ import annotations

import itertools
import json
import logging
import os
from pathlib import Path
from unittest import mock

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from corpus_builds import COMPRESS, continued, corpus_files, crashed_build, kept_of, one_reader_build

from bert_core.corpus import CorpusError, CorpusParams, build_corpus
from bert_core.corpus import pieces as corpus_pieces
from bert_core.corpus.pieces import line_spans
from bert_core.corpus.units import plan_units
from bert_core.kept_work import partial_dir

UNIT = 20_000


def _corpus(root: Path) -> Path:
    """One JSONL file of 400 lines: documents with and without ids, bad lines, blank lines, bytes that are
    not UTF-8 in two places far apart."""
    lines = []
    for i in range(400):
        text = " ".join(f"Record {i} states fact {j}, which is number {i * 10 + j}." for j in range(9))
        if i % 97 == 13:
            lines.append(b'{"text": "a line cut short')
        elif i % 53 == 7:
            lines.append(b"")
        elif i in (20, 370):
            lines.append(json.dumps({"id": f"r{i}", "text": text}).encode()[:-2] + b' \xff\xfe"}')
        else:
            record = {"text": text} if i % 5 == 0 else {"id": f"r{i}", "text": text}  # no id: the line number
            lines.append(json.dumps(record).encode())
    path = root / "mine.jsonl"
    path.write_bytes(b"\n".join(lines) + b"\n")
    return path


def _params(path: str = "mine.jsonl") -> CorpusParams:
    return CorpusParams.model_validate(
        {
            "sources": [{"name": "hub", "kind": "hf", "path": "x"}],
            "local_sources": [{"name": "mine", "kind": "jsonl", "path": path, "id_field": "id"}],
            "heldout": {"fraction": 0.1, "max_documents": 20},
        }
    )


def test_line_spans_cut_after_a_newline_and_count_the_lines_before(tmp_path):
    data = _corpus(tmp_path).read_bytes()
    for unit in (1, 5_000, UNIT, len(data) - 10, len(data)):
        pieces = line_spans(tmp_path / "mine.jsonl", unit)
        assert pieces[0][0] == 0 and pieces[-1][1] == len(data)
        assert all(a[1] == b[0] for a, b in itertools.pairwise(pieces))
        for start, end, before in pieces:
            assert start == 0 or data[start - 1 : start] == b"\n"
            assert before == data[:start].count(b"\n")
            assert end - start >= unit or end == len(data)


def test_a_large_jsonl_file_read_in_pieces_gives_the_corpus_of_one_reader(tmp_path, monkeypatch, caplog):
    _corpus(tmp_path)
    one_reader_build(_params(), tmp_path / "whole", tmp_path, monkeypatch)
    monkeypatch.setattr(corpus_pieces, "UNIT_BYTES", UNIT)
    caplog.set_level(logging.INFO, logger="bert_core.corpus")
    stats = build_corpus(_params(), tmp_path / "pieces", data_root=tmp_path, workers=2)
    pieces = len(line_spans(tmp_path / "mine.jsonl", UNIT))
    assert pieces > 5
    assert any(f"read in {pieces} pieces (work units)" in r.getMessage() for r in caplog.records)
    assert stats.input_files == 1 and stats.files_with_utf8_errors == 1 and stats.utf8_replacements == 4
    assert f"{tmp_path / 'mine.jsonl'}:{97 * 3 + 13 + 1}: not valid JSON" in " ".join(
        stats.bad_record_examples
    )
    assert corpus_files(tmp_path / "pieces") == corpus_files(
        tmp_path / "whole"
    )  # ids, examples, statistics included


def test_a_crashed_build_keeps_the_pieces_it_finished(tmp_path, monkeypatch, caplog):
    _corpus(tmp_path)
    one_reader_build(_params(), tmp_path / "whole", tmp_path, monkeypatch)
    monkeypatch.setattr(corpus_pieces, "UNIT_BYTES", UNIT)
    out = tmp_path / "out"
    crashed_build(_params(), out, tmp_path, monkeypatch, 3)
    caplog.set_level(logging.INFO, logger="bert_core.corpus.build")
    build_corpus(_params(), out, data_root=tmp_path, workers=2)
    pieces = len(line_spans(tmp_path / "mine.jsonl", UNIT))
    assert continued(caplog) == [f"corpus: continuing an unfinished build: 4 of {pieces} work unit(s) kept"]
    assert corpus_files(out) == corpus_files(tmp_path / "whole")
    assert not partial_dir(out).exists()


def test_a_compressed_jsonl_file_is_read_in_pieces_of_its_text_and_a_crash_keeps_them(
    tmp_path, monkeypatch, caplog
):
    data = _corpus(tmp_path).read_bytes()
    packed = tmp_path / "packed"
    packed.mkdir()
    (packed / "mine.jsonl.gz").write_bytes(COMPRESS[".gz"](data))
    params = _params("mine.jsonl.gz")
    one_reader_build(params, packed / "whole", packed, monkeypatch)
    monkeypatch.setattr(corpus_pieces, "UNIT_BYTES", 5_000)
    pieces = line_spans(packed / "mine.jsonl.gz", 5_000)
    assert (
        1 < len(pieces) <= corpus_pieces.most_pieces("gzip") < len(line_spans(tmp_path / "mine.jsonl", 5_000))
    )
    assert [
        (s, e, b) for s, e, b in pieces[1:] if b != data[:s].count(b"\n") or data[s - 1 : s] != b"\n"
    ] == []
    out = packed / "out"
    crashed_build(params, out, packed, monkeypatch, 3, workers=2)  # on one worker, the file is one unit
    caplog.set_level(logging.INFO, logger="bert_core.corpus.build")
    with monkeypatch.context() as patch:  # the plan kept with the units: no second decompressing pass
        patch.setattr(corpus_pieces, "_text_spans", mock.Mock(wraps=corpus_pieces._text_spans))
        stats = build_corpus(params, out, data_root=packed, workers=2)
        assert corpus_pieces._text_spans.call_count == 0
    assert "corpus: 1 large file(s) cut as the unfinished build planned them" in caplog.messages
    kept, total = kept_of(caplog)
    assert kept >= 4 and total == len(pieces)
    assert stats.input_bytes == len(
        data
    ) and f"{packed / 'mine.jsonl.gz'}:{97 * 3 + 13 + 1}: not valid JSON" in (
        " ".join(stats.bad_record_examples)
    )
    assert corpus_files(out) == corpus_files(packed / "whole")  # ids by line number included

    crashed_build(
        params, packed / "again", packed, monkeypatch, 3, workers=2
    )  # the file changed: planned again
    os.utime(packed / "mine.jsonl.gz", ns=(1, 1))
    caplog.clear()
    with monkeypatch.context() as patch:
        patch.setattr(corpus_pieces, "_text_spans", mock.Mock(wraps=corpus_pieces._text_spans))
        build_corpus(params, packed / "again", data_root=packed, workers=2)
        assert corpus_pieces._text_spans.call_count == 1
    assert not any("as the unfinished build planned" in m for m in caplog.messages)
    assert corpus_files(packed / "again") == corpus_files(packed / "whole")


def test_a_compressed_file_is_cut_only_when_it_holds_more_than_a_workers_share(tmp_path, monkeypatch):
    raw = _corpus(tmp_path).read_bytes()
    data = COMPRESS[".gz"](raw)
    many, one = tmp_path / "many", tmp_path / "one"
    for k in range(16):  # a sixteenth each: the files keep 16 workers busy, none is decompressed
        (many / f"part-{k:02}.jsonl.gz").parent.mkdir(exist_ok=True)
        (many / f"part-{k:02}.jsonl.gz").write_bytes(data)
    for k in range(30):  # one large file among small ones: cut
        (one / f"small-{k:02}.jsonl.gz").parent.mkdir(exist_ok=True)
        (one / f"small-{k:02}.jsonl.gz").write_bytes(COMPRESS[".gz"](b'{"text": "A small one."}\n'))
    (one / "large.jsonl.gz").write_bytes(data)
    monkeypatch.setattr(corpus_pieces, "UNIT_BYTES", 5_000)
    monkeypatch.setattr(corpus_pieces, "_text_spans", mock.Mock(wraps=corpus_pieces._text_spans))

    def cut(folder: Path, workers: int) -> set[str]:
        sources = _params(folder.name).active_sources(tmp_path)
        inputs = [i for u in plan_units(sources, tmp_path, workers=workers) for i in u.inputs]
        return {Path(i.path).name for i in inputs if i.span is not None}

    assert cut(many, 16) == set() and cut(one, 16) == {"large.jsonl.gz"}
    assert corpus_pieces._text_spans.call_count == 1  # only the large file was decompressed to plan it
    assert cut(one, 1) == set()  # one worker: nothing to gain
    (many / "part-00.jsonl.gz").write_bytes(COMPRESS[".gz"](raw * 2))  # more than its share: cut
    assert cut(many, 16) == {"part-00.jsonl.gz"}


def test_a_damaged_compressed_file_is_one_piece_its_reader_names(tmp_path, monkeypatch):
    data = COMPRESS[".gz"](_corpus(tmp_path).read_bytes())
    (tmp_path / "mine.jsonl.gz").write_bytes(data[: len(data) // 2])
    path = tmp_path / "mine.jsonl.gz"
    assert corpus_pieces.file_pieces(path, _params(path.name).local_sources[0]) == [(0, len(data) // 2, 0)]
    monkeypatch.setattr(corpus_pieces, "UNIT_BYTES", 5_000)
    with pytest.raises(CorpusError, match=f"{path}: cannot read .*corrupt or truncated"):
        build_corpus(_params(path.name), tmp_path / "out", data_root=tmp_path, workers=2)
    assert not (tmp_path / "out").exists()


def _parquet(root: Path) -> Path:
    """One Parquet file of 20 row groups of 20 rows: documents with and without ids, a row whose text is not a
    string."""
    rows = [
        {
            "id": None if i % 7 == 0 else f"p{i}",  # no id: the file's row number
            "text": None
            if i == 233
            else " ".join(f"Row {i} gives fact {j}, the number {i * 10 + j}." for j in range(9)),
        }
        for i in range(400)
    ]
    path = root / "mine.parquet"
    pq.write_table(pa.Table.from_pylist(rows), path, row_group_size=20)
    return path


def test_a_large_parquet_file_read_in_pieces_gives_the_corpus_of_one_reader(tmp_path, monkeypatch, caplog):
    path = _parquet(tmp_path)
    spec = {"name": "mine", "kind": "parquet", "path": "mine.parquet", "id_field": "id"}
    params = CorpusParams.model_validate(
        {"sources": [spec], "local_sources": [spec], "heldout": {"fraction": 0.1}}
    )
    one_reader_build(params, tmp_path / "whole", tmp_path, monkeypatch)
    monkeypatch.setattr(corpus_pieces, "UNIT_BYTES", 5_000)
    pieces = corpus_pieces.row_group_spans(path, 5_000)
    assert len(pieces) > 5
    assert all(a[1] == b[0] for a, b in itertools.pairwise(pieces)) and pieces[-1][1] == path.stat().st_size
    meta = pq.ParquetFile(path).metadata
    starts = [corpus_pieces.row_group_start(meta.row_group(i)) for i in range(meta.num_row_groups)]
    for start, end, rows_before in pieces:  # each starts at a row group, numbered by the rows before it
        assert start == 0 or start in starts
        assert rows_before == 20 * next(i for i, at in enumerate(starts) if start <= at < end)
    stats = build_corpus(params, tmp_path / "pieces", data_root=tmp_path, workers=2)
    assert stats.input_files == 1 and stats.input_bytes == path.stat().st_size
    assert f"{path}: row 234: field 'text' is not a string" in " ".join(stats.bad_record_examples)
    assert corpus_files(tmp_path / "pieces") == corpus_files(tmp_path / "whole")  # ids by row number included
    damaged = tmp_path / "damaged.parquet"
    damaged.write_bytes(path.read_bytes()[:-100])  # no footer: one piece, and its reader names the fault
    assert corpus_pieces.file_pieces(damaged, params.local_sources[0]) == [(0, damaged.stat().st_size, 0)]


def test_a_parquet_file_with_row_groups_out_of_order_is_one_piece(tmp_path, monkeypatch):
    path = _parquet(tmp_path)
    assert len(corpus_pieces.row_group_spans(path, 5_000)) > 5
    real = corpus_pieces.row_group_start
    monkeypatch.setattr(
        corpus_pieces, "row_group_start", lambda group: 10**9 - real(group)
    )  # stored backwards
    assert corpus_pieces.row_group_spans(path, 5_000) == [(0, path.stat().st_size, 0)]
