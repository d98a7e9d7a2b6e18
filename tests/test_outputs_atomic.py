"""All-or-nothing outputs of a stage with several outs (:func:`bert_core.atomic.atomic_outputs`)."""

from __future__ import annotations

import os

import pytest

from bert_core import atomic
from bert_core.atomic import OutputNotWritableError, atomic_outputs, check_writable


def _previous(tmp_path):
    (tmp_path / "results").mkdir()
    (tmp_path / "results" / "summary.json").write_text("old")
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
