"""Planning: each configured source resolved to its files, and the files to *work units*, what one worker
reads at a time.

A work unit is one input: a file, a piece of a large one (:mod:`bert_core.corpus.pieces`), a Hub dataset or
one of its data files; or several small files of one source, read one after the other (up to
:data:`GROUP_BYTES`, :data:`GROUP_FILES`): a folder of a million 4 KB files is about a thousand units, not
a million, each of which would cost a result file, a record and a turn of the merge. Units are processed
in parallel and their results merged in unit order, so the output never depends on the worker count nor on
how the inputs are grouped or cut.
"""

from __future__ import annotations

import fnmatch
import glob
import json
import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import fsspec

from bert_core.corpus import compressed
from bert_core.corpus import pieces as piece_plan
from bert_core.corpus.params import CorpusParams, SourceSpec
from bert_core.inputs import Hub, Reads

log = logging.getLogger(__name__)

#: Small files of one source are read together, one after the other, up to this many file bytes a unit (about
#: half a CPU-second of cleaning and segmenting) ...
GROUP_BYTES = 4 << 20
#: ... and this many files (the files a unit's record names).
GROUP_FILES = 4096


class CorpusError(RuntimeError):
    """The corpus stage cannot do its job; the message names the source/file/line and what to do."""


class SourceNotFoundError(CorpusError, FileNotFoundError):
    """A configured source path matches no file."""


@dataclass(frozen=True)
class SourceFile:
    """One input of a source: a file, one piece of a large file (``span``: its byte range; ``before``: the
    file's lines, rows or documents before it), or a Hub dataset (``path`` None), whole or one of its data
    files (``shard``: its index and the dataset's number of data files)."""

    source: SourceSpec
    path: str | None
    rel: str
    span: tuple[int, int] | None = None
    shard: tuple[int, int] | None = None
    before: int = 0

    @property
    def first_of_its_file(self) -> bool:
        """Whether this input starts its file (or Hub dataset): the one that counts it."""
        return (self.span or (0, 0))[0] == 0 and (self.shard or (0, 0))[0] == 0


@dataclass(frozen=True)
class WorkUnit:
    """What one worker reads at a time: one input, or several small files of one source, in order."""

    index: int
    source_index: int
    inputs: tuple[SourceFile, ...]

    @property
    def source(self) -> SourceSpec:
        return self.inputs[0].source


def _resolve(source: SourceSpec, root: Path | None) -> tuple[Path, list[Path]]:
    raw = Path(source.path).expanduser()
    base = raw if (raw.is_absolute() or root is None) else root / raw
    if base.is_file():
        files = [base]
        anchor = base.parent
    elif base.is_dir():
        patterns = source.patterns or ("*",)  # a local dataset folder (kind hf): every file in it
        files = sorted({p for pattern in patterns for p in base.rglob(pattern) if p.is_file()})
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


def corpus_reads(params: CorpusParams, data_root: Path | None, key: str | None = None) -> Reads:
    """What the corpus stage reads: every file of each source (the Hub dataset, without a data root); the
    ``inputs`` DVC stage records it (:mod:`bert_core.inputs`)."""
    reads: Reads = {}
    for source in params.active_sources(data_root):
        if data_root is None:
            reads[source.name] = Hub(source.path, source.revision)
            continue
        try:
            reads[source.name] = _resolve(source, data_root)[1]
        except CorpusError as err:
            reads[source.name] = f"missing: {err}"
    return reads


