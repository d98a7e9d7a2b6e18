"""Wikipedia XML dumps: stream pages, keep text passages only (BERT paper, Section 3.1).

"For Wikipedia we extract only the text passages and ignore lists, tables, and headers." Pages are streamed
through ``xml.etree.ElementTree.XMLPullParser`` (``.xml``, ``.xml.bz2``, ``.xml.gz``) and every finished
``<page>`` is cleared, so memory does not grow with the dump. Redirects and pages outside namespace 0
(articles) are skipped.

A large dump is read in pieces, ranges that start where a page does
(:func:`bert_core.corpus.pieces.dump_spans`: in a multistream ``.xml.bz2``, the form dumps.wikimedia.org
recommends, at a bz2 stream of 100 pages; in a dump compressed otherwise, ranges of its decompressed text),
each by :func:`iter_pages` on its own. The wikitext is parsed with mwparserfromhell and rendered to plain
text:

* dropped: templates (infoboxes, citations, navboxes), tables, ``<ref>`` and other non-prose tags, comments,
  headings, list items (``*``, ``#``, ``;``, ``:`` lines), file/image/category/interlanguage links, and the
  trailing reference sections (References, External links, See also, ...);
* kept: prose paragraphs, with wiki links rendered as their visible text and bold/italic markup removed.
"""

from __future__ import annotations

import bz2
import re
import xml.etree.ElementTree as ET
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import fsspec
import mwparserfromhell
from mwparserfromhell.nodes import (
    Argument,
    Comment,
    ExternalLink,
    Heading,
    HTMLEntity,
    Tag,
    Template,
    Text,
    Wikilink,
)

from bert_core.corpus import compressed
from bert_core.corpus.pieces import in_text

# Tags whose whole content is not prose.
_DROP_TAGS = {
    "ref",
    "references",
    "table",
    "gallery",
    "math",
    "chem",
    "ce",
    "score",
    "timeline",
    "imagemap",
    "syntaxhighlight",
    "source",
    "pre",
    "code",
    "templatedata",
    "graph",
    "mapframe",
    "maplink",
    "hiero",
    "nowiki",
    "noinclude",
    "includeonly",
    "onlyinclude",
    "categorytree",
    "inputbox",
    "poem",
    "div",
    "indicator",
    "caption",
}
_LIST_TAGS = {"li", "dt", "dd"}
_LINE_BREAK_TAGS = {"br", "p", "hr"}
# Sections after which an article holds no prose worth keeping (until the next heading of the same level).
_STOP_SECTIONS = {
    "references",
    "external links",
    "see also",
    "further reading",
    "notes",
    "bibliography",
    "sources",
    "citations",
    "footnotes",
    "notes and references",
    "references and notes",
    "works cited",
    "gallery",
    "selected works",
    "works",
    "publications",
    "discography",
    "filmography",
    "explanatory notes",
}
_NON_ARTICLE_LINK = re.compile(
    r"^\s*:?\s*(file|image|media|category|wikt|wiktionary|commons|s|q|n|b|v|voy|species|[a-z]{2,3}(-[a-z]+)?)\s*:",
    re.IGNORECASE,
)
_DISAMBIG_TEMPLATES = {"disambiguation", "disambig", "dab", "hndis", "geodis", "set index article"}
_LIST_MARK = "\x01"
_MAGIC_RE = re.compile(r"__[A-Z]+__")
_EMPTY_PARENS_RE = re.compile(r"\(\s*[,;:]?\s*\)")
_LEADING_PUNCT_PARENS_RE = re.compile(r"\(\s*[,;:]\s*")
# Inline templates whose visible text is prose: {{lang|fr|texte}}, {{nowrap|1 000 km}}, {{convert|5|km}}.
_INLINE_TEMPLATES = {"lang": 2, "transl": 2, "nowrap": 1, "nobr": 1, "nobreak": 1, "script": 2, "small": 1}
_SPACE_BEFORE_PUNCT_RE = re.compile(r" +([,.;:!?)])")
_MULTI_SPACE_RE = re.compile(r"[^\S\n]+")  # incl. NBSP from &nbsp;
_TABLE_LINE_RE = re.compile(r"^\s*(\{\||\|\}|\|-|\||!)")


class WikiDumpError(ValueError):
    """A dump file is unreadable (corrupt or truncated compression, malformed XML)."""


