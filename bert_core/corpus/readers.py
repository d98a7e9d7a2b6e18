"""Source kinds: turn each input of a work unit (:mod:`bert_core.corpus.units`) into raw documents.

Readers stream: a file is read line by line (JSONL, blank-line and WikiText layouts), batch by batch
(Parquet) or page by page (XML dumps); only one-document-per-file text is read whole, and files too large to
pass the ``max_doc_chars`` filter are skipped without being read.
"""

from __future__ import annotations

import codecs
import json
import logging
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import fsspec

from bert_core.corpus import compressed
from bert_core.corpus.clean import wikitext_detokenize, wikitext_line
from bert_core.corpus.pieces import in_text, row_groups_in
from bert_core.corpus.units import CorpusError, SourceFile, SourceNotFoundError, WorkUnit, load_hf
from bert_core.corpus.wiki import WikiDumpError, is_disambiguation, iter_pages, wikitext_to_passages

log = logging.getLogger(__name__)

MAX_BAD_RECORD_EXAMPLES = 20


# --- UTF-8 decoding that counts what it replaces -------------------------------------------------------
_REPLACED = [0]


def _count_and_replace(err: UnicodeDecodeError) -> tuple[str, int]:
    _REPLACED[0] += 1
    return "\ufffd", err.end


codecs.register_error("bert_corpus_replace", _count_and_replace)


def decode(data: bytes) -> tuple[str, int]:
    """Decode UTF-8, replacing invalid sequences with U+FFFD; return the text and the replacement count."""
    before = _REPLACED[0]
    text = data.decode("utf-8", errors="bert_corpus_replace")
    return text, _REPLACED[0] - before


@dataclass
class UnitStats:
    """Counters one work unit contributes to the stage metrics."""

    input_files: int = 0
    input_bytes: int = 0
    records: int = 0
    utf8_replacements: int = 0
    gutenberg_stripped: int = 0
    stopped_early: bool = False
    dropped: Counter = field(default_factory=Counter)
    bad_record_examples: list[str] = field(default_factory=list)
    #: The unit's files with bytes that are not UTF-8: ``[path, sequences replaced, bytes read]``.
    utf8_files: list[list] = field(default_factory=list)

    def bad_record(self, where: str, why: str, on_bad_record: str) -> None:
        msg = f"{where}: {why}"
        if on_bad_record == "error":
            raise CorpusError(f"{msg}. Fix or remove the record, or set corpus.on_bad_record: skip")
        self.dropped["bad_record"] += 1
        if len(self.bad_record_examples) < MAX_BAD_RECORD_EXAMPLES:
            self.bad_record_examples.append(msg)
        log.warning("skipping bad record %s", msg)


@dataclass(frozen=True)
class RawDoc:
    """A document as read, before cleaning. ``text`` holds paragraphs as described by ``newlines``."""

    local_id: str
    title: str
    text: str
    newlines: str


# --- readers -------------------------------------------------------------------------------------------
def _stem(path: Path) -> str:
    name = path.name
    for suffix in compressed.SUFFIX.values():
        if name.lower().endswith(suffix):
            name = name[: -len(suffix)]
    return name.rsplit(".", 1)[0] if "." in name else name


def _lines(part: SourceFile, stats: UnitStats) -> Iterator[tuple[int, str]]:
    """Decoded lines of ``part``'s file, or of its piece of the file (1-based line numbers of the file),
    counting UTF-8 replacements; compressed input errors named."""
    replaced, path = 0, Path(part.path)
    start, end = part.span or (0, None)
    try:
        with fsspec.open(path, "rb", compression="infer") as fh:
            if start:
                fh.seek(start)
            for lineno, raw in enumerate(fh, part.before + 1):
                if end is not None and start >= end:
                    break
                start += len(raw)
                stats.input_bytes += len(raw)
                text, n = decode(raw)
                replaced += n
                yield lineno, text
    except compressed.ERRORS as err:
        raise CorpusError(
            f"{path}: cannot read ({err}); the compressed file is corrupt or truncated — re-create it or "
            "remove it from the source"
        ) from None
    finally:
        stats.utf8_replacements += replaced


def _wikitext_docs(lines: Iterator[str], prefix: str, n: int = 0) -> Iterator[RawDoc]:
    """Group WikiText lines into articles at top-level ``" = Title = "`` lines, numbered from ``n``; drop
    sub-headings."""
    title, paras = "", []
    for line in lines:
        kind, text = wikitext_line(line)
        if kind == "title":
            if paras:
                yield RawDoc(f"{prefix}{n}", title, "\n".join(paras), "paragraph")
                n += 1
            title, paras = wikitext_detokenize(text), []
        elif kind == "paragraph":
            paras.append(wikitext_detokenize(text))
    if paras:
        yield RawDoc(f"{prefix}{n}", title, "\n".join(paras), "paragraph")


