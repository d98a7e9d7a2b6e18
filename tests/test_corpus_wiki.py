"""Wikipedia XML dumps: streamed pages, passages only (no lists, tables, headers, templates, references)."""

from __future__ import annotations

import bz2
import re

import pytest

from bert_core.corpus import CorpusError, CorpusParams, build_corpus, iter_documents
from bert_core.corpus.wiki import WikiDumpError, iter_pages, wikitext_to_passages

DUMP = "wikipedia_dump/enwiki-20250201-tiny.xml.bz2"
MARKUP = re.compile(
    r"\{\{|\}\}|\[\[|\]\]|<ref|</?[a-z]+[ >/]|\{\||\|\}|''|==|__[A-Z]+__|thumb\||\bCategory:|\bFile:"
)


@pytest.fixture(scope="module")
def pages(shared_data):
    return list(iter_pages(shared_data / DUMP))


def test_pages_streamed_with_redirects_flagged(pages):
    assert len(pages) == 70
    assert sum(p.redirect for p in pages) == 64
    articles = [p.title for p in pages if not p.redirect and p.ns == 0]
    assert articles == ["Anarchism", "Albedo", "A", "Alabama", "Achilles", "Abraham Lincoln"]


def test_passages_only(pages):
    for page in (p for p in pages if not p.redirect):
        passages = wikitext_to_passages(page.text)
        assert len(passages) >= 10, page.title
        text = "\n".join(passages)
        assert not MARKUP.search(text), (page.title, MARKUP.search(text).group(0))
        # List items, table rows and headings of the source never reach the output.
        for line in page.text.split("\n"):
            plain = re.sub(r"^[*#:;]+\s*", "", line).strip()
            if re.match(r"^[*#;]", line) and len(plain) > 40 and not re.search(r"[\[\]{}<>'|=]", plain):
                assert plain not in text, (page.title, "list item kept", plain)
            if re.match(r"^==+[^=]+==+\s*$", line):
                heading = line.strip("= \t")
                assert heading not in passages, (page.title, "heading kept", heading)
        assert "ISBN" not in text and "Retrieved" not in text  # references / citations dropped
        assert all(p[-1] in ".!?\"'”’)" for p in passages)
    lincoln = next(p for p in pages if p.title == "Abraham Lincoln")
    first = wikitext_to_passages(lincoln.text)[0]
    assert first.startswith("Abraham Lincoln (February 12, 1809 – April 15, 1865) was the 16th president")
    anarchism = next(p for p in pages if p.title == "Anarchism")
    assert wikitext_to_passages(anarchism.text)[0].startswith(
        "Anarchism is a political philosophy and movement that is against all forms of authority"
    )


def test_dump_as_corpus_source(shared_data, tmp_path):
    params = CorpusParams.model_validate(
        {
            "sources": [{"name": "hub", "kind": "hf", "path": "x"}],
            "local_sources": [{"name": "enwiki", "kind": "wikipedia_xml", "path": DUMP}],
            "heldout": {"fraction": 0.2, "max_documents": 2},
        }
    )
    stats = build_corpus(params, tmp_path / "out", data_root=shared_data, workers=1)
    assert stats.documents == 6 and stats.dropped["redirect"] == 64
    docs = list(iter_documents(tmp_path / "out", "train")) + list(iter_documents(tmp_path / "out", "heldout"))
    assert {d["doc_id"] for d in docs} == {f"enwiki:{i}" for i in (12, 39, 290, 303, 305, 307)}
    assert {d["title"] for d in docs} >= {"Anarchism", "Abraham Lincoln"}
    assert sum(len(d["sentences"]) for d in docs) > 1000


def test_truncated_and_corrupt_bz2(shared_data, tmp_path):
    data = (shared_data / DUMP).read_bytes()
    truncated = tmp_path / "truncated.xml.bz2"
    truncated.write_bytes(data[: len(data) // 2])
    with pytest.raises(
        WikiDumpError, match=r"truncated\.xml\.bz2: compressed stream is corrupt or truncated"
    ):
        list(iter_pages(truncated))
    corrupt = tmp_path / "corrupt.xml.bz2"
    corrupt.write_bytes(data[:5000] + bytes(b ^ 0xFF for b in data[5000:6000]) + data[6000:])
    with pytest.raises(WikiDumpError, match="corrupt"):
        list(iter_pages(corrupt))
    plain = tmp_path / "cut.xml"
    plain.write_bytes(bz2.decompress(data)[:100_000])
    with pytest.raises(WikiDumpError, match="malformed XML"):
        list(iter_pages(plain))
    # Through the stage: a clear error naming the file, and no output.
    params = CorpusParams.model_validate(
        {
            "sources": [{"name": "hub", "kind": "hf", "path": "x"}],
            "local_sources": [{"name": "enwiki", "kind": "wikipedia_xml", "path": "truncated.xml.bz2"}],
        }
    )
    with pytest.raises(CorpusError, match=r"truncated\.xml\.bz2"):
        build_corpus(params, tmp_path / "out", data_root=tmp_path, workers=2)
    assert not (tmp_path / "out").exists()
    assert not [p for p in tmp_path.iterdir() if ".tmp-" in p.name]


def test_inline_markup_rendering():
    text = (
        "{{Infobox person|name=X}}\n'''Bold''' and ''italic'' [[Target|shown]] and [[plain]] "
        "{{lang|fr|bonjour}}<ref>cite</ref> [http://x.org site] &amp; 10<sup>6</sup> ok.\n"
        "* a list item that should go.\n\n== History ==\nThe history section text.\n"
        "{| class=wikitable\n| cell || cell\n|}\n[[File:X.jpg|thumb|A caption.]]\n"
        "== References ==\n{{reflist}}\nSome trailing reference prose.\n"
    )
    assert wikitext_to_passages(text) == [
        "Bold and italic shown and plain bonjour site & 106 ok.",
        "The history section text.",
    ]
