"""The ``corpus`` stage: sources -> cleaned, sentence-segmented, de-duplicated documents in Parquet shards.

Pipeline (streaming; the corpus is never held in memory):

1. :func:`~bert_core.corpus.units.plan_units` resolves the sources to ordered work units (files, small
   files read together, the pieces of a large file, the data files of a Hub dataset).
2. Worker processes clean and segment one unit each and write it to a Parquet file in the build's work
   directory, ``.<output>.partial/`` beside the output (:func:`process_unit`); at most ``2 * workers`` units
   are in flight. Each unit is recorded there as soon as it is finished, before its turn to be merged
   (:class:`~bert_core.kept_work.KeptWork`): after a crash or a stop, the same build takes the units whose
   input files (path, size, modification time) and Parquet file (size, XXH3-128) still match their record
   and reads only the others. The units stay until the output is in place, so a build needs about twice the
   output's disk space while it runs.
3. The parent merges unit results *in unit order* (:mod:`bert_core.corpus.merge`): exact de-duplication (64-bit hash of the cleaned
   text, first occurrence wins), per-source and global caps, the seeded held-out split, shard writing.
   The output is therefore identical for any worker count.
4. Great Expectations checks run on per-document statistics; only then is the output directory moved
   into place (``atomic_path``), so a failure leaves no finished-looking corpus.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import multiprocessing as mp
import os
import shutil
import time
import unicodedata
from collections import Counter, deque
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from pathlib import Path

import pyarrow as pa

from bert_core.atomic import atomic_path, write_json_atomic
from bert_core.checks import DataCheckError
from bert_core.corpus.clean import normalize_text, paragraphs, strip_gutenberg
from bert_core.corpus.merge import Merger, corpus_checks, h64
from bert_core.corpus.params import CorpusParams, SourceSpec
from bert_core.corpus.readers import UnitStats, read_unit
from bert_core.corpus.segment import get_segmenter, segment_paragraphs
from bert_core.corpus.shards import MANIFEST, SCHEMA, DocumentShardWriter
from bert_core.corpus.stats import CorpusStats, UnitResult
from bert_core.corpus.units import CorpusError, SourceFile, WorkUnit, plan_units
from bert_core.kept_work import KeptWork, code_fingerprint, partial_dir
from bert_core.progress import Progress
from bert_core.tracking.fingerprint import json_fingerprint

log = logging.getLogger(__name__)

FORMAT = "bert-corpus/1"
_RUN_DEPENDENT = ("elapsed_s", "input_mb_per_s")
_UNIT_SCHEMA = pa.schema(
    [
        *SCHEMA,
        pa.field("hash", pa.uint64()),
        pa.field("n_bytes", pa.int64()),
        pa.field("n_words", pa.int64()),
    ]
)


class EmptyCorpusError(CorpusError):
    """No document survived reading and filtering."""


def _clean_title(title: str, form: str) -> str:
    return " ".join(normalize_text(title, form).split())


# --- worker side ---------------------------------------------------------------------------------------
def unit_read_limits(params: CorpusParams, src: SourceSpec) -> tuple[int | None, int | None]:
    """How much one unit may produce before it stops reading: twice the tightest cap that applies.

    The caps are applied exactly in the parent; this only keeps a capped profile from reading a whole
    large unit (a Hub dataset is a single unit). The factor 2 leaves room for documents the parent drops
    as duplicates. It depends only on params, so the output stays independent of the worker count.
    """

    def tightest(*values: int | None) -> int | None:
        present = [v for v in values if v is not None]
        return 2 * min(present) if present else None

    return (
        tightest(src.max_documents, params.cap.max_documents),
        tightest(src.max_bytes, params.cap.max_bytes),
    )


def process_unit(unit: WorkUnit, params: CorpusParams, work_dir: str, root: str | None) -> UnitResult:
    """Read, clean and segment one work unit into ``work_dir/unit-NNNNNN.parquet``.

    Runs in a worker process. Per-document filters (empty, too short/long, too few sentences) are
    applied here; de-duplication, caps and the split need the global order and happen in the parent.
    """
    clean = params.clean
    segment = get_segmenter(params.segmenter)
    stats = UnitStats()
    out = Path(work_dir) / f"unit-{unit.index:06d}.parquet"
    # The buffering shard writer, used for one temporary file (never rolls over).
    writer = DocumentShardWriter(
        Path(work_dir) / f"u{unit.index:06d}", max_bytes=1 << 62, schema=_UNIT_SCHEMA
    )
    src = unit.source
    max_docs, max_bytes = unit_read_limits(params, src)
    n = n_bytes = 0
    for doc in read_unit(
        unit,
        stats,
        max_doc_chars=clean.max_doc_chars,
        on_bad_record=params.on_bad_record,
        root=Path(root) if root else None,
    ):
        stats.records += 1
        text = doc.text
        if clean.strip_gutenberg:
            text, stripped = strip_gutenberg(text)
            stats.gutenberg_stripped += int(stripped)
        text = normalize_text(text, clean.unicode_form)
        n_chars = len(text) - text.count("\n")
        if not text.strip():
            stats.dropped["empty"] += 1
            continue
        if n_chars < clean.min_doc_chars:
            stats.dropped["too_short"] += 1
            continue
        if n_chars > clean.max_doc_chars:
            stats.dropped["too_long"] += 1
            continue
        sentences = segment_paragraphs(paragraphs(text, doc.newlines), segment, clean.max_sentence_chars)
        if len(sentences) < clean.min_sentences:
            stats.dropped["too_few_sentences"] += 1
            continue
        body = "\n".join(sentences).encode("utf-8")
        row = {
            "doc_id": f"{src.name}:{doc.local_id}",
            "source": src.name,
            "title": _clean_title(doc.title, clean.unicode_form),
            "sentences": sentences,
            "hash": h64(body),
            "n_bytes": len(body),
            "n_words": sum(len(s.split()) for s in sentences),
        }
        writer.write(row, len(body))
        n += 1
        n_bytes += len(body)
        if (max_docs is not None and n >= max_docs) or (max_bytes is not None and n_bytes >= max_bytes):
            stats.stopped_early = True
            break
    shards = writer.close()
    path = None
    if shards:
        (writer.directory / shards[0]["file"]).rename(out)
        path = str(out)
    writer.directory.rmdir()
    return UnitResult(unit.index, path, n, stats)


# --- parent side ---------------------------------------------------------------------------------------
def params_hash(params: CorpusParams, root: Path | None) -> str:
    """Hash of everything that determines the output: params (less ``workers``) and the active source list."""
    payload = {"params": params.output_hash_payload(), "mode": "local" if root is not None else "hub"}
    return json_fingerprint(payload)


def stop_workers(pool: ProcessPoolExecutor) -> None:
    """Terminate ``pool``'s worker processes now and drop its queued work (``shutdown`` alone waits for
    the running tasks; Python 3.14's ``terminate_workers`` does this)."""
    terminate = getattr(pool, "terminate_workers", None)
    if terminate is not None:
        terminate()
        return
    workers = list((getattr(pool, "_processes", None) or {}).values())
    for proc in workers:
        proc.terminate()
    for proc in workers:
        proc.join(timeout=5)
    pool.shutdown(wait=False, cancel_futures=True)


