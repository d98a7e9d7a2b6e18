"""What the stages read from outside the repository, recorded by the ``inputs`` stage so that DVC sees it
change (``bert_core/inputs.py``): the records, and DVC re-running the stage whose data was edited."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from bert_core import inputs
from bert_core.constants import REPO_ROOT
from bert_core.corpus import CorpusParams
from bert_core.corpus.units import corpus_reads
from bert_core.finetune.params import FinetuneParams, task_reads
from bert_core.params import parse_params
from bert_core.vocab import VocabParams
from bert_core.vocab.checkpoint import vocab_reads
from flows import stages


def _section(name: str, **changes) -> dict:
    data = yaml.safe_load((REPO_ROOT / "params" / f"{name}.yaml").read_text(encoding="utf-8"))[name]
    return {**data, **changes}


def _finetune(**tasks) -> FinetuneParams:
    return parse_params(_section("finetune", tasks=tasks), FinetuneParams, where="test", prefix="finetune")


def _corpus(sources: list[dict]) -> CorpusParams:
    return parse_params(
        _section("corpus", local_sources=sources), CorpusParams, where="test", prefix="corpus"
    )


@pytest.fixture
def root(tmp_path) -> Path:
    """A data root with SST-2's train and dev files and two books where the corpus params look for them."""
    root = tmp_path / "data"
    (root / "glue" / "SST-2").mkdir(parents=True)
    for split in ("train", "dev"):
        (root / "glue" / "SST-2" / f"{split}.tsv").write_text(f"sentence\tlabel\n{split} row\t1\n")
    (root / "corpus" / "gutenberg").mkdir(parents=True)
    for name in ("a", "b"):
        (root / "corpus" / "gutenberg" / f"{name}.txt").write_text(f"Book {name}.\n")
    return root


def _record(reads: inputs.Reads, root: Path | None, tmp_path: Path) -> dict:
    return inputs.record(reads, root, inputs.StatCache(tmp_path / "stat.json"))


def _entry(path: Path) -> dict:
    return {"size": path.stat().st_size, "xxh3_128": inputs.file_digest(path)}


def test_a_tasks_record_names_the_file_of_each_split_it_reads(root, tmp_path):
    own = tmp_path / "own.tsv"
    own.write_text("sentence\tlabel\nmine\t0\n")
    params = _finetune(sst2={}, cola={}, rte={"train_file": str(own), "dev_file": str(own)})
    sst2 = _record(task_reads(params, root, "sst2"), root, tmp_path)
    assert sst2 == {
        "train": {"<data root>/glue/SST-2/train.tsv": _entry(root / "glue/SST-2/train.tsv")},
        "dev": {"<data root>/glue/SST-2/dev.tsv": _entry(root / "glue/SST-2/dev.tsv")},
    }  # no test file there: its unlabelled test split is not read
    cola = _record(task_reads(params, root, "cola"), root, tmp_path)
    assert set(cola) == {"train", "dev"} and cola["train"].startswith("missing: ") and "CoLA" in cola["train"]
    rte = _record(task_reads(params, root, "rte"), root, tmp_path)  # own files, not the data root's
    assert rte == {"train": {own.as_posix(): _entry(own)}, "dev": {own.as_posix(): _entry(own)}}
    hub = _record(task_reads(params, None, "sst2"), None, tmp_path)  # offline: no commit known yet
    assert hub == {key: {"hub": "nyu-mll/glue", "commit": None} for key in ("train", "dev", "test")}


def test_a_squad_dev_split_records_the_dev_file_for_both_halves(tmp_path):
    root = tmp_path / "data"
    (root / "squad").mkdir(parents=True)
    (root / "squad" / "dev-v1.1.json").write_text('{"data": []}')
    params = _finetune(squad_v1={"dev_split": True})
    record = _record(task_reads(params, root, "squad_v1"), root, tmp_path)
    entry = {"<data root>/squad/dev-v1.1.json": _entry(root / "squad" / "dev-v1.1.json")}
    assert record == {"train": entry, "dev": entry}


