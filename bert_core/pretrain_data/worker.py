"""Worker side of the builder: one task (consecutive corpus shards) -> one output shard per phase.

Runs in a worker process (or in-process with one worker). Streams the task's documents from Parquet,
tokenises them in bounded batches, cuts them into windows of about ``window_tokens`` tokens and, per
window, phase and dupe pass, creates, masks and appends instances. Every random choice is seeded by
(seed, phase, split, task, window, pass), so the output does not depend on which process runs the task,
nor on which other phases it builds: a task can be run again for one phase alone (with another NSP
``offset``, see :mod:`.build`) and that phase's shard is rewritten in full.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import itertools
import random
import zlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from bert_core.pretrain_data.instances import NspCounter, Pairs, Window, create_pairs, materialize
from bert_core.pretrain_data.masking import MaskingSpec, mask_with_generator
from bert_core.pretrain_data.params import PretrainDataParams
from bert_core.pretrain_data.storage import InstanceShardWriter
from bert_core.vocab.info import load_tokenizer, read_vocab

READ_BATCH_DOCS = 64  # documents decoded from Parquet at a time
ENCODE_BATCH_SENTENCES = 8192  # sentences per tokenizer call (bounds the tokenizer's temporary objects)
CHUNK_INSTANCES = 4096  # instances laid out and masked at a time (bounds the (N, T) temporaries)


@dataclass(frozen=True)
class BuildUnit:
    """One unit of the builder's work: consecutive documents of one split, processed by one worker into
    one output shard per phase (``task_bytes`` of text).

    Attributes:
        split: ``train`` or ``heldout``.
        index: Unit number within the split (names the output shard and keys its seeds).
        segments: ``(file, first_row, end_row)`` ranges of corpus shards, in stream order.
        num_rows: Documents in the task.
    """

    split: str
    index: int
    segments: tuple[tuple[str, int, int], ...]
    num_rows: int

    def describe(self) -> str:
        return ", ".join(f"{Path(f).name}[{a}:{b}]" for f, a, b in self.segments)

    def rows(self) -> list[list[Any]]:
        """The task's corpus rows as ``[shard name, first_row, end_row]`` (recorded in the index)."""
        return [[Path(f).name, a, b] for f, a, b in self.segments]


def read_segment(path: str, start: int, end: int) -> Iterator[Any]:
    """The ``sentences`` column of rows ``[start, end)`` of a Parquet file, in batches (only the row groups
    that overlap the range are decoded)."""
    from bert_core.corpus.shards import iter_shard_batches, open_shard

    pf = open_shard(path)
    md = pf.metadata
    groups, pos, first = [], None, 0
    for g in range(md.num_row_groups):
        n = md.row_group(g).num_rows
        if first < end and first + n > start:
            groups.append(g)
            pos = first if pos is None else pos
        first += n
    if not groups:
        return
    batches = iter_shard_batches(
        pf, path, batch_size=READ_BATCH_DOCS, row_groups=groups, columns=["sentences"]
    )
    for batch in batches:
        lo, hi = max(start - pos, 0), min(end - pos, batch.num_rows)
        if hi > lo:
            yield batch.column(0).slice(lo, hi - lo)
        pos += batch.num_rows
        if pos >= end:
            break


@dataclass(frozen=True)
class Job:
    """A task plus what a worker process needs to run it (picklable).

    Attributes:
        phases: The phases to build (a subset of ``params["phases"]``); empty: all of them.
        nsp_offset: Per phase, the starting :attr:`NspCounter.offset` (0 when absent).
    """

    task: BuildUnit
    out_dir: str
    vocab_dir: str
    params: dict[str, Any]
    phases: tuple[str, ...] = ()
    nsp_offset: dict[str, float] = field(default_factory=dict)


def _encode(tokenizer, sentences) -> tuple[np.ndarray, np.ndarray]:
    """Token ids of ``sentences`` (an Arrow string array) back to back (int32) and the token count of each
    sentence. Only ``ENCODE_BATCH_SENTENCES`` become Python strings at a time."""
    ids: list[np.ndarray] = []
    lens: list[np.ndarray] = []
    for k in range(0, len(sentences), ENCODE_BATCH_SENTENCES):
        texts = [t or "" for t in sentences.slice(k, ENCODE_BATCH_SENTENCES).to_pylist()]
        per_sentence = [e.ids for e in tokenizer.encode_batch_fast(texts, add_special_tokens=False)]
        n = np.fromiter(map(len, per_sentence), dtype=np.int64, count=len(per_sentence))
        lens.append(n)
        ids.append(
            np.fromiter(itertools.chain.from_iterable(per_sentence), dtype=np.int32, count=int(n.sum()))
        )
    if not ids:
        return np.zeros(0, np.int32), np.zeros(0, np.int64)
    return np.concatenate(ids), np.concatenate(lens)