def _unit_input(unit: WorkUnit) -> list[dict[str, object]]:
    """What a unit reads, as its record keeps it: per input, its file's path, size and modification time, and
    the byte range of a piece of a file (a Hub dataset: its name in the plan and the data file; the source's
    settings are in the build's params)."""
    return [_input(part) for part in unit.inputs]


def _input(part: SourceFile) -> dict[str, object]:
    if part.path is None:
        hub = {"source": part.source.name, "rel": part.rel}
        return hub if part.shard is None else {**hub, "shard": list(part.shard)}
    st = os.stat(part.path)
    found = {"source": part.source.name, "path": part.path, "size": st.st_size, "mtime_ns": st.st_mtime_ns}
    return found if part.span is None else {**found, "span": list(part.span)}


#: The pieces of the large files, as planned (:func:`~bert_core.corpus.units.plan_units`), in the work
#: directory.
PLAN = "plan.json"


def kept_plan(out_dir: Path, identity: dict[str, object]) -> dict[str, list[list[int]]]:
    """The pieces the unfinished build of ``out_dir`` planned, if it has the same identity (each file's are
    taken only while the file is unchanged: :func:`~bert_core.corpus.units.plan_key`); else none."""
    work = partial_dir(out_dir)
    try:
        if json.loads((work / "identity.json").read_text(encoding="utf-8")) == identity:
            return dict(json.loads((work / PLAN).read_text(encoding="utf-8")))
    except (OSError, ValueError, TypeError):
        pass
    return {}