def test_a_local_reference_checkpoint_is_recorded_file_by_file(root, tmp_path):
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    (ckpt / "config.json").write_text("{}")
    params = _finetune(sst2={})
    params = params.model_copy(
        update={"reference": params.reference.model_copy(update={"source": str(ckpt)})}
    )
    record = _record(task_reads(params, root, "sst2"), root, tmp_path)
    assert record["reference"] == {(ckpt / "config.json").as_posix(): _entry(ckpt / "config.json")}


def test_the_corpus_record_lists_each_sources_files_or_says_what_is_missing(root, tmp_path):
    sources = [
        {"name": "books", "kind": "text", "path": "corpus/gutenberg/*.txt"},
        {"name": "gone", "kind": "jsonl", "path": "corpus/nothing/*.jsonl"},
    ]
    record = _record(corpus_reads(_corpus(sources), root), root, tmp_path)
    assert record["books"] == {
        f"<data root>/corpus/gutenberg/{n}.txt": _entry(root / "corpus/gutenberg" / f"{n}.txt") for n in "ab"
    }
    assert record["gone"].startswith("missing: source 'gone' (jsonl): path 'corpus/nothing/*.jsonl'")
    hub = _record(corpus_reads(_corpus(sources), None), None, tmp_path)
    hub_sources = _corpus(sources).sources
    assert sorted(hub.values(), key=str) == sorted(
        (
            {"hub": s.path, **({"revision": s.revision} if s.revision else {}), "commit": None}
            for s in hub_sources
        ),
        key=str,
    )


class _FakeHub:
    """``HfApi.dataset_info`` / ``model_info`` answering from ``commits`` ((repo, revision) -> sha; another
    repository: ``default``, when given), or raising ``error``."""

    def __init__(self, monkeypatch, commits: dict, default: str | None = None):
        from huggingface_hub import HfApi

        self.commits, self.default, self.error, self.calls = commits, default, None, []
        monkeypatch.setattr(HfApi, "dataset_info", self.repo_info)
        monkeypatch.setattr(HfApi, "model_info", self.repo_info)

    def repo_info(self, repo_id, *, revision=None, timeout=None, **_):
        from types import SimpleNamespace

        self.calls.append((repo_id, revision))
        assert timeout == inputs.HUB_TIMEOUT_S
        if self.error is not None:
            raise self.error
        key = (repo_id, revision)
        return SimpleNamespace(
            sha=self.commits[key] if self.default is None else self.commits.get(key, self.default)
        )


def test_a_hub_dataset_is_recorded_by_the_commit_its_revision_resolves_to(tmp_path, monkeypatch):
    """Once per dataset and revision a run; a pinned commit without asking; a new upstream commit changes the
    record, so DVC re-runs the task; ``hub_revision`` also pins an own task's Hub dataset; a Hub model named
    as the reference checkpoint is recorded by its commit too."""
    pinned = "c" * 40
    hub = _FakeHub(
        monkeypatch,
        {("nyu-mll/glue", None): "1" * 40, ("nyu-mll/glue", "v2"): "2" * 40, ("google/tiny", None): "4" * 40},
    )
    own = {"kind": "classification", "hub": "someone/imdb", "labels": ["neg", "pos"], "text": "text"}
    params = _finetune(
        sst2={},
        cola={},
        rte={"hub_revision": "v2"},
        mrpc={"hub_revision": pinned},
        imdb={"define": own, "hub_revision": pinned},
    )
    commits = inputs.HubCommits()

    def record(task: str, previous: dict | None = None) -> dict:
        cache = inputs.StatCache(tmp_path / "stat.json")
        return inputs.record(task_reads(params, None, task), None, cache, commits, previous)

    newest = {"hub": "nyu-mll/glue", "commit": "1" * 40}
    assert record("sst2") == {"train": newest, "dev": newest, "test": newest}
    assert record("cola")["dev"] == newest
    assert record("rte")["train"] == {"hub": "nyu-mll/glue", "revision": "v2", "commit": "2" * 40}
    assert record("mrpc")["train"] == {"hub": "nyu-mll/glue", "revision": pinned, "commit": pinned}
    assert record("imdb") == {
        s: {"hub": "someone/imdb", "revision": pinned, "commit": pinned} for s in ("train", "dev")
    }
    assert hub.calls == [("nyu-mll/glue", None), ("nyu-mll/glue", "v2")]  # asked once each
    params = params.model_copy(
        update={"reference": params.reference.model_copy(update={"source": "google/tiny"})}
    )
    assert record("sst2")["reference"] == {"hub": "google/tiny", "type": "model", "commit": "4" * 40}
    path = tmp_path / "sst2.json"
    assert inputs.write_record(path, record("sst2")) is True
    hub.commits[("nyu-mll/glue", None)] = "3" * 40  # a new commit on the Hub: the next run's record differs
    commits = inputs.HubCommits()
    assert inputs.write_record(path, record("sst2", inputs.read_record(path))) is True
    assert inputs.read_record(path)["train"]["commit"] == "3" * 40


