"""The ``vocab`` stage: a WordPiece vocabulary trained on a sample of the corpus, and the reader of it.

- ``train``: :class:`VocabParams`, :func:`train_vocab` (the stage), BERT's special layout and the checks.
- ``wordpiece``: :func:`~bert_core.vocab.wordpiece.learn_wordpiece`, the deterministic merge learner
  ``train`` uses, and :func:`~bert_core.vocab.wordpiece.count_words`, its word counts.
- ``info``: :class:`VocabInfo` / :func:`bert_core.vocab.info.read_vocab` and :func:`load_tokenizer`, how the
  ``pretrain_data`` and ``pretrain`` stages read the written vocabulary (``read_vocab`` here, from ``train``,
  returns the plain token list).
"""

from bert_core.vocab.info import VocabInfo, load_tokenizer
from bert_core.vocab.train import (
    VocabError,
    VocabParams,
    VocabStats,
    read_vocab,
    segmentation_stats,
    special_layout,
    train_vocab,
    vocab_checks,
)

__all__ = [
    "VocabError",
    "VocabInfo",
    "VocabParams",
    "VocabStats",
    "load_tokenizer",
    "read_vocab",
    "segmentation_stats",
    "special_layout",
    "train_vocab",
    "vocab_checks",
]