def _read_text(part: SourceFile, stats: UnitStats, max_doc_chars: int) -> Iterator[RawDoc]:
    src, path = part.source, Path(part.path)
    mode = src.effective_doc_split
    if mode == "file":
        size = path.stat().st_size
        packed = fsspec.utils.infer_compression(path.name) is not None
        if not packed and size > 4 * max_doc_chars:  # >= size/4 characters: cannot pass max_doc_chars
            stats.input_bytes += size
            stats.records += 1
            stats.dropped["too_long"] += 1
            return
        try:
            with fsspec.open(path, "rb", compression="infer") as fh:
                data = fh.read()
        except compressed.ERRORS as err:
            raise CorpusError(
                f"{path}: cannot read ({err}); the file is corrupt or truncated — re-create it or remove it"
            ) from None
        stats.input_bytes += len(data)
        text, n = decode(data)
        stats.utf8_replacements += n
        yield RawDoc(part.rel, _stem(path), text, src.effective_newlines)
        return
    lines = (line for _, line in _lines(part, stats))
    if mode == "wikitext":
        yield from _wikitext_docs(lines, f"{part.rel}#", part.before)
        return
    # blank_lines: documents separated by blank lines; a document longer than max_doc_chars is dropped
    # as soon as it gets there so memory stays bounded.
    buf: list[str] = []
    size, n, overflow = 0, part.before, False
    for line in lines:
        if line.strip():
            if not overflow:
                buf.append(line)
                size += len(line)
                if size > max_doc_chars:
                    overflow, buf = True, []
            continue
        if buf or overflow:
            if overflow:
                stats.records += 1
                stats.dropped["too_long"] += 1
            else:
                yield RawDoc(f"{part.rel}#{n}", "", "".join(buf), src.effective_newlines)
            n += 1
            buf, size, overflow = [], 0, False
    if buf:
        yield RawDoc(f"{part.rel}#{n}", "", "".join(buf), src.effective_newlines)
    elif overflow:
        stats.records += 1
        stats.dropped["too_long"] += 1


def _field_str(rec: dict, name: str | None) -> str | None:
    if name is None:
        return None
    v = rec.get(name)
    return None if v is None else str(v)


def _read_jsonl(part: SourceFile, stats: UnitStats, on_bad_record: str) -> Iterator[RawDoc]:
    src, path = part.source, Path(part.path)
    for lineno, line in _lines(part, stats):
        if not line.strip():
            continue
        where = f"{path}:{lineno}"
        try:
            rec = json.loads(line)
        except json.JSONDecodeError as err:
            stats.records += 1
            stats.bad_record(where, f"not valid JSON ({err.msg} at column {err.colno})", on_bad_record)
            continue
        if not isinstance(rec, dict) or not isinstance(rec.get(src.text_field), str):
            stats.records += 1
            stats.bad_record(where, f"no string field '{src.text_field}'", on_bad_record)
            continue
        rid = _field_str(rec, src.id_field) or f"{part.rel}:{lineno}"
        yield RawDoc(rid, _field_str(rec, src.title_field) or "", rec[src.text_field], src.effective_newlines)


def _read_parquet(part: SourceFile, stats: UnitStats, on_bad_record: str) -> Iterator[RawDoc]:
    import pyarrow.parquet as pq

    src, path = part.source, Path(part.path)
    try:
        pf = pq.ParquetFile(path)
    except Exception as err:
        raise CorpusError(f"{path}: not a readable Parquet file ({err}); re-create it or remove it") from None
    groups = None if part.span is None else row_groups_in(pf.metadata, part.span)  # None: all
    stats.input_bytes += path.stat().st_size if part.span is None else part.span[1] - part.span[0]
    names = pf.schema_arrow.names
    wanted = [c for c in (src.text_field, src.id_field, src.title_field) if c]
    missing = [c for c in wanted if c not in names]
    if missing:
        raise CorpusError(
            f"{path}: missing column(s) {missing} (columns: {names}); set text_field/id_field/title_field "
            f"of source '{src.name}'"
        )
    row = part.before
    for batch in pf.iter_batches(batch_size=256, columns=sorted(set(wanted)), row_groups=groups):
        cols = batch.to_pydict()
        for i in range(batch.num_rows):
            row += 1
            text = cols[src.text_field][i]
            if not isinstance(text, str):
                stats.records += 1
                stats.bad_record(
                    f"{path}: row {row}", f"field '{src.text_field}' is not a string", on_bad_record
                )
                continue
            rid = (
                str(cols[src.id_field][i]) if src.id_field and cols[src.id_field][i] is not None else None
            ) or (f"{part.rel}:{row}")
            title = str(cols[src.title_field][i] or "") if src.title_field else ""
            yield RawDoc(rid, title, text, src.effective_newlines)


