"""Facts that several stages share, defined once.

Every other module imports these names from here; none repeats a value.
"""

from __future__ import annotations

import os
from pathlib import Path

#: The repository root (an editable install runs the code in place; outputs and ``mlflow.db`` live here).
REPO_ROOT = Path(__file__).resolve().parents[1]


def repo_relative(path: str | Path) -> str:
    """``path`` as outputs and log lines name it: relative to the repository when inside it (so a DVC
    output reads the same in every clone, and names no user's home), else as given."""
    absolute = Path(os.path.abspath(path))
    for candidate in (absolute, absolute.resolve()):  # resolved too: a path through a link to the repository
        if candidate.is_relative_to(REPO_ROOT):
            return candidate.relative_to(REPO_ROOT).as_posix()
    return str(path)


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