def test_offline_a_hub_dataset_keeps_the_commit_its_last_record_named(tmp_path, monkeypatch, caplog):
    """An unreachable Hub re-runs nothing: each dataset keeps the commit its last record named for the same
    revision (another revision has none: ``null``), and the Hub is asked once, not once per dataset."""
    hub = _FakeHub(monkeypatch, {("nyu-mll/glue", None): "1" * 40})
    params = _finetune(sst2={})
    cache = inputs.StatCache(tmp_path / "stat.json")
    online = inputs.record(task_reads(params, None, "sst2"), None, cache, inputs.HubCommits())
    hub.error, hub.calls = ConnectionError("Name or service not known"), []
    offline = inputs.HubCommits()
    assert inputs.record(task_reads(params, None, "sst2"), None, cache, offline, online) == online
    pinned = _finetune(sst2={"hub_revision": "v2"}, cola={})
    other = inputs.record(task_reads(pinned, None, "sst2"), None, cache, offline, online)
    assert other["train"] == {"hub": "nyu-mll/glue", "revision": "v2", "commit": None}
    assert inputs.record(task_reads(pinned, None, "cola"), None, cache, offline, {}) == {
        key: {"hub": "nyu-mll/glue", "commit": None} for key in ("train", "dev", "test")
    }
    assert hub.calls == [("nyu-mll/glue", None)]
    assert "the Hub did not give the commit of nyu-mll/glue (ConnectionError: Name or service not known)" in (
        caplog.text
    )


def test_a_copy_of_the_data_root_elsewhere_records_the_same(root, tmp_path):
    params = _finetune(sst2={})
    copy = shutil.copytree(root, tmp_path / "copy")
    assert _record(task_reads(params, root, "sst2"), root, tmp_path) == _record(
        task_reads(params, copy, "sst2"), copy, tmp_path
    )


def test_a_file_seen_with_the_same_size_and_time_is_not_read_again(root, tmp_path, monkeypatch):
    reads = {"books": sorted((root / "corpus" / "gutenberg").glob("*.txt"))}
    first = _record(reads, root, tmp_path)
    cache = inputs.StatCache(tmp_path / "stat.json")
    inputs.record(reads, root, cache)
    cache.save()
    digested = []
    monkeypatch.setattr(inputs, "file_digest", lambda p: digested.append(Path(p).name) or "x")
    cache = inputs.StatCache(tmp_path / "stat.json")
    assert inputs.record(reads, root, cache) == first and digested == []
    book = root / "corpus" / "gutenberg" / "a.txt"
    book.write_text("Book A.\n")  # same size, other bytes, a newer modification time
    os.utime(book, ns=(book.stat().st_atime_ns, book.stat().st_mtime_ns + 10**9))
    assert (
        inputs.record(reads, root, cache)["books"][f"<data root>/corpus/gutenberg/{book.name}"]["xxh3_128"]
        == "x"
    )
    assert digested == ["a.txt"]