def iter_windows(task: BuildUnit, tokenizer, window_tokens: int, min_docs: int) -> Iterator[Window]:
    """Stream the task's documents as tokenised windows.

    A window closes after the first document at which it holds at least ``window_tokens`` tokens and
    ``min_docs`` documents, unless fewer than ``min_docs`` rows remain in the task (those join it).
    Sentences without tokens and documents without sentences are dropped (as Google's reader does).
    Window boundaries depend only on the task's rows, never on how they are read.
    """
    import pyarrow.compute as pc

    parts: list[tuple[np.ndarray, np.ndarray, int]] = []  # (token ids, sentence lengths, row) per document
    held_tokens = 0
    row = 0  # task-stream row of the next document

    def emit() -> Window:
        sent_lens = np.concatenate([p[1] for p in parts])
        window = Window(
            tokens=np.concatenate([p[0] for p in parts]),
            sent_starts=np.concatenate([[0], np.cumsum(sent_lens)]).astype(np.int64),
            doc_sents=np.concatenate([[0], np.cumsum([len(p[1]) for p in parts])]).astype(np.int64),
            doc_rows=np.array([p[2] for p in parts], dtype=np.int64),
        )
        parts.clear()
        return window

    for path, start, end in task.segments:
        for col in read_segment(path, start, end):
            per_doc = pc.fill_null(pc.list_value_length(col), 0).to_numpy().astype(np.int64)
            ids, sent_lens = _encode(tokenizer, pc.list_flatten(col))
            sent_first = np.concatenate([[0], np.cumsum(per_doc)])
            tok_first = np.concatenate([[0], np.cumsum(sent_lens)])
            for d in range(len(per_doc)):
                lo, hi = sent_first[d], sent_first[d + 1]
                lens = sent_lens[lo:hi]
                lens = lens[lens > 0]  # empty sentences add no tokens, so the doc's tokens stay contiguous
                if len(lens):
                    parts.append((ids[tok_first[lo] : tok_first[hi]], lens, row))
                    held_tokens += int(lens.sum())
                row += 1
                if (
                    held_tokens >= window_tokens
                    and len(parts) >= min_docs
                    and task.num_rows - row >= min_docs
                ):
                    yield emit()
                    held_tokens = 0
    if parts:
        yield emit()


def derive_seed(*words: int | str) -> int:
    ints = [zlib.crc32(w.encode()) if isinstance(w, str) else int(w) for w in words]
    state = np.random.SeedSequence(ints).generate_state(2, dtype=np.uint64)
    return int(state[0]) << 64 | int(state[1])


def _new_stats() -> dict[str, int]:
    keys = (
        "instances tokens slots truncated short_target random_next forced_random a_tokens b_tokens eligible "
        "predictions pred_mask pred_random pred_keep"
    )
    return dict.fromkeys(keys.split(), 0)


def _write_chunk(
    pairs: Pairs,
    window: Window,
    max_seq_length: int,
    writer: InstanceShardWriter,
    s: dict[str, int],
    spec: MaskingSpec,
    mask_rng: np.random.Generator | None,
    continuation: np.ndarray,
    track_docs: bool,
) -> None:
    """Lay out, mask (static: ``mask_rng`` given) and append a block of instances; update the counters."""
    ids, lengths = materialize(window.tokens, pairs, max_seq_length, *spec.layout_ids)
    docs = (
        np.stack([window.doc_rows[pairs.a_doc], window.doc_rows[pairs.b_doc]], axis=1) if track_docs else None
    )
    if mask_rng is not None:
        masked, chosen = mask_with_generator(ids, lengths, pairs.a_len, spec, mask_rng, continuation)
        writer.append(masked, lengths, pairs.a_len, pairs.random_next, chosen=chosen, original=ids, docs=docs)
        orig, new = ids[chosen], masked[chosen]
        s["predictions"] += len(orig)
        s["pred_mask"] += int((new == spec.mask_id).sum())
        s["pred_keep"] += int((new == orig).sum())
    else:
        writer.append(ids, lengths, pairs.a_len, pairs.random_next, docs=docs)
    s["instances"] += len(pairs)
    s["tokens"] += int(lengths.sum())
    s["slots"] += len(pairs) * max_seq_length
    s["truncated"] += int(pairs.truncated.sum())
    s["short_target"] += int(pairs.short_target.sum())
    s["random_next"] += int(pairs.random_next.sum())
    s["forced_random"] += int(pairs.forced.sum())
    s["a_tokens"] += int(pairs.a_len.sum())
    s["b_tokens"] += int(pairs.b_len.sum())
    s["eligible"] += int((lengths - 3).sum())


