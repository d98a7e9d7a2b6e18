"""Source kinds: turn each configured source into work units (files) and each unit into raw documents.

A *work unit* is one input file, a piece of a large one (:mod:`bert_core.corpus.pieces`), a Hub dataset or
one of its data files: units are processed in parallel and their results merged in unit order, so the output never depends on the worker count. Readers stream:
a file is read line by line (JSONL, blank-line and WikiText layouts), batch by batch (Parquet) or page by
page (XML dumps); only one-document-per-file text is read whole, and files too large to pass the
``max_doc_chars`` filter are skipped without being read.
"""

from __future__ import annotations

import codecs
import fnmatch
import glob
import json
import logging
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import fsspec

from bert_core.corpus import compressed
from bert_core.corpus.clean import wikitext_detokenize, wikitext_line
from bert_core.corpus.params import SourceSpec
from bert_core.corpus.pieces import file_pieces, row_groups_in
from bert_core.corpus.wiki import WikiDumpError, is_disambiguation, iter_pages, wikitext_to_passages

log = logging.getLogger(__name__)

MAX_BAD_RECORD_EXAMPLES = 20


class CorpusError(RuntimeError):
    """The corpus stage cannot do its job; the message names the source/file/line and what to do."""


class SourceNotFoundError(CorpusError, FileNotFoundError):
    """A configured source path matches no file."""


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

    def bad_record(self, where: str, why: str, on_bad_record: str) -> None:
        msg = f"{where}: {why}"
        if on_bad_record == "error":
            raise CorpusError(f"{msg}. Fix or remove the record, or set corpus.on_bad_record: skip")
        self.dropped["bad_record"] += 1
        if len(self.bad_record_examples) < MAX_BAD_RECORD_EXAMPLES:
            self.bad_record_examples.append(msg)
        log.warning("skipping bad record %s", msg)


@dataclass(frozen=True)
class SourceFile:
    """One input file of a source, one piece of a large file (``span``: its byte range; ``before``: the
    file's lines, rows or documents before it), or a Hub dataset (``path`` None), whole or one of its data files
    (``shard``: its index and the dataset's number of data files)."""

    index: int
    source_index: int
    source: SourceSpec
    path: str | None
    rel: str
    span: tuple[int, int] | None = None
    shard: tuple[int, int] | None = None
    before: int = 0

    @property
    def first_of_its_file(self) -> bool:
        """Whether this unit starts its input (a file, or a Hub dataset): the one that counts it."""
        return (self.span or (0, 0))[0] == 0 and (self.shard or (0, 0))[0] == 0


@dataclass(frozen=True)
class RawDoc:
    """A document as read, before cleaning. ``text`` holds paragraphs as described by ``newlines``."""

    local_id: str
    title: str
    text: str
    newlines: str


# --- planning ------------------------------------------------------------------------------------------
def _resolve(source: SourceSpec, root: Path | None) -> tuple[Path, list[Path]]:
    raw = Path(source.path).expanduser()
    base = raw if (raw.is_absolute() or root is None) else root / raw
    if base.is_file():
        files = [base]
        anchor = base.parent
    elif base.is_dir():
        files = sorted({p for pattern in source.patterns for p in base.rglob(pattern) if p.is_file()})
        anchor = base
    else:
        files = sorted(Path(p) for p in glob.glob(str(base), recursive=True) if Path(p).is_file())
        anchor = Path(glob.escape(str(base)).split("*")[0].split("?")[0].split("[")[0])
        anchor = anchor if anchor.is_dir() else anchor.parent
    files = [p for p in files if not any(fnmatch.fnmatch(p.name, pat) for pat in source.exclude)]
    if not files:
        where = f" under data root {root}" if root is not None and not raw.is_absolute() else ""
        if base.is_dir():
            raise SourceNotFoundError(
                f"source '{source.name}' ({source.kind}): folder '{source.path}'{where} ({base}) has no file "
                f"matching {list(source.patterns)}; set the source's pattern (e.g. pattern: '*.md')"
            )
        raise SourceNotFoundError(
            f"source '{source.name}' ({source.kind}): path '{source.path}'{where} matches no files "
            f"({base}). Check the path, or set/unset BERT_DATA_ROOT."
        )
    return anchor, files


