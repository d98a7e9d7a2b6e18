"""The corpus and vocab stages as DVC/Prefect/MLflow stages: dvc.yaml entries and the thin flows."""

from __future__ import annotations

import json

import pytest
import yaml

from bert_core.constants import REPO_ROOT as REPO
from bert_core.params import flatten


def _dvc_stages() -> dict:
    return yaml.safe_load((REPO / "dvc.yaml").read_text())["stages"]


def _get(data: dict, dotted: str):
    node = data
    for part in dotted.split("."):
        assert isinstance(node, dict) and part in node, dotted
        node = node[part]
    return node


def test_every_dvc_params_key_exists_in_params():
    """Every params key any stage of dvc.yaml names exists in its params file."""
    for name, stage in _dvc_stages().items():
        for entry in stage.get("params", []):
            items = entry.items() if isinstance(entry, dict) else [("params.yaml", [entry])]
            for file, keys in items:
                data = yaml.safe_load((REPO / file).read_text())
                for key in keys:
                    try:
                        _get(data, key)
                    except AssertionError:
                        pytest.fail(f"dvc.yaml stage '{name}': {file} has no key '{key}'")


def test_corpus_and_vocab_stage_entries():
    stages = _dvc_stages()
    corpus, vocab = stages["corpus"], stages["vocab"]
    assert corpus["cmd"] == "exec python -m flows.corpus" and vocab["cmd"] == "exec python -m flows.vocab"
    for stage in (corpus, vocab):
        for dep in stage["deps"]:
            assert dep.startswith("data/") or (REPO / dep).exists(), dep
    # The corpus stage lists every key of its section except `workers`, which does not change the output.
    section = yaml.safe_load((REPO / "params/corpus.yaml").read_text())["corpus"]
    listed = {k.split(".", 1)[1] for k in corpus["params"][0]["params/corpus.yaml"]}
    assert listed == set(section) - {"workers"}
    vsection = yaml.safe_load((REPO / "params/vocab.yaml").read_text())["vocab"]
    assert {k.split(".", 1)[1] for k in vocab["params"][0]["params/vocab.yaml"]} == set(vsection)
    assert (
        "data/corpus" in vocab["deps"]
        and corpus["outs"]
        == [
            {"data/corpus": {"persist": True}},
            {"metrics/details/corpus.json": {"cache": False, "persist": True}},
        ]
        and vocab["outs"]
        == [
            {"data/vocab": {"persist": True}},
            {"metrics/details/vocab.json": {"cache": False, "persist": True}},
        ]
    )
    assert corpus["metrics"] == [{"metrics/corpus.json": {"cache": False, "persist": True}}]
    assert vocab["metrics"] == [{"metrics/vocab.json": {"cache": False, "persist": True}}]


def test_committed_params_parse():
    from bert_core.corpus import CorpusParams
    from bert_core.params import load_params
    from bert_core.vocab import VocabParams

    corpus = load_params(REPO / "params/corpus.yaml", "corpus", CorpusParams)
    vocab = load_params(REPO / "params/vocab.yaml", "vocab", VocabParams)
    assert (
        corpus.sources[0].path == "Salesforce/wikitext" and corpus.sources[0].config == "wikitext-103-raw-v1"
    )
    assert [s.name for s in corpus.local_sources] == ["gutenberg", "wikipedia"]
    # The CPU default is a small vocab; the [unused] block scales with it (994 at the released 30522).
    assert vocab.vocab_size == 8192 and vocab.unused_slots == round(994 * 8192 / 30522) and vocab.lowercase
    assert VocabParams(vocab_size=30522).unused_slots == 994


