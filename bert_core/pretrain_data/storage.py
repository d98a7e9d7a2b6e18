"""On-disk format of the pretraining instances: flat, memory-mappable shards plus ``index.json``.

One output directory (``<out>/<phase>/<split>/``) holds::

    index.json                      format, counts, vocab size + sha256, lengths, masking, params, shards
    vocab.txt                       copy of the vocabulary the ids refer to
    shard-NNNNN.tokens.bin          (total_tokens,) uint16|int32  ids of all instances back to back, no
                                    padding: [CLS] A [SEP] B [SEP] (masked when masking is static)
    shard-NNNNN.offsets.bin         (n + 1,) int64   instance i is tokens[offsets[i]:offsets[i+1]]
    shard-NNNNN.len_a.bin           (n,) uint16      tokens of segment A (the first [SEP] is at len_a + 1)
    shard-NNNNN.nsp.bin             (n,) uint8       1 = NotNext (B from another document), 0 = IsNext
    shard-NNNNN.mlm_offsets.bin     (n + 1,) int64   static masking only: predictions of instance i are
    shard-NNNNN.mlm_pos.bin         (total_preds,) uint16         mlm_pos/mlm_labels[mlm_offsets[i]:...]
    shard-NNNNN.mlm_labels.bin      (total_preds,) uint16|int32   (positions ascending, original ids)
    shard-NNNNN.docs.bin            (n, 2) int64     debug (track_docs): corpus row of A's and B's document

All arrays are little-endian raw ``.bin`` files (``numpy.memmap``-able); their dtypes and lengths are in
``index.json`` so a reader never guesses. Segment ids are not stored: they are 0 up to and including the
first [SEP] and 1 after it.

:class:`InstanceStore` checks what it opens once, before the first batch: each file's size against
``index.json``, its checksum against the output's manifest (:func:`bert_core.integrity.verify_output`), and
the ranges the gather relies on (offsets that start at 0, never decrease and end at the recorded count;
token ids below ``vocab_size``; prediction positions inside the sequence), so a damaged file, even one with
no recorded checksum, is refused by name instead of failing later as an index error inside a batch.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from bert_core.constants import IGNORE_INDEX
from bert_core.integrity import corrupt, verify_output

FORMAT = "bert-pretrain-data"
FORMAT_VERSION = 1


class InstanceShardWriter:
    """Appends instances to one shard's files as they are produced (nothing is held back in memory)."""

    def __init__(self, directory: Path, name: str, token_dtype: str, *, static: bool, track_docs: bool):
        self.directory, self.name = Path(directory), name
        self.token_dtype = np.dtype(token_dtype)
        self.static, self.track_docs = static, track_docs
        self.num_instances = self.num_tokens = self.num_predictions = 0
        self._files: dict[str, Any] = {}
        names = ["tokens", "offsets", "len_a", "nsp"]
        names += ["mlm_offsets", "mlm_pos", "mlm_labels"] if static else []
        names += ["docs"] if track_docs else []
        self.directory.mkdir(parents=True, exist_ok=True)
        for key in names:
            self._files[key] = open(self.directory / f"{name}.{key}.bin", "wb")  # noqa: SIM115
        self._write("offsets", np.zeros(1, np.int64))
        if static:
            self._write("mlm_offsets", np.zeros(1, np.int64))

    def __enter__(self) -> InstanceShardWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        """The files closed also when the shard is abandoned (:meth:`close` gives the index entry)."""
        for f in self._files.values():
            f.close()

    def _write(self, key: str, arr: np.ndarray) -> None:
        self._files[key].write(np.ascontiguousarray(arr).tobytes())

    def append(
        self,
        ids: np.ndarray,
        lengths: np.ndarray,
        len_a: np.ndarray,
        random_next: np.ndarray,
        *,
        chosen: np.ndarray | None = None,
        original: np.ndarray | None = None,
        docs: np.ndarray | None = None,
    ) -> None:
        """Write a block of instances.

        Args:
            ids: ``(N, T)`` ids as they go to the model (masked when static), padded.
            lengths: ``(N,)`` unpadded lengths.
            len_a: ``(N,)`` segment A lengths.
            random_next: ``(N,)`` bool, NotNext.
            chosen: ``(N, T)`` bool masked positions (static masking).
            original: ``(N, T)`` unmasked ids (static masking; the labels).
            docs: ``(N, 2)`` corpus rows of A's and B's documents (track_docs).
        """
        n = len(lengths)
        if n == 0:
            return
        real = np.arange(ids.shape[1])[None, :] < lengths[:, None]
        self._write("tokens", ids[real].astype(self.token_dtype))
        self._write("offsets", self.num_tokens + np.cumsum(lengths, dtype=np.int64))
        self._write("len_a", len_a.astype(np.uint16))
        self._write("nsp", random_next.astype(np.uint8))
        if self.static:
            assert chosen is not None and original is not None
            rows, cols = np.nonzero(chosen)  # row-major: positions ascend within a row
            per_row = np.bincount(rows, minlength=n)
            self._write("mlm_offsets", self.num_predictions + np.cumsum(per_row, dtype=np.int64))
            self._write("mlm_pos", cols.astype(np.uint16))
            self._write("mlm_labels", original[rows, cols].astype(self.token_dtype))
            self.num_predictions += len(rows)
        if self.track_docs:
            assert docs is not None
            self._write("docs", docs.astype(np.int64))
        self.num_instances += n
        self.num_tokens += int(lengths.sum())

    def close(self) -> dict[str, Any]:
        """Close the files; return the shard's entry for ``index.json``."""
        for f in self._files.values():
            f.close()
        return {
            "name": self.name,
            "num_instances": self.num_instances,
            "num_tokens": self.num_tokens,
            "num_predictions": self.num_predictions,
        }


