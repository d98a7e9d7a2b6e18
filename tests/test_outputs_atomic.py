"""All-or-nothing outputs of a stage with several outs (:func:`bert_core.atomic.atomic_outputs`)."""

from __future__ import annotations

import os

import pytest

from bert_core import atomic, owned
from bert_core.atomic import OutputNotWritableError, atomic_outputs, check_writable


def _previous(tmp_path):
    (tmp_path / "results").mkdir()
    (tmp_path / "results" / "summary.json").write_text("old")
    owned.mark_output(tmp_path / "results")  # an earlier run's output
    (tmp_path / "metrics.json").write_text("old")
    return [tmp_path / "results", tmp_path / "model", tmp_path / "metrics.json"]


def _leftovers(tmp_path):
    return sorted(p.name for p in tmp_path.iterdir() if atomic.TEMP_MARKER in p.name)


def test_all_outputs_are_committed_together(tmp_path):
    results, model, metrics = _previous(tmp_path)
    with atomic_outputs([results, model, metrics], dirs=[results]) as staged:
        (staged[results] / "summary.json").write_text("new")
        staged[model].mkdir()
        (staged[model] / "config.json").write_text("{}")
        staged[metrics].write_text("new")
        assert not (model / "config.json").exists()  # nothing visible before the block ends
        assert (results / "summary.json").read_text() == "old"
    assert (results / "summary.json").read_text() == "new"
    assert (model / "config.json").exists() and metrics.read_text() == "new"
    assert _leftovers(tmp_path) == []


def test_an_error_commits_nothing(tmp_path):
    results, model, metrics = _previous(tmp_path)
    with (
        pytest.raises(RuntimeError, match="boom"),
        atomic_outputs([results, model, metrics], dirs=[results]) as staged,
    ):
        (staged[results] / "summary.json").write_text("new")
        staged[metrics].write_text("new")
        raise RuntimeError("boom")  # e.g. the model could not be saved
    assert (results / "summary.json").read_text() == "old" and metrics.read_text() == "old"
    assert not model.exists() and _leftovers(tmp_path) == []


def test_an_output_not_written_commits_nothing(tmp_path):
    results, model, metrics = _previous(tmp_path)
    with (
        pytest.raises(FileNotFoundError, match="model"),
        atomic_outputs([results, model, metrics], dirs=[results]) as staged,
    ):
        staged[metrics].write_text("new")
    assert metrics.read_text() == "old" and _leftovers(tmp_path) == []


def test_a_failing_rename_rolls_back_the_others(tmp_path, monkeypatch):
    results, model, metrics = _previous(tmp_path)
    real_replace = os.replace

    def replace(src, dst):
        if str(dst) == str(metrics) and atomic.TEMP_MARKER in str(src) and "old-" not in str(src):
            raise PermissionError(13, "Permission denied", str(dst))
        return real_replace(src, dst)

    monkeypatch.setattr(atomic.os, "replace", replace)
    with pytest.raises(PermissionError), atomic_outputs([results, model, metrics], dirs=[results]) as staged:
        (staged[results] / "summary.json").write_text("new")
        staged[model].mkdir()
        staged[metrics].write_text("new")
    assert (results / "summary.json").read_text() == "old"  # the new results were taken back out
    assert metrics.read_text() == "old" and not model.exists()
    assert _leftovers(tmp_path) == []


def test_an_output_inside_a_directory_output(tmp_path):
    results = tmp_path / "results"
    model = results / "model"
    with atomic_outputs([results, model], dirs=[results, model]) as staged:
        assert staged[model].parent == staged[results]
        (staged[model] / "w").write_text("w")
        (staged[results] / "summary.json").write_text("s")
    assert (model / "w").read_text() == "w" and (results / "summary.json").exists()


