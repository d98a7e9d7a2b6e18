"""Corpus builds the resume and piece tests share: a build that crashes as it merges a given unit, a build
with every input read whole (one reader per file or dataset), the files of an output, and the rerun's
"continuing" lines; and the compressions a corpus file is read in, by suffix."""

from __future__ import annotations

import bz2
import functools
import gzip
import lzma
import re
from pathlib import Path

import pytest
from backports import zstd

from bert_core.corpus import CorpusParams, build, build_corpus
from bert_core.corpus.units import plan_units

#: A file's bytes as a file with this suffix holds them.
COMPRESS = {".gz": gzip.compress, ".bz2": bz2.compress, ".xz": lzma.compress, ".zst": zstd.compress}


def corpus_files(out: Path) -> dict[str, bytes]:
    """Every file of a corpus output by its relative path: equal dicts are byte-identical outputs."""
    return {p.relative_to(out).as_posix(): p.read_bytes() for p in sorted(out.rglob("*")) if p.is_file()}


def crashed_build(
    params: CorpusParams, out: Path, root: Path, monkeypatch, index: int, workers: int = 1
) -> None:
    """A build of ``out`` that fails as it merges unit ``index`` (that unit and the ones before it recorded)."""
    real = build.Merger.consume

    def consume(self, unit, result):
        if unit.index == index:
            raise RuntimeError("the machine went down")
        real(self, unit, result)

    with monkeypatch.context() as patch:
        patch.setattr(build.Merger, "consume", consume)
        with pytest.raises(RuntimeError, match="went down"):
            build_corpus(params, out, data_root=root, workers=workers)


def one_reader_build(params: CorpusParams, out: Path, root: Path, monkeypatch) -> None:
    """The build with every file and Hub dataset as one work unit, on one worker: the reference of pieces."""
    with monkeypatch.context() as patch:
        patch.setattr(build, "plan_units", functools.partial(plan_units, split=False))
        build_corpus(params, out, data_root=root, workers=1)


def continued(caplog) -> list[str]:
    """The rerun's ``continuing an unfinished build: <k> of <n> work unit(s) kept`` lines."""
    return [r.getMessage() for r in caplog.records if "continuing an unfinished build" in r.getMessage()]


def kept_of(caplog) -> tuple[int, int]:
    """``(k, n)`` of the rerun's one ``continuing`` line: with two workers, a crash as unit *i* is merged
    keeps at least ``i + 1`` units (more, when the other worker finished one after it)."""
    (line,) = continued(caplog)
    kept, total = re.fullmatch(
        r"corpus: continuing an unfinished build: (\d+) of (\d+) work unit\(s\) kept", line
    ).groups()
    return int(kept), int(total)
