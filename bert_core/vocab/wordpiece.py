"""Deterministic WordPiece training: word counts from ``tokenizers``, pair merges with a total order.

Hugging Face ``tokenizers``' ``WordPieceTrainer`` (a BPE trainer that writes ``##`` pieces) does not give
the same vocabulary twice on the same text: it numbers the ``##`` continuation pieces in the iteration
order of a hash map with per-process random keys, and it breaks ties between equally frequent pairs by
those numbers; ``limit_alphabet`` drops characters of equal count in hash order too; and its merge queue
can hold two entries for one pair with the same count, popped in insertion (hash) order. None of it can
be pinned from Python.

So the trainer here splits the work. :func:`count_words` lets ``tokenizers`` do the costly part, the
normalisation, pre-tokenisation and counting of every word (Rust, parallel; the counts are sums, so the
same whatever the thread count or order). :func:`learn_wordpiece` then learns the merges over those
counts as the library's trainer does (frequency-ranked pair merges, ``##`` on continuing pieces), with
every choice made by a total order:

- the alphabet keeps the ``limit_alphabet`` most frequent characters, equal counts by code point;
- ids: special tokens in the given order, the alphabet by code point, the ``##`` pieces by code point,
  then merged pieces in the order they are learned;
- each step merges the most frequent adjacent pair, equal counts by the pair's strings (left piece, then
  right piece, compared by code point), and merges every occurrence of it at once.

The vocabulary is therefore a function of the word counts and the params alone.
"""

from __future__ import annotations

import heapq
import json
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping, Sequence
from itertools import pairwise
from typing import Any


class WordCountError(RuntimeError):
    """The installed ``tokenizers`` no longer exposes the word counts its trainer collected."""


def count_words(batches: Iterable[list[str]], normalizer: Any, pre_tokenizer: Any) -> dict[str, int]:
    """Count the words of ``batches`` exactly as ``tokenizers``' trainers count them.

    A ``WordLevelTrainer`` is fed through ``Tokenizer.train_from_iterator`` (normalise, pre-tokenise and
    count in Rust, in parallel); its ``vocab_size=0`` leaves the training step after the count next to
    nothing to do, and the counts are read from the trainer's pickled state. The result equals counting
    ``pre_tokenizer.pre_tokenize_str(normalizer.normalize_str(text))`` over every text, only faster.

    Args:
        batches: Lists of texts (e.g. the sentences of one document).
        normalizer: A ``tokenizers.normalizers.Normalizer``.
        pre_tokenizer: A ``tokenizers.pre_tokenizers.PreTokenizer``.

    Raises:
        WordCountError: the trainer's state has no word counts (a ``tokenizers`` release that changed it).
    """
    import tokenizers
    from tokenizers import Tokenizer, models, trainers

    counter = Tokenizer(models.WordLevel(unk_token="[UNK]"))
    counter.normalizer = normalizer
    counter.pre_tokenizer = pre_tokenizer
    trainer = trainers.WordLevelTrainer(vocab_size=0, show_progress=False)
    counter.train_from_iterator(batches, trainer=trainer)
    state = json.loads(trainer.__getstate__())
    words = state.get("WordLevelTrainer", {}).get("words") if isinstance(state, dict) else None
    if not isinstance(words, dict):
        raise WordCountError(
            f"tokenizers {tokenizers.__version__}: the WordLevelTrainer state has no 'words' counts; "
            "install the version pinned in requirements/lock.txt"
        )
    return words


def _merge_word(symbols: list[int], left: int, right: int, new: int) -> list[int] | None:
    """``symbols`` with every ``left right`` replaced by ``new``, left to right; ``None`` if none occurs."""
    out: list[int] = []
    i, n = 0, len(symbols)
    while i < n:
        if i + 1 < n and symbols[i] == left and symbols[i + 1] == right:
            out.append(new)
            i += 2
        else:
            out.append(symbols[i])
            i += 1
    return out if len(out) != n else None


