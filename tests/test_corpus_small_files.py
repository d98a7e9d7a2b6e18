"""Small files of a source are read together, several to a work unit: in file order, the same corpus as one unit
per file, bytes that are not UTF-8 accounted and named per file, and kept group by group after a crash."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
from corpus_builds import continued, corpus_files, crashed_build, one_reader_build

from bert_core.corpus import CorpusParams, build_corpus, units
from bert_core.corpus.units import plan_units

GROUP = 5_000  # bytes of a group here: about four files


@pytest.fixture(autouse=True)
def _small_groups(monkeypatch):
    monkeypatch.setattr(units, "GROUP_BYTES", GROUP)


def _files(root: Path) -> list[Path]:
    """40 one-document files of about 1.2 KB; file 7 mostly bytes that are not UTF-8, file 31 a few; file 20
    larger than a group."""
    folder = root / "docs"
    folder.mkdir(parents=True)
    paths = []
    for i in range(40):
        text = " ".join(
            f"Note {i} records fact {j}, which is number {i * 100 + j}." for j in range(24)
        ).encode()
        if i == 7:
            text = bytes(range(128, 256)) * 12 + text
        elif i == 31:
            text = text[:200] + b" \xff\xfe " + text[200:]
        elif i == 20:
            text = text * 6
        paths.append(folder / f"note-{i:03d}.txt")
        paths[-1].write_bytes(text)
    return paths


def _params() -> CorpusParams:
    spec = {"name": "notes", "kind": "text", "path": "docs"}
    return CorpusParams.model_validate(
        {"sources": [spec], "local_sources": [spec], "heldout": {"fraction": 0.1, "max_documents": 5}}
    )


def test_consecutive_small_files_make_a_unit_up_to_the_group_bytes_and_files(tmp_path, monkeypatch):
    paths = _files(tmp_path)
    plan = plan_units(_params().active_sources(tmp_path), tmp_path)
    assert [Path(p.path) for u in plan for p in u.inputs] == paths  # every file once, in order
    assert [u.index for u in plan] == list(range(len(plan))) and 8 < len(plan) < 20
    for unit in plan:
        sizes = [Path(p.path).stat().st_size for p in unit.inputs]
        assert len(sizes) == 1 or sum(sizes) <= GROUP
    assert [len(u.inputs) for u in plan if u.inputs[0].path == str(paths[20])] == [1]  # the large file alone
    monkeypatch.setattr(units, "GROUP_FILES", 3)
    assert max(len(u.inputs) for u in plan_units(_params().active_sources(tmp_path), tmp_path)) == 3
    whole = plan_units(_params().active_sources(tmp_path), tmp_path, split=False)
    assert [len(u.inputs) for u in whole] == [1] * 40


def test_grouped_files_give_the_corpus_of_a_unit_per_file(tmp_path, monkeypatch, caplog):
    paths = _files(tmp_path)
    one_reader_build(_params(), tmp_path / "apart", tmp_path, monkeypatch)
    caplog.set_level(logging.INFO, logger="bert_core.corpus")
    caplog.clear()
    stats = build_corpus(_params(), tmp_path / "grouped", data_root=tmp_path, workers=2)
    assert corpus_files(tmp_path / "grouped") == corpus_files(tmp_path / "apart")  # the manifest included
    assert stats.input_files == 40 and stats.files_with_utf8_errors == 2
    assert stats.utf8_error_files == [str(paths[7]), str(paths[31])]
    [warning] = [
        r.getMessage()
        for r in caplog.records
        if r.levelno == logging.WARNING and "not UTF-8" in r.getMessage()
    ]
    assert warning.startswith(f"{paths[7]}: ") and "is it a text file?" in warning
    assert any(r.getMessage().startswith(f"{paths[31]}: bytes that are not UTF-8") for r in caplog.records)


def test_a_crashed_build_keeps_its_finished_groups_and_reads_an_edited_one_again(
    tmp_path, monkeypatch, caplog
):
    paths = _files(tmp_path)
    plan = plan_units(_params().active_sources(tmp_path), tmp_path)
    one_reader_build(_params(), tmp_path / "apart", tmp_path, monkeypatch)
    caplog.set_level(logging.INFO, logger="bert_core.corpus.build")
    crashed_build(_params(), tmp_path / "out", tmp_path, monkeypatch, 2)
    build_corpus(_params(), tmp_path / "out", data_root=tmp_path, workers=2)
    assert continued(caplog) == [
        f"corpus: continuing an unfinished build: 3 of {len(plan)} work unit(s) kept"
    ]
    assert corpus_files(tmp_path / "out") == corpus_files(tmp_path / "apart")

    crashed_build(_params(), tmp_path / "again", tmp_path, monkeypatch, 2)
    edited = Path(plan[1].inputs[-1].path)  # the last file of the second group
    edited.write_bytes(edited.read_bytes() + b" A sentence added after the crash, long enough to keep.")
    caplog.clear()
    build_corpus(_params(), tmp_path / "again", data_root=tmp_path, workers=1)
    assert continued(caplog) == [
        f"corpus: continuing an unfinished build: 2 of {len(plan)} work unit(s) kept"
    ]
    build_corpus(_params(), tmp_path / "fresh", data_root=tmp_path, workers=1)
    assert corpus_files(tmp_path / "again") == corpus_files(tmp_path / "fresh")
    assert paths[0].exists()