def test_flows_run_the_stages_and_record_them(shared_data, tmp_path, monkeypatch):
    """Both flows' bodies (without a Prefect server): outputs, DVC metrics files, one MLflow run each."""
    import mlflow

    from flows.corpus import corpus_flow
    from flows.vocab import vocab_flow

    root = tmp_path / "root"
    (root / "corpus" / "wikipedia").mkdir(parents=True)
    (root / "corpus" / "wikipedia" / "wiki_01.jsonl").symlink_to(
        shared_data / "corpus/wikipedia/wiki_01.jsonl"
    )
    (root / "checkpoints").symlink_to(shared_data / "checkpoints")
    corpus_yaml = {
        "corpus": {
            "sources": [{"name": "hub", "kind": "hf", "path": "Salesforce/wikitext"}],
            "local_sources": [
                {
                    "name": "wikipedia",
                    "kind": "jsonl",
                    "path": "corpus/wikipedia/*.jsonl",
                    "id_field": "id",
                    "title_field": "title",
                    "max_documents": 150,
                }
            ],
            "heldout": {"fraction": 0.05, "max_documents": 10},
            "workers": 1,
        }
    }
    (tmp_path / "corpus.yaml").write_text(yaml.safe_dump(corpus_yaml))
    (tmp_path / "vocab.yaml").write_text(yaml.safe_dump({"vocab": {"vocab_size": 1200}}))
    monkeypatch.setenv("BERT_DATA_ROOT", str(root))
    repo_reports = REPO / "reports" / "data_checks"
    before = {p: p.stat().st_mtime_ns for p in repo_reports.rglob("*")} if repo_reports.is_dir() else {}
    cm = corpus_flow.fn(
        str(tmp_path / "corpus.yaml"),
        str(tmp_path / "corpus"),
        metrics_path=str(tmp_path / "m" / "corpus.json"),
    )
    vm = vocab_flow.fn(
        str(tmp_path / "vocab.yaml"),
        str(tmp_path / "corpus"),
        str(tmp_path / "vocab"),
        metrics_path=str(tmp_path / "m" / "vocab.json"),
    )
    # the metrics file: the headline figures; the details file beside it: every statistic
    corpus_headline = json.loads((tmp_path / "m" / "corpus.json").read_text())
    assert json.loads((tmp_path / "m" / "details" / "corpus.json").read_text()) == json.loads(json.dumps(cm))
    assert corpus_headline == {k: v for k, v in flatten(cm).items() if k in corpus_headline}
    assert 5 <= len(corpus_headline) <= 20 and len(flatten(cm)) > len(corpus_headline)
    assert cm["documents"] == 150 and cm["checks_failed"] == 0 and corpus_headline["documents"] == 150
    vocab_headline = json.loads((tmp_path / "m" / "vocab.json").read_text())
    assert vocab_headline["vocab_size"] == vm["vocab_size"] == 1200 and len(vocab_headline) <= 20
    assert json.loads((tmp_path / "m" / "details" / "vocab.json").read_text()) == json.loads(json.dumps(vm))
    assert "reference_bert_base_uncased" in vm  # the released vocab came from the local root
    # The data-check reports follow the outputs (tmp_path), the repository's reports stay as they were.
    assert (tmp_path / "reports" / "data_checks" / "corpus" / "corpus" / "index.html").is_file()
    assert (tmp_path / "reports" / "data_checks" / "vocab" / "vocab" / "index.html").is_file()
    after = {p: p.stat().st_mtime_ns for p in repo_reports.rglob("*")} if repo_reports.is_dir() else {}
    assert after == before
    runs = mlflow.search_runs(experiment_names=["bert-pipeline"])
    assert sorted(runs["tags.stage"]) == ["corpus", "vocab"]
    assert set(runs["status"]) == {"FINISHED"}
    corpus_run = runs[runs["tags.stage"] == "corpus"].iloc[0]
    assert corpus_run["metrics.documents"] == 150 and corpus_run["tags.data_root"] == "local"
    artifacts = {a.path for a in mlflow.MlflowClient().list_artifacts(corpus_run["run_id"])}
    assert {"manifest.json", "data_checks"} <= artifacts


@pytest.mark.slow
def test_stage_command_fails_with_non_zero_exit_and_no_output(tmp_path):
    """`python -m flows.corpus` (as DVC runs it, with Prefect) on a source with no usable document: exit 1,
    nothing written, the MLflow run FAILED. (A source that matches no file is refused before Prefect starts:
    tests/test_stage_exit.py.)"""
    import os
    import subprocess
    import sys

    import mlflow

    params = {
        "corpus": {
            "sources": [{"name": "hub", "kind": "hf", "path": "Salesforce/wikitext"}],
            "local_sources": [{"name": "books", "kind": "text", "path": "corpus/books/*.txt"}],
        }
    }
    (tmp_path / "corpus" / "books").mkdir(parents=True)
    (tmp_path / "corpus" / "books" / "a.txt").write_text("Too short to keep.\n")  # under clean.min_doc_chars
    (tmp_path / "corpus.yaml").write_text(yaml.safe_dump(params))
    env = {**os.environ, "BERT_DATA_ROOT": str(tmp_path)}
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "flows.corpus",
            "--params",
            str(tmp_path / "corpus.yaml"),
            "--out",
            str(tmp_path / "out"),
            "--metrics",
            str(tmp_path / "corpus.json"),
        ],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 1, proc.stderr[-2000:]
    assert "corpus stage failed: EmptyCorpusError: no documents left after reading 1 records" in proc.stderr
    assert not (tmp_path / "out").exists() and not (tmp_path / "corpus.json").exists()
    runs = mlflow.search_runs(experiment_names=["bert-pipeline"])
    assert list(runs["status"]) == ["FAILED"] and list(runs["tags.stage"]) == ["corpus"]
