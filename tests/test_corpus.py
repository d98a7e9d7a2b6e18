"""Stage `corpus` on small real data: outputs, determinism, cleaning, caps, the held-out split, checks."""

from __future__ import annotations

import hashlib
import json
import logging
import re
import signal
import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from bert_core.corpus import (
    SCHEMA,
    CorpusParams,
    SourceSpec,
    build_corpus,
    iter_documents,
    read_manifest,
    units,
)
from bert_core.corpus.clean import normalize_text, paragraphs, strip_gutenberg
from bert_core.corpus.segment import split_long

BOOKS = ("pg14837.txt", "pg29962.txt", "pg2817.txt")  # 4.8 KB, 6.2 KB, 16.6 KB public-domain books


def make_root(shared: Path, tmp: Path) -> Path:
    """A data root laid out like shared/data holding three small books and one Wikipedia file (symlinks)."""
    root = tmp / "root"
    (root / "corpus" / "gutenberg").mkdir(parents=True)
    (root / "corpus" / "wikipedia").mkdir(parents=True)
    for name in BOOKS:
        (root / "corpus" / "gutenberg" / name).symlink_to(shared / "corpus" / "gutenberg" / name)
    (root / "corpus" / "gutenberg" / "MANIFEST.tsv").symlink_to(
        shared / "corpus" / "gutenberg" / "MANIFEST.tsv"
    )
    (root / "corpus" / "wikipedia" / "wiki_00.jsonl").symlink_to(
        shared / "corpus" / "wikipedia" / "wiki_00.jsonl"
    )
    return root


def small_params(**over) -> CorpusParams:
    base = {
        "sources": [
            {"name": "wt", "kind": "hf", "path": "Salesforce/wikitext", "config": "wikitext-103-raw-v1"}
        ],
        "local_sources": [
            {"name": "gutenberg", "kind": "text", "path": "corpus/gutenberg/*.txt"},
            {
                "name": "wikipedia",
                "kind": "jsonl",
                "path": "corpus/wikipedia/*.jsonl",
                "id_field": "id",
                "title_field": "title",
                "max_documents": 120,
            },
        ],
        "heldout": {"fraction": 0.1, "max_documents": 20},
        "workers": 1,
    }
    base.update(over)
    return CorpusParams.model_validate(base)


