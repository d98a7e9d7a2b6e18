"""The vocab stage's artifact as its consumers read it: special ids, size, a content hash and a fast tokenizer.

Used by the ``pretrain_data`` stage (builder, checks, loader) and the ``pretrain`` stage.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from bert_core.constants import SPECIAL_TOKENS
from bert_core.integrity import verify_output


@dataclass(frozen=True)
class VocabInfo:
    """What the builder, the checks and the loader need to know about ``vocab.txt``.

    Attributes:
        path: The ``vocab.txt`` file (one WordPiece per line; the line number is the id).
        size: Number of entries (the model's ``vocab_size`` must equal it).
        sha256: Hash of the file's bytes (recorded with the data).
        special_ids: ``{"[PAD]": 0, "[CLS]": 101, ...}`` for :data:`SPECIAL_TOKENS`.
        continuation: ``(size,)`` bool, true for ``##`` word-continuation pieces (whole-word masking).
    """

    path: Path
    size: int
    sha256: str
    special_ids: dict[str, int]
    continuation: np.ndarray

    @property
    def token_dtype(self) -> str:
        """``uint16`` when every id fits in 16 bits, else ``int32``."""
        return "uint16" if self.size <= 65535 else "int32"

    @property
    def special_id_array(self) -> np.ndarray:
        return np.array(sorted(self.special_ids.values()), dtype=np.int64)


def read_vocab(path: str | Path) -> VocabInfo:
    """Read ``vocab.txt`` and check that the special tokens BERT needs are present.

    Raises:
        FileNotFoundError: the file does not exist.
        ValueError: the file is empty, not UTF-8, repeats an entry, or lacks one of :data:`SPECIAL_TOKENS`.
        CorruptOutputError: the file differs from what its stage wrote (its output's checksum).
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(
            f"vocabulary file {path} not found; run the vocab stage first (dvc repro vocab)"
        )
    verify_output(path.parent, [path])
    raw = path.read_bytes()
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as err:
        raise ValueError(f"{path}: not UTF-8 (byte {err.start}); a vocab.txt must be UTF-8") from None
    tokens = text.split("\n")
    if tokens and tokens[-1] == "":
        tokens.pop()
    tokens = [t.rstrip("\r") for t in tokens]
    if not tokens:
        raise ValueError(f"{path}: the vocabulary is empty")
    index: dict[str, int] = {}
    for i, t in enumerate(tokens):
        if t in index:
            raise ValueError(
                f"{path}: line {i + 1} repeats {t!r} (first on line {index[t] + 1}); every entry must be "
                f"unique or ids shift. Rebuild the vocabulary."
            )
        index[t] = i
    missing = [t for t in SPECIAL_TOKENS if t not in index]
    if missing:
        raise ValueError(
            f"{path}: the vocabulary has no {', '.join(missing)} entry; BERT pretraining needs "
            f"{', '.join(SPECIAL_TOKENS)}. Rebuild it with the vocab stage (which adds them)."
        )
    continuation = np.fromiter((t.startswith("##") for t in tokens), dtype=bool, count=len(tokens))
    return VocabInfo(
        path=path,
        size=len(tokens),
        sha256=hashlib.sha256(raw).hexdigest(),
        special_ids={t: index[t] for t in SPECIAL_TOKENS},
        continuation=continuation,
    )


def load_tokenizer(vocab_dir: str | Path, vocab: VocabInfo):
    """The fast WordPiece tokenizer of ``vocab_dir`` (``tokenizer.json``, else ``vocab.txt`` uncased).

    Truncation and padding are switched off; callers encode with ``add_special_tokens=False``.

    Raises:
        ValueError: ``tokenizer.json`` disagrees with ``vocab.txt`` on the vocabulary size.
    """
    from tokenizers import Tokenizer

    vocab_dir = Path(vocab_dir)
    tj = vocab_dir / "tokenizer.json"
    if tj.is_file():
        tok = Tokenizer.from_file(str(tj))
    else:  # a bare vocab.txt (e.g. Google's release): BERT's uncased normalisation
        from tokenizers import BertWordPieceTokenizer

        tok = BertWordPieceTokenizer(str(vocab.path), lowercase=True)._tokenizer
    tok.no_truncation()
    tok.no_padding()
    size = tok.get_vocab_size(with_added_tokens=True)
    if size != vocab.size:
        raise ValueError(
            f"{tj} has {size} tokens but {vocab.path} has {vocab.size}; they must come from the same "
            f"vocab stage run (rebuild {vocab_dir})"
        )
    for t, i in vocab.special_ids.items():
        if tok.token_to_id(t) != i:
            raise ValueError(f"{tj}: {t} has id {tok.token_to_id(t)} but line {i} of {vocab.path}")
    return tok
