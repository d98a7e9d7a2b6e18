"""The plan of a ``pretrain_data`` build: a corpus split cut into tasks of consecutive documents by bytes.

The plan depends on the corpus and the params only, never on the worker count, so every seed and every output
byte do not either; it is made from the Parquet metadata and one ``sentences`` column at a time.
"""

from __future__ import annotations

import itertools
from pathlib import Path

import numpy as np

from bert_core.pretrain_data.worker import BuildUnit

MIN_TASK_DOCS = 2  # NSP draws NotNext segments from another document of the same task


def _row_bytes(pf, group: int) -> np.ndarray:
    """Text bytes of each document in one row group (only the ``sentences`` column is decoded)."""
    import pyarrow.compute as pc

    col = pf.read_row_group(group, columns=["sentences"]).column(0).combine_chunks()
    lens = pc.fill_null(pc.binary_length(pc.list_flatten(col)), 0).to_numpy(zero_copy_only=False)
    parents = pc.list_parent_indices(col).to_numpy(zero_copy_only=False)
    return np.bincount(parents, weights=lens, minlength=len(col)).astype(np.int64)


def plan_tasks(corpus_dir: str | Path, split: str, task_bytes: int) -> list[BuildUnit]:
    """Cut the split's documents (all ``part-*.parquet`` files in name order, read as one stream) into
    tasks of consecutive documents holding about ``task_bytes`` bytes of text each.

    A task closes after the document that brings it to ``task_bytes`` (so a task may span shards and a
    shard may hold many tasks), provided it and the rest of the split keep at least two documents. The
    plan depends on the corpus and the params only, never on the worker count; planning reads one row
    group at a time and keeps only the cut points.

    Raises:
        FileNotFoundError: the split directory does not exist.
        ValueError: no shard, no document, a single document (NSP needs two), or a shard without a
            ``sentences`` list<string> column.
    """
    import pyarrow as pa

    d = Path(corpus_dir) / split
    if not d.is_dir():
        raise FileNotFoundError(f"corpus split directory {d} not found; run the corpus stage first")
    files = sorted(d.glob("part-*.parquet"))
    if not files:
        raise ValueError(f"empty corpus: {d} has no part-*.parquet shard; run the corpus stage first")
    rows = []
    from bert_core.corpus.shards import open_shard, shard_error

    for f in files:
        shard = open_shard(f)
        schema = shard.schema_arrow
        col = schema.field("sentences").type if "sentences" in schema.names else None
        if col is None or not (pa.types.is_list(col) or pa.types.is_large_list(col)):
            raise ValueError(
                f"{f}: needs a 'sentences' column of type list<string> (one document per row); "
                f"found columns {schema.names}"
            )
        rows.append(shard.metadata.num_rows)
    total = sum(rows)
    if total == 0:
        raise ValueError(f"empty corpus: the {len(files)} shard(s) in {d} hold no document")
    if total < 2:
        raise ValueError(
            f"the corpus split {d} holds a single document; next-sentence prediction takes NotNext "
            f"segments from another document, so it needs at least two (four in the whole corpus). In "
            "params/corpus.yaml: add documents, cut long ones into several (a text source's `doc_split: "
            "blank_lines`), or raise corpus.heldout.fraction so that two go to the held-out split"
        )
    cuts, row, held, first = [0], 0, 0, 0
    for f in files:
        pf = open_shard(f)
        for g in range(pf.metadata.num_row_groups):
            try:
                sizes = _row_bytes(pf, g).tolist()
            except (pa.ArrowException, OSError) as err:
                raise shard_error(f, err) from err
            for size in sizes:
                row += 1
                held += size
                if held >= task_bytes and row - first >= MIN_TASK_DOCS and total - row >= MIN_TASK_DOCS:
                    cuts.append(row)
                    held, first = 0, row
    cuts.append(total)
    starts = np.concatenate([[0], np.cumsum(rows)])
    tasks = []
    for k, (lo, hi) in enumerate(itertools.pairwise(cuts)):
        segments = []
        for i, f in enumerate(files):
            a, b = max(lo, starts[i]), min(hi, starts[i + 1])
            if b > a:
                segments.append((str(f), int(a - starts[i]), int(b - starts[i])))
        tasks.append(BuildUnit(split, k, tuple(segments), hi - lo))
    return tasks