@pytest.fixture(scope="module")
def built(shared_data, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("corpus")
    root = make_root(shared_data, tmp)
    stats = build_corpus(small_params(), tmp / "out", data_root=root, workers=1, report_dir=tmp / "report")
    return root, tmp, stats


def test_output_layout_schema_and_manifest(built):
    _, tmp, stats = built
    out = tmp / "out"
    manifest = read_manifest(out)
    assert manifest["format"] == "bert-corpus/1"
    assert sorted(p.name for p in out.iterdir()) == [".bert-output", "heldout", "manifest.json", "train"]
    for split in ("train", "heldout"):
        files = sorted(p.name for p in (out / split).iterdir())
        assert files == [s["file"] for s in manifest["splits"][split]["shards"]]
        assert all(re.fullmatch(r"part-\d{5}\.parquet", f) for f in files)
        for shard in manifest["splits"][split]["shards"]:
            table = pq.read_table(out / split / shard["file"])
            assert table.schema.equals(SCHEMA)
            assert table.num_rows == shard["documents"]
    assert stats.documents == stats.documents_train + stats.documents_heldout
    assert manifest["splits"]["heldout"]["documents"] == stats.documents_heldout
    # Every record is accounted for: kept or dropped for a named reason.
    assert stats.documents + sum(stats.dropped.values()) == stats.records
    assert (tmp / "report" / "index.html").is_file()
    assert stats.check_report.success


def test_documents_are_documents(built):
    _, tmp, stats = built
    docs = list(iter_documents(tmp / "out", "train")) + list(iter_documents(tmp / "out", "heldout"))
    ids = [d["doc_id"] for d in docs]
    assert len(ids) == len(set(ids)) == stats.documents
    books = [d for d in docs if d["source"] == "gutenberg"]
    assert sorted(d["doc_id"] for d in books) == sorted(f"gutenberg:{b}" for b in BOOKS)  # no MANIFEST.tsv
    assert stats.per_source["wikipedia"]["documents"] == 120  # the per-source cap
    assert sum(len(d["sentences"]) for d in docs) == stats.sentences
    for d in docs:
        assert d["sentences"] and all(s and s == s.strip() and "\n" not in s for s in d["sentences"])
    wiki = {d["doc_id"]: d for d in docs if d["source"] == "wikipedia"}
    first = json.loads((Path(tmp) / "root/corpus/wikipedia/wiki_00.jsonl").read_text().split("\n")[0])
    if f"wikipedia:{first['id']}" in wiki:  # dropped only if shorter than min_doc_chars
        assert wiki[f"wikipedia:{first['id']}"]["title"] == first["title"]
    kitten = next(d for d in books if d["doc_id"] == "gutenberg:pg14837.txt")
    text = " ".join(kitten["sentences"])
    assert "Tom Kitten" in text and len(kitten["sentences"]) > 20


def test_heldout_membership_is_stable_and_whole_documents(built):
    root, tmp, _ = built
    held = {d["doc_id"] for d in iter_documents(tmp / "out", "heldout")}
    train = {d["doc_id"] for d in iter_documents(tmp / "out", "train")}
    assert held and train and not held & train
    assert len(held) <= 20
    # Membership is a hash of doc_id: a smaller build puts every document it keeps on the same side.
    params = small_params(
        local_sources=[
            {
                "name": "wikipedia",
                "kind": "jsonl",
                "path": "corpus/wikipedia/*.jsonl",
                "id_field": "id",
                "max_documents": 60,
            }
        ],
        heldout={"fraction": 0.1, "max_documents": 20},
    )
    build_corpus(params, tmp / "small", data_root=root, workers=1)
    held2 = {d["doc_id"] for d in iter_documents(tmp / "small", "heldout")}
    train2 = {d["doc_id"] for d in iter_documents(tmp / "small", "train")}
    assert held2 and held2 <= held and train2 <= train


def test_output_independent_of_worker_count(built):
    root, tmp, stats1 = built
    stats2 = build_corpus(small_params(), tmp / "out2", data_root=root, workers=2)
    for split in ("train", "heldout"):
        for p in sorted((tmp / "out" / split).iterdir()):
            a = hashlib.sha256(p.read_bytes()).hexdigest()
            b = hashlib.sha256((tmp / "out2" / split / p.name).read_bytes()).hexdigest()
            assert a == b, p.name
    assert read_manifest(tmp / "out") == read_manifest(tmp / "out2")
    assert stats2.workers == 2 and stats2.documents == stats1.documents


def test_an_interrupt_stops_the_workers_at_once(built, monkeypatch):
    """Ctrl-C / SIGTERM while units run in the pool: the workers are terminated, not waited for (a worker
    spawned after a signal to the process group never got it; waiting took 15 s under DVC on CI)."""
    import psutil

    from bert_core.corpus import build

    root, tmp, _ = built

    def interrupted(self, unit, result):
        raise KeyboardInterrupt

    exit_codes: list[int | None] = []
    real_stop = build.stop_workers

    def stop_workers(pool):
        workers = list(pool._processes.values())
        real_stop(pool)
        for p in workers:
            # The pool's manager thread reaps dead workers too: when it wins the race for waitpid, our
            # poll sees ECHILD and reads None until the manager records the code (a dead worker, not a
            # running one: a worker left to finish its unit would exit 0 and fail the assertion below).
            deadline = time.monotonic() + 5
            while p.exitcode is None and time.monotonic() < deadline:
                time.sleep(0.01)
        exit_codes.extend(p.exitcode for p in workers)

    monkeypatch.setattr(build.Merger, "consume", interrupted)
    monkeypatch.setattr(build, "stop_workers", stop_workers)
    with pytest.raises(KeyboardInterrupt):
        build_corpus(small_params(), tmp / "interrupted", data_root=root, workers=2)
    assert exit_codes and set(exit_codes) == {-signal.SIGTERM}, exit_codes  # terminated, not waited for
    left = [
        p
        for p in psutil.Process().children(recursive=True)
        if p.is_running() and p.status() != "zombie" and "resource_tracker" not in " ".join(p.cmdline())
    ]
    assert left == [], left
    assert not (tmp / "interrupted").exists()


def test_exact_duplicates_dropped(shared_data, tmp_path):
    root = tmp_path / "root"
    (root / "a").mkdir(parents=True)
    (root / "b").mkdir(parents=True)
    book = shared_data / "corpus" / "gutenberg" / BOOKS[1]
    (root / "a" / "x.txt").symlink_to(book)
    (root / "b" / "y.txt").symlink_to(book)  # same text under another name
    (root / "b" / "z.txt").symlink_to(shared_data / "corpus" / "gutenberg" / BOOKS[2])
    params = small_params(
        local_sources=[
            {"name": "a", "kind": "text", "path": "a"},
            {"name": "b", "kind": "text", "path": "b"},
        ],
        heldout={"fraction": 0.5, "max_documents": 1},
    )
    stats = build_corpus(params, tmp_path / "out", data_root=root, workers=1)
    assert stats.duplicates == 1 and stats.dropped["duplicate"] == 1
    ids = {d["doc_id"] for s in ("train", "heldout") for d in iter_documents(tmp_path / "out", s)}
    assert ids == {"a:x.txt", "b:z.txt"}  # the first occurrence wins


def test_progress_counts_the_work_units(built, tmp_path, monkeypatch, caplog):
    root = built[0]
    monkeypatch.setattr(units, "GROUP_FILES", 1)  # a unit a file
    monkeypatch.setenv("BERT_PROGRESS_INTERVAL_S", "0")
    monkeypatch.setenv("BERT_PROGRESS_MIN_PERCENT", "0")
    caplog.set_level(logging.INFO, "bert_core")
    build_corpus(small_params(), tmp_path / "out", data_root=root, workers=2)
    lines = [m for m in caplog.messages if m.startswith("corpus: work unit ")]
    n = len(lines)
    assert n >= 4 and lines[0].startswith(f"corpus: work unit 1/{n} (") and "ETA" in lines[0]
    assert [m for m in caplog.messages if m.startswith(f"corpus: done, work unit {n}/{n} (100.0%)")]


def test_global_byte_cap_is_deterministic(shared_data, tmp_path, caplog, monkeypatch):
    root = make_root(shared_data, tmp_path)
    params = small_params(cap={"max_bytes": 60_000})
    caplog.set_level(logging.INFO, "bert_core")
    monkeypatch.setenv("BERT_PROGRESS_INTERVAL_S", "0")
    s1 = build_corpus(params, tmp_path / "o1", data_root=root, workers=1)
    assert [
        m for m in caplog.messages if m.startswith("corpus: done, ") and m.endswith("; the caps are reached")
    ]
    line = f"corpus: {s1.documents:,} documents ({s1.documents_train:,} train, {s1.documents_heldout:,} held out)"
    summary = [m for m in caplog.messages if m.startswith(line)]  # the stage's summary reads as a sentence
    assert len(summary) == 1 and "; stopped at corpus.cap; " in summary[0] and "over_cap" in summary[0]
    s2 = build_corpus(params, tmp_path / "o2", data_root=root, workers=2)
    assert s1.bytes <= 60_000 and s1.capped and s1.dropped["over_cap"] >= 1
    assert (s1.documents, s1.bytes) == (s2.documents, s2.bytes)
    assert read_manifest(tmp_path / "o1")["splits"] == read_manifest(tmp_path / "o2")["splits"]


def test_wikitext_layout_splits_articles(shared_data, tmp_path):
    params = small_params(
        local_sources=[
            {"name": "wt2", "kind": "text", "path": "wikitext/wikitext-2/valid.txt", "doc_split": "wikitext"}
        ],
        heldout={"fraction": 0.2, "max_documents": 50},
    )
    stats = build_corpus(params, tmp_path / "out", data_root=shared_data, workers=1)
    docs = list(iter_documents(tmp_path / "out", "train")) + list(iter_documents(tmp_path / "out", "heldout"))
    titles = {d["title"] for d in docs}
    assert "Homarus gammarus" in titles  # the first article of the validation split
    assert stats.documents > 50  # WikiText-2 valid holds 60 articles
    for d in docs:
        assert not any(re.match(r"^ ?= ", s) for s in d["sentences"])  # no heading lines
        assert not any(" @-@ " in s or " @,@ " in s for s in d["sentences"])


def test_gutenberg_boilerplate_removed(shared_data, tmp_path):
    body = (shared_data / "corpus" / "gutenberg" / BOOKS[0]).read_text(encoding="utf-8")
    wrapped = (
        "\ufeffThe Project Gutenberg EBook of The Tale of Tom Kitten, by Beatrix Potter\r\n\r\n"
        "This eBook is for the use of anyone anywhere at no cost and with\r\nalmost no restrictions whatsoever.\r\n\r\n"
        "*** START OF THIS PROJECT GUTENBERG EBOOK THE TALE OF TOM KITTEN ***\r\n\r\n\r\n\r\n\r\n"
        "Produced by Robert Cicconetti, Melissa Er-Raqabi and the\r\nOnline Distributed Proofreading Team\r\n\r\n"
        + body.replace("\n", "\r\n")
        + "\r\n\r\nEnd of the Project Gutenberg EBook of The Tale of Tom Kitten, by Beatrix Potter\r\n\r\n"
        "*** END OF THIS PROJECT GUTENBERG EBOOK THE TALE OF TOM KITTEN ***\r\n\r\n"
        "***** This file should be named 14837.txt or 14837.zip *****\r\n"
        "Section 1. General Terms of Use and Redistributing Project Gutenberg-tm\r\n"
    )
    stripped, changed = strip_gutenberg(normalize_text(wrapped))
    assert changed
    # The stored body still opens with its transcriber credits ("Produced by ..."): those go too.
    assert stripped == strip_gutenberg(normalize_text(body))[0]
    assert "Gutenberg" not in stripped and "Produced by" not in stripped
    assert stripped.startswith("[Illustration]") and stripped.endswith("ever since.")
    root = tmp_path / "root"
    root.mkdir()
    (root / "pg.txt").write_text(wrapped, encoding="utf-8")
    params = small_params(
        local_sources=[{"name": "pg", "kind": "text", "path": "pg.txt"}],
        heldout={"fraction": 0.999, "max_documents": 1},
    )
    # One document cannot fill both splits: the stage says so instead of writing a lopsided corpus.
    from bert_core.corpus import EmptyCorpusError

    with pytest.raises(EmptyCorpusError, match="split is empty: 1 document"):
        build_corpus(params, tmp_path / "out", data_root=root, workers=1)
    assert not (tmp_path / "out").exists()


def test_cleaning_helpers():
    text = "Caf\u0065\u0301 \u00a0 au\x00 lait\r\nline two\u200b\r\n\r\n\r\n  Second\tpara  \n"
    norm = normalize_text(text)
    assert norm.split("\n")[0] == "Café au lait" and "\u0301" not in norm
    assert paragraphs(norm, "wrap") == ["Café au lait line two", "Second para"]
    assert paragraphs("a\nb\n\nc", "paragraph") == ["a", "b", "c"]
    pieces = split_long("word " * 1000, 100)
    assert all(len(p) <= 100 for p in pieces) and " ".join(pieces).split() == ["word"] * 1000
    assert split_long("x" * 250, 100) == ["x" * 100, "x" * 100, "x" * 50]


def test_source_spec_validation():
    with pytest.raises(ValueError, match="doc_split 'wikitext' is not valid for kind 'jsonl'"):
        SourceSpec(name="a", kind="jsonl", path="x", doc_split="wikitext")
    with pytest.raises(ValueError, match="prefixes every doc_id"):
        SourceSpec(name="a b", kind="text", path="x")


def test_hf_dataset_source_with_wikitext_layout(shared_data, tmp_path):
    """The Hub reader path (``datasets`` streaming), on a local dataset folder in WikiText's row layout."""
    lines = (shared_data / "wikitext" / "wikitext-2" / "test.txt").read_text(encoding="utf-8").split("\n")
    rows = [{"text": line + "\n" if line else ""} for line in lines[:600]]
    ds_dir = tmp_path / "root" / "wikitext_local"
    ds_dir.mkdir(parents=True)
    (ds_dir / "train.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n", encoding="utf-8")
    params = small_params(
        local_sources=[{"name": "wt", "kind": "hf", "path": "wikitext_local", "doc_split": "wikitext"}],
        heldout={"fraction": 0.3, "max_documents": 5},
    )
    stats = build_corpus(params, tmp_path / "out", data_root=tmp_path / "root", workers=1)
    docs = list(iter_documents(tmp_path / "out", "train")) + list(iter_documents(tmp_path / "out", "heldout"))
    assert {d["title"] for d in docs} >= {"Robert <unk>"}  # the first article of the test split
    assert all(d["doc_id"].startswith("wt:train#") for d in docs)
    assert stats.documents >= 2 and stats.input_bytes > 0


def test_capped_unit_stops_reading_early(shared_data, tmp_path):
    """A cap bounds the reading too: a capped profile does not process a whole large unit."""
    root = make_root(shared_data, tmp_path)
    params = small_params(
        local_sources=[
            {"name": "wikipedia", "kind": "jsonl", "path": "corpus/wikipedia/*.jsonl", "max_documents": 5}
        ],
        heldout={"fraction": 0.2, "max_documents": 2},
    )
    stats = build_corpus(params, tmp_path / "out", data_root=root, workers=1)
    assert stats.documents == 5 and stats.units_stopped_early == 1
    assert stats.records < 60  # of 620 records in wiki_00.jsonl
    assert stats.documents + sum(stats.dropped.values()) == stats.records
