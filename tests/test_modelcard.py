"""Model cards (bert_core.modelcard): Hugging Face format, lineage, deterministic DVC-output copy."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest
import yaml

from bert_core import modelcard
from bert_core.evaluate.references import reference_for
from bert_core.serving.finetuned import finetuned_card_for
from bert_core.serving.pretrained import pretrained_card_for
from bert_core.tasks import get_task
from bert_core.tracking import provenance
from tests.test_pretrain import data  # noqa: F401 - the fixture

LOCK = {
    "schema": "2.0",
    "stages": {
        "corpus": {
            "cmd": "python -m flows.corpus",
            "params": {
                "params/corpus.yaml": {"corpus.sources": [{"kind": "hf", "path": "Salesforce/wikitext"}]}
            },
            "deps": [{"path": "bert_core/corpus", "md5": "aaa.dir"}],
            "outs": [{"path": "data/corpus", "md5": "bbb.dir"}],
        },
        "pretrain": {
            "cmd": "python -m flows.pretrain",
            "outs": [{"path": "models/pretrained", "md5": "ccc.dir"}],
        },
    },
}


class _Model:  # the bits of PretrainParams.model the card reads
    preset = "tiny"

    def config(self, vocab_size):
        from bert_core.config import BertConfig

        return BertConfig(
            vocab_size=vocab_size,
            hidden_size=128,
            num_hidden_layers=2,
            num_attention_heads=2,
            intermediate_size=512,
        )


class _Params:
    model = _Model()
    registered_model = "bert-pretrained"

    def model_dump(self, mode="json"):
        return {"seed": 1, "model": {"preset": "tiny"}}


METRICS = {"heldout": {"mlm_acc": 0.31, "baseline_mlm_acc": 0.06, "nsp_acc": 0.8}, "steps": 20}
STATS = {"vocab_size": 30522, "seq128.train": {"instances": 1000, "tokens": 128000}}


def _pretrained(lock, run_ids=None):
    return pretrained_card_for(
        _Params(),
        _Model().config(30522),
        METRICS,
        STATS,
        git_commit="abc123",
        lock_path=lock,
        run_ids=run_ids,
    )


def _finetuned(lock, run_ids=None, preset="tiny", baselines=None, **kw):
    spec = get_task("sst2")
    metrics = {"dev.accuracy": 82.5, "dev.accuracy_mean": 81.0, "random_init.dev.accuracy": 55.0}
    info = {"preset": preset, "source": "models/pretrained", "model": "bert-pretrained", "model_version": "3"}
    return finetuned_card_for(
        spec,
        metrics,
        info,
        params={"epochs": 3},
        git_commit="abc123",
        lock_path=lock,
        run_ids=run_ids,
        reference=reference_for(preset),
        baselines=baselines,
        **kw,
    )


@pytest.fixture
def lock(tmp_path):
    path = tmp_path / "dvc.lock"
    path.write_text(yaml.safe_dump(LOCK))
    return path


def test_pretrained_card_front_matter_and_lineage(lock, monkeypatch, tmp_path):
    monkeypatch.setenv("BERT_DATA_ROOT", str(tmp_path))  # local mode: the corpus read files, no Hub dataset
    assert modelcard.parse_front_matter(_pretrained(lock))[0].get("datasets") is None
    monkeypatch.delenv("BERT_DATA_ROOT")
    monkeypatch.setenv("DVC_STAGE", "pretrain")
    text = _pretrained(lock)
    meta, body = modelcard.parse_front_matter(text)
    assert (
        meta["language"] == "en" and meta["license"] == "apache-2.0" and meta["pipeline_tag"] == "fill-mask"
    )
    assert meta["datasets"] == ["Salesforce/wikitext"]
    [result] = meta["model-index"][0]["results"]
    assert {m["name"]: m["value"] for m in result["metrics"]}["held-out mlm_acc"] == pytest.approx(0.31)
    assert "`bbb.dir`" in body and "stage `pretrain`" in body
    # The commit (``-dirty`` in a changed work tree) is in the registered copy only: the output stays identical.
    assert "`abc123`" not in body and "`abc123`" in _pretrained(lock, run_ids={"mlflow_run_id": "r"})
    assert "ccc.dir" not in body  # the stage's own (stale) lock entry is not part of its output's card
    assert "instances: 1000" in body and "seed: 1" in body
    assert _pretrained(lock) == text, "the DVC-output card must be deterministic"
    assert "run id" not in text.lower()


def test_continued_pretraining_card_shows_the_checkpoint_it_started_from(lock):
    metrics = {**METRICS, "heldout_before": {"mlm_acc": 0.12, "nsp_acc": 0.5}}
    text = pretrained_card_for(
        _Params(), _Model().config(30522), metrics, STATS, git_commit="abc", lock_path=lock, run_ids=None
    )
    table = re.sub(r" {2,}", " ", text)
    assert "| metric | this model | the checkpoint it started from | most-frequent-token baseline |" in table
    assert (
        "| mlm_acc | 0.31 | 0.12 | 0.06 |" in table
        and "the checkpoint it started from" not in _pretrained(lock)
    )


def test_an_mlm_only_model_is_not_tagged_nsp(lock):
    class MlmOnly(_Params):
        def model_dump(self, mode="json"):
            return {**super().model_dump(mode), "nsp": False}

    meta, body = modelcard.parse_front_matter(
        pretrained_card_for(MlmOnly(), _Model().config(30522), METRICS, STATS, git_commit="a", lock_path=lock)
    )
    assert "nsp" not in meta["tags"] and "pretrained with masked-LM alone" in body
    assert "nsp" in modelcard.parse_front_matter(_pretrained(lock))[0]["tags"]


def test_finetuned_card_scores_next_to_published(lock):
    text = _finetuned(lock, run_ids={"pipeline_run_id": "pipe-1", "mlflow_run_id": "run-42"})
    meta, body = modelcard.parse_front_matter(text)
    assert meta["base_model"] == "bert-pretrained/3" and meta["pipeline_tag"] == "text-classification"
    assert meta["datasets"] == ["nyu-mll/glue"] and "accuracy" in meta["metrics"]
    [result] = meta["model-index"][0]["results"]
    assert result["dataset"]["config"] == "sst2" and result["metrics"][0]["value"] == pytest.approx(82.5)
    assert "| accuracy (main) | 82.50 | 83.20 |" in re.sub(r" {2,}", " ", body)  # Turc et al. BERT-Tiny SST-2
    assert "test-set scores" in body and "`pipe-1`" in body and "`run-42`" in body
    assert "random_init" not in meta["model-index"][0]["results"][0]["metrics"][0]["name"]


def test_cards_without_dvc_or_published_scores(tmp_path):
    text = _finetuned(tmp_path / "missing.lock", preset="custom")
    _, body = modelcard.parse_front_matter(text)
    assert "Not run under DVC" in body and "No published score" in body
    bad = tmp_path / "dvc.lock"
    bad.write_text("stages: [unclosed\n")
    assert "not readable as a DVC lock file" in provenance.dvc_lineage(bad, ["corpus"])["error"]


def test_a_card_names_upstream_stages_only_when_they_made_its_starting_model(lock, tmp_path, monkeypatch):
    monkeypatch.setenv("DVC_STAGE", "finetune@sst2")
    _, ours = modelcard.parse_front_matter(_finetuned(lock))
    assert "| pretrain |" in re.sub(r" {2,}", " ", ours)  # models/pretrained: the upstream entries
    _, released = modelcard.parse_front_matter(_finetuned(lock, from_pipeline=False))
    assert (
        "| pretrain |" not in re.sub(r" {2,}", " ", released) and "No stage of this pipeline made" in released
    )
    _, first = modelcard.parse_front_matter(_finetuned(tmp_path / "no.lock"))  # under DVC, before its lock
    assert "Run by `dvc repro` as stage `finetune@sst2`" in first and "No `dvc.lock` yet" in first
    assert "Not run under DVC" not in first
    from bert_core.constants import REPO_ROOT
    from bert_core.serving.finetuned import _from_pipeline

    assert _from_pipeline({"source": str(REPO_ROOT / "models" / "pretrained")})
    assert not _from_pipeline({"source": str(REPO_ROOT / "models" / "released" / "all-MiniLM-L6-v2")})


def test_a_card_shows_the_best_trivial_baseline_and_says_when_the_model_is_not_above_it(lock):
    _, plain = modelcard.parse_front_matter(_finetuned(lock))
    assert "trivial baseline" not in plain  # none scored: no column
    beaten = {"majority": {"accuracy": 50.9}, "tfidf_lr": {"accuracy": 72.2}}
    _, body = modelcard.parse_front_matter(_finetuned(lock, baselines=beaten))
    assert "| accuracy (main) | 82.50 | 72.20 (tfidf_lr) | 83.20 |" in re.sub(r" {2,}", " ", body)
    assert "Not above" not in body
    tie = {
        "lexicon": {"accuracy": 82.5},
        "majority": {"accuracy": 82.5},
    }  # equal: the first, as in the report
    _, body = modelcard.parse_front_matter(_finetuned(lock, baselines=tie))
    assert "**Not above its best trivial baseline** (`lexicon`) on `accuracy`." in body


def test_huggingface_hub_parses_the_cards(lock):
    hub = pytest.importorskip("huggingface_hub")
    for text in (_pretrained(lock), _finetuned(lock)):
        card = hub.ModelCard(text)
        assert card.data.language == "en" and card.data.license == "apache-2.0"
        assert card.data.eval_results, "model-index must parse into evaluation results"
        assert all(r.metric_value is not None for r in card.data.eval_results)
    assert hub.ModelCard(_finetuned(lock)).data.base_model == "bert-pretrained/3"


def test_the_registered_copy_verifies_against_its_own_checksums(tmp_path):
    """A registered version is read back as a model source (``models:/bert-pretrained@newest``): its card
    differs from the output's, and its manifest must say so, while the output's stays as it was."""
    from bert_core.integrity import read_manifest, verify_output
    from bert_core.owned import mark_output

    model = tmp_path / "pretrained"
    model.mkdir()
    (model / "model.safetensors").write_bytes(b"weights")
    modelcard.write_card(model, "local card\n")
    mark_output(model)
    before = read_manifest(model)
    with modelcard.staged_with_card(model, "registered card, longer: it names the runs\n") as staged:
        assert len(verify_output(staged)) == 2  # the card and the weights, both as recorded
    assert read_manifest(model) == before and len(verify_output(model)) == 2


def test_parse_front_matter_rejects_non_cards():
    for text in ("# no metadata\n", "---\nlanguage: en\n", "---\n- a list\n---\n"):
        with pytest.raises(ValueError, match="model card"):
            modelcard.parse_front_matter(text)


def test_staged_copy_carries_the_run_card_and_leaves_the_model_alone(tmp_path):
    model = tmp_path / "pretrained"
    (model / "sub").mkdir(parents=True)
    (model / "model.safetensors").write_bytes(b"weights")
    (model / "sub" / "x.txt").write_text("x")
    modelcard.write_card(model, "local card\n")
    with modelcard.staged_with_card(model, "registered card\n") as staged:
        assert (staged / "README.md").read_text() == "registered card\n"
        assert (staged / "model.safetensors").read_bytes() == b"weights"
        assert (staged / "sub" / "x.txt").read_text() == "x"
        assert staged.name.startswith(".pretrained.tmp-")  # cleaned by the next atomic write when killed
        assert os.stat(staged / "model.safetensors").st_ino == os.stat(model / "model.safetensors").st_ino
    assert not staged.exists() and (model / "README.md").read_text() == "local card\n"


def test_save_model_writes_the_card_in_the_same_atomic_move(tmp_path):
    import torch

    from bert_core.model import BertForPreTraining
    from bert_core.pretrain import save_model

    torch.manual_seed(0)
    model = BertForPreTraining(_Model().config(64))
    vocab = tmp_path / "vocab"
    vocab.mkdir()
    (vocab / "vocab.txt").write_text("\n".join(f"t{i}" for i in range(64)))
    out = save_model(model, vocab, tmp_path / "model", readme="---\nlanguage: en\n---\n# card\n")
    assert (out / "README.md").read_text().startswith("---\nlanguage: en")
    assert (out / "model.safetensors").is_file()


def test_pretrain_flow_writes_a_reproducible_card_and_registers_one_with_run_ids(data, tmp_path, monkeypatch):  # noqa: F811
    """The DVC output's card is run-free and identical across reruns; the registered copy names its runs."""
    import json

    from huggingface_hub import ModelCard
    from mlflow import MlflowClient

    from flows.pretrain import pretrain_flow_fn
    from tests.test_pretrain import small_params

    monkeypatch.setenv("BERT_PIPELINE_RUN_ID", "pipe-pretrain-card")
    data_dir, vocab = data
    params_file = tmp_path / "pretrain.yaml"
    params_file.write_text(json.dumps({"pretrain": small_params().model_dump(mode="json")}))
    out = tmp_path / "models" / "pretrained"
    kwargs = {
        "out_dir": str(out),
        "checkpoint_root": str(tmp_path / "ckpt"),
        "loss_plot": str(tmp_path / "l.csv"),
        "heldout_plot": str(tmp_path / "h.csv"),
        "metrics_path": str(tmp_path / "m.json"),
    }
    pretrain_flow_fn(str(params_file), str(data_dir), str(vocab), **kwargs)
    first = (out / "README.md").read_text()
    assert "pipe-pretrain-card" not in first and ModelCard(first).data.pipeline_tag == "fill-mask"
    pretrain_flow_fn(str(params_file), str(data_dir), str(vocab), **kwargs)
    assert (out / "README.md").read_text() == first, "the DVC output's card must not change between reruns"
    assert not list(out.parent.glob(".*.tmp-*")), "the staging copy is removed"
    client = MlflowClient()
    version = client.get_model_version_by_alias("bert-pretrained", "newest")
    registered = Path(
        client.download_artifacts(version.run_id, "model/artifacts/hf_model/README.md", str(tmp_path / "dl"))
    )
    text = registered.read_text()
    assert "pipe-pretrain-card" in text and version.run_id in text
    # ... and the registered version serves as a model source, its checksums verified as written
    from bert_core.released import check_checkpoint, resolve_checkpoint

    source = resolve_checkpoint("models:/bert-pretrained@newest", tmp_path / "source")
    assert check_checkpoint(source.path)["embeddings"] > 0
