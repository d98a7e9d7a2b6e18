"""Where a large input file can be cut into pieces that are read on their own (one work unit each).

A piece is a byte range of the file and starts where a record starts, so that a reader given only the range
reads the records it holds and no other, and each piece carries the number of records before it, so that
the ids and messages that number records (lines, rows, documents) stay those of the whole file: after a
newline in a JSONL file (:func:`line_spans`, which counts the lines); after a blank line in a text file of
documents separated by blank lines (:func:`document_spans`, which counts the documents); at an article's
title line in a WikiText file (:func:`article_spans`, which counts the articles); at a row group in a
Parquet file (:func:`row_group_spans`, the row numbers from its footer); at a ``<page>`` tag in a Wikipedia
``.xml`` dump, and at a bz2 stream whose text starts with one in a multistream ``.xml.bz2``
(:func:`dump_spans`).

A compressed JSONL or text file (gzip, zstd, xz, bz2), and a compressed dump in another form than multistream
(a single-stream ``.bz2``, ``.gz``), is cut in its decompressed bytes: its pieces are ranges
of the decompressed text, found in one decompressing pass at planning, and a piece's reader decompresses the
file from its start and drops what comes before its piece (a compressed stream cannot be entered in the
middle). So ``n`` pieces decompress the file about ``n / 2`` times over in all, and a file is cut into at
most :func:`most_pieces` of them, by how fast its compression decompresses.
"""

from __future__ import annotations

import bz2
import logging
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any, BinaryIO

import fsspec

from bert_core.corpus.clean import wikitext_line
from bert_core.corpus.compressed import BZ2_STREAM, ERRORS
from bert_core.corpus.params import SourceSpec

log = logging.getLogger(__name__)

#: The file bytes of one piece of a large file (of a compressed JSONL or text file, of its decompressed
#: text): 64 MB of JSONL is about 10 CPU-seconds of cleaning and segmenting, 64 MB of a multistream ``.bz2``
#: Wikipedia dump (about 300 MB of XML) a few CPU-minutes of rendering; what a crash can cost a worker, and
#: what one worker takes of a file.
UNIT_BYTES = 64 << 20
#: What the passes that count lines or documents read at a time.
_READ_BYTES = 1 << 24
#: Decompressed MB of text a CPU-second, by compression (Python's own decompressors, as
#: ``bench_corpus_split`` measures them), and what the stage cleans and segments a CPU-second.
DECOMPRESS_MB_S = {"gzip": 300, "zstd": 1000, "xz": 90, "lzma": 90, "bz2": 40}
CLEAN_MB_S = 8
#: What the stage renders of a Wikipedia dump's XML to passages a CPU-second (``bench_corpus_split``'s dump).
RENDER_MB_S = 1.5


def most_pieces(compression: str, clean_mb_s: float = CLEAN_MB_S) -> int:
    """The most pieces a file of ``compression`` is cut into. ``n`` pieces decompress it ``1 + (n - 1) / 2``
    extra times in all (the planning pass, and each reader from the file's start), which ``n = D / 2C - 1``
    holds to about a quarter of the cleaning's CPU time (``D``: :data:`DECOMPRESS_MB_S`; ``C``:
    ``clean_mb_s``, :data:`CLEAN_MB_S` or a dump's :data:`RENDER_MB_S`); at least 2 (bzip2 text: two
    readers, at about a third more CPU)."""
    return max(2, int(DECOMPRESS_MB_S[compression] / clean_mb_s / 2) - 1)


