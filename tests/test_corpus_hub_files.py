"""A Hub dataset of a document a row is read one data file per work unit: in parallel, kept file by file
after a crash, and, when its rows carry ids, the same corpus as one reader of the whole dataset; a row without
one is named by its data file and its row in it."""

from __future__ import annotations

import csv
import logging
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from corpus_builds import continued, corpus_files, crashed_build, one_reader_build

from bert_core.corpus import CorpusError, CorpusParams, build_corpus, iter_documents
from bert_core.corpus.readers import UnitStats, read_unit
from bert_core.corpus.units import plan_units
from bert_core.kept_work import partial_dir

FILES = 4


def _dataset(root: Path, files: int = FILES) -> None:
    """A local dataset folder (as ``BERT_DATA_ROOT`` holds a Hub dataset): ``files`` Parquet data files of
    documents with ids, titles and sentences of their own."""
    folder = root / "hub" / "wiki"
    folder.mkdir(parents=True, exist_ok=True)
    for k in range(files):
        rows = [
            {
                "id": f"{k}{i:03d}",
                "title": f"Article {k}.{i}",
                "text": " ".join(
                    f"Article {k}.{i} says in sentence {j} that the number {k * 1000 + i * 10 + j} is odd."
                    for j in range(8)
                ),
            }
            for i in range(30)
        ]
        pq.write_table(pa.Table.from_pylist(rows), folder / f"train-{k:05d}-of-{files:05d}.parquet")


def _params(**source: object) -> CorpusParams:
    return CorpusParams.model_validate(
        {
            "sources": [{"name": "hub", "kind": "hf", "path": "x"}],
            "local_sources": [
                {
                    "name": "wiki",
                    "kind": "hf",
                    "path": "hub/wiki",
                    "id_field": "id",
                    "title_field": "title",
                    **source,
                }
            ],
            "heldout": {"fraction": 0.1, "max_documents": 20},
        }
    )


def test_a_dataset_with_ids_is_read_one_data_file_per_unit_into_the_corpus_of_one_reader(
    tmp_path, monkeypatch, caplog
):
    _dataset(tmp_path)
    units = plan_units(_params().active_sources(tmp_path), tmp_path)
    assert [u.inputs[0].shard for u in units] == [(k, FILES) for k in range(FILES)]
    one_reader_build(_params(), tmp_path / "whole", tmp_path, monkeypatch)
    caplog.set_level(logging.INFO, logger="bert_core.corpus")
    stats = build_corpus(_params(), tmp_path / "files", data_root=tmp_path, workers=2)
    assert any(f"read as its {FILES} data files (work units)" in r.getMessage() for r in caplog.records)
    assert stats.documents == 30 * FILES and stats.input_files == 1
    assert corpus_files(tmp_path / "files") == corpus_files(
        tmp_path / "whole"
    )  # the manifest's statistics included


def test_rows_without_ids_are_named_by_their_data_file_and_row(tmp_path):
    _dataset(tmp_path)
    params = _params(id_field=None)
    assert [u.inputs[0].shard for u in plan_units(params.active_sources(tmp_path), tmp_path)] == [
        (k, FILES) for k in range(FILES)
    ]
    build_corpus(params, tmp_path / "out", data_root=tmp_path, workers=2)
    docs = [d for split in ("train", "heldout") for d in iter_documents(tmp_path / "out", split)]
    assert sorted(d["doc_id"] for d in docs) == sorted(
        f"wiki:train:{k}:{i}" for k in range(FILES) for i in range(30)
    )
    assert all(d["title"] == f"Article {d['doc_id'].split(':')[2]}.{d['doc_id'].split(':')[3]}" for d in docs)


def test_wikitext_articles_keep_the_dataset_one_unit(tmp_path):
    _dataset(tmp_path)
    params = _params(doc_split="wikitext")
    assert [u.inputs[0].shard for u in plan_units(params.active_sources(tmp_path), tmp_path)] == [None]


def test_a_crashed_build_keeps_the_data_files_it_finished(tmp_path, monkeypatch, caplog):
    _dataset(tmp_path)
    one_reader_build(_params(), tmp_path / "whole", tmp_path, monkeypatch)
    out = tmp_path / "out"
    crashed_build(_params(), out, tmp_path, monkeypatch, 2)
    caplog.set_level(logging.INFO, logger="bert_core.corpus.build")
    build_corpus(_params(), out, data_root=tmp_path, workers=2)
    assert continued(caplog) == [f"corpus: continuing an unfinished build: 3 of {FILES} work unit(s) kept"]
    assert corpus_files(out) == corpus_files(tmp_path / "whole")
    assert not partial_dir(out).exists()


def test_a_dataset_that_changed_since_the_plan_is_refused(tmp_path):
    _dataset(tmp_path)
    unit = plan_units(_params().active_sources(tmp_path), tmp_path)[1]
    for old in (tmp_path / "hub" / "wiki").iterdir():
        old.unlink()
    _dataset(tmp_path, files=FILES + 1)  # one more data file, as a Hub dataset updated during the build
    with pytest.raises(
        CorpusError, match=rf"has {FILES + 1} data files, not the {FILES} .* set the source's revision"
    ):
        list(read_unit(unit, UnitStats(), max_doc_chars=10**6, on_bad_record="skip", root=tmp_path))


def test_a_folder_of_csv_files_is_a_dataset_of_a_unit_per_file(tmp_path):
    folder = tmp_path / "mine"
    folder.mkdir()
    for k in range(3):
        rows = [["id", "title", "text"]] + [
            [
                f"{k}-{i}",
                f"Row {k}.{i}",
                " ".join(f'Row {k}.{i}, sentence {j}, says "{j}".' for j in range(8)),
            ]
            for i in range(10)
        ]
        with (folder / f"part-{k}.csv").open("w", newline="", encoding="utf-8") as fh:
            csv.writer(fh).writerows(rows)
    params = _params(path="mine")
    assert [u.inputs[0].shard for u in plan_units(params.active_sources(tmp_path), tmp_path)] == [
        (k, 3) for k in range(3)
    ]
    stats = build_corpus(params, tmp_path / "out", data_root=tmp_path, workers=2)
    docs = [d for split in ("train", "heldout") for d in iter_documents(tmp_path / "out", split)]
    assert stats.documents == 30 and sorted(d["doc_id"] for d in docs)[:2] == ["wiki:0-0", "wiki:0-1"]
    assert any('sentence 3, says "3".' in " ".join(d["sentences"]) for d in docs)
