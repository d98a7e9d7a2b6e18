"""The ``vocab`` stage: a WordPiece vocabulary trained on a bounded sample of the corpus.

The algorithm is that of Hugging Face ``tokenizers``' ``WordPieceTrainer``: frequency-based pair merges
(BPE-style) whose pieces are written with the ``##`` continuation prefix; it is *not* Google's original
WordPiece criterion (merge the pair that most increases the likelihood of a unigram language model of the
training data). The resulting vocab is used exactly like BERT's: greedy longest-match-first segmentation
of each word.

The same corpus and params give the same ``vocab.txt`` and ``tokenizer.json``, byte for byte, in any
process and with any thread count, so a rerun (``dvc repro --force``, a colleague's checkout) reproduces
the lineage the pretraining data was built with. The library's trainer cannot promise that: it numbers
pieces and breaks ties between equally frequent pairs (and between characters at the ``limit_alphabet``
cut) in the order of hash maps whose keys are random per process. So ``tokenizers`` only normalises,
pre-tokenises and counts the words (fast, and exact in any order), and :mod:`bert_core.vocab.wordpiece`
learns the merges from those counts, breaking every tie by a total order (count, then the pieces' text).
The sample is deterministic too: a seeded hash of each ``doc_id``.

Special-token layout (checked against the released ``bert-base-uncased`` vocab, 30,522 entries)::

    [PAD]=0, [unused0..98]=1..99, [UNK]=100, [CLS]=101, [SEP]=102, [MASK]=103, [unused99..993]=104..998

i.e. 994 ``[unused*]`` slots, 99 of them before ``[UNK]``. For another ``vocab_size`` the number of unused
slots is scaled in proportion (``round(994 * vocab_size / 30522)``, at most 99 before ``[UNK]``), so a
30,522 vocab has the released layout exactly and a small vocab does not spend most of its rows on unused
slots; ``num_unused`` sets it explicitly. The unused slots are ordinary vocab entries (like the release),
reserved for tokens a user adds later without resizing the embedding.

Uncased by default (lower-case + strip accents, like ``bert-base-uncased``); ``lowercase: false`` gives a
cased vocab (accents kept, like ``bert-base-cased``).
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import Field, model_validator

from bert_core.atomic import atomic_path
from bert_core.constants import SPECIAL_TOKENS
from bert_core.params import StrictModel

log = logging.getLogger(__name__)

RELEASED_VOCAB_SIZE = 30_522
RELEASED_UNUSED = 994
UNUSED_BEFORE_UNK = 99
CORE_SPECIALS = SPECIAL_TOKENS[1:]  # all but [PAD]: ("[UNK]", "[CLS]", "[SEP]", "[MASK]")


class VocabError(RuntimeError):
    """The vocab cannot be built as asked (e.g. the sample is too small for ``vocab_size``)."""


class VocabParams(StrictModel):
    """Params of the ``vocab`` stage (``params/vocab.yaml``, section ``vocab``).

    Attributes:
        vocab_size: Number of entries, special and unused slots included (BERT: 30,522).
        lowercase: Uncased vocab (lower-case input); ``False`` for a cased vocab.
        strip_accents: Strip accents; ``None`` follows ``lowercase`` (BERT's behaviour).
        num_unused: ``[unused*]`` slots; ``None`` scales the released 994 with ``vocab_size``.
        min_frequency: Minimum pair frequency for a merge.
        limit_alphabet: Most single characters kept in the initial alphabet.
        sample_max_bytes: Upper bound on the UTF-8 bytes of training text sampled from the corpus.
        sample_max_documents: Optional upper bound on sampled documents.
        eval_max_sentences: Held-out sentences used for the unknown-rate / sub-words-per-word metrics.
        model_max_length: ``model_max_length`` written to ``tokenizer_config.json``.
        seed: Seeds the document sample (a hash of ``doc_id``; stable across runs).
        reference_local: Released vocab to compare with, relative to ``BERT_DATA_ROOT`` (local mode).
        reference_hub: Hub model whose ``vocab.txt`` is the comparison (Hub mode); ``null``: no comparison.
        from_checkpoint: Continued pretraining: a Hugging Face BERT directory, Hub id or ``models:/`` URI
            whose tokenizer becomes the vocabulary (copied, not trained) and whose weights initialise the
            ``pretrain`` stage (:mod:`bert_core.vocab.checkpoint`); ``vocab_size`` must then equal its
            vocabulary's size. ``null``: train a WordPiece vocabulary on the corpus.
    """

    vocab_size: int = Field(RELEASED_VOCAB_SIZE, ge=128, le=1_000_000)
    lowercase: bool = True
    strip_accents: bool | None = None
    num_unused: int | None = Field(None, ge=0)
    min_frequency: int = Field(2, ge=1)
    limit_alphabet: int = Field(1000, ge=1)
    sample_max_bytes: int = Field(200_000_000, ge=1_000)
    sample_max_documents: int | None = Field(None, ge=1)
    eval_max_sentences: int = Field(20_000, ge=1)
    model_max_length: int = Field(512, ge=8)
    seed: int = 12345
    reference_local: str | None = "checkpoints/bert-base-uncased/vocab.txt"
    reference_hub: str | None = "google-bert/bert-base-uncased"
    from_checkpoint: str | None = Field(None, min_length=1)

    @model_validator(mode="after")
    def _layout_fits(self) -> VocabParams:
        n = self.unused_slots
        if 1 + len(CORE_SPECIALS) + n >= self.vocab_size // 2:
            raise ValueError(
                f"{n} unused slots + 5 special tokens leave too little room in vocab_size={self.vocab_size}; "
                "lower num_unused or raise vocab_size"
            )
        return self

    @property
    def unused_slots(self) -> int:
        if self.num_unused is not None:
            return self.num_unused
        return round(RELEASED_UNUSED * self.vocab_size / RELEASED_VOCAB_SIZE)

    @property
    def effective_strip_accents(self) -> bool:
        return self.lowercase if self.strip_accents is None else self.strip_accents


def special_layout(num_unused: int) -> list[str]:
    """The leading vocab entries in BERT's order: ``[PAD]``, unused, ``[UNK] [CLS] [SEP] [MASK]``, unused."""
    before = min(UNUSED_BEFORE_UNK, num_unused)
    return (
        ["[PAD]"]
        + [f"[unused{i}]" for i in range(before)]
        + list(CORE_SPECIALS)
        + [f"[unused{i}]" for i in range(before, num_unused)]
    )


def read_vocab(path: str | Path) -> list[str]:
    """Tokens of a ``vocab.txt`` in id order (one per line; a trailing newline is not an entry)."""
    text = Path(path).read_text(encoding="utf-8")
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    return lines


# --- checks --------------------------------------------------------------------------------------------
def vocab_checks(tokens: list[str], vocab_size: int, num_unused: int):
    """Great Expectations checks of a vocab: size, special tokens at their ids, no empty/duplicate entry.

    Returns:
        ``(frame, checks)`` to pass to :func:`bert_core.checks.validate`.
    """
    import great_expectations as gx
    import pandas as pd

    from bert_core.checks import Check

    layout = special_layout(num_unused)
    expected = [layout[i] if i < len(layout) else None for i in range(len(tokens))]
    df = pd.DataFrame({"id": range(len(tokens)), "token": tokens, "expected_special": expected})
    E = gx.expectations
    checks = [
        Check(E.ExpectTableRowCountToEqual(value=vocab_size)),
        Check(E.ExpectColumnValuesToNotBeNull(column="token")),
        Check(E.ExpectColumnValueLengthsToBeBetween(column="token", min_value=1)),
        Check(E.ExpectColumnValuesToNotMatchRegex(column="token", regex=r"\s")),
        Check(E.ExpectColumnValuesToBeUnique(column="token")),
        Check(E.ExpectColumnDistinctValuesToContainSet(column="token", value_set=["[PAD]", *CORE_SPECIALS])),
        Check(
            E.ExpectColumnPairValuesToBeEqual(
                column_A="token", column_B="expected_special", ignore_row_if="either_value_is_missing"
            )
        ),
    ]
    return df, checks


# --- sampling and metrics ------------------------------------------------------------------------------
def _h(doc_id: str, seed: int) -> float:
    d = hashlib.blake2b(doc_id.encode(), digest_size=8, key=str(seed).encode()[:64]).digest()
    return int.from_bytes(d, "little") / 2.0**64


@dataclass
class _Sample:
    documents: int = 0
    sentences: int = 0
    bytes: int = 0
    fraction: float = 1.0


def _sample_batches(corpus_dir: Path, params: VocabParams, sample: _Sample) -> Iterator[list[str]]:
    """Sentences of a seeded, hash-selected subset of train documents, bounded by the sample limits."""
    from bert_core.corpus.shards import iter_documents, read_manifest

    manifest = read_manifest(corpus_dir)
    total = sum(s["bytes"] for s in manifest["splits"]["train"]["shards"]) or 1
    sample.fraction = min(1.0, params.sample_max_bytes / total)
    for doc in iter_documents(corpus_dir, "train", columns=["doc_id", "sentences"]):
        if sample.fraction < 1.0 and _h(doc["doc_id"], params.seed) >= sample.fraction:
            continue
        sents = doc["sentences"]
        n = sum(len(s.encode("utf-8")) for s in sents) + max(len(sents) - 1, 0)
        if sample.bytes + n > params.sample_max_bytes and sample.documents > 0:
            break
        if params.sample_max_documents is not None and sample.documents >= params.sample_max_documents:
            break
        sample.documents += 1
        sample.sentences += len(sents)
        sample.bytes += n
        yield sents


def _heldout_sentences(corpus_dir: Path, limit: int) -> list[str]:
    from bert_core.corpus.shards import iter_documents

    out: list[str] = []
    for doc in iter_documents(corpus_dir, "heldout", columns=["sentences"]):
        out.extend(doc["sentences"][: limit - len(out)])
        if len(out) >= limit:
            break
    return out


def segmentation_stats(tokenizer: Any, sentences: list[str], batch: int = 1024) -> dict[str, float]:
    """Unknown-token rate and sub-words per word of ``tokenizer`` (a ``tokenizers.Tokenizer``) on text.

    Returns:
        ``unk_rate`` ([UNK] pieces / all pieces), ``subwords_per_word`` (pieces / pre-tokenized words),
        ``words_with_unk`` (share of words containing an [UNK] piece), ``tokens``, ``words``.
    """
    unk_id = tokenizer.token_to_id("[UNK]")
    tokens = words = unk = unk_words = 0
    for i in range(0, len(sentences), batch):
        for enc in tokenizer.encode_batch(sentences[i : i + batch], add_special_tokens=False):
            ids = enc.ids
            wids = enc.word_ids
            tokens += len(ids)
            bad = {w for t, w in zip(ids, wids) if t == unk_id}
            unk += sum(1 for t in ids if t == unk_id)
            words += len({w for w in wids if w is not None})
            unk_words += len(bad)
    return {
        "unk_rate": unk / tokens if tokens else 0.0,
        "subwords_per_word": tokens / words if words else 0.0,
        "words_with_unk": unk_words / words if words else 0.0,
        "tokens": tokens,
        "words": words,
    }


# --- training ------------------------------------------------------------------------------------------
@dataclass
class VocabStats:
    """What the stage produced; ``as_metrics()`` is the DVC/MLflow metrics dict."""

    vocab_size: int
    num_unused: int
    lowercase: bool
    sample_documents: int
    sample_sentences: int
    sample_bytes: int
    sample_fraction: float
    heldout: dict[str, float]
    reference: dict[str, float] | None
    continuation_pieces: int
    train_seconds: float
    check_report: Any = None
    checkpoint: dict[str, Any] | None = None

    def as_metrics(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "vocab_size": self.vocab_size,
            "num_unused": self.num_unused,
            "lowercase": int(self.lowercase),
            "sample_documents": self.sample_documents,
            "sample_sentences": self.sample_sentences,
            "sample_bytes": self.sample_bytes,
            "sample_fraction": round(self.sample_fraction, 6),
            "continuation_pieces": self.continuation_pieces,
            "heldout": {k: round(v, 6) if isinstance(v, float) else v for k, v in self.heldout.items()},
            "train_seconds": round(self.train_seconds, 3),
            "checks_failed": len(self.check_report.failed) if self.check_report is not None else 0,
        }
        if self.checkpoint is not None:
            out["checkpoint"] = dict(self.checkpoint)
        if self.reference is not None:
            out["reference_bert_base_uncased"] = {
                k: round(v, 6) if isinstance(v, float) else v for k, v in self.reference.items()
            }
        return out


def _bert_tokenizer(vocab_file: Path, lowercase: bool, strip_accents: bool):
    from tokenizers.implementations import BertWordPieceTokenizer

    return BertWordPieceTokenizer(
        str(vocab_file),
        lowercase=lowercase,
        strip_accents=strip_accents,
        clean_text=True,
        handle_chinese_chars=True,
    )


def _hf_files(out: Path, params: VocabParams) -> None:
    specials = {
        "unk_token": "[UNK]",
        "sep_token": "[SEP]",
        "pad_token": "[PAD]",
        "cls_token": "[CLS]",
        "mask_token": "[MASK]",
    }
    config = {
        "tokenizer_class": "BertTokenizer",
        "do_lower_case": params.lowercase,
        "strip_accents": params.strip_accents,
        "tokenize_chinese_chars": True,
        "clean_up_tokenization_spaces": True,
        "model_max_length": params.model_max_length,
        **specials,
    }
    (out / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")
    (out / "special_tokens_map.json").write_text(json.dumps(specials, indent=2) + "\n", encoding="utf-8")


def train_vocab(
    params: VocabParams,
    corpus_dir: str | Path,
    out_dir: str | Path,
    *,
    reference_vocab: str | Path | None = None,
    report_dir: str | Path | None = None,
) -> VocabStats:
    """Train a WordPiece vocab on a sample of ``corpus_dir``'s train split and write it to ``out_dir``.

    ``out_dir`` receives ``vocab.txt``, ``tokenizer.json``, ``tokenizer_config.json`` and
    ``special_tokens_map.json`` (loadable by ``BertTokenizerFast``/``AutoTokenizer.from_pretrained`` and
    ``tokenizers.Tokenizer.from_file``), atomically and only after the checks pass.

    Args:
        params: Stage params.
        corpus_dir: A directory written by :func:`bert_core.corpus.build_corpus`.
        out_dir: Output directory (replaced atomically).
        reference_vocab: Optional released ``vocab.txt`` (uncased) to compare held-out metrics with.
        report_dir: Where to write the data-check report (Data Docs HTML).

    Raises:
        FileNotFoundError: ``corpus_dir`` is not a built corpus, or ``reference_vocab`` is missing.
        VocabError: the sample is empty or too small to reach ``vocab_size``.
        bert_core.checks.DataCheckError: a critical vocab check failed.
    """
    from tokenizers import Tokenizer, normalizers, pre_tokenizers

    from bert_core.checks import validate
    from bert_core.vocab.wordpiece import WordCountError, count_words, learn_wordpiece

    corpus_dir, out_dir = Path(corpus_dir), Path(out_dir)
    if reference_vocab is not None and not Path(reference_vocab).is_file():
        raise FileNotFoundError(f"reference vocab {reference_vocab} not found")
    strip = params.effective_strip_accents
    layout = special_layout(params.unused_slots)
    sample = _Sample()
    t0 = time.perf_counter()
    try:
        word_counts = count_words(
            _sample_batches(corpus_dir, params, sample),
            normalizers.BertNormalizer(
                clean_text=True, handle_chinese_chars=True, strip_accents=strip, lowercase=params.lowercase
            ),
            pre_tokenizers.BertPreTokenizer(),
        )
    except WordCountError as err:
        raise VocabError(str(err)) from None
    if sample.documents == 0:
        raise VocabError(f"{corpus_dir}: the train split has no documents to learn a vocab from")
    tokens = learn_wordpiece(
        word_counts,
        vocab_size=params.vocab_size,
        special_tokens=layout,
        min_frequency=params.min_frequency,
        limit_alphabet=params.limit_alphabet,
        prefix="##",
    )
    train_s = time.perf_counter() - t0
    if len(tokens) < params.vocab_size:
        raise VocabError(
            f"the sample ({sample.documents} documents, {sample.bytes} bytes) yields only {len(tokens)} "
            f"WordPiece entries, fewer than vocab.vocab_size={params.vocab_size}; lower vocab_size or "
            "min_frequency, or build a larger corpus / raise vocab.sample_max_bytes"
        )
    log.info("vocab: trained %d entries on %d documents in %.1fs", len(tokens), sample.documents, train_s)

    with atomic_path(out_dir, is_dir=True) as tmp:
        (tmp / "vocab.txt").write_text("\n".join(tokens) + "\n", encoding="utf-8")
        final_tok = _bert_tokenizer(tmp / "vocab.txt", params.lowercase, strip)
        final_tok.save(str(tmp / "tokenizer.json"))
        _hf_files(tmp, params)
        written = read_vocab(tmp / "vocab.txt")
        df, checks = vocab_checks(written, params.vocab_size, params.unused_slots)
        report = validate(df, "vocab", checks, report_dir=report_dir)
        report.raise_for_critical()

        heldout = _heldout_sentences(corpus_dir, params.eval_max_sentences)
        ours = segmentation_stats(Tokenizer.from_file(str(tmp / "tokenizer.json")), heldout)
        ours["sentences"] = len(heldout)
        reference = None
        if reference_vocab is not None:
            ref_tok = _bert_tokenizer(Path(reference_vocab), True, True)
            reference = segmentation_stats(ref_tok._tokenizer, heldout)
    return VocabStats(
        vocab_size=len(written),
        num_unused=params.unused_slots,
        lowercase=params.lowercase,
        sample_documents=sample.documents,
        sample_sentences=sample.sentences,
        sample_bytes=sample.bytes,
        sample_fraction=sample.fraction,
        heldout=ours,
        reference=reference,
        continuation_pieces=sum(1 for t in written if t.startswith("##")),
        train_seconds=train_s,
        check_report=report,
    )
