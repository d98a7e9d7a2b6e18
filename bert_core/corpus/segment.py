"""Sentence segmentation.

The default is BlingFire (Microsoft, MIT licence, offline, a compiled finite-state segmenter): it was the
fastest of the candidates measured in ``bench/bench_segmenters.py`` with boundary F1 close to the best
(figures in ``docs/benchmarks.md``). ``lines`` treats every paragraph as one sentence, for input that is
already one sentence per line.
"""

from __future__ import annotations

from collections.abc import Callable


def split_long(sentence: str, max_chars: int) -> list[str]:
    """Cut a sentence longer than ``max_chars`` at whitespace into pieces of at most ``max_chars``.

    A piece with no whitespace in reach (e.g. a 50 MB token) is cut hard at ``max_chars``.
    """
    if len(sentence) <= max_chars:
        return [sentence]
    # An index walks the sentence: slicing off the remainder at every cut would copy it each time,
    # quadratic in its length (minutes for one 50 MB line).
    out = []
    start, end = 0, len(sentence)
    while end - start > max_chars:
        cut = sentence.rfind(" ", start, start + max_chars + 1)
        if cut <= start:
            cut = start + max_chars
        piece = sentence[start:cut].strip()
        if piece:
            out.append(piece)
        start = cut
        while start < end and sentence[start].isspace():
            start += 1
    if start < end:
        out.append(sentence[start:])
    return out


def get_segmenter(name: str) -> Callable[[str], list[str]]:
    """Return ``paragraph -> sentences`` for the named segmenter (``blingfire`` or ``lines``)."""
    if name == "blingfire":
        from blingfire import text_to_sentences

        def _blingfire(paragraph: str) -> list[str]:
            return [s for s in text_to_sentences(paragraph).split("\n") if s.strip()]

        return _blingfire
    if name == "lines":
        return lambda paragraph: [paragraph] if paragraph.strip() else []
    raise ValueError(f"unknown segmenter {name!r}; use 'blingfire' or 'lines'")


def segment_paragraphs(
    paragraphs: list[str], segment: Callable[[str], list[str]], max_sentence_chars: int
) -> list[str]:
    """Sentences of a document, in order, none empty, none longer than ``max_sentence_chars``."""
    sentences: list[str] = []
    for para in paragraphs:
        for s in segment(para):
            s = s.strip()
            if s:
                sentences.extend(split_long(s, max_sentence_chars))
    return sentences
