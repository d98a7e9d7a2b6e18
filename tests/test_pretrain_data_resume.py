"""A pretraining-data build stopped part-way continues after its finished tasks, to the very output an
uninterrupted build writes; a kept task whose files changed is built again; other inputs start afresh."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from bert_core.pretrain_data import build
from bert_core.pretrain_data.build import build_pretrain_data
from bert_core.pretrain_data.partial import BuildInUseError, PartialBuild, partial_dir
from bert_core.pretrain_data.testing import make_synthetic_inputs, write_corpus
from tests.test_pretrain_data_nsp import long_sentence_doc, params


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """A "book" of over-long sentences first (its task is all forced NotNext), so that NSP balancing runs some
    tasks again after the first pass."""
    root = tmp_path_factory.mktemp("resume-in")
    base, vocab = make_synthetic_inputs(root / "base", n_train=400, n_heldout=60)
    docs = [
        d
        for f in sorted((base / "train").glob("*.parquet"))
        for d in pq.read_table(f)["sentences"].to_pylist()
    ]
    heldout = pq.read_table(base / "heldout" / "part-00000.parquet")["sentences"].to_pylist()
    write_corpus(root / "corpus", "train", [long_sentence_doc(150, 0), *docs], docs_per_shard=150)
    write_corpus(root / "corpus", "heldout", heldout)
    return root / "corpus", vocab


def run(corpus, out: Path, **kw):
    return build_pretrain_data(params(**kw), corpus_dir=corpus[0], vocab_dir=corpus[1], output_dir=out)


def files(directory: Path) -> dict[str, bytes]:
    return {
        p.relative_to(directory).as_posix(): p.read_bytes()
        for p in sorted(directory.rglob("*"))
        if p.is_file()
    }


@pytest.fixture(scope="module")
def reference(corpus, tmp_path_factory):
    """The uninterrupted build: its files, and how many tasks it ran (NSP balancing's included)."""
    out = tmp_path_factory.mktemp("resume-ref") / "pretrain_data"
    calls = []
    real = build.run_task
    build.run_task = lambda job: calls.append(job) or real(job)
    try:
        result = run(corpus, out)
    finally:
        build.run_task = real
    reruns = [j for j in calls if j.nsp_offset]
    assert result.metrics["seq128"]["train"]["nsp_tasks_rerun"] == len(reruns) > 0
    assert not partial_dir(out).exists()
    return files(out), len(calls) - len(reruns), reruns


class Stop(KeyboardInterrupt):
    """Ctrl-C in the middle of the build."""


def stop_at(monkeypatch, when) -> list:
    """``run_task`` that raises :class:`Stop` on the first job ``when(job, jobs run before)`` picks; returns
    the jobs that ran."""
    calls: list = []
    real = build.run_task

    def task(job):
        if when(job, len(calls)):
            raise Stop
        calls.append(job)
        return real(job)

    monkeypatch.setattr(build, "run_task", task)
    return calls


def test_a_build_stopped_mid_way_continues_after_its_finished_tasks(
    corpus, reference, tmp_path, monkeypatch, caplog
):
    ref_files, tasks, _ = reference
    out = tmp_path / "pretrain_data"
    with monkeypatch.context() as m, pytest.raises(Stop):
        stop_at(m, lambda job, ran: ran == 3)
        run(corpus, out)
    work = partial_dir(out)
    assert not out.exists() and len(list((work / "tasks").glob("*.json"))) == 3
    assert f"3 of {tasks} task(s) are built and kept" in caplog.text
    with monkeypatch.context() as m, caplog.at_level(logging.INFO, logger="bert_core.pretrain_data.build"):
        ran = stop_at(m, lambda job, ran: False)
        m.setenv("BERT_PROGRESS_INTERVAL_S", "0")
        m.setenv("BERT_PROGRESS_MIN_PERCENT", "0")
        run(corpus, out)
    assert f"continuing an unfinished build: 3 of {tasks} task(s) kept" in caplog.text
    progress = [m for m in caplog.messages if m.startswith("pretrain_data: task ")]
    assert progress[0].startswith(f"pretrain_data: task 4/{tasks} (") and len(progress) == tasks - 3
    assert f"pretrain_data: done, task {tasks}/{tasks} (100.0%)" in caplog.text
    assert len([j for j in ran if not j.nsp_offset]) == tasks - 3
    assert files(out) == ref_files and not work.exists()


def test_stopped_while_balancing_nsp_the_rewritten_tasks_are_built_again(
    corpus, reference, tmp_path, monkeypatch
):
    ref_files, tasks, reruns = reference
    out = tmp_path / "pretrain_data"
    with monkeypatch.context() as m, pytest.raises(Stop):
        stop_at(m, lambda job, ran: bool(job.nsp_offset) and ran > tasks)  # after the first rewrite
        run(corpus, out)
    assert len(list((partial_dir(out) / "tasks").glob("*.json"))) == tasks
    with monkeypatch.context() as m:
        ran = stop_at(m, lambda job, ran: False)
        run(corpus, out)
    first_pass = [j for j in ran if not j.nsp_offset]
    assert [(j.task.split, j.task.index) for j in first_pass] == [
        (reruns[0].task.split, reruns[0].task.index)
    ]
    assert files(out) == ref_files


def test_a_kept_task_whose_files_changed_is_built_again(corpus, reference, tmp_path, monkeypatch):
    ref_files, tasks, _ = reference
    out = tmp_path / "pretrain_data"
    with monkeypatch.context() as m, pytest.raises(Stop):
        stop_at(m, lambda job, ran: ran == 4)
        run(corpus, out)
    shard = sorted((partial_dir(out) / "seq128" / "train").glob("shard-00001.tokens.bin"))[0]
    data = bytearray(shard.read_bytes())
    data[10] ^= 0xFF
    shard.write_bytes(bytes(data))
    with monkeypatch.context() as m:
        ran = stop_at(m, lambda job, ran: False)
        run(corpus, out)
    first_pass = [(j.task.split, j.task.index) for j in ran if not j.nsp_offset]
    assert len(first_pass) == tasks - 3 and ("train", 1) in first_pass
    assert files(out) == ref_files


def test_a_build_of_other_params_starts_afresh(corpus, tmp_path, monkeypatch, caplog):
    out = tmp_path / "pretrain_data"
    with monkeypatch.context() as m, pytest.raises(Stop):
        stop_at(m, lambda job, ran: ran == 2)
        run(corpus, out)
    with caplog.at_level(logging.INFO, logger="bert_core.pretrain_data.build"):
        run(corpus, out, seed=7)
    assert "discarding the 2 finished task(s)" in caplog.text and "continuing" not in caplog.text
    fresh = tmp_path / "fresh"
    run(corpus, fresh, seed=7)
    assert files(out) == files(fresh)


def test_refused_input_keeps_nothing(corpus, tmp_path, monkeypatch):
    out = tmp_path / "pretrain_data"
    with monkeypatch.context() as m, pytest.raises(ValueError, match="bad rows"):
        real = build.run_task
        calls = []

        def task(job):
            calls.append(job)
            if len(calls) == 3:
                raise ValueError("bad rows")
            return real(job)

        m.setattr(build, "run_task", task)
        run(corpus, out)
    assert sorted(p.name for p in tmp_path.iterdir()) == []


def test_a_second_build_of_the_same_output_fails_at_once(tmp_path):
    work = tmp_path / ".out.partial"
    second = PartialBuild(work, {"a": 1}, 1)
    with PartialBuild(work, {"a": 1}, 1), pytest.raises(BuildInUseError, match="another pretrain_data build"):
        second.__enter__()
    assert not work.exists()


def test_the_record_is_json_of_the_result_and_each_file(corpus, tmp_path, monkeypatch):
    out = tmp_path / "pretrain_data"
    with monkeypatch.context() as m, pytest.raises(Stop):
        stop_at(m, lambda job, ran: ran == 1)
        run(corpus, out)
    work = partial_dir(out)
    record = json.loads((work / "tasks" / "train-00000.json").read_text())
    assert set(record) == {"segments", "result", "files"}
    assert sorted(record["files"]) == sorted(
        p.relative_to(work).as_posix() for p in (work / "seq128" / "train").glob("shard-00000.*.bin")
    )
    assert json.loads((work / "identity.json").read_text())["params"] == params().data_params()


def test_a_corpus_moved_elsewhere_keeps_the_finished_tasks(corpus, reference, tmp_path, monkeypatch, caplog):
    import shutil

    ref_files, tasks, _ = reference
    out = tmp_path / "pretrain_data"
    with monkeypatch.context() as m, pytest.raises(Stop):
        stop_at(m, lambda job, ran: ran == 3)
        run(corpus, out)
    moved = shutil.copytree(corpus[0], tmp_path / "moved-corpus")
    with caplog.at_level(logging.INFO, logger="bert_core.pretrain_data.build"):
        run((moved, corpus[1]), out)
    assert f"continuing an unfinished build: 3 of {tasks} task(s) kept" in caplog.text
    assert files(out) == ref_files


def test_a_directory_that_is_not_a_work_directory_is_never_emptied(corpus, tmp_path):
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("keep me")
    with pytest.raises(ValueError, match="is not the work directory of a pretrain_data build"):
        build_pretrain_data(
            params(), corpus_dir=corpus[0], vocab_dir=corpus[1], output_dir=tmp_path / "out", work_dir=mine
        )
    assert [p.name for p in mine.iterdir()] == ["notes.txt"]


def test_a_stage_s_staged_output_keeps_its_tasks_beside_the_final_output(tmp_path):
    staged = tmp_path / "data" / ".pretrain_data.tmp-host_123-abcd"
    assert partial_dir(staged) == partial_dir(tmp_path / "data" / "pretrain_data")
    assert partial_dir(staged) == tmp_path / "data" / ".pretrain_data.partial"


def test_a_build_stopped_after_its_first_pass_runs_no_task_again(
    corpus, reference, tmp_path, monkeypatch, caplog
):
    ref_files, tasks, _ = reference
    out = tmp_path / "pretrain_data"
    with monkeypatch.context() as m, pytest.raises(Stop):
        m.setattr(build, "_balance_nsp", lambda *a: (_ for _ in ()).throw(Stop()))  # before any rewrite
        run(corpus, out, num_workers=2)
    assert len(list((partial_dir(out) / "tasks").glob("*.json"))) == tasks
    with caplog.at_level(logging.INFO, logger="bert_core.pretrain_data.build"):
        run(corpus, out, num_workers=2)
    assert "pretrain_data: 0 tasks on 2 worker(s)" in caplog.text
    assert files(out) == ref_files
