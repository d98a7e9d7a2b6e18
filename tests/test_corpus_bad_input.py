"""Bad input to the corpus stage: each a clear error or a counted skip, and never a half-written output."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from bert_core.constants import REPO_ROOT
from bert_core.corpus import (
    CorpusError,
    CorpusParams,
    EmptyCorpusError,
    SourceNotFoundError,
    build_corpus,
    iter_documents,
)
from bert_core.corpus.shards import read_manifest
from bert_core.owned import mark_output
from bert_core.params import ParamsError, load_params

SENT = "The quick brown fox jumps over the lazy dog near the river bank. It was a sunny day in the old town. "


def params_for(*sources: dict, **over) -> CorpusParams:
    base = {
        "sources": [{"name": "hub", "kind": "hf", "path": "x"}],
        "local_sources": list(sources),
        "clean": {"min_doc_chars": 20},
        "heldout": {"fraction": 0.3, "max_documents": 5},
        "workers": 1,
    }
    base.update(over)
    return CorpusParams.model_validate(base)


def docs(out: Path) -> list[dict]:
    return list(iter_documents(out, "train")) + list(iter_documents(out, "heldout"))


def assert_untouched(out: Path) -> None:
    """The previous output is intact and no temporary sibling is left behind."""
    assert (out / "old.txt").read_text() == "previous good output"
    assert not [p for p in out.parent.iterdir() if ".tmp-" in p.name]


@pytest.fixture
def prev_out(tmp_path) -> Path:
    out = tmp_path / "out"
    out.mkdir()
    (out / "old.txt").write_text("previous good output")
    mark_output(out)  # an earlier run's output
    return out


def test_missing_path(tmp_path, prev_out):
    params = params_for({"name": "books", "kind": "text", "path": "corpus/nothere/*.txt"})
    with pytest.raises(SourceNotFoundError, match=r"source 'books' \(text\): path 'corpus/nothere/\*\.txt'"):
        build_corpus(params, prev_out, data_root=tmp_path, workers=1)
    assert_untouched(prev_out)


def test_non_utf8_is_replaced_counted_and_the_files_named(tmp_path, caplog):
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "latin1.txt").write_bytes(("Caf\xe9 au lait. " + SENT * 3).encode("latin-1"))
    (tmp_path / "src" / "cp1252.txt").write_bytes(b"\x93Quoted\x94 text. " + SENT.encode() * 3 + b"\xff\xfe")
    (tmp_path / "src" / "good.txt").write_text(SENT * 4, encoding="utf-8")
    params = params_for({"name": "t", "kind": "text", "path": "src"})
    with caplog.at_level("INFO", logger="bert_core.corpus"):
        stats = build_corpus(params, tmp_path / "out", data_root=tmp_path, workers=1)
    assert stats.files_with_utf8_errors == 2
    assert stats.utf8_replacements == 1 + 2 + 2
    bad = sorted(str(tmp_path / "src" / f) for f in ("cp1252.txt", "latin1.txt"))
    assert sorted(read_manifest(tmp_path / "out")["utf8_error_files"]) == bad
    named = [m.split(": ")[0] for m in caplog.messages if "not UTF-8" in m]  # one line per file: a warning
    assert sorted(named) == bad  # for cp1252.txt (4 bytes of 320: no text file?), else an INFO line
    assert any("5 bad UTF-8 sequences replaced in 2 file(s)" in m for m in caplog.messages)
    text = {d["doc_id"]: " ".join(d["sentences"]) for d in docs(tmp_path / "out")}
    assert text["t:latin1.txt"].startswith("Caf\ufffd au lait.")
    assert "\ufffdQuoted\ufffd text." in text["t:cp1252.txt"]


def _jsonl(tmp_path: Path) -> Path:
    lines = [
        json.dumps({"id": "a", "title": "A", "text": SENT * 2}),
        json.dumps({"id": "b", "title": "B", "text": SENT * 3}),
        '{"id": "c", "title": "C", "text": "unterminated',
        json.dumps({"id": "d", "title": "D"}),
        json.dumps({"id": "e", "title": "E", "text": SENT * 4}),
    ]
    path = tmp_path / "wiki.jsonl"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def test_bad_jsonl_line_skipped_and_named(tmp_path):
    path = _jsonl(tmp_path)
    params = params_for(
        {"name": "w", "kind": "jsonl", "path": "wiki.jsonl", "id_field": "id", "title_field": "title"}
    )
    stats = build_corpus(params, tmp_path / "out", data_root=tmp_path, workers=1)
    assert stats.dropped["bad_record"] == 2 and stats.documents == 3
    assert stats.bad_record_examples[0].startswith(f"{path}:3: not valid JSON")
    assert stats.bad_record_examples[1] == f"{path}:4: no string field 'text'"
    assert {d["doc_id"] for d in docs(tmp_path / "out")} == {"w:a", "w:b", "w:e"}
    manifest = json.loads((tmp_path / "out" / "manifest.json").read_text())
    assert manifest["bad_record_examples"] == stats.bad_record_examples


def test_bad_jsonl_line_is_an_error_when_asked(tmp_path, prev_out):
    path = _jsonl(tmp_path)
    params = params_for({"name": "w", "kind": "jsonl", "path": "wiki.jsonl"}, on_bad_record="error")
    with pytest.raises(CorpusError, match=rf"{path}:3: not valid JSON .*corpus\.on_bad_record"):
        build_corpus(params, prev_out, data_root=tmp_path, workers=2)  # raised in a worker process
    assert_untouched(prev_out)


def test_truncated_compressed_text(tmp_path, prev_out):
    import bz2

    data = bz2.compress((SENT * 200).encode())
    (tmp_path / "part.txt.bz2").write_bytes(data[: len(data) // 2])
    params = params_for({"name": "t", "kind": "text", "path": "part.txt.bz2", "doc_split": "blank_lines"})
    with pytest.raises(CorpusError, match=r"part\.txt\.bz2: cannot read .*corrupt or truncated"):
        build_corpus(params, prev_out, data_root=tmp_path, workers=1)
    assert_untouched(prev_out)


def test_empty_corpus_after_filtering(tmp_path, prev_out):
    (tmp_path / "a.txt").write_text(SENT, encoding="utf-8")
    (tmp_path / "b.txt").write_text("   \n\n\t\n", encoding="utf-8")
    params = params_for({"name": "t", "kind": "text", "path": "*.txt"}, clean={"min_doc_chars": 10_000})
    with pytest.raises(
        EmptyCorpusError, match=r"no documents left .*'too_short': 1.*'empty': 1|'empty': 1.*'too_short': 1"
    ):
        build_corpus(params, prev_out, data_root=tmp_path, workers=1)
    assert_untouched(prev_out)


def test_a_folder_source_reads_its_kinds_files_compressed_ones_too(tmp_path):
    import gzip

    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "a.txt").write_text(SENT * 3, encoding="utf-8")
    with gzip.open(tmp_path / "mine" / "b.txt.gz", "wt", encoding="utf-8") as fh:
        fh.write(SENT * 4)
    rows = [json.dumps({"text": SENT * n}) for n in (5, 6)]
    (tmp_path / "mine" / "c.jsonl").write_text("\n".join(rows) + "\n", encoding="utf-8")
    (tmp_path / "mine" / "notes.md").write_text(SENT, encoding="utf-8")
    out = tmp_path / "out"
    build_corpus(
        params_for({"name": "t", "kind": "text", "path": "mine"}), out, data_root=tmp_path, workers=1
    )
    assert sorted(d["doc_id"] for d in docs(out)) == ["t:a.txt", "t:b.txt.gz"]
    jsonl = params_for({"name": "j", "kind": "jsonl", "path": "mine"})
    build_corpus(jsonl, tmp_path / "out2", data_root=tmp_path, workers=1)
    assert len(docs(tmp_path / "out2")) == 2  # both records of c.jsonl
    (tmp_path / "md").mkdir()
    (tmp_path / "md" / "x.md").write_text(SENT, encoding="utf-8")
    with pytest.raises(
        SourceNotFoundError, match=r"folder 'md'.*no file matching \['\*\.txt'.*set the source's pattern"
    ):
        build_corpus(
            params_for({"name": "m", "kind": "text", "path": "md"}), tmp_path / "o3", data_root=tmp_path
        )


def test_a_file_that_is_not_utf8_text_is_named_in_a_warning(tmp_path, caplog):
    (tmp_path / "a.txt").write_text(SENT * 3, encoding="utf-8")
    (tmp_path / "b.txt").write_text(SENT * 4, encoding="utf-8")
    (tmp_path / "blob.txt").write_bytes(bytes(range(128, 256)) * 40 + SENT.encode())
    with caplog.at_level("WARNING", logger="bert_core.corpus"):
        stats = build_corpus(
            params_for({"name": "t", "kind": "text", "path": "*.txt"}),
            tmp_path / "out",
            data_root=tmp_path,
            workers=1,
        )
    assert stats.files_with_utf8_errors == 1
    [warning] = [r.getMessage() for r in caplog.records if "not UTF-8" in r.getMessage()]
    assert "blob.txt" in warning and "is it a text file?" in warning


def test_a_corpus_emptied_by_a_cap_names_the_cap(tmp_path, prev_out):
    (tmp_path / "book.txt").write_text(SENT * 200, encoding="utf-8")  # one document larger than the cap
    params = params_for({"name": "t", "kind": "text", "path": "*.txt"}, cap={"max_bytes": 1000})
    with pytest.raises(EmptyCorpusError, match=r"'over_cap': 1.*raise corpus\.cap\.max_bytes"):
        build_corpus(params, prev_out, data_root=tmp_path, workers=1)
    assert_untouched(prev_out)


def test_blank_line_documents_and_parquet_source(tmp_path):
    (tmp_path / "docs.txt").write_text(f"{SENT}\n{SENT}\n\n\n{SENT * 3}\n\n{SENT * 4}\n", encoding="utf-8")
    table = pa.table({"body": [SENT * 5, SENT * 6, None], "key": [1, 2, 3], "name": ["x", "y", "z"]})
    pq.write_table(table, tmp_path / "rows.parquet")
    params = params_for(
        {"name": "b", "kind": "text", "path": "docs.txt", "doc_split": "blank_lines"},
        {
            "name": "p",
            "kind": "parquet",
            "path": "rows.parquet",
            "text_field": "body",
            "id_field": "key",
            "title_field": "name",
        },
    )
    stats = build_corpus(params, tmp_path / "out", data_root=tmp_path, workers=1)
    got = {d["doc_id"]: d for d in docs(tmp_path / "out")}
    assert set(got) == {"b:docs.txt#0", "b:docs.txt#1", "b:docs.txt#2", "p:1", "p:2"}
    assert got["b:docs.txt#0"]["sentences"] == [s.strip() + "." for s in SENT.split(". ") if s.strip()] * 2
    assert got["p:2"]["title"] == "y" and stats.dropped["bad_record"] == 1  # the null text row
    bad = params_for({"name": "p", "kind": "parquet", "path": "rows.parquet"})
    with pytest.raises(CorpusError, match=r"missing column\(s\) \['text'\]"):
        build_corpus(bad, tmp_path / "out2", data_root=tmp_path, workers=1)


def _write_params(tmp_path: Path, source_kind: str = "text", **corpus) -> Path:
    data = {
        "corpus": {
            "sources": [{"name": "hub", "kind": "hf", "path": "x"}],
            "local_sources": [{"name": "s", "kind": source_kind, "path": "a"}],
            **corpus,
        }
    }
    path = tmp_path / "corpus.yaml"
    path.write_text(json.dumps(data), encoding="utf-8")  # JSON is valid YAML
    return path


def test_unknown_source_kind_and_bad_values(tmp_path):
    with pytest.raises(
        ParamsError, match=r"'corpus\.local_sources\.0\.kind' = 'csv': Input should be 'hf', 'text'"
    ):
        load_params(_write_params(tmp_path, "csv"), "corpus", CorpusParams)
    with pytest.raises(ParamsError, match=r"'corpus\.heldout\.fraction' = 1\.5"):
        load_params(_write_params(tmp_path, heldout={"fraction": 1.5}), "corpus", CorpusParams)
    with pytest.raises(ParamsError, match=r"unknown key 'corpus\.clean\.min_chars'"):
        load_params(_write_params(tmp_path, clean={"min_chars": 3}), "corpus", CorpusParams)
    with pytest.raises(ParamsError, match=r"min_doc_chars \(500\) > max_doc_chars \(100\)"):
        load_params(
            _write_params(tmp_path, clean={"min_doc_chars": 500, "max_doc_chars": 100}),
            "corpus",
            CorpusParams,
        )
    with pytest.raises(ParamsError, match=r"'corpus\.workers' = 0"):
        load_params(_write_params(tmp_path, workers=0), "corpus", CorpusParams)


def test_flow_cli_exits_non_zero_on_bad_params(tmp_path, capsys):
    from flows.corpus import main

    assert main(["--params", str(_write_params(tmp_path, "csv"))]) == 1
    err = capsys.readouterr().err
    assert "corpus stage failed: ParamsError" in err and "corpus.local_sources.0.kind" in err


def test_hub_source_offline_is_a_clear_error(tmp_path, prev_out):
    """Without BERT_DATA_ROOT the Hub sources are used; offline (as in tests) that fails clearly."""
    params = load_params(REPO_ROOT / "params/corpus.yaml", "corpus", CorpusParams)
    with pytest.raises(
        CorpusError, match=r"cannot load Hugging Face dataset 'Salesforce/wikitext'.*BERT_DATA_ROOT"
    ):
        build_corpus(params, prev_out, data_root=None, workers=1)
    assert_untouched(prev_out)