def read_index(data_dir: str | Path) -> dict[str, Any]:
    """Read and sanity-check ``<data_dir>/index.json``.

    Raises:
        FileNotFoundError: no index (the stage has not run, or the path is wrong).
        ValueError: not this format, or a newer format version.
    """
    return read_index_with_digest(data_dir)[0]


def read_index_with_digest(data_dir: str | Path) -> tuple[dict[str, Any], str]:
    """:func:`read_index` and the sha256 of the file's bytes, from one read.

    The digest identifies the data (the index lists every shard with its counts and the params that built
    it), e.g. for the checkpoint fingerprint of a pretraining phase.
    """
    data_dir = Path(data_dir)
    path = data_dir / "index.json"
    if not path.is_file():
        raise FileNotFoundError(
            f"{path} not found: {data_dir} is not a pretraining data directory (expected e.g. "
            f"data/pretrain_data/seq128/train); build it with `dvc repro pretrain_data`"
        )
    verify_output(data_dir, [path])
    raw = path.read_bytes()
    try:
        index = json.loads(raw.decode("utf-8"))
    except ValueError as err:
        raise corrupt(path, f"it is not valid JSON ({err})") from err
    if index.get("format") != FORMAT:
        raise ValueError(f"{path}: format {index.get('format')!r} is not {FORMAT!r}")
    if index.get("format_version", 0) > FORMAT_VERSION:
        raise ValueError(
            f"{path}: format version {index['format_version']} is newer than this code reads "
            f"({FORMAT_VERSION}); update the code or rebuild the data"
        )
    return index, hashlib.sha256(raw).hexdigest()


def _ranges(starts: np.ndarray, ends: np.ndarray, width: int) -> tuple[np.ndarray, np.ndarray]:
    """``(n, width)`` indices ``starts[i] + j`` (clamped to ``starts[i]`` past the end) and the mask
    ``j < ends[i] - starts[i]``."""
    j = np.arange(width)[None, :]
    valid = j < (ends - starts)[:, None]
    return starts[:, None] + np.where(valid, j, 0), valid


def _check_offsets(offsets: np.ndarray, total: int, longest: int, path: str) -> None:
    """Offsets start at 0, end at ``total``, and no step is negative or longer than ``longest``."""
    if offsets[0] != 0 or offsets[-1] != total:
        raise corrupt(path, f"offsets run from {offsets[0]} to {offsets[-1]}, expected 0 to {total}")
    steps = np.diff(offsets)
    bad = np.flatnonzero((steps < 0) | (steps > longest))
    if bad.size:
        raise corrupt(
            path,
            f"entry {bad[0]} spans {steps[bad[0]]} items, outside [0, {longest}] (offsets must not decrease)",
        )


def _check_ids(ids: np.ndarray, limit: int, path: str, what: str = "token id") -> None:
    """Every value lies in ``[0, limit)`` (``limit``: ``vocab_size`` for ids, ``max_seq_length`` for positions)."""
    if not ids.size:
        return
    low, high = (int(ids.min()) if ids.dtype.kind == "i" else 0), int(ids.max())
    if low < 0 or high >= limit:
        bad = high if high >= limit else low
        at = int(np.flatnonzero(ids == bad)[0])
        raise corrupt(path, f"{what} {bad} at position {at} is outside [0, {limit}) given by index.json")


@dataclass
class _Shard:
    name: str
    n: int
    arrays: dict[str, np.ndarray]


