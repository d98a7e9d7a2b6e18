"""Where a large input file can be cut into pieces that are read on their own (one work unit each).

A piece is a byte range of the file and starts where a record starts, so that a reader given only the range
reads the records it holds and no other: after a newline in a JSONL file (:func:`line_spans`, which also
counts the lines before each piece, so that line numbers stay those of the file); at a row group in a Parquet
file (:func:`row_group_spans`, the row numbers from its footer); at a ``<page>`` tag in a
Wikipedia ``.xml`` dump, and at a bz2 stream whose text starts with one in a multistream ``.xml.bz2``
(:func:`dump_spans`). A compressed file with no such starts (``.gz``, a single-stream ``.bz2``) is one piece.
"""

from __future__ import annotations

import bz2
import re
from pathlib import Path
from typing import Any, BinaryIO

import fsspec

#: The file bytes of one piece of a large file: 64 MB of JSONL is about 10 CPU-seconds of cleaning and
#: segmenting, 64 MB of a multistream ``.bz2`` Wikipedia dump (about 300 MB of XML) a few CPU-minutes of
#: rendering; what a crash can cost a worker, and what one worker takes of a file.
UNIT_BYTES = 64 << 20


def file_pieces(path: Path, kind: str) -> list[tuple[int, int, int]]:
    """The pieces a file of a source of ``kind`` is read in: ``(start, end, the line or row number it starts
    at)``. A file that cannot be read here (a damaged footer, no permission) is one piece, whose reader
    names the fault as it would."""
    try:
        if kind == "wikipedia_xml":
            return [(a, b, 1) for a, b in dump_spans(path, UNIT_BYTES)]
        if kind == "jsonl" and fsspec.utils.infer_compression(path.name) is None:
            return line_spans(path, UNIT_BYTES)
        if kind == "parquet":
            return row_group_spans(path, UNIT_BYTES)
    except (OSError, ValueError):  # pyarrow's errors are of these kinds too
        pass
    return [(0, path.stat().st_size, 1)]


def line_spans(path: Path, unit_bytes: int) -> list[tuple[int, int, int]]:
    """A text file's pieces of at least ``unit_bytes`` (the last may be shorter), cut after a newline:
    ``(start, end, the line number it starts at)``, in one pass over the file counting its lines."""
    size = path.stat().st_size
    pieces, lines, at, cut = [(0, size, 1)], 0, 0, unit_bytes
    if size <= unit_bytes:
        return pieces
    with path.open("rb") as fh:
        while chunk := fh.read(1 << 24):
            while cut < at + len(chunk) and (i := chunk.find(b"\n", max(0, cut - at))) != -1:
                start = at + i + 1
                if start >= size:
                    break
                pieces[-1] = (pieces[-1][0], start, pieces[-1][2])
                pieces.append((start, size, lines + chunk.count(b"\n", 0, i + 1) + 1))
                cut = start + unit_bytes
            lines += chunk.count(b"\n")
            at += len(chunk)
    return pieces


def row_group_start(row_group: Any) -> int:
    """The file offset a Parquet row group's bytes start at (its first column chunk's first page)."""
    columns = (row_group.column(j) for j in range(row_group.num_columns))
    return min(c.dictionary_page_offset if c.has_dictionary_page else c.data_page_offset for c in columns)


def row_groups_in(meta: Any, span: tuple[int, int]) -> list[int]:
    """The row groups of a piece of a Parquet file (``meta``: its footer): those that start in ``span``."""
    return [i for i in range(meta.num_row_groups) if span[0] <= row_group_start(meta.row_group(i)) < span[1]]


def row_group_spans(path: Path, unit_bytes: int) -> list[tuple[int, int, int]]:
    """A Parquet file's pieces of at least ``unit_bytes``, cut where a row group starts: ``(start, end, the
    row number it starts at)``, from the file's footer alone (its row groups: :func:`row_groups_in`)."""
    import pyarrow.parquet as pq

    size = path.stat().st_size
    pieces = [(0, size, 1)]
    if size <= unit_bytes:
        return pieces
    meta = pq.ParquetFile(path).metadata
    groups = [meta.row_group(i) for i in range(meta.num_row_groups)]
    starts = [row_group_start(group) for group in groups]
    if starts != sorted(set(starts)):  # not written one after the other: the pieces would reorder the rows
        return pieces
    rows = 0
    for i, (group, start) in enumerate(zip(groups, starts, strict=True)):
        if i > 0 and start - pieces[-1][0] >= unit_bytes:
            pieces[-1] = (pieces[-1][0], start, pieces[-1][2])
            pieces.append((start, size, rows + 1))
        rows += group.num_rows
    return pieces


#: How far past each ``unit_bytes`` step of :func:`dump_spans` a piece's start is looked for.
_SEARCH_BYTES = 16 << 20
_CHUNK = 1 << 20
_BZ2_STREAM = re.compile(rb"BZh[1-9]1AY&SY")  # a bz2 stream's header and its first block's magic
_PAGE = b"<page>"
_PAGE_TAG = re.compile(re.escape(_PAGE))


def dump_spans(path: str | Path, unit_bytes: int) -> list[tuple[int, int]]:
    """The byte ranges a dump file is read in, in order and covering the whole file: one range for a small
    file, a single-stream ``.bz2`` or a ``.gz``; else ranges of at least ``unit_bytes`` (the last may be
    shorter), each starting at a ``<page>`` tag (``.xml``) or at a bz2 stream whose text starts with one."""
    path = Path(path)
    size = path.stat().st_size
    name = path.name.lower()
    if size <= unit_bytes or not name.endswith((".xml", ".bz2")):
        return [(0, size)]
    starts = [0]
    with path.open("rb") as fh:
        # None: no start within _SEARCH_BYTES, so not a multistream file (which has one every ~100 KB)
        while starts[-1] + unit_bytes < size and (
            found := _piece_start(fh, starts[-1] + unit_bytes, name.endswith(".bz2"))
        ):
            starts.append(found)
    return list(zip(starts, [*starts[1:], size], strict=True))


def _piece_start(fh: BinaryIO, target: int, compressed: bool) -> int | None:
    """The first offset at or after ``target`` (searching ``_SEARCH_BYTES``) where a piece can start."""
    pattern = _BZ2_STREAM if compressed else _PAGE_TAG
    for searched in range(0, _SEARCH_BYTES, _CHUNK):
        fh.seek(target + searched)
        chunk = fh.read(_CHUNK + 16)  # overlapping the next, so that no start is cut in two between them
        for match in pattern.finditer(chunk):
            if match.start() >= _CHUNK:
                break
            at = target + searched + match.start()
            if not compressed or _stream_starts_a_page(fh, at):
                return at
        if len(chunk) <= _CHUNK:
            return None
    return None


def _stream_starts_a_page(fh: BinaryIO, at: int) -> bool:
    """Whether a bz2 stream starts at ``at`` and its text with ``<page>`` (not a chance match of the magic
    inside compressed data, nor a stream of a tool that cuts at any byte, as ``pbzip2`` does)."""
    fh.seek(at)
    decompressor, head = bz2.BZ2Decompressor(), b""
    try:
        while len(head) < 64 and not decompressor.eof and (data := fh.read(1 << 16)):
            head += decompressor.decompress(data, max_length=64 - len(head))
    except OSError:
        return False
    return head.lstrip().startswith(_PAGE)