def file_pieces(path: Path, source: SourceSpec, *, decompress: bool = True) -> list[tuple[int, int, int]]:
    """The pieces a file of ``source`` is read in: ``(start, end, the lines, rows or documents before it)``;
    with ``decompress`` false, a file that would be cut in its decompressed text is one piece, without the
    planning pass. A file that cannot be read here (a damaged footer, no permission) is one piece, whose
    reader names the fault as it would."""
    spans = {"jsonl": line_spans, "parquet": row_group_spans}.get(source.kind)
    if source.kind == "text":
        spans = {"blank_lines": document_spans, "wikitext": article_spans}.get(source.effective_doc_split)
    if not decompress and fsspec.utils.infer_compression(path.name) is not None:
        spans = None
    try:
        if source.kind == "wikipedia_xml":
            return [(a, b, 0) for a, b in dump_spans(path, UNIT_BYTES, decompress=decompress)]
        if spans is not None:
            return spans(path, UNIT_BYTES)
    except (OSError, ValueError, *ERRORS):  # pyarrow's errors are of these kinds too
        pass
    return [(0, path.stat().st_size, 0)]


def _spans(starts: list[tuple[int, int]], size: int) -> list[tuple[int, int, int]]:
    """Pieces ``(start, end, records before it)`` from their ``(start, records before it)``, in order: each
    ends where the next starts, the last at ``size`` (a start there begins no piece)."""
    starts = starts[:1] + [s for s in starts[1:] if s[0] < size]
    ends = [start for start, _ in starts[1:]] + [size]
    return [(start, end, before) for (start, before), end in zip(starts, ends, strict=True)]