def plan_units(
    sources: tuple[SourceSpec, ...],
    root: Path | None,
    *,
    split: bool = True,
    workers: int = 1,
    planned: dict[str, list[list[int]]] | None = None,
) -> list[WorkUnit]:
    """Resolve every source to its ordered work units: with ``split`` false, one per file or Hub dataset.
    With ``split``, small files of a source are grouped (:data:`GROUP_BYTES`, :data:`GROUP_FILES`); a large
    JSONL file, text file of documents separated by blank lines or of WikiText (compressed or not), Parquet
    file or Wikipedia dump is one unit per :data:`~bert_core.corpus.pieces.UNIT_BYTES` piece
    (:mod:`bert_core.corpus.pieces`); and a Hub dataset of a document a row, one unit per data file (a row
    without an id of its own is named by its data file and its row in it). WikiText articles of a Hub dataset
    cross its data files: that dataset is one unit.

    A file that is cut in its decompressed text (a compressed one) is cut only when it holds more than one of
    the ``workers``' share of its source's bytes. Otherwise the source's files keep the workers busy as they
    are (a C4 folder; two large files on two workers), and cutting would only cost: a planning pass over the
    file, one file after the other before any work starts, and each piece decompressing the file up to its
    start.

    ``planned`` holds the pieces of the files large enough to be cut, by :func:`plan_key`: those of a file
    found there are taken as they are (a compressed file's planning pass is not repeated when a build
    continues), and on return it holds this plan's.

    Raises:
        SourceNotFoundError: a source path matches no file (names the source, the path and the root).
        CorpusError: a Hub dataset to split cannot be loaded; a file whose bytes are compressed otherwise than
            its name says (:func:`~bert_core.corpus.compressed.check_content`).
    """
    units: list[WorkUnit] = []
    earlier = dict(planned or {})
    if planned is not None:
        planned.clear()

    def add(si: int, inputs: list[SourceFile]) -> None:
        if inputs:
            units.append(WorkUnit(len(units), si, tuple(inputs)))

    for si, source in enumerate(sources):
        if source.kind == "hf":  # the Hub dataset, or a local dataset folder under the root
            if root is not None and not (root / source.path).exists():
                raise SourceNotFoundError(
                    f"source '{source.name}' (hf): '{source.path}' does not exist under data root {root}; "
                    "with BERT_DATA_ROOT set, Hub datasets must be given as local dataset folders"
                )
            rows = source.effective_doc_split == "row"
            n = load_hf(source, root).num_shards if split and rows else 1
            if n > 1:
                log.info("%s: read as its %d data files (work units)", source.path, n)
            for shard in [(k, n) for k in range(n)] if n > 1 else [None]:
                add(si, [SourceFile(source, None, source.split, shard=shard)])
            continue
        group: list[SourceFile] = []  # small files read together, and their bytes
        group_bytes = 0
        anchor, files = _resolve(source, root)
        stats = [p.stat() for p in files]
        fair_share = sum(st.st_size for st in stats) / workers  # a compressed file of more is cut
        for p, st in zip(files, stats, strict=True):
            if source.kind != "parquet":
                try:
                    compressed.check_content(p)
                except ValueError as err:
                    raise CorpusError(f"source '{source.name}' ({source.kind}): {err}") from None
            try:
                rel = p.relative_to(anchor).as_posix()
            except ValueError:
                rel = p.name
            pieces = _file_pieces(p, st, source, st.st_size > fair_share, earlier, planned) if split else []
            small = len(pieces) == 1 and pieces[0][1] < GROUP_BYTES
            if group and (not small or group_bytes + pieces[0][1] > GROUP_BYTES or len(group) == GROUP_FILES):
                add(si, group)
                group, group_bytes = [], 0
            if small:
                group.append(SourceFile(source, str(p), rel))
                group_bytes += pieces[0][1]
            elif len(pieces) < 2:  # the file whole
                add(si, [SourceFile(source, str(p), rel)])
            else:
                text = "decompressed " if fsspec.utils.infer_compression(p.name) else ""
                log.info(
                    "%s: read in %d pieces (work units) of its %s %sbytes",
                    p,
                    len(pieces),
                    f"{pieces[-1][1]:,}",
                    text,
                )
                for start, end, before in pieces:
                    add(si, [SourceFile(source, str(p), rel, (start, end), before=before)])
        add(si, group)
    return units


def plan_key(path: Path, st: os.stat_result, source: SourceSpec, decompress: bool) -> str:
    """What a file's pieces are planned from: the file (path, and ``st``: size, modification time), how its
    records are told apart, the piece size and whether it may be decompressed to plan it."""
    how = [source.kind, source.effective_doc_split, piece_plan.UNIT_BYTES, decompress]
    return json.dumps([str(path), st.st_size, st.st_mtime_ns, *how])


def _file_pieces(
    path: Path,
    st: os.stat_result,
    source: SourceSpec,
    decompress: bool,
    earlier: dict[str, list[list[int]]],
    planned: dict[str, list[list[int]]] | None,
) -> list[tuple[int, int, int]]:
    if planned is None or st.st_size <= piece_plan.UNIT_BYTES // 4:  # not kept, or no planning pass
        return piece_plan.file_pieces(path, source, decompress=decompress)
    key = plan_key(path, st, source, decompress)
    pieces = earlier.get(key) or [
        list(p) for p in piece_plan.file_pieces(path, source, decompress=decompress)
    ]
    planned[key] = pieces
    return [(start, end, before) for start, end, before in pieces]


def load_hf(src: SourceSpec, root: Path | None) -> Any:
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
