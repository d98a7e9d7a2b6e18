"""Facts that several stages share, defined once.

Every other module imports these names from here; none repeats a value.
"""

from __future__ import annotations

from pathlib import Path

#: The repository root (an editable install runs the code in place; outputs and ``mlflow.db`` live here).
REPO_ROOT = Path(__file__).resolve().parents[1]

#: DVC's lock file: the content hashes of every stage's outputs (model cards and the report quote them).
DVC_LOCK = REPO_ROOT / "dvc.lock"

#: BERT's special tokens, in the order the vocab stage writes them (``[PAD]`` is id 0).
SPECIAL_TOKENS: tuple[str, ...] = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")

#: Label of positions without a prediction (PyTorch's ``cross_entropy`` default, transformers' convention).
IGNORE_INDEX = -100

#: The files a saved tokenizer consists of; the pretrain stage copies those present next to the weights.
TOKENIZER_FILES: tuple[str, ...] = (
    "vocab.txt",
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
)

#: Any one of these is enough to load a tokenizer from a model directory (``tokenizer.json`` preferred).
TOKENIZER_VOCAB_FILES: tuple[str, ...] = ("tokenizer.json", "vocab.txt")