def test_a_source_of_many_files_is_recorded_by_count_bytes_and_one_digest(root, tmp_path, monkeypatch):
    monkeypatch.setattr(inputs, "LISTED_FILES", 1)
    reads = {"books": sorted((root / "corpus" / "gutenberg").glob("*.txt"))}
    record = _record(reads, root, tmp_path)["books"]
    assert set(record) == {"files", "bytes", "xxh3_128"} and record["files"] == 2
    (root / "corpus" / "gutenberg" / "b.txt").write_text("Book c.\n")
    assert _record(reads, root, tmp_path)["books"]["xxh3_128"] != record["xxh3_128"]


def test_a_record_is_rewritten_only_when_it_changes(tmp_path):
    path = tmp_path / "r" / "x.json"
    assert inputs.write_record(path, {"a": "missing: x"}) is True
    mtime = path.stat().st_mtime_ns
    assert inputs.write_record(path, {"a": "missing: x"}) is False and path.stat().st_mtime_ns == mtime
    assert inputs.write_record(path, {"a": "missing: y"}) is True and json.loads(path.read_text()) == {
        "a": "missing: y"
    }


def _run(cmd: list[str], cwd: Path, env: dict[str, str]) -> str:
    proc = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, f"{' '.join(cmd)}: {proc.stdout}\n{proc.stderr}"
    return proc.stdout + proc.stderr


def test_an_edited_task_file_makes_dvc_rerun_that_tasks_stage_alone(root, tmp_path):
    """On a scratch copy of the repository and the real dvc.yaml: after the inputs stage, an edit of SST-2's
    train file under the data root makes ``dvc status`` report ``finetune@sst2`` (its record changed), not
    ``finetune@cola``; an edited corpus file changes the corpus stage's record."""
    repo = tmp_path / "repo"
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    for name in ("bert_core", "flows", "params"):
        shutil.copytree(REPO_ROOT / name, repo / name, ignore=ignore)
    shutil.copy(REPO_ROOT / "dvc.yaml", repo / "dvc.yaml")
    env = {**os.environ, "BERT_DATA_ROOT": str(root)}
    dvc = [sys.executable, "-m", "dvc"]
    _run([*dvc, "init", "--no-scm", "-q"], repo, env)
    record = [sys.executable, "-m", "flows.stages", "inputs"]
    assert "inputs changed: data/inputs/corpus.json" in _run(record, repo, env)
    (repo / "models" / "pretrained").mkdir(parents=True)
    (repo / "models" / "pretrained" / "config.json").write_text("{}")
    finetune = stages.get("finetune")
    for task in ("sst2", "cola"):
        for out in (*finetune.outs, *finetune.details, *finetune.metrics, *finetune.plots):
            path = repo / finetune.expand(out, task)
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(task) if path.suffix else (path.mkdir(), (path / "x").write_text(task))
        _run([*dvc, "commit", "-f", "-q", f"finetune@{task}"], repo, env)
    assert _run(record, repo, env).strip() == "inputs unchanged"
    (root / "glue" / "SST-2" / "train.tsv").write_text("sentence\tlabel\nedited\t0\n")
    assert _run(record, repo, env).strip() == "inputs changed: data/inputs/finetune/sst2.json"
    status = json.loads(_run([*dvc, "status", "--json", "finetune@sst2", "finetune@cola"], repo, env))
    assert status == {"finetune@sst2": [{"changed deps": {"data/inputs/finetune/sst2.json": "modified"}}]}
    (root / "corpus" / "gutenberg" / "a.txt").write_text("Book A, edited.\n")
    assert _run(record, repo, env).strip() == "inputs changed: data/inputs/corpus.json"


def test_the_vocab_record_holds_its_checkpoint_and_the_reference_vocabulary(root, tmp_path):
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    (ckpt / "vocab.txt").write_text("[PAD]\n")
    data = _section("vocab", from_checkpoint=str(ckpt), reference_local="checkpoints/bert/vocab.txt")
    params = parse_params(data, VocabParams, where="test", prefix="vocab")
    record = _record(vocab_reads(params, root), root, tmp_path)
    assert record == {
        "from_checkpoint": {(ckpt / "vocab.txt").as_posix(): _entry(ckpt / "vocab.txt")},
        "reference": "missing: <data root>/checkpoints/bert/vocab.txt",
    }
    hub = parse_params(
        {**data, "from_checkpoint": "google/bert_uncased_L-2_H-128_A-2"}, VocabParams, where="t"
    )
    assert vocab_reads(hub, None) == {  # a Hub model, recorded by its commit
        "from_checkpoint": inputs.Hub("google/bert_uncased_L-2_H-128_A-2", type="model")
    }