class KeptUnits(KeptWork):
    """The corpus build's work directory: one record per finished work unit under ``units/``."""

    def __init__(self, out_dir: Path, identity: dict[str, object], total: int) -> None:
        super().__init__(
            partial_dir(out_dir),
            identity,
            total,
            build="corpus",
            piece="work unit",
            records="units",
            refused=(ValueError, EmptyCorpusError, DataCheckError),
        )

    def finished(self, unit: WorkUnit) -> UnitResult | None:  # type: ignore[override]
        """The unit's result as an earlier build recorded it, when its input and file still match (a unit
        that kept no document has no file); else ``None``, with what a killed worker left of it removed."""
        path = self.dir / f"unit-{unit.index:06d}.parquet"
        record = super().finished(path.stem, lambda r: [path] if path.exists() else [])
        if record is None or record["input"] != _unit_input(unit):
            for stale in (path, self.dir / f"u{unit.index:06d}"):  # a killed worker's, if any
                shutil.rmtree(stale) if stale.is_dir() else stale.unlink(missing_ok=True)
            return None
        stats = UnitStats(**{**record["stats"], "dropped": Counter(record["stats"]["dropped"])})
        return UnitResult(unit.index, str(path) if record["files"] else None, record["documents"], stats)

    def record(self, unit: WorkUnit, result: UnitResult) -> None:  # type: ignore[override]
        files = [Path(result.path)] if result.path else []
        stats = {f.name: getattr(result.stats, f.name) for f in dataclasses.fields(result.stats)}
        super().record(
            f"unit-{unit.index:06d}", files, input=_unit_input(unit), documents=result.documents, stats=stats
        )