def _read_wiki(part: SourceFile, stats: UnitStats) -> Iterator[RawDoc]:
    path = Path(part.path)
    of_text = part.span is not None and in_text(path)
    if part.span is not None and not of_text:
        stats.input_bytes += part.span[1] - part.span[0]
    elif part.first_of_its_file:  # the whole file, or the first of its pieces in its decompressed text
        stats.input_bytes += path.stat().st_size
    try:
        for page in iter_pages(path, part.span, of_text=of_text):
            if page.redirect:
                stats.records += 1
                stats.dropped["redirect"] += 1
                continue
            if page.ns != 0:
                stats.records += 1
                stats.dropped["non_article_namespace"] += 1
                continue
            if is_disambiguation(page.text):
                stats.records += 1
                stats.dropped["disambiguation"] += 1
                continue
            yield RawDoc(
                page.page_id or page.title,
                page.title,
                "\n".join(wikitext_to_passages(page.text)),
                "paragraph",
            )
    except WikiDumpError as err:
        raise CorpusError(str(err)) from None


def _read_hf(part: SourceFile, stats: UnitStats, root: Path | None) -> Iterator[RawDoc]:
    src = part.source
    ds = load_hf(src, root)
    at = ""  # a data file's rows: the default ids name the file
    if part.shard is not None:
        k, n = part.shard
        if ds.num_shards != n:
            raise CorpusError(
                f"source '{src.name}': Hugging Face dataset {src.path!r} has {ds.num_shards} data files, "
                f"not the {n} it had when the build was planned: it changed during the build; set the "
                "source's revision to pin one"
            )
        ds, at = ds.shard(n, k, contiguous=True), f"{k}:"

    def rows() -> Iterator[dict]:
        for rec in ds:
            text = rec.get(src.text_field)
            if isinstance(text, str):
                stats.input_bytes += len(text.encode("utf-8", "replace"))
            yield rec

    if src.effective_doc_split == "wikitext":
        yield from _wikitext_docs((r.get(src.text_field) or "" for r in rows()), f"{src.split}#")
        return
    for i, rec in enumerate(rows()):
        text = rec.get(src.text_field)
        if not isinstance(text, str):
            stats.records += 1
            of_file = "" if part.shard is None else f" of data file {part.shard[0]}"
            stats.bad_record(f"{src.path}: row {i}{of_file}", f"no string field '{src.text_field}'", "skip")
            continue
        rid = _field_str(rec, src.id_field) or f"{src.split}:{at}{i}"
        yield RawDoc(rid, _field_str(rec, src.title_field) or "", text, src.effective_newlines)


def read_unit(
    unit: WorkUnit, stats: UnitStats, *, max_doc_chars: int, on_bad_record: str, root: Path | None
) -> Iterator[RawDoc]:
    """Stream the raw documents of one work unit, its inputs in order, updating ``stats`` (bytes, bad records,
    skips, the files with bytes that are not UTF-8).

    Raises:
        CorpusError: unreadable file (corrupt/truncated compression, malformed XML or Parquet), a missing
            Parquet column, or a bad record with ``on_bad_record='error'`` (names file and line).
    """
    for part in unit.inputs:
        replaced, read = stats.utf8_replacements, stats.input_bytes
        try:
            yield from _read_part(part, stats, max_doc_chars, on_bad_record, root)
        finally:  # also when the unit stops early, at a cap
            if stats.utf8_replacements > replaced:
                stats.utf8_files.append(
                    [part.path, stats.utf8_replacements - replaced, stats.input_bytes - read]
                )


def _read_part(
    part: SourceFile, stats: UnitStats, max_doc_chars: int, on_bad_record: str, root: Path | None
) -> Iterator[RawDoc]:
    kind = part.source.kind
    if kind == "hf":
        stats.input_files += int(part.first_of_its_file)
        yield from _read_hf(part, stats, root)
        return
    path = Path(part.path)
    if not path.is_file():
        raise SourceNotFoundError(
            f"source '{part.source.name}': {path} disappeared while building the corpus"
        )
    stats.input_files += int(part.first_of_its_file)  # a file read in pieces counts once
    if kind == "text":
        yield from _read_text(part, stats, max_doc_chars)
    elif kind == "jsonl":
        yield from _read_jsonl(part, stats, on_bad_record)
    elif kind == "parquet":
        yield from _read_parquet(part, stats, on_bad_record)
    elif kind == "wikipedia_xml":
        yield from _read_wiki(part, stats)
    else:  # pragma: no cover - SourceSpec validation makes this unreachable
        raise CorpusError(f"source '{part.source.name}': unknown kind {kind!r}")
