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
