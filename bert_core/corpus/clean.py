"""Text cleaning: Unicode normalisation, control characters, whitespace, Project Gutenberg boilerplate.

All functions are pure ``str -> str`` (or ``str -> list[str]``) so they are cheap to test and run in
worker processes.
"""

from __future__ import annotations

import re
import unicodedata

# C0/C1 controls except \t \n (and \r, handled by line-end normalisation), plus invisible format characters
# that only hurt tokenisation: BOM/zero-width no-break space, zero-width space/joiners, soft hyphen, and the
# Unicode replacement character's frequent companion, the object replacement character.
_CONTROL_RE = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f\u00ad\u200b\u200c\u200d\u2060\ufeff\ufffc]")
# Whitespace other than newline (incl. NBSP and other Unicode spaces) that is not already a single space.
_SPACES_RE = re.compile(r"[^\S\n ][^\S\n]*| [^\S\n]+")
_BLANK_LINES_RE = re.compile(r"\n[^\S\n]*\n\s*")

# Project Gutenberg licence boilerplate. Modern files: "*** START OF THE PROJECT GUTENBERG EBOOK X ***" /
# "*** END OF THE PROJECT GUTENBERG EBOOK X ***"; older: "***START OF THIS PROJECT GUTENBERG EBOOK",
# "*END*THE SMALL PRINT! FOR PUBLIC DOMAIN ETEXTS*...*END*" closing the header, and a closing
# "End of (the) Project Gutenberg('s) EBook of ..." line.
_PG_START_RE = re.compile(
    r"^[^\S\n]*(?:\*{3}[^\S\n]*START OF (?:THIS |THE )?PROJECT GUTENBERG[^\n]*"
    r"|\*END\*THE SMALL PRINT![^\n]*)$",
    re.IGNORECASE | re.MULTILINE,
)
_PG_END_RE = re.compile(
    r"^[^\S\n]*(?:\*{3}[^\S\n]*END OF (?:THIS |THE )?PROJECT GUTENBERG[^\n]*"
    r"|End of (?:the )?Project Gutenberg(?:'s|’s)?\b[^\n]*)$",
    re.IGNORECASE | re.MULTILINE,
)


# Transcriber credits PG puts at the top of a body ("Produced by ...", "E-text prepared by ...",
# "HTML version by ...", "Note: Project Gutenberg also has an HTML version ..."): whole paragraphs.
_PG_CREDITS_RE = re.compile(
    r"\A(?:\s*(?:Produced by|E-text prepared by|Etext prepared by|This etext was produced by|"
    r"Transcribed from|Transcribed by|HTML version by|Note: Project Gutenberg also has)[^\n]*(?:\n[^\S\n]*\S[^\n]*)*)+",
    re.IGNORECASE,
)


def normalize_text(text: str, form: str = "NFC") -> str:
    """Normalise line ends, Unicode form, control characters and horizontal whitespace.

    Newlines are kept (they carry paragraph structure); runs of other whitespace become one space and
    every line is stripped.
    """
    if "\r" in text:
        text = text.replace("\r\n", "\n").replace("\r", "\n")
    text = unicodedata.normalize(form, text)
    text = _CONTROL_RE.sub("", text)
    text = _SPACES_RE.sub(" ", text)
    return "\n".join(line.strip() for line in text.split("\n"))


def strip_gutenberg(text: str) -> tuple[str, bool]:
    """Remove Project Gutenberg header and footer when their markers are present.

    The header is everything up to and including the last start marker in the first half of the text;
    the footer is everything from the first end marker after that; transcriber credits at the top of the
    body ("Produced by ...") go too. Text without any of these is returned unchanged.

    Returns:
        The body, and whether anything was removed.
    """
    changed = False
    start = 0
    for m in _PG_START_RE.finditer(text, 0, max(len(text) // 2, 1)):
        start = m.end()
        changed = True
    end_m = _PG_END_RE.search(text, start)
    end = len(text)
    if end_m is not None and end_m.start() >= len(text) // 2:
        end = end_m.start()
        changed = True
    body = text[start:end].strip() if changed else text
    head = _PG_CREDITS_RE.match(body[:3000])
    if head is not None:
        body = body[head.end() :]
        changed = True
    return (body.strip(), True) if changed else (text, False)


def paragraphs(text: str, newlines: str) -> list[str]:
    """Split normalised text into paragraphs (each a single line, no empty ones).

    Args:
        text: Output of :func:`normalize_text`.
        newlines: ``wrap`` (blank lines separate paragraphs; single newlines are line wrapping) or
            ``paragraph`` (every line is its own paragraph).
    """
    if newlines == "paragraph":
        return [line for line in text.split("\n") if line]
    return [" ".join(block.split("\n")).strip() for block in _BLANK_LINES_RE.split(text) if block.strip()]


_WIKITEXT_DETOK = (
    (" @-@ ", "-"),
    (" @,@ ", ","),
    (" @.@ ", "."),
)


def wikitext_detokenize(line: str) -> str:
    """Undo WikiText's number/hyphen escapes (``1 @,@ 000`` -> ``1,000``, ``long @-@ term`` -> ``long-term``)."""
    if "@" in line:
        for a, b in _WIKITEXT_DETOK:
            line = line.replace(a, b)
    return line


_WT_TITLE_RE = re.compile(r"^ ?= ([^=].*?) = ?$")
_WT_SUBHEAD_RE = re.compile(r"^ ?(= ){2,}.*?( =){2,} ?$")


def wikitext_line(line: str) -> tuple[str, str]:
    """What a line of a WikiText file is: ``("title", its text)`` for an article's top-level ``" = Title = "``
    line, ``("paragraph", the line stripped)``, or ``("skip", "")`` for a sub-heading or a blank line."""
    s = line.rstrip("\n")
    if _WT_SUBHEAD_RE.match(s):
        return "skip", ""
    if m := _WT_TITLE_RE.match(s):
        return "title", m.group(1).strip()
    return ("paragraph", s.strip()) if s.strip() else ("skip", "")