def test_unwritable_output_fails_before_anything(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(OutputNotWritableError, match=r"cannot write output .*file/model: .*not a directory"):
        check_writable(tmp_path / "ok.json", blocker / "model")
    ran = []
    with (
        pytest.raises(OutputNotWritableError, match="file/model"),
        atomic_outputs([tmp_path / "ok.json", blocker / "model"]),
    ):
        ran.append(1)
    assert not ran and not (tmp_path / "ok.json").exists()


def test_same_output_twice_is_refused(tmp_path):
    with pytest.raises(ValueError, match="named twice"), atomic_outputs([tmp_path / "a", tmp_path / "a"]):
        pass


def test_a_failure_leaves_no_new_parent_directories(tmp_path):
    results, plot = tmp_path / "results", tmp_path / "plots" / "task" / "train.csv"
    with pytest.raises(RuntimeError), atomic_outputs([results, plot], dirs=[results]) as staged:
        staged[plot].write_text("x")
        raise RuntimeError("data error")
    assert list(tmp_path.iterdir()) == []


# --- never destroy what the pipeline did not write -----------------------------------------------------
def test_a_foreign_directory_is_refused_and_left_intact(tmp_path):
    foreign = tmp_path / "out"
    foreign.mkdir()
    (foreign / "thesis.tex").write_text("years of work")
    with (
        pytest.raises(owned.ForeignOutputError, match=r"out is an existing directory that this pipeline"),
        atomic.atomic_path(foreign, is_dir=True) as tmp,
    ):
        (tmp / "x").write_text("new")
    with pytest.raises(owned.ForeignOutputError), atomic_outputs([foreign], dirs=[foreign]):
        pytest.fail("the block must not run")
    with pytest.raises(owned.ForeignOutputError):
        check_writable(foreign)
    assert (foreign / "thesis.tex").read_text() == "years of work"
    assert _leftovers(tmp_path) == []


def test_a_directory_where_a_file_goes_is_refused_even_when_it_is_ours(tmp_path):
    out = tmp_path / "predictions.jsonl"
    with atomic.atomic_path(out, is_dir=True) as tmp:
        (tmp / "a").write_text("x")
    with pytest.raises(owned.ForeignOutputError, match="a file goes there"):
        check_writable(out, is_dir=False)
    with pytest.raises(owned.ForeignOutputError, match="a file goes there"), atomic.atomic_path(out) as tmp:
        tmp.write_text("rows")
    assert (out / "a").read_text() == "x"
    assert _leftovers(tmp_path) == []


def test_a_fifo_is_refused(tmp_path):
    fifo = tmp_path / "out.jsonl"
    os.mkfifo(fifo)
    with pytest.raises(owned.ForeignOutputError, match="FIFO"):
        atomic.write_text_atomic(fifo, "x")
    assert fifo.exists()


def test_our_own_outputs_and_empty_directories_are_replaced(tmp_path):
    out = tmp_path / "model"
    out.mkdir()  # empty: nothing to lose
    for text in ("one", "two"):
        with atomic.atomic_path(out, is_dir=True) as tmp:
            (tmp / "w").write_text(text)
    assert (out / "w").read_text() == "two"
    assert (out / owned.OUTPUT_MARK).is_file()
    results, metrics = tmp_path / "results", tmp_path / "m.json"
    for text in ("one", "two"):
        with atomic_outputs([results, metrics], dirs=[results]) as staged:
            (staged[results] / "s").write_text(text)
            staged[metrics].write_text(text)
    assert (results / "s").read_text() == "two" and (results / owned.OUTPUT_MARK).is_file()


def test_repository_output_folders_written_before_the_marker_are_ours(tmp_path, monkeypatch):
    import bert_core.constants

    monkeypatch.setattr(bert_core.constants, "REPO_ROOT", tmp_path)
    legacy = tmp_path / "data" / "corpus"
    legacy.mkdir(parents=True)
    (legacy / "manifest.json").write_text("{}")
    with atomic.atomic_path(legacy, is_dir=True) as tmp:
        (tmp / "manifest.json").write_text("new")
    assert (legacy / "manifest.json").read_text() == "new"


def test_staged_directories_get_the_umask_mode(tmp_path):
    old = os.umask(0o022)
    try:
        with atomic_outputs([tmp_path / "r"], dirs=[tmp_path / "r"]) as staged:
            (staged[tmp_path / "r"] / "f").write_text("x")
        with atomic.atomic_path(tmp_path / "d", is_dir=True) as tmp:
            (tmp / "f").write_text("x")
    finally:
        os.umask(old)
    assert (tmp_path / "r").stat().st_mode & 0o777 == 0o755
    assert (tmp_path / "d").stat().st_mode & 0o777 == 0o755