def build_corpus(
    params: CorpusParams,
    out_dir: str | Path,
    *,
    data_root: Path | None,
    workers: int | None = None,
    report_dir: str | Path | None = None,
) -> CorpusStats:
    """Build the corpus directory ``out_dir`` (layout in :mod:`bert_core.corpus.shards`).

    Args:
        params: Stage params.
        out_dir: Final output directory; replaced atomically only when the build and its checks succeed.
        data_root: Local data root: ``params.local_sources`` are read relative to it. ``None``:
            ``params.sources`` (the Hugging Face Hub default) are used.
        workers: Worker processes (default ``params.workers``); the output does not depend on it.
        report_dir: Where to write the data-check report (Data Docs HTML); not written when ``None``.

    Returns:
        Statistics of the build, with ``check_report`` (a ``bert_core.checks.CheckReport``).

    Raises:
        SourceNotFoundError: a source path matches nothing.
        CorpusError: unreadable input, or a bad record with ``on_bad_record='error'``.
        EmptyCorpusError: nothing survived filtering, or the held-out split came out empty.
        bert_core.checks.DataCheckError: a critical data check failed.
        bert_core.kept_work.BuildInUseError: another build is writing the same output.
    """
    import pandas as pd

    from bert_core.checks import validate

    t0 = time.perf_counter()
    workers = params.workers if workers is None else workers
    if workers < 1:
        raise ValueError(f"workers must be >= 1, got {workers}")
    out_dir = Path(out_dir)
    sources = params.active_sources(data_root)
    stats = CorpusStats(workers=workers, params_hash=params_hash(params, data_root))
    identity = {
        "format": FORMAT,
        "params_hash": stats.params_hash,
        "code": code_fingerprint(Path(__file__).parent),
    }
    earlier = kept_plan(out_dir, identity)
    units = plan_units(sources, data_root, workers=workers, planned=(planned := dict(earlier)))
    if reused := len(planned.keys() & earlier.keys()):
        log.info("corpus: %d large file(s) cut as the unfinished build planned them", reused)
    stats.data_root = "local" if data_root is not None else "hub"
    root_s = str(data_root) if data_root is not None else None
    log.info("corpus: %d work units from %d sources, %d workers", len(units), len(sources), workers)
    progress = Progress("corpus", len(units), noun="work unit", unit="units", logger=log)

    with atomic_path(out_dir, is_dir=True) as tmp, KeptUnits(out_dir, identity, len(units)) as kept:
        if planned:  # kept with the finished units, for a build that continues them
            write_json_atomic(kept.dir / PLAN, planned)
        work, merger = str(kept.dir), Merger(params, sources, tmp, stats)
        earlier = {unit.index: result for unit in units if (result := kept.finished(unit)) is not None}
        if earlier:
            log.info(
                "corpus: continuing an unfinished build: %d of %d work unit(s) kept", len(earlier), len(units)
            )

        recorded = set(earlier)

        def keep(unit: SourceFile, result: UnitResult) -> None:
            if unit.index not in recorded:
                kept.record(unit, result)
                recorded.add(unit.index)

        def take(unit: SourceFile, result: UnitResult) -> None:
            keep(unit, result)
            if unit.source_index not in merger.src_done:
                merger.consume(unit, result)
            progress.advance()

        if workers == 1:
            for unit in units:
                if merger.done:
                    break
                if unit.source_index in merger.src_done:
                    continue
                take(unit, earlier.get(unit.index) or process_unit(unit, params, work, root_s))
        else:
            with ProcessPoolExecutor(max_workers=workers, mp_context=mp.get_context("spawn")) as pool:
                pending: deque[tuple[SourceFile, Future]] = deque()
                todo = iter(units)

                def keep_finished() -> None:
                    """Record every unit a worker finished, merged or not (merging goes in unit order)."""
                    for unit, fut in pending:
                        if fut.done() and not fut.cancelled() and fut.exception() is None:
                            keep(unit, fut.result())

                def submit_next() -> None:
                    for unit in todo:
                        if merger.done:
                            return
                        if unit.source_index in merger.src_done:
                            continue
                        if (result := earlier.get(unit.index)) is not None:
                            pending.append((unit, done := Future()))
                            done.set_result(result)
                        else:
                            pending.append((unit, pool.submit(process_unit, unit, params, work, root_s)))
                        return

                try:
                    for _ in range(2 * workers):
                        submit_next()
                    while pending and not merger.done:
                        while not pending[0][1].done():  # a later unit that finishes first is kept at once
                            wait([f for _, f in pending if not f.done()], return_when=FIRST_COMPLETED)
                            keep_finished()
                        unit, fut = pending.popleft()
                        take(unit, fut.result())
                        submit_next()
                except BaseException:
                    # Interrupted (Ctrl-C, SIGTERM) or failed: keep what is finished, abandon the units in
                    # flight. Without this the pool's exit waits for every running unit, and a worker spawned
                    # after a signal to the process group never got that signal (measured: 15 s to stop under
                    # DVC on CI).
                    try:
                        keep_finished()
                    except Exception as err:  # the stop goes on: those units are read again
                        log.warning("corpus: could not record the finished work units: %s", err)
                    finally:
                        stop_workers(pool)
                    raise
                finally:
                    for _, fut in pending:
                        fut.cancel()
        progress.finish("the caps are reached" if merger.done else "")
        train_shards, heldout_shards = merger.close()

        if stats.documents == 0:
            capped = (
                " The caps stop at the first document that does not fit: raise corpus.cap.max_bytes / "
                "max_documents or the source's max_bytes / max_documents (a document larger than a byte cap "
                "is never taken), or cut documents smaller (doc_split)."
                if stats.dropped.get("over_cap")
                else " Check the sources and the corpus.clean limits."
            )
            raise EmptyCorpusError(
                f"no documents left after reading {stats.records} records and filtering "
                f"(dropped: {dict(stats.dropped)}).{capped}"
            )
        if stats.documents_heldout == 0 or stats.documents_train == 0:
            raise EmptyCorpusError(
                f"the {'held-out' if stats.documents_heldout == 0 else 'train'} split is empty: "
                f"{stats.documents} document(s) survived filtering (dropped: {dict(stats.dropped)}), "
                f"heldout.fraction={params.heldout.fraction}. The corpus needs at least 2 documents "
                "(one per split); add documents or adjust corpus.heldout / corpus.clean"
            )
        stats.shards_train, stats.shards_heldout = len(train_shards), len(heldout_shards)
        for si, src in enumerate(sources):
            stats.per_source[src.name] = {
                "documents": int(merger.src_docs[si]),
                "bytes": int(merger.src_bytes[si]),
            }
        report = validate(
            pd.DataFrame(merger.check_rows),
            "corpus",
            corpus_checks(params, [s.name for s in sources]),
            report_dir=report_dir,
        )
        stats.check_report = report
        report.raise_for_critical()
        stats.elapsed_s = time.perf_counter() - t0
        manifest = {
            "format": FORMAT,
            "params_hash": stats.params_hash,
            "data_root": stats.data_root,
            "columns": SCHEMA.names,
            "splits": {
                "train": {"documents": stats.documents_train, "shards": train_shards},
                "heldout": {"documents": stats.documents_heldout, "shards": heldout_shards},
            },
            "sources": [s.model_dump(mode="json") for s in sources],
            # Everything but timings, so the directory is identical for any worker count.
            "stats": {k: v for k, v in stats.as_metrics().items() if k not in _RUN_DEPENDENT},
            "bad_record_examples": stats.bad_record_examples,
            "unicode_version": unicodedata.unidata_version,
        }
        if stats.utf8_error_files:  # only then: a clean corpus's manifest stays byte for byte as it was
            manifest["utf8_error_files"] = stats.utf8_error_files
        (tmp / MANIFEST).write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    log.info("corpus: %s", stats.summary())
    return stats