class InstanceStore:
    """Random access to the instances of one output directory (memory-mapped, nothing loaded up front).

    Args:
        data_dir: A directory written by the builder (holds ``index.json``).
        index: Its parsed ``index.json`` when the caller has read it already (:func:`read_index`).
        verify: Check checksums and ranges on open (:meth:`_verify`). The data checks
            (:mod:`.checks`) pass False: they test the same ranges row by row and report them as failed
            expectations.
    """

    def __init__(self, data_dir: str | Path, index: dict[str, Any] | None = None, *, verify: bool = True):
        self.data_dir = Path(data_dir)
        self.index = read_index(self.data_dir) if index is None else index
        self.max_seq_length: int = self.index["max_seq_length"]
        self.vocab_size: int = self.index["vocab_size"]
        self.static: bool = self.index["masking"] == "static"
        token_dtype = np.dtype(self.index["token_dtype"])
        self.shards: list[_Shard] = []
        for meta in self.index["shards"]:
            n, name = meta["num_instances"], meta["name"]
            spec = {
                "tokens": (token_dtype, meta["num_tokens"]),
                "offsets": (np.int64, n + 1),
                "len_a": (np.uint16, n),
                "nsp": (np.uint8, n),
            }
            if self.static:
                spec |= {
                    "mlm_offsets": (np.int64, n + 1),
                    "mlm_pos": (np.uint16, meta["num_predictions"]),
                    "mlm_labels": (token_dtype, meta["num_predictions"]),
                }
            if self.index.get("track_docs"):
                spec["docs"] = (np.int64, 2 * n)
            arrays = {}
            for key, (dtype, count) in spec.items():
                path = self.data_dir / f"{name}.{key}.bin"
                expected = count * np.dtype(dtype).itemsize
                size = path.stat().st_size if path.is_file() else -1
                if size != expected:
                    raise ValueError(
                        f"{path}: expected {expected} bytes per index.json, found "
                        f"{'no file' if size < 0 else f'{size} bytes'}; the data directory is "
                        f"incomplete or corrupt, rebuild it with `dvc repro pretrain_data`"
                    )
                arrays[key] = np.memmap(path, dtype=dtype, mode="r") if count else np.zeros(0, dtype)
            if "docs" in arrays:
                arrays["docs"] = arrays["docs"].reshape(n, 2)
            self.shards.append(_Shard(name, n, arrays))
        if verify:
            self._verify()
        self.cum = np.cumsum([0] + [s.n for s in self.shards], dtype=np.int64)

    def _verify(self) -> None:
        """Checksums (when the output has a manifest) and ranges of every file, once per open.

        Raises:
            CorruptOutputError: naming the damaged file and what is wrong with it.
        """
        files = [self.data_dir / f"{s.name}.{key}.bin" for s in self.shards for key in s.arrays]
        if (self.data_dir / "vocab.txt").is_file():
            files.append(self.data_dir / "vocab.txt")
        verify_output(self.data_dir, files)
        for shard in self.shards:
            a = shard.arrays
            path = self.data_dir / shard.name
            _check_offsets(a["offsets"], int(a["tokens"].size), self.max_seq_length, f"{path}.offsets.bin")
            _check_ids(a["tokens"], self.vocab_size, f"{path}.tokens.bin")
            if self.static:
                _check_offsets(
                    a["mlm_offsets"], int(a["mlm_pos"].size), self.max_seq_length, f"{path}.mlm_offsets.bin"
                )
                _check_ids(
                    a["mlm_pos"], self.max_seq_length, f"{path}.mlm_pos.bin", what="prediction position"
                )
                _check_ids(a["mlm_labels"], self.vocab_size, f"{path}.mlm_labels.bin")

    def __len__(self) -> int:
        return int(self.cum[-1])

    def gather(self, idx: np.ndarray, pad_id: int = 0) -> dict[str, np.ndarray]:
        """Instances ``idx`` (global numbers), padded to ``max_seq_length``.

        Returns:
            ``ids`` ``(n, T)`` int64, ``lengths`` ``(n,)``, ``len_a`` ``(n,)``, ``nsp`` ``(n,)`` int64;
            with static masking ``labels`` ``(n, T)`` int64 (:data:`IGNORE_INDEX` where not predicted);
            with track_docs ``docs`` ``(n, 2)``.
        """
        idx = np.asarray(idx, dtype=np.int64)
        n, t = len(idx), self.max_seq_length
        ids = np.full((n, t), pad_id, dtype=np.int64)
        lengths = np.zeros(n, np.int64)
        len_a = np.zeros(n, np.int64)
        nsp = np.zeros(n, np.int64)
        labels = np.full((n, t), IGNORE_INDEX, dtype=np.int64) if self.static else None
        docs = np.zeros((n, 2), np.int64) if self.index.get("track_docs") else None
        shard_of = np.searchsorted(self.cum, idx, side="right") - 1
        if n and (idx.min() < 0 or idx.max() >= len(self)):
            raise IndexError(f"instance numbers must be in [0, {len(self)})")
        for s in np.unique(shard_of):
            rows = np.flatnonzero(shard_of == s)
            a = self.shards[s].arrays
            local = idx[rows] - self.cum[s]
            starts, ends = a["offsets"][local], a["offsets"][local + 1]
            lengths[rows] = ends - starts
            len_a[rows] = a["len_a"][local]
            nsp[rows] = a["nsp"][local]
            src, valid = _ranges(starts, ends, t)  # one vectorised gather per shard
            ids[rows] = np.where(valid, a["tokens"][src], pad_id)
            if labels is not None:
                ps, pe = a["mlm_offsets"][local], a["mlm_offsets"][local + 1]
                src, valid = _ranges(ps, pe, int((pe - ps).max(initial=0)))
                r = np.broadcast_to(rows[:, None], valid.shape)[valid]
                labels[r, a["mlm_pos"][src[valid]]] = a["mlm_labels"][src[valid]]
            if docs is not None:
                docs[rows] = a["docs"][local]
        out = {"ids": ids, "lengths": lengths, "len_a": len_a, "nsp": nsp}
        if labels is not None:
            out["labels"] = labels
        if docs is not None:
            out["docs"] = docs
        return out
