"""Typed params of the ``corpus`` stage (``params/corpus.yaml``, section ``corpus``).

Two source lists are declared side by side so the Hub default and its local equivalent are both visible:
``sources`` is used when ``BERT_DATA_ROOT`` is unset (Hugging Face Hub), ``local_sources`` when it is set
(paths relative to the data root, no network). Everything else applies to whichever list is active.
"""

from __future__ import annotations

import os
import re
from typing import Literal

from pydantic import Field, field_validator, model_validator

from bert_core.corpus.compressed import SUFFIX
from bert_core.params import StrictModel

SourceKind = Literal["hf", "text", "jsonl", "parquet", "wikipedia_xml"]

# How a source's raw records become documents.
#   file:        one document per file (books)
#   blank_lines: documents separated by one or more blank lines in a text file
#   wikitext:    WikiText layout: a document starts at each top-level " = Title = " line
#   row:         one document per record (JSONL line, Parquet row, Hub dataset row, wiki page)
DocSplit = Literal["file", "blank_lines", "wikitext", "row"]

_DOC_SPLITS: dict[str, tuple[str, ...]] = {
    "text": ("file", "blank_lines", "wikitext"),
    "hf": ("row", "wikitext"),
    "jsonl": ("row",),
    "parquet": ("row",),
    "wikipedia_xml": ("row",),
}
_DEFAULT_SPLIT = {"text": "file", "hf": "row", "jsonl": "row", "parquet": "row", "wikipedia_xml": "row"}
#: The files a folder source reads by default, per kind (compressed ones too).
DEFAULT_PATTERNS = {
    kind: tuple(f"*.{ext}{c}" for c in ("", *SUFFIX.values()))
    for kind, ext in (("text", "txt"), ("jsonl", "jsonl"), ("wikipedia_xml", "xml"))
} | {"hf": (), "parquet": ("*.parquet",)}
_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")


class SourceSpec(StrictModel):
    """One input source.

    Attributes:
        name: Short unique name; every ``doc_id`` of this source starts with ``<name>:``.
        kind: ``hf`` (a Hugging Face dataset), ``text`` (text files or folders), ``jsonl``, ``parquet`` or
            ``wikipedia_xml`` (a MediaWiki XML dump, ``.xml`` or ``.xml.bz2``).
        path: Dataset id for ``hf``; otherwise a file, a folder or a glob (relative to the data root for
            ``local_sources``). Text/JSONL/XML files may be compressed: ``.gz``, ``.bz2``, ``.xz``,
            ``.zst`` (:mod:`bert_core.corpus.compressed`).
        config: Dataset config name (``hf`` only), e.g. ``wikitext-103-raw-v1``.
        revision: Dataset revision (git commit/tag on the Hub) to pin (``hf`` only).
        split: Dataset split (``hf`` only).
        text_field: Field holding the text (``hf``, ``jsonl``, ``parquet``).
        id_field: Optional field with a stable record id (default: file and line/row number; for an ``hf``
            dataset of several data files, ``<split>:<data file>:<row in it>``: it is read one data file
            a work unit, in parallel, kept file by file).
        title_field: Optional field with the document title.
        doc_split: How records become documents (see ``DocSplit``); default depends on ``kind``.
        newlines: ``wrap``: lines are hard-wrapped, paragraphs are separated by blank lines (books);
            ``paragraph``: every line is a paragraph (Wikipedia extracts). Default: ``wrap`` for ``text``.
        pattern: File name glob used when ``path`` is a folder (default: the kind's own files, compressed
            ones too: :data:`DEFAULT_PATTERNS`).
        exclude: File name globs never read (e.g. ``MANIFEST.tsv``).
        max_documents: Optional cap on documents kept from this source (deterministic: input order).
        max_bytes: Optional cap on UTF-8 text bytes kept from this source.
    """

    name: str
    kind: SourceKind
    path: str = Field(min_length=1)
    config: str | None = None
    revision: str | None = None
    split: str = "train"
    text_field: str = "text"
    id_field: str | None = None
    title_field: str | None = None
    doc_split: DocSplit | None = None
    newlines: Literal["wrap", "paragraph"] | None = None
    pattern: str | None = None
    exclude: tuple[str, ...] = ("MANIFEST.tsv",)
    max_documents: int | None = Field(None, ge=1)
    max_bytes: int | None = Field(None, ge=1)

    @field_validator("name")
    @classmethod
    def _name_ok(cls, v: str) -> str:
        if not _NAME_RE.match(v):
            raise ValueError("must be letters, digits, '_', '.', '-' (it prefixes every doc_id)")
        return v

    @model_validator(mode="after")
    def _split_ok(self) -> SourceSpec:
        if self.doc_split is not None and self.doc_split not in _DOC_SPLITS[self.kind]:
            raise ValueError(
                f"doc_split {self.doc_split!r} is not valid for kind {self.kind!r}; "
                f"use one of {list(_DOC_SPLITS[self.kind])}"
            )
        if self.kind != "hf" and (self.config is not None or self.revision is not None):
            raise ValueError("'config' and 'revision' are only valid for kind 'hf'")
        return self

    @property
    def patterns(self) -> tuple[str, ...]:
        """The file name globs a folder ``path`` is read with."""
        return (self.pattern,) if self.pattern else DEFAULT_PATTERNS[self.kind]

    @property
    def effective_doc_split(self) -> str:
        return self.doc_split or _DEFAULT_SPLIT[self.kind]

    @property
    def effective_newlines(self) -> str:
        return self.newlines or ("wrap" if self.kind == "text" else "paragraph")