def _text_spans(
    path: Path,
    unit_bytes: int,
    find: Callable[[BinaryIO, int], tuple[list[tuple[int, int]], int]],
    clean_mb_s: float = CLEAN_MB_S,
) -> list[tuple[int, int, int]]:
    """The pieces ``find`` finds in ``path``'s text (``(start, records before it)`` of at least ``unit_bytes``
    apart, and the text's size, from a stream): in the file's bytes, or in its decompressed bytes if its
    name gives a compression, then no more than :func:`most_pieces` of about equal size. A file of at most
    ``unit_bytes`` (compressed: a quarter of it) is one piece, without a pass."""
    size = path.stat().st_size
    compression = fsspec.utils.infer_compression(path.name)
    if size <= (unit_bytes if compression is None else unit_bytes // 4):
        return _spans([(0, 0)], size)
    if compression is None:
        with path.open("rb") as fh:
            return _spans(*find(fh, unit_bytes))
    log.info("%s: decompressing it once (%s bytes) to find where its pieces start", path, f"{size:,}")
    with fsspec.open(path, "rb", compression=compression) as fh:
        starts, size = find(fh, unit_bytes)
    step = size / most_pieces(compression, clean_mb_s)  # piece k: the first start after k steps
    kept = starts[:1]
    for start in starts[1:]:
        if start[0] >= len(kept) * step:
            kept.append(start)
    return _spans(kept, size)


def line_spans(path: Path, unit_bytes: int) -> list[tuple[int, int, int]]:
    """A text file's pieces of at least ``unit_bytes`` (the last may be shorter), cut after a newline:
    ``(start, end, the lines before it)``, in one pass over the file counting its lines."""
    return _text_spans(path, unit_bytes, _line_starts)


def _line_starts(fh: BinaryIO, unit_bytes: int) -> tuple[list[tuple[int, int]], int]:
    starts, lines, at, cut = [(0, 0)], 0, 0, unit_bytes
    while chunk := fh.read(_READ_BYTES):
        while cut < at + len(chunk) and (i := chunk.find(b"\n", max(0, cut - at))) != -1:
            starts.append((at + i + 1, lines + chunk.count(b"\n", 0, i + 1)))
            cut = at + i + 1 + unit_bytes
        lines += chunk.count(b"\n")
        at += len(chunk)
    return starts, at


#: A line that ``str.strip()`` empties once decoded (the readers' blank line), as UTF-8 bytes: ASCII
#: whitespace, and the encodings of the other characters for which ``str.isspace()`` holds.
_BLANK_LINE = (
    rb"(?:[\t\x0b\x0c\r\x1c-\x1f ]|\xc2[\x85\xa0]|\xe1\x9a\x80|\xe2\x80[\x80-\x8a\xa8\xa9\xaf]|\xe2\x81\x9f"
    rb"|\xe3\x80\x80)*\n"
)
#: Blank lines at the start of a text, and blank lines after the newline that ends a line that is not
#: blank (or is the text's first): the literal newline first makes the search about ten times faster.
_BLANK_START = re.compile(rb"(?:" + _BLANK_LINE + rb")+")
_BLANK_RUN = re.compile(rb"\n(?:" + _BLANK_LINE + rb")+")


def document_spans(path: Path, unit_bytes: int) -> list[tuple[int, int, int]]:
    """The pieces of a text file of documents separated by blank lines, of at least ``unit_bytes`` (the last
    may be shorter), each starting at the line after blank lines: ``(start, end, the documents before it)``,
    in one pass over the file counting the documents (one ends where blank lines follow a line that is not
    blank)."""
    return _text_spans(path, unit_bytes, _document_starts)


def _document_starts(fh: BinaryIO, unit_bytes: int) -> tuple[list[tuple[int, int]], int]:
    starts, docs, at, cut = [(0, 0)], 0, 0, unit_bytes
    rest, after_blank = b"", True  # the file's start counts as after a blank line: no document ends there
    while True:
        data = fh.read(_READ_BYTES)
        text = rest + data
        whole = text.rfind(b"\n") + 1 if data else len(text)  # whole lines only, but at the end
        chunk, rest = text[:whole], text[whole:]
        head = _BLANK_START.match(chunk)
        runs = [head.end()] if head else []
        runs += [run.end() for run in _BLANK_RUN.finditer(chunk, runs[0] if runs else 0)]
        for end in runs[1:] if head and after_blank else runs:  # blank lines going on end no document
            docs += 1
            if cut <= at + end:
                starts.append((at + end, docs))
                cut = at + end + unit_bytes
        if chunk:
            after_blank = bool(runs) and runs[-1] == len(chunk)
        at += len(chunk)
        if not data:
            return starts, at


def article_spans(path: Path, unit_bytes: int) -> list[tuple[int, int, int]]:
    """The pieces of a WikiText file, of at least ``unit_bytes`` (the last may be shorter), each starting at
    an article's ``" = Title = "`` line: ``(start, end, the articles before it)``, in one pass over the file
    reading each line as the reader does (an article is counted when it has a paragraph)."""
    return _text_spans(path, unit_bytes, _article_starts)


def _article_starts(fh: BinaryIO, unit_bytes: int) -> tuple[list[tuple[int, int]], int]:
    starts, articles, at, cut, paragraphs = [(0, 0)], 0, 0, unit_bytes, False
    for raw in fh:
        kind, _ = wikitext_line(raw.decode("utf-8", "replace"))
        if kind == "title":
            articles, paragraphs = articles + paragraphs, False
            if at >= cut:
                starts.append((at, articles))
                cut = at + unit_bytes
        paragraphs = paragraphs or kind == "paragraph"
        at += len(raw)
    return starts, at


def row_group_start(row_group: Any) -> int:
    """The file offset a Parquet row group's bytes start at (its first column chunk's first page)."""
    columns = (row_group.column(j) for j in range(row_group.num_columns))
    return min(c.dictionary_page_offset if c.has_dictionary_page else c.data_page_offset for c in columns)


def row_groups_in(meta: Any, span: tuple[int, int]) -> list[int]:
    """The row groups of a piece of a Parquet file (``meta``: its footer): those that start in ``span``."""
    return [i for i in range(meta.num_row_groups) if span[0] <= row_group_start(meta.row_group(i)) < span[1]]


def row_group_spans(path: Path, unit_bytes: int) -> list[tuple[int, int, int]]:
    """A Parquet file's pieces of at least ``unit_bytes``, cut where a row group starts: ``(start, end, the
    rows before it)``, from the file's footer alone (its row groups: :func:`row_groups_in`)."""
    import pyarrow.parquet as pq

    size = path.stat().st_size
    starts = [(0, 0)]
    if size <= unit_bytes:
        return _spans(starts, size)
    meta = pq.ParquetFile(path).metadata
    groups = [meta.row_group(i) for i in range(meta.num_row_groups)]
    offsets = [row_group_start(group) for group in groups]
    if offsets != sorted(set(offsets)):  # not written one after the other: the pieces would reorder the rows
        return _spans(starts, size)
    rows = 0
    for i, (group, offset) in enumerate(zip(groups, offsets, strict=True)):
        if i > 0 and offset - starts[-1][0] >= unit_bytes:
            starts.append((offset, rows))
        rows += group.num_rows
    return _spans(starts, size)


#: How far past each ``unit_bytes`` step of :func:`dump_spans` a piece's start is looked for.
_SEARCH_BYTES = 16 << 20
_CHUNK = 1 << 20
_BZ2_STREAM = re.compile(BZ2_STREAM)
_PAGE = b"<page>"
_PAGE_TAG = re.compile(re.escape(_PAGE))


def dump_spans(path: str | Path, unit_bytes: int, *, decompress: bool = True) -> list[tuple[int, int]]:
    """The ranges a dump file is read in, in order and covering the whole file: one range for a small file;
    else ranges of at least ``unit_bytes`` (the last may be shorter), each starting at a ``<page>`` tag: of
    the file's bytes for an ``.xml`` file, at a bz2 stream whose text starts with a page for a
    :func:`multistream` ``.bz2``; of the decompressed text for a dump compressed otherwise (:func:`in_text`,
    at most :func:`most_pieces`; with ``decompress`` false, one range)."""
    path = Path(path)
    if in_text(path):
        if not decompress:
            return [(0, path.stat().st_size)]
        return [(a, b) for a, b, _ in _text_spans(path, unit_bytes, _page_starts, RENDER_MB_S)]
    size = path.stat().st_size
    name = path.name.lower()
    starts = [(0, 0)]
    if size > unit_bytes and name.endswith((".xml", ".bz2")):
        with path.open("rb") as fh:
            # None: no start within _SEARCH_BYTES, so not a multistream file (which has one every ~100 KB)
            while starts[-1][0] + unit_bytes < size and (
                found := _piece_start(fh, starts[-1][0] + unit_bytes, name.endswith(".bz2"))
            ):
                starts.append((found, 0))
    return [(start, end) for start, end, _ in _spans(starts, size)]


def multistream(path: Path) -> bool:
    """Whether a ``.bz2`` dump is in the multistream form dumps.wikimedia.org writes: its header in a bz2
    stream of its own, which ends before the first ``<page>``. Its pieces are runs of its streams.

    Raises:
        OSError: the first stream is corrupt (what its reader names).
    """
    if not path.name.lower().endswith(".bz2"):
        return False
    decompressor, text = bz2.BZ2Decompressor(), b""
    with path.open("rb") as fh:
        while not decompressor.eof and _PAGE not in text and len(text) < _SEARCH_BYTES:
            if not (data := fh.read(1 << 16)):
                break
            text += decompressor.decompress(data)
    return decompressor.eof and _PAGE not in text


def in_text(path: Path) -> bool:
    """Whether the pieces of a dump file are ranges of its decompressed text (a compressed dump that is not
    :func:`multistream`), not of its bytes."""
    return fsspec.utils.infer_compression(path.name) is not None and not multistream(path)


def _page_starts(fh: BinaryIO, unit_bytes: int) -> tuple[list[tuple[int, int]], int]:
    """``<page>`` tags at least ``unit_bytes`` apart in a dump's text, and the text's size."""
    starts, at, cut, tail = [(0, 0)], 0, unit_bytes, b""
    while chunk := fh.read(_READ_BYTES):
        text, base = tail + chunk, at - len(tail)  # a tag cut in two between reads is found whole
        i = text.find(_PAGE, max(0, cut - base))
        while i != -1:
            starts.append((base + i, 0))
            cut = base + i + unit_bytes
            i = text.find(_PAGE, max(i + 1, cut - base))
        at += len(chunk)
        tail = text[-(len(_PAGE) - 1) :]
    return starts, at


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