@functools.lru_cache(maxsize=2)
def _vocab_and_tokenizer(vocab_dir: str):
    """Read once per worker process (a worker runs many tasks)."""
    vocab = read_vocab(Path(vocab_dir) / "vocab.txt")
    return vocab, load_tokenizer(vocab_dir, vocab)


@functools.cache
def _libc():
    """glibc, for ``malloc_trim`` (``None`` elsewhere). Loaded by name: ``ctypes.util.find_library`` would
    spawn ``ldconfig`` every time."""
    try:
        return ctypes.CDLL("libc.so.6")
    except OSError:
        return None


def release_memory() -> None:
    """Hand freed memory back to the OS (Arrow's pool and glibc's heap), so a long-lived worker's RSS
    tracks its current window rather than the largest one it has ever held."""
    import pyarrow as pa

    with contextlib.suppress(Exception):
        pa.default_memory_pool().release_unused()
    libc = _libc()
    if libc is not None and hasattr(libc, "malloc_trim"):
        libc.malloc_trim(0)


def run_task(job: Job) -> dict[str, Any]:
    """Worker: build the job's phases' output shards for one task; return the shards' index entries + stats."""
    p = PretrainDataParams.model_validate(job.params)
    phases = list(job.phases) or p.phases
    vocab, tokenizer = _vocab_and_tokenizer(job.vocab_dir)
    task, split = job.task, job.task.split
    static = p.masking == "static" or split == "heldout"
    dupe = p.dupe_factor if split == "train" else p.heldout_dupe_factor
    sp = vocab.special_ids
    name = f"shard-{task.index:05d}"
    # The shards' files are closed however the task ends (a failed task's worker lives on in the pool).
    with contextlib.ExitStack() as files:
        writers, stats, specs = {}, {}, {}
        for phase in phases:
            ps = p.phase_specs[phase]
            writers[phase] = files.enter_context(
                InstanceShardWriter(
                    Path(job.out_dir) / phase / split,
                    name,
                    vocab.token_dtype,
                    static=static,
                    track_docs=p.track_docs,
                )
            )
            stats[phase] = _new_stats()
            specs[phase] = MaskingSpec(
                masked_lm_prob=p.masked_lm_prob,
                max_predictions_per_seq=ps.max_predictions_per_seq,
                vocab_size=vocab.size,
                mask_id=sp["[MASK]"],
                special_ids=tuple(int(i) for i in vocab.special_id_array),
                whole_word=p.whole_word_masking,
                cls_id=sp["[CLS]"],
                sep_id=sp["[SEP]"],
                pad_id=sp["[PAD]"],
                mask_prob=p.mask_split.mask,
                keep_prob=p.mask_split.keep,
            )
        corpus = {"documents": 0, "sentences": 0, "tokens": 0, "windows": 0}
        # NSP balance carried across windows and passes
        nsp = {phase: NspCounter(offset=job.nsp_offset.get(phase, 0.0)) for phase in phases}
        for w, window in enumerate(iter_windows(task, tokenizer, p.window_tokens, p.min_window_docs)):
            if window.num_docs < 2:
                raise ValueError(
                    f"corpus rows {task.describe()} hold fewer than two non-empty documents; "
                    f"next-sentence prediction needs two (drop empty documents in the corpus stage)"
                )
            corpus["documents"] += window.num_docs
            corpus["sentences"] += len(window.sent_starts) - 1
            corpus["tokens"] += len(window.tokens)
            corpus["windows"] += 1
            for phase in phases:
                t = p.phase_specs[phase].max_seq_length
                for k in range(dupe):
                    pairs = create_pairs(
                        window,
                        max_seq_length=t,
                        short_seq_prob=p.short_seq_prob,
                        random_next_prob=p.random_next_prob,
                        nsp_balance=p.nsp_balance,
                        rng=random.Random(derive_seed(p.seed, phase, split, task.index, w, k, 0)),
                        counter=nsp[phase],
                    )
                    mask_rng = None
                    if static:
                        seed = derive_seed(p.seed, phase, split, task.index, w, k, 1)
                        mask_rng = np.random.Generator(np.random.PCG64(seed))
                    for c in range(0, len(pairs), CHUNK_INSTANCES):
                        _write_chunk(
                            pairs.slice(c, c + CHUNK_INSTANCES),
                            window,
                            t,
                            writers[phase],
                            stats[phase],
                            specs[phase],
                            mask_rng,
                            vocab.continuation,
                            p.track_docs,
                        )
            del window
            release_memory()
        out = {}
        for phase in phases:
            s = stats[phase]
            s["pred_random"] = s["predictions"] - s["pred_mask"] - s["pred_keep"]
            entry = writers[phase].close()
            entry["corpus_rows"] = task.rows()
            out[phase] = {"shard": entry, "stats": s, "nsp_offset": nsp[phase].offset}
        return {"task": task.index, "split": split, "phases": out, "corpus": corpus}