def test_a_data_root_that_is_no_directory_fails_the_stage_naming_it(tmp_path, monkeypatch, capsys):
    from flows.stages.inputs import write_records

    monkeypatch.setenv("BERT_DATA_ROOT", str(tmp_path / "nowhere"))
    assert write_records(tmp_path) == 1
    err = capsys.readouterr().err
    assert err.startswith("inputs stage failed: BERT_DATA_ROOT=") and "nowhere" in err
    assert not (tmp_path / "data").exists()


def test_the_stage_records_hub_commits_and_keeps_them_while_the_hub_is_unreachable(
    tmp_path, monkeypatch, capsys
):
    """``python -m flows.stages inputs`` without a data root, on the committed params: every Hub dataset by
    its commit; a run that cannot reach the Hub rewrites no record ("inputs unchanged"), so DVC re-runs
    nothing; a new commit upstream changes the records of the stages that read it."""
    from flows.stages.inputs import write_records

    shutil.copytree(REPO_ROOT / "params", tmp_path / "params")
    monkeypatch.delenv("BERT_DATA_ROOT", raising=False)
    hub = _FakeHub(monkeypatch, {}, default="1" * 40)
    assert (
        write_records(tmp_path) == 0 and "inputs changed: data/inputs/corpus.json" in capsys.readouterr().err
    )
    records = {p: p.read_bytes() for p in (tmp_path / "data" / "inputs").rglob("*.json")}
    sst2 = json.loads(records[tmp_path / "data/inputs/finetune/sst2.json"])
    assert sst2["train"] == {"hub": "nyu-mll/glue", "commit": "1" * 40}
    hub.error = ConnectionError("Name or service not known")
    assert write_records(tmp_path) == 0 and capsys.readouterr().err.endswith("inputs unchanged\n")
    assert {p: p.read_bytes() for p in records} == records
    hub.error, hub.commits[("nyu-mll/glue", None)] = None, "2" * 40
    assert write_records(tmp_path) == 0
    changed = capsys.readouterr().err.splitlines()[-1]
    assert "data/inputs/finetune/sst2.json" in changed and "data/inputs/corpus.json" not in changed


def test_with_a_data_root_an_own_tasks_hub_dataset_is_still_recorded_by_its_commit(
    root, tmp_path, monkeypatch
):
    """An own task's ``define.hub`` is loaded from the Hub whatever the data root, so the stage asks the Hub
    about it then too, and leaves the process online (the Hub libraries' offline mode is for the stages that
    read local data)."""
    from flows.stages.inputs import write_records

    repo = tmp_path / "repo"
    shutil.copytree(REPO_ROOT / "params", repo / "params")
    finetune = yaml.safe_load((repo / "params" / "finetune.yaml").read_text(encoding="utf-8"))
    finetune["finetune"]["tasks"] = {
        "imdb": {
            "define": {"kind": "classification", "hub": "someone/imdb", "text": "text", "labels": ["a", "b"]}
        }
    }
    (repo / "params" / "finetune.yaml").write_text(yaml.safe_dump(finetune), encoding="utf-8")
    monkeypatch.setenv("BERT_DATA_ROOT", str(root))
    for var in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE"):
        monkeypatch.delenv(var, raising=False)
    hub = _FakeHub(monkeypatch, {("someone/imdb", None): "5" * 40})
    assert write_records(repo) == 0
    record = json.loads((repo / "data" / "inputs" / "finetune" / "imdb.json").read_text())
    assert record == {s: {"hub": "someone/imdb", "commit": "5" * 40} for s in ("train", "dev")}
    assert hub.calls == [("someone/imdb", None)] and "HF_HUB_OFFLINE" not in os.environ