def learn_wordpiece(
    word_counts: Mapping[str, int],
    *,
    vocab_size: int,
    special_tokens: Sequence[str] = (),
    min_frequency: int = 0,
    limit_alphabet: int | None = None,
    prefix: str = "##",
) -> list[str]:
    """Learn a WordPiece vocabulary from word counts by frequency-ranked pair merges, deterministically.

    The algorithm of ``tokenizers``' ``WordPieceTrainer`` (its BPE trainer with a continuation prefix),
    with the ties broken as the module docstring says.

    Args:
        word_counts: Word -> occurrences (normalised, pre-tokenised words; see :func:`count_words`).
        vocab_size: Stop once the vocabulary has this many entries.
        special_tokens: Leading entries, in this order.
        min_frequency: Stop when the most frequent pair occurs fewer times than this.
        limit_alphabet: Most single characters kept (the most frequent); ``None``: all.
        prefix: Marks a piece that continues a word (BERT: ``##``).

    Returns:
        The tokens in id order. Merging stops at ``vocab_size`` entries, or earlier when no pair is left
        or frequent enough; the specials and the alphabet are kept even when they alone exceed it.
    """
    tokens: list[str] = []
    ids: dict[str, int] = {}

    def add(token: str) -> int:
        if token not in ids:
            ids[token] = len(tokens)
            tokens.append(token)
        return ids[token]

    for token in special_tokens:
        add(token)

    char_counts: Counter[str] = Counter()
    for word, count in word_counts.items():
        for ch in word:
            char_counts[ch] += count
    ranked = sorted(char_counts, key=lambda ch: (-char_counts[ch], ch))
    alphabet = set(ranked if limit_alphabet is None else ranked[:limit_alphabet])
    for ch in sorted(alphabet):
        add(ch)
    # A character outside the alphabet is dropped from its word; the one after it still continues the word.
    for ch in sorted({ch for word in word_counts for ch in word[1:] if ch in alphabet}):
        add(prefix + ch)

    words: list[list[int]] = []
    counts: list[int] = []
    for word in sorted(word_counts):
        words.append([ids[ch if i == 0 else prefix + ch] for i, ch in enumerate(word) if ch in alphabet])
        counts.append(word_counts[word])

    pair_counts: dict[tuple[int, int], int] = defaultdict(int)
    where: dict[tuple[int, int], set[int]] = defaultdict(set)  # words that hold (or held) the pair
    for w, symbols in enumerate(words):
        for pair in pairwise(symbols):
            pair_counts[pair] += counts[w]
            where[pair].add(w)
    # Max-heap on (count, then the pair's strings ascending). An entry may be stale: a count only falls
    # without a new entry, so every pair keeps an entry at or above its count, and the first entry popped
    # whose count is current is the exact maximum of that order.
    heap = [(-c, tokens[a], tokens[b], a, b) for (a, b), c in pair_counts.items()]
    heapq.heapify(heap)
    floor = max(min_frequency, 1)
    while len(tokens) < vocab_size and heap:
        neg, _, _, a, b = heapq.heappop(heap)
        count = pair_counts.get((a, b), 0)
        if count != -neg:
            if count > 0:
                heapq.heappush(heap, (-count, tokens[a], tokens[b], a, b))
            continue
        if count < floor:
            break
        new = add(tokens[a] + tokens[b].removeprefix(prefix))
        delta: dict[tuple[int, int], int] = defaultdict(int)
        for w in where.pop((a, b)):
            merged = _merge_word(words[w], a, b, new)
            if merged is None:
                continue
            c = counts[w]
            for pair in pairwise(words[w]):
                delta[pair] -= c
            for pair in pairwise(merged):
                delta[pair] += c
                where[pair].add(w)
            words[w] = merged
        for pair, d in delta.items():
            c = pair_counts[pair] + d
            if c > 0:
                pair_counts[pair] = c
                if d > 0:  # a count that grew needs an entry; one that fell keeps its higher one
                    heapq.heappush(heap, (-c, tokens[pair[0]], tokens[pair[1]], *pair))
            else:  # no word holds the pair any more (the merged pair itself, for one)
                del pair_counts[pair]
                where.pop(pair, None)
    return tokens
