"""A corpus build stopped by a crash continues after the work units it finished and writes the same corpus.
Here each input file is a unit of its own (small files are grouped otherwise:
``test_corpus_small_files.py``)."""

from __future__ import annotations

import logging
import shutil
import time
from pathlib import Path

import pytest
from corpus_builds import continued, corpus_files, crashed_build
from test_corpus import make_root, small_params

from bert_core.corpus import build, build_corpus, units
from bert_core.corpus.build import EmptyCorpusError, KeptUnits
from bert_core.kept_work import BuildInUseError, partial_dir


@pytest.fixture(autouse=True)
def _a_unit_a_file(monkeypatch):
    monkeypatch.setattr(units, "GROUP_FILES", 1)


def _crashed_build(root: Path, out: Path, monkeypatch, index: int, workers: int = 1) -> None:
    crashed_build(small_params(), out, root, monkeypatch, index, workers)


@pytest.mark.parametrize("workers", [1, 2])
def test_a_crashed_build_continues_after_its_finished_units_and_writes_the_same_corpus(
    shared_data, tmp_path, monkeypatch, caplog, workers
):
    root = make_root(shared_data, tmp_path)
    build_corpus(small_params(), tmp_path / "whole", data_root=root, workers=workers)
    assert not partial_dir(tmp_path / "whole").exists()  # a build that succeeds leaves no work directory

    out = tmp_path / "out"
    _crashed_build(root, out, monkeypatch, 2, workers)
    assert not out.exists()
    # units 0, 1, 2 of 4, and with 2 workers unit 3 too when it finished before the crash
    kept = len(list((partial_dir(out) / "units").glob("*.json")))
    assert kept == 3 if workers == 1 else kept in (3, 4)

    caplog.set_level(logging.INFO, logger="bert_core.corpus.build")
    build_corpus(small_params(), out, data_root=root, workers=workers)
    assert continued(caplog) == [f"corpus: continuing an unfinished build: {kept} of 4 work unit(s) kept"]
    assert corpus_files(out) == corpus_files(
        tmp_path / "whole"
    )  # byte for byte, the manifest's statistics included
    assert not partial_dir(out).exists()


def test_a_changed_input_or_a_damaged_unit_is_read_again(shared_data, tmp_path, monkeypatch, caplog):
    root = make_root(shared_data, tmp_path)
    out = tmp_path / "out"
    _crashed_build(root, out, monkeypatch, 3)
    units = sorted((partial_dir(out)).glob("unit-*.parquet"))
    assert len(units) == 4  # every unit recorded; the crash came as the last one was merged
    # unit 0's kept file damaged in place (same size); unit 1's input edited; units 2 and 3 untouched
    data = bytearray(units[0].read_bytes())
    data[len(data) // 2] ^= 0xFF
    units[0].write_bytes(bytes(data))
    book = sorted((root / "corpus" / "gutenberg").glob("*.txt"))[1]
    text = book.read_text(encoding="utf-8")
    book.unlink()
    book.write_text(
        text + "\n\nA paragraph the user added after the crash, long enough to be kept.\n", "utf-8"
    )

    caplog.set_level(logging.INFO, logger="bert_core.corpus.build")
    build_corpus(small_params(), out, data_root=root)
    assert continued(caplog) == ["corpus: continuing an unfinished build: 2 of 4 work unit(s) kept"]
    build_corpus(small_params(), tmp_path / "fresh", data_root=root)
    assert corpus_files(out) == corpus_files(tmp_path / "fresh")


def test_other_params_start_afresh_and_a_refused_input_keeps_nothing(
    shared_data, tmp_path, monkeypatch, caplog
):
    root = make_root(shared_data, tmp_path)
    out = tmp_path / "out"
    _crashed_build(root, out, monkeypatch, 2)
    caplog.set_level(logging.INFO, logger="bert_core.corpus.build")
    with pytest.raises(EmptyCorpusError):
        build_corpus(small_params(clean={"min_doc_chars": 10**7}), out, data_root=root)
    assert any("discarding the 3 finished work unit(s)" in r.getMessage() for r in caplog.records)
    assert not partial_dir(out).exists() and not out.exists()


def test_a_second_build_of_the_same_output_fails_at_once(shared_data, tmp_path):
    root = make_root(shared_data, tmp_path)
    out = tmp_path / "out"
    with (
        KeptUnits(out, {"held": "by another build"}, 1),
        pytest.raises(BuildInUseError, match="another corpus build"),
    ):
        build_corpus(small_params(), out, data_root=root)
    assert not out.exists()
    shutil.rmtree(partial_dir(out), ignore_errors=True)


def test_units_another_version_of_the_code_built_are_not_taken(shared_data, tmp_path, monkeypatch, caplog):
    root = make_root(shared_data, tmp_path)
    out = tmp_path / "out"
    _crashed_build(root, out, monkeypatch, 2)
    monkeypatch.setattr(build, "code_fingerprint", lambda package: "the next release")
    caplog.set_level(logging.INFO, logger="bert_core.corpus.build")
    build_corpus(small_params(), out, data_root=root)
    assert any("discarding the 3 finished work unit(s)" in r.getMessage() for r in caplog.records)
    assert continued(caplog) == []


def test_units_finished_before_their_turn_to_merge_are_kept(shared_data, tmp_path, monkeypatch, caplog):
    """Merging goes in unit order; a unit that finishes while an earlier one is still read is kept too."""
    root = make_root(shared_data, tmp_path)
    build_corpus(small_params(), tmp_path / "whole", data_root=root, workers=2)
    out = tmp_path / "out"
    real = build.Merger.consume

    def consume(self, unit, result):
        if unit.index == 0:  # the crash comes as unit 0 merges, once units 1 and 2 are finished too
            deadline = time.monotonic() + 60
            while not all((partial_dir(out) / f"unit-00000{i}.parquet").exists() for i in (1, 2)):
                assert time.monotonic() < deadline
                time.sleep(0.05)
            time.sleep(1.0)  # their results reach the parent
            raise RuntimeError("the machine went down")
        real(self, unit, result)

    with monkeypatch.context() as patch:
        patch.setattr(build.Merger, "consume", consume)
        with pytest.raises(RuntimeError, match="went down"):
            build_corpus(small_params(), out, data_root=root, workers=2)
    assert len(list((partial_dir(out) / "units").glob("*.json"))) >= 3  # 0 (merging), 1 and 2

    caplog.set_level(logging.INFO, logger="bert_core.corpus.build")
    build_corpus(small_params(), out, data_root=root, workers=2)
    assert continued(caplog) and int(continued(caplog)[0].split(": ")[2].split()[0]) >= 3
    assert corpus_files(out) == corpus_files(tmp_path / "whole")