class CleanParams(StrictModel):
    """Document cleaning and filtering.

    Attributes:
        unicode_form: Unicode normalisation form applied to every document.
        strip_gutenberg: Remove Project Gutenberg licence headers/footers when their markers are present.
        min_doc_chars: Documents shorter than this (after cleaning) are dropped (``too_short``).
        max_doc_chars: Documents longer than this are dropped (``too_long``); also bounds memory per document.
        min_sentences: Documents with fewer sentences are dropped (``too_few_sentences``).
        max_sentence_chars: Longer "sentences" (tables, 50 MB lines) are cut at whitespace into pieces.
        dedup: Drop exact duplicate documents (same cleaned text), keeping the first in input order.
    """

    unicode_form: Literal["NFC", "NFKC"] = "NFC"
    strip_gutenberg: bool = True
    min_doc_chars: int = Field(200, ge=1)
    max_doc_chars: int = Field(20_000_000, ge=1)
    min_sentences: int = Field(1, ge=1)
    max_sentence_chars: int = Field(2_000, ge=16)
    dedup: bool = True

    @model_validator(mode="after")
    def _range_ok(self) -> CleanParams:
        if self.min_doc_chars > self.max_doc_chars:
            raise ValueError(f"min_doc_chars ({self.min_doc_chars}) > max_doc_chars ({self.max_doc_chars})")
        return self


class CapParams(StrictModel):
    """Optional global caps for small profiles (applied in input order, so deterministic)."""

    max_documents: int | None = Field(None, ge=1)
    max_bytes: int | None = Field(None, ge=1)


class HeldoutParams(StrictModel):
    """Held-out split of whole documents, chosen by a seeded hash of ``doc_id`` (stable across runs).

    When no document hashes into it (a tiny corpus), the first train document is moved there instead, so
    any corpus of two or more documents gets both splits (the pretraining data needs two in each: NotNext
    segments come from another document).

    Attributes:
        fraction: Share of documents sent to the held-out split.
        max_documents: The held-out split stops growing here; later picks go to train.
    """

    fraction: float = Field(0.01, gt=0.0, lt=1.0)
    max_documents: int = Field(500, ge=1)


class CorpusParams(StrictModel):
    """Params of the ``corpus`` stage.

    ``workers`` does not change the output (shards are identical for any worker count), so ``dvc.yaml``
    deliberately does not list it: changing it does not invalidate the stage.
    """

    sources: tuple[SourceSpec, ...] = Field(min_length=1)
    local_sources: tuple[SourceSpec, ...] = Field(min_length=1)
    clean: CleanParams = CleanParams()
    segmenter: Literal["blingfire", "lines"] = "blingfire"
    cap: CapParams = CapParams()
    heldout: HeldoutParams = HeldoutParams()
    shard_max_bytes: int = Field(64_000_000, ge=1_000)
    on_bad_record: Literal["skip", "error"] = "skip"
    seed: int = Field(12345, ge=0)
    workers: int = Field(2, ge=1, le=256)

    @field_validator("sources", "local_sources")
    @classmethod
    def _unique_names(cls, v: tuple[SourceSpec, ...]) -> tuple[SourceSpec, ...]:
        names = [s.name for s in v]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise ValueError(f"source names must be unique; repeated: {dupes}")
        return v

    def active_sources(self, data_root: str | os.PathLike[str] | None) -> tuple[SourceSpec, ...]:
        """The sources a build reads: ``local_sources`` under a local data root, else the Hub ``sources``."""
        return self.local_sources if data_root is not None else self.sources

    def output_hash_payload(self) -> dict:
        """The params that determine the output (everything except ``workers``)."""
        return self.model_dump(mode="json", exclude={"workers"})