@dataclass(frozen=True)
class WikiPage:
    """One ``<page>`` of a MediaWiki XML export."""

    page_id: str
    title: str
    ns: int
    redirect: bool
    text: str


def _local(tag: str) -> str:
    return tag.rsplit("}", 1)[-1]


_CHUNK = 1 << 20  # bytes read (and text decompressed) at a time


def _raw(path: Path, span: tuple[int, int]) -> Iterator[bytes]:
    with path.open("rb") as fh:
        fh.seek(span[0])
        left = span[1] - span[0]
        while left > 0 and (chunk := fh.read(min(_CHUNK, left))):
            left -= len(chunk)
            yield chunk


def _bz2_streams(chunks: Iterator[bytes]) -> Iterator[bytes]:
    """The text of the complete bz2 streams ``chunks`` hold, one after the other."""
    decompressor, started = bz2.BZ2Decompressor(), False
    for chunk in chunks:
        while chunk:
            yield decompressor.decompress(chunk)
            started = True
            if not decompressor.eof:
                break
            chunk, decompressor, started = decompressor.unused_data, bz2.BZ2Decompressor(), False
    if started:
        raise EOFError("a bz2 stream ends before its end of stream marker")


def _text_chunks(path: Path, span: tuple[int, int] | None, of_text: bool) -> Iterator[bytes]:
    """The XML text of a dump file, or of one of its pieces (:func:`~bert_core.corpus.pieces.dump_spans`; a
    range of its decompressed text if ``of_text``) wrapped in the root element that the first piece opens
    and the last one closes."""
    if span is None or of_text:
        at, end = span or (0, None)
        with fsspec.open(path, "rb", compression="infer") as text:
            text.seek(at)  # decompressing what comes before
            if at > 0:
                yield b"<mediawiki>"
            while (end is None or at < end) and (
                chunk := text.read(_CHUNK if end is None else min(_CHUNK, end - at))
            ):
                at += len(chunk)
                yield chunk
            if end is not None and text.read(1):
                yield b"</mediawiki>"
        return
    if span[0] > 0:
        yield b"<mediawiki>"
    raw = _raw(path, span)
    yield from _bz2_streams(raw) if path.name.lower().endswith(".bz2") else raw
    if span[1] < path.stat().st_size:
        yield b"</mediawiki>"


def iter_pages(
    path: str | Path, span: tuple[int, int] | None = None, *, of_text: bool | None = None
) -> Iterator[WikiPage]:
    """Stream the pages of a MediaWiki XML dump (``.xml``, ``.xml.bz2`` or ``.xml.gz``), in file order; with
    ``span``, those of one piece of it (:func:`~bert_core.corpus.pieces.dump_spans`), a range of its
    decompressed text if ``of_text`` (default: :func:`~bert_core.corpus.pieces.in_text`).

    Raises:
        WikiDumpError: the compressed stream is corrupt or truncated, or the XML is malformed; the message
            names the file (and the piece's bytes) and the last page read.
    """
    path = Path(path)
    last = "<none yet>"
    parser = ET.XMLPullParser(events=("start", "end"))
    root = None
    where = f"{path}" if span is None else f"{path} (bytes {span[0]:,}-{span[1]:,})"
    try:
        of_text = span is not None and (in_text(path) if of_text is None else of_text)
        where = where.removesuffix(")") + " of its text)" if of_text else where
        for chunk in _text_chunks(path, span, of_text):
            parser.feed(chunk)
            for event, elem in parser.read_events():
                if root is None and event == "start":
                    root = elem
                    continue
                if event != "end" or _local(elem.tag) != "page":
                    continue
                page = _page(elem)
                last = page.title
                yield page
                elem.clear()
                root.clear()  # drop finished pages held by the root element
        parser.close()
    except compressed.ERRORS as err:
        raise WikiDumpError(
            f"{where}: compressed stream is corrupt or truncated after page {last!r} ({err}); "
            "re-download the dump file or remove it from the source"
        ) from None
    except ET.ParseError as err:
        raise WikiDumpError(
            f"{where}: malformed XML after page {last!r} ({err}); the file is truncated or not a "
            "MediaWiki export"
        ) from None