def plan_units(sources: tuple[SourceSpec, ...], root: Path | None, *, split: bool = True) -> list[SourceFile]:
    """Resolve every source to its ordered work units: one per file or Hub dataset; with ``split``, one per
    :data:`~bert_core.corpus.pieces.UNIT_BYTES` piece of a large uncompressed JSONL file, text file of
    documents separated by blank lines or of WikiText, Parquet file or Wikipedia dump
    (:mod:`bert_core.corpus.pieces`), and one per data file of a Hub dataset of a document a row (a row
    without an id of its own is named by its data file and its row in it). WikiText articles of a Hub dataset
    cross its data files: that dataset is one unit.

    Raises:
        SourceNotFoundError: a source path matches no file (names the source, the path and the root).
        CorpusError: a Hub dataset to split cannot be loaded.
    """
    units: list[SourceFile] = []
    for si, source in enumerate(sources):
        if source.kind == "hf":  # the Hub dataset, or a local dataset folder under the root
            if root is not None and not (root / source.path).exists():
                raise SourceNotFoundError(
                    f"source '{source.name}' (hf): '{source.path}' does not exist under data root {root}; "
                    "with BERT_DATA_ROOT set, Hub datasets must be given as local dataset folders"
                )
            rows = source.effective_doc_split == "row"
            n = _load_hf(source, root).num_shards if split and rows else 1
            if n > 1:
                log.info("%s: read as its %d data files (work units)", source.path, n)
            for shard in [(k, n) for k in range(n)] if n > 1 else [None]:
                units.append(SourceFile(len(units), si, source, None, f"{source.split}", shard=shard))
            continue
        anchor, files = _resolve(source, root)
        for p in files:
            if source.kind != "parquet":
                try:
                    compressed.check_content(p)
                except ValueError as err:
                    raise CorpusError(f"source '{source.name}' ({source.kind}): {err}") from None
            try:
                rel = p.relative_to(anchor).as_posix()
            except ValueError:
                rel = p.name
            pieces = file_pieces(p, source) if split else []
            if len(pieces) < 2:  # the file whole
                units.append(SourceFile(len(units), si, source, str(p), rel))
                continue
            log.info(
                "%s: read in %d pieces (work units) of its %s bytes", p, len(pieces), f"{pieces[-1][1]:,}"
            )
            for start, end, before in pieces:
                units.append(SourceFile(len(units), si, source, str(p), rel, (start, end), before=before))
    return units


# --- readers -------------------------------------------------------------------------------------------
def _stem(path: Path) -> str:
    name = path.name
    for suffix in compressed.SUFFIX.values():
        if name.lower().endswith(suffix):
            name = name[: -len(suffix)]
    return name.rsplit(".", 1)[0] if "." in name else name


def _lines(unit: SourceFile, stats: UnitStats) -> Iterator[tuple[int, str]]:
    """Decoded lines of ``unit``'s file, or of its piece of the file (1-based line numbers of the file),
    counting UTF-8 replacements; compressed input errors named."""
    replaced, path = 0, Path(unit.path)
    start, end = unit.span or (0, None)
    try:
        with fsspec.open(path, "rb", compression="infer") as fh:
            if start:
                fh.seek(start)
            for lineno, raw in enumerate(fh, unit.before + 1):
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


def _read_text(unit: SourceFile, stats: UnitStats, max_doc_chars: int) -> Iterator[RawDoc]:
    src, path = unit.source, Path(unit.path)
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
        yield RawDoc(unit.rel, _stem(path), text, src.effective_newlines)
        return
    lines = (line for _, line in _lines(unit, stats))
    if mode == "wikitext":
        yield from _wikitext_docs(lines, f"{unit.rel}#", unit.before)
        return
    # blank_lines: documents separated by blank lines; a document longer than max_doc_chars is dropped
    # as soon as it gets there so memory stays bounded.
    buf: list[str] = []
    size, n, overflow = 0, unit.before, False
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
                yield RawDoc(f"{unit.rel}#{n}", "", "".join(buf), src.effective_newlines)
            n += 1
            buf, size, overflow = [], 0, False
    if buf:
        yield RawDoc(f"{unit.rel}#{n}", "", "".join(buf), src.effective_newlines)
    elif overflow:
        stats.records += 1
        stats.dropped["too_long"] += 1


def _field_str(rec: dict, name: str | None) -> str | None:
    if name is None:
        return None
    v = rec.get(name)
    return None if v is None else str(v)


