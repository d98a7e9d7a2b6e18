"""flows/_stage.py::stage: a stage's outs and its metrics files are committed together or not at all."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bert_core.atomic import atomic_path
from bert_core.owned import mark_output
from flows._stage import stage


def _previous(tmp_path: Path) -> tuple[Path, Path]:
    out, metrics = tmp_path / "data" / "corpus", tmp_path / "metrics" / "corpus.json"
    out.mkdir(parents=True)
    (out / "part.txt").write_text("old")
    mark_output(out)  # an earlier run's output
    metrics.parent.mkdir()
    metrics.write_text('{"old": true}')
    return out, metrics


def _build(final: Path) -> None:
    """A builder that stages its own directory (as build_corpus does): inside the staged one."""
    with atomic_path(final, is_dir=True) as tmp:
        (tmp / "part.txt").write_text("new")


def _names(tmp_path: Path) -> list[str]:
    return sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*"))


def test_a_failing_metrics_write_keeps_every_previous_out(tmp_path, monkeypatch):
    out, metrics = _previous(tmp_path)
    before = _names(tmp_path)

    def failing(path, text):
        Path(path).write_text(text[:3])
        raise OSError("disk error while writing the metrics")

    monkeypatch.setattr("flows._stage.write_text_atomic", failing)
    with pytest.raises(OSError, match="disk error"), stage("corpus", {}, out, metrics_path=metrics) as s:
        _build(s[out])
        s.done({"documents": 2})
    assert (out / "part.txt").read_text() == "old"
    assert metrics.read_text() == '{"old": true}'
    assert _names(tmp_path) == before  # no temporaries


def test_all_outs_are_committed_together(tmp_path, caplog):
    out, metrics = _previous(tmp_path)
    with (
        caplog.at_level("INFO", logger="bert_core.stage"),
        stage("corpus", {}, out, metrics_path=metrics) as s,
    ):
        _build(s[out])
        s.done({"documents": 2})
        assert metrics.read_text() == '{"old": true}'  # not before the block ends
    assert (out / "part.txt").read_text() == "new"
    assert json.loads(metrics.read_text()) == {"documents": 2}
    assert _names(tmp_path) == [
        "data",
        "data/corpus",
        "data/corpus/.bert-output",
        "data/corpus/part.txt",
        "metrics",
        "metrics/corpus.json",
        "metrics/details",
        "metrics/details/corpus.json",
    ]
    # the log names the outputs where they now are, not where they were staged
    details = metrics.parent / "details" / "corpus.json"
    assert f"corpus: outputs in place: {out}, {metrics}, {details}" in caplog.messages


def test_a_file_where_a_directory_out_goes_is_refused_before_any_work(tmp_path):
    """Without the up-front check, a stage trained to the end (hours of pretraining) and only its commit
    found the file."""
    from bert_core.owned import ForeignOutputError

    out, metrics = tmp_path / "model", tmp_path / "metrics.json"
    out.write_text("a user's file")
    worked = []
    with (
        pytest.raises(ForeignOutputError, match="is an existing file, and a directory goes there"),
        stage("corpus", {}, out, metrics_path=metrics, dirs=(out,)),
    ):
        worked.append(True)
    assert not worked and out.read_text() == "a user's file" and not metrics.exists()


@pytest.mark.parametrize("name", ["notes.md", "vocab.yaml"])
def test_a_metrics_path_that_is_not_json_is_refused_and_the_file_there_kept(tmp_path, name):
    out, metrics = tmp_path / "corpus", tmp_path / name
    metrics.write_text("a user's file")
    with (
        pytest.raises(ValueError, match=rf"metrics file .*{name}: .*ending in \.json"),
        stage("corpus", {}, out, metrics_path=metrics, dirs=(out,)),
    ):
        raise AssertionError("the block ran")
    assert metrics.read_text() == "a user's file" and not (tmp_path / "details").exists()


def test_a_plot_path_that_is_not_csv_is_refused_and_the_file_there_kept(tmp_path):
    out, notes = tmp_path / "model", tmp_path / "notes.md"
    notes.write_text("a user's file")
    with (
        pytest.raises(ValueError, match=r"plot .*notes\.md: .*ending in \.csv"),
        stage("pretrain", {}, out, metrics_path=tmp_path / "m.json", dirs=(out,), plots=(notes,)),
    ):
        raise AssertionError("the block ran")
    assert notes.read_text() == "a user's file"
    # a CSV plot is committed with the other outs
    plot = tmp_path / "plots" / "loss.csv"
    with stage("pretrain", {}, out, metrics_path=tmp_path / "m.json", dirs=(out,), plots=(plot,)) as s:
        _build(s[out])
        s[plot].write_text("step,loss\n")
        s.done({})
    assert plot.read_text() == "step,loss\n"


def test_the_previous_data_check_reports_stay_until_a_run_writes_new_ones(tmp_path):
    out, metrics, checks = tmp_path / "corpus", tmp_path / "m.json", tmp_path / "reports" / "corpus"
    checks.mkdir(parents=True)
    (checks / "old.html").write_text("old")
    # a run that fails before writing a report (a missing input, an unreachable server): the old ones stay
    with pytest.raises(FileNotFoundError), stage("corpus", {}, out, metrics_path=metrics, checks_dir=checks):
        raise FileNotFoundError("no corpus")
    assert _names(checks.parent) == ["corpus", "corpus/old.html"]
    # a run whose data check fails: its own report, the one its message points at
    with pytest.raises(ValueError), stage("corpus", {}, out, metrics_path=metrics, checks_dir=checks):
        (checks / "new.html").parent.mkdir(parents=True)
        (checks / "new.html").write_text("new")
        raise ValueError("check failed")
    assert _names(checks.parent) == ["corpus", "corpus/new.html"]
    # a run that succeeds: none of an earlier run's reports
    with stage("corpus", {}, out, metrics_path=metrics, checks_dir=checks) as s:
        _build(s[out])
        s.done({})
    assert _names(checks.parent) == []