def _page(elem: ET.Element) -> WikiPage:
    fields = {"title": "", "ns": "0", "id": "", "text": ""}
    redirect = False
    for child in elem:
        tag = _local(child.tag)
        if tag in ("title", "ns", "id"):
            fields[tag] = child.text or ""
        elif tag == "redirect":
            redirect = True
        elif tag == "revision":
            for rc in child:
                if _local(rc.tag) == "text":
                    fields["text"] = rc.text or ""
    try:
        ns = int(fields["ns"])
    except ValueError:
        ns = -1
    return WikiPage(fields["id"], fields["title"], ns, redirect, fields["text"])


def is_disambiguation(wikitext: str) -> bool:
    """True when the page carries a disambiguation template."""
    low = wikitext.lower()
    return any("{{" + t in low for t in _DISAMBIG_TEMPLATES)


def _render_inline_template(node: Template) -> str:
    name = str(node.name).strip().lower().replace("_", " ")
    if name.startswith("lang-") and node.has(1):
        return _render(node.get(1).value.nodes)
    if name in ("convert", "cvt") and node.has(1) and node.has(2):
        return f"{node.get(1).value.strip_code().strip()} {node.get(2).value.strip_code().strip()}"
    pos = _INLINE_TEMPLATES.get(name)
    if pos is not None and node.has(pos):
        return _render(node.get(pos).value.nodes)
    return ""


def _render(nodes) -> str:
    out: list[str] = []
    for node in nodes:
        if isinstance(node, Text):
            out.append(node.value)
        elif isinstance(node, Wikilink):
            title = str(node.title)
            if _NON_ARTICLE_LINK.match(title):
                continue
            out.append(_render(node.text.nodes) if node.text is not None else title.split("#")[0])
        elif isinstance(node, ExternalLink):
            if node.title is not None:
                out.append(_render(node.title.nodes))
        elif isinstance(node, HTMLEntity):
            out.append(node.normalize())
        elif isinstance(node, Tag):
            tag = str(node.tag).lower().strip()
            if tag in _LIST_TAGS:
                out.append(_LIST_MARK)
            elif tag in _LINE_BREAK_TAGS:
                out.append("\n")
            elif tag in _DROP_TAGS:
                continue
            elif node.contents is not None:
                out.append(_render(node.contents.nodes))
        elif isinstance(node, Template):
            out.append(_render_inline_template(node))
        elif isinstance(node, Comment | Argument | Heading):
            continue
        else:  # pragma: no cover - unknown node types render as their text
            out.append(str(node))
    return "".join(out)


def wikitext_to_passages(wikitext: str) -> list[str]:
    """Plain-text prose paragraphs of an article's wikitext, in order.

    Returns:
        One string per paragraph (no newlines inside), without lists, tables, headings, templates or
        references. Empty for pages with no prose.
    """
    code = mwparserfromhell.parse(wikitext)
    kept = []
    skip_level: int | None = None
    for node in code.nodes:
        if isinstance(node, Heading):
            if skip_level is not None and node.level <= skip_level:
                skip_level = None
            title = _render(node.title.nodes).strip().lower()
            if skip_level is None and title in _STOP_SECTIONS:
                skip_level = node.level
            kept.append("\n\n")  # a heading always ends a paragraph
            continue
        if skip_level is None:
            kept.append(node)
    text = "".join(x if isinstance(x, str) else _render([x]) for x in kept)
    text = _MAGIC_RE.sub("", text)
    passages: list[str] = []
    current: list[str] = []
    for line in text.split("\n"):
        stripped = line.strip()
        if not stripped or stripped.startswith(_LIST_MARK) or _TABLE_LINE_RE.match(stripped):
            if current:
                passages.append(" ".join(current))
                current = []
            continue
        current.append(stripped)
    if current:
        passages.append(" ".join(current))
    cleaned = []
    for p in passages:
        p = _EMPTY_PARENS_RE.sub("", p)
        p = _LEADING_PUNCT_PARENS_RE.sub("(", p)
        p = _MULTI_SPACE_RE.sub(" ", p)
        p = _SPACE_BEFORE_PUNCT_RE.sub(r"\1", p).strip()
        # A passage is prose: it has letters and ends like a sentence (drops captions, stray fragments).
        if any(c.isalpha() for c in p) and p[-1] in ".!?\"'”’)":
            cleaned.append(p)
    return cleaned