def _read_jsonl(unit: SourceFile, stats: UnitStats, on_bad_record: str) -> Iterator[RawDoc]:
    src, path = unit.source, Path(unit.path)
    for lineno, line in _lines(unit, stats):
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
        rid = _field_str(rec, src.id_field) or f"{unit.rel}:{lineno}"
        yield RawDoc(rid, _field_str(rec, src.title_field) or "", rec[src.text_field], src.effective_newlines)


def _read_parquet(unit: SourceFile, stats: UnitStats, on_bad_record: str) -> Iterator[RawDoc]:
    import pyarrow.parquet as pq

    src, path = unit.source, Path(unit.path)
    try:
        pf = pq.ParquetFile(path)
    except Exception as err:
        raise CorpusError(f"{path}: not a readable Parquet file ({err}); re-create it or remove it") from None
    groups = None if unit.span is None else row_groups_in(pf.metadata, unit.span)  # None: all
    stats.input_bytes += path.stat().st_size if unit.span is None else unit.span[1] - unit.span[0]
    names = pf.schema_arrow.names
    wanted = [c for c in (src.text_field, src.id_field, src.title_field) if c]
    missing = [c for c in wanted if c not in names]
    if missing:
        raise CorpusError(
            f"{path}: missing column(s) {missing} (columns: {names}); set text_field/id_field/title_field "
            f"of source '{src.name}'"
        )
    row = unit.before
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
            ) or (f"{unit.rel}:{row}")
            title = str(cols[src.title_field][i] or "") if src.title_field else ""
            yield RawDoc(rid, title, text, src.effective_newlines)


def _read_wiki(unit: SourceFile, stats: UnitStats) -> Iterator[RawDoc]:
    path = Path(unit.path)
    stats.input_bytes += path.stat().st_size if unit.span is None else unit.span[1] - unit.span[0]
    try:
        for page in iter_pages(path, unit.span):
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


def _load_hf(src: SourceSpec, root: Path | None) -> Any:
    """The source's Hub dataset (a local dataset folder under ``root``), streamed."""
    try:
        import datasets

        name = str(root / src.path) if root is not None else src.path
        return datasets.load_dataset(name, src.config, split=src.split, streaming=True, revision=src.revision)
    except Exception as err:
        raise CorpusError(
            f"source '{src.name}': cannot load Hugging Face dataset {src.path!r} "
            f"(config {src.config!r}, split {src.split!r}): {err}. Check the name and your network, or set "
            "BERT_DATA_ROOT to build from local files"
        ) from None


def _read_hf(unit: SourceFile, stats: UnitStats, root: Path | None) -> Iterator[RawDoc]:
    src = unit.source
    ds = _load_hf(src, root)
    at = ""  # a data file's rows: the default ids name the file
    if unit.shard is not None:
        k, n = unit.shard
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
            of_file = "" if unit.shard is None else f" of data file {unit.shard[0]}"
            stats.bad_record(f"{src.path}: row {i}{of_file}", f"no string field '{src.text_field}'", "skip")
            continue
        rid = _field_str(rec, src.id_field) or f"{src.split}:{at}{i}"
        yield RawDoc(rid, _field_str(rec, src.title_field) or "", text, src.effective_newlines)


def read_unit(
    unit: SourceFile, stats: UnitStats, *, max_doc_chars: int, on_bad_record: str, root: Path | None
) -> Iterator[RawDoc]:
    """Stream the raw documents of one work unit, updating ``stats`` (bytes, bad records, skips).

    Raises:
        CorpusError: unreadable file (corrupt/truncated compression, malformed XML or Parquet), a missing
            Parquet column, or a bad record with ``on_bad_record='error'`` (names file and line).
    """
    kind = unit.source.kind
    if kind == "hf":
        stats.input_files += int(unit.first_of_its_file)
        yield from _read_hf(unit, stats, root)
        return
    path = Path(unit.path)
    if not path.is_file():
        raise SourceNotFoundError(
            f"source '{unit.source.name}': {path} disappeared while building the corpus"
        )
    stats.input_files += int(unit.first_of_its_file)  # a file read in pieces counts once
    if kind == "text":
        yield from _read_text(unit, stats, max_doc_chars)
    elif kind == "jsonl":
        yield from _read_jsonl(unit, stats, on_bad_record)
    elif kind == "parquet":
        yield from _read_parquet(unit, stats, on_bad_record)
    elif kind == "wikipedia_xml":
        yield from _read_wiki(unit, stats)
    else:  # pragma: no cover - SourceSpec validation makes this unreachable
        raise CorpusError(f"source '{unit.source.name}': unknown kind {kind!r}")
