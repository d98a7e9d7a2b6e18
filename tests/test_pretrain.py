"""The ``pretrain`` stage on generated data: outputs, transformers interop, phases, resume, bad input."""

from __future__ import annotations

import json
import logging
import os
import signal

import pytest
import torch

from bert_core.constants import REPO_ROOT as REPO
from bert_core.owned import OUTPUT_MARK
from bert_core.params import ParamsError, load_params, parse_params
from bert_core.pretrain import PretrainParams, check_inputs, pretrain, write_curves
from bert_core.training import TrainingInterrupted


def small_params(**kw) -> PretrainParams:
    base = {
        "model": {
            "preset": "tiny",
            "overrides": {
                "hidden_size": 32,
                "num_attention_heads": 2,
                "num_hidden_layers": 1,
                "intermediate_size": 64,
            },
        },
        "max_steps": 10,
        "phases": [
            {
                "name": "seq128",
                "share": 0.8,
                "micro_batch": 4,
                "global_batch": 8,
                "lr": 2e-3,
                "warmup_ratio": 0.1,
            },
            {
                "name": "seq512",
                "share": 0.2,
                "micro_batch": 2,
                "global_batch": 4,
                "lr": 1e-3,
                "warmup_steps": 0,
            },
        ],
        "checkpoint_every": 3,
        "log_every": 2,
        "eval_batches": 2,
        "device": "cpu",
        "deterministic": True,
    }
    base.update(kw)
    return PretrainParams.model_validate(base)


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    """A small generated corpus + vocab, built into pretraining instances for both phases."""
    from bert_core.pretrain_data.build import build_pretrain_data
    from bert_core.pretrain_data.params import PretrainDataParams
    from bert_core.pretrain_data.testing import make_synthetic_inputs

    root = tmp_path_factory.mktemp("pretrain-inputs")
    corpus, vocab = make_synthetic_inputs(root, n_train=200, n_heldout=60)
    (vocab / "tokenizer_config.json").write_text(json.dumps({"tokenizer_class": "BertTokenizer"}))
    p = PretrainDataParams(dupe_factor=1, num_workers=1, window_tokens=5_000, min_window_docs=16)
    build_pretrain_data(
        p, corpus_dir=corpus, vocab_dir=vocab, output_dir=root / "pretrain_data", run_checks=False
    )
    return root / "pretrain_data", vocab


@pytest.fixture(scope="module", autouse=True)
def _one_thread():  # module scope: set before the module-scoped `trained` run (results depend on threads)
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@pytest.fixture(scope="module")
def trained(data, tmp_path_factory):
    data_dir, vocab = data
    out = tmp_path_factory.mktemp("pretrain-out")
    seen: list[tuple[int, dict]] = []
    result = pretrain(
        small_params(), data_dir, vocab, out / "model", on_metrics=lambda s, m: seen.append((s, m))
    )
    return result, out, seen


def test_two_phases_continue_and_report_metrics_with_baselines(trained):
    result, _, seen = trained
    assert [f.step for f in result.phases] == [8, 2]
    train_steps = [h["step"] for h in result.history if h["kind"] == "train"]
    assert train_steps == [2, 4, 6, 8, 10]  # global steps continue across phases
    assert {h["phase"] for h in result.history} == {"seq128", "seq512"}
    heldout = result.metrics["heldout"]
    for key in ("mlm_acc", "mlm_ppl", "nsp_acc", "baseline_mlm_acc", "baseline_mlm_ppl", "baseline_nsp_acc"):
        assert 0 <= heldout[key] < float("inf"), key
    assert set(result.metrics["phases"]) == {"seq128", "seq512"}
    assert all(phase["checkpoint_s"] > 0 for phase in result.metrics["phases"].values())  # phase ends
    assert result.data_stats["seq128.train"]["instances"] > 0
    keys = set().union(*(m.keys() for _, m in seen))
    assert {"train/loss", "train/mlm_acc", "train/lr", "heldout/mlm_acc", "heldout/baseline_mlm_acc"} <= keys
    assert [s for s, m in seen if "heldout/mlm_acc" in m] == [8, 10]


def test_model_directory_loads_in_transformers_with_the_same_outputs(trained, data):
    from transformers import AutoModelForPreTraining, AutoTokenizer

    from bert_core.model import BertForPreTraining

    result, _, _ = trained
    model_dir = result.model_dir
    assert {"config.json", "model.safetensors", "vocab.txt", "tokenizer_config.json"} <= {
        p.name for p in model_dir.iterdir()
    }
    tok = AutoTokenizer.from_pretrained(model_dir)
    theirs = AutoModelForPreTraining.from_pretrained(model_dir).eval()
    ours = BertForPreTraining.from_pretrained(model_dir).eval()
    enc = tok(["w1 w2 w3ing .", "w5 w6"], ["w7 w8 .", "w9"], return_tensors="pt", padding=True)
    assert (enc["input_ids"] != tok.unk_token_id).all()
    with torch.no_grad():
        a = theirs(**enc)
        b = ours(**enc)
    torch.testing.assert_close(b.prediction_logits, a.prediction_logits, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(b.seq_relationship_logits, a.seq_relationship_logits, rtol=1e-4, atol=1e-4)


def test_loss_curve_and_heldout_csv(trained, tmp_path):
    result, _, _ = trained
    write_curves(result.history, tmp_path / "loss.csv", tmp_path / "heldout.csv")
    lines = (tmp_path / "loss.csv").read_text().splitlines()
    assert lines[0] == "step,phase,loss,mlm_loss,nsp_loss,mlm_acc,nsp_acc,lr"
    assert [r.split(",")[0] for r in lines[1:]] == ["2", "4", "6", "8", "10"]
    held = (tmp_path / "heldout.csv").read_text().splitlines()
    assert held[0].startswith("step,phase,mlm_acc,baseline_mlm_acc") and len(held) == 3


def _untimed(seen):
    """What ``on_metrics`` got, without the clock's figures (they differ between any two runs)."""
    from bert_core.training.window import CLOCK_METRICS

    return [(s, {k: v for k, v in m.items() if k.rpartition("/")[2] not in CLOCK_METRICS}) for s, m in seen]


def test_rerun_with_the_same_params_is_instant_and_identical(trained, data):
    result, out, seen = trained
    again_seen: list[tuple[int, dict]] = []
    again = pretrain(
        small_params(),
        *data,
        out / "model2",
        on_metrics=lambda s, m: again_seen.append((s, m)),
        checkpoint_root=out / "model.checkpoints",
    )
    assert [f.resumed_from_step for f in again.phases] == [8, 2]
    assert [again.metrics["phases"][p]["resumed_from_step"] for p in ("seq128", "seq512")] == [8, 2]
    assert "resumed_from_step" not in result.metrics["phases"]["seq128"]
    # the new tracking run gets the curve again, from the checkpoints, timings and all
    assert again_seen == seen
    assert again.metrics["heldout"] == result.metrics["heldout"]
    assert (out / "model2" / "model.safetensors").read_bytes() == (
        result.model_dir / "model.safetensors"
    ).read_bytes()


@pytest.mark.parametrize(
    ("at_call", "message", "resumed"),
    [
        (8 * 2 + 2 + 1, "after step 1", [8, 1]),  # phase 2, first step (phase 1: 16 train + 2 eval calls)
        (8 * 2 + 2, "after step 8", [8, None]),  # during phase 1's final evaluation
    ],
)
def test_sigterm_then_rerun_gives_the_uninterrupted_weights(
    trained, data, tmp_path, monkeypatch, at_call, message, resumed
):
    result, _, _ = trained
    from bert_core.pretrain import objective

    real_step = objective.PretrainingObjective.step
    calls = {"n": 0}

    def step(self, model, batch):
        calls["n"] += 1
        if calls["n"] == at_call:
            os.kill(os.getpid(), signal.SIGTERM)
        return real_step(self, model, batch)

    monkeypatch.setattr(objective.PretrainingObjective, "step", step)
    with pytest.raises(TrainingInterrupted, match=f"SIGTERM {message}"):
        pretrain(small_params(), *data, tmp_path / "model")
    assert not (tmp_path / "model").exists()  # no finished-looking output after an interruption
    monkeypatch.setattr(objective.PretrainingObjective, "step", real_step)
    again_seen: list[tuple[int, dict]] = []
    again = pretrain(
        small_params(), *data, tmp_path / "model", on_metrics=lambda s, m: again_seen.append((s, m))
    )
    assert [f.resumed_from_step for f in again.phases] == resumed
    # the rerun's tracking run holds the whole curve: the records before the stop again, then the rest
    assert _untimed(again_seen) == _untimed(trained[2])
    assert (tmp_path / "model" / "model.safetensors").read_bytes() == (
        result.model_dir / "model.safetensors"
    ).read_bytes()


# ---------------------------------------------------------------------------------------------- bad input
def test_missing_data_names_the_directory_and_the_fix(data, tmp_path):
    _, vocab = data
    with pytest.raises(
        FileNotFoundError, match=r"seq128/train/index.json not found.*dvc repro pretrain_data"
    ):
        check_inputs(small_params(), tmp_path / "nowhere", vocab)


def test_missing_vocab_is_a_clear_error(data, tmp_path):
    with pytest.raises(FileNotFoundError, match=r"vocab\.txt not found"):
        check_inputs(small_params(), data[0], tmp_path)


def test_vocab_mismatch_between_data_and_model(data, tmp_path):
    data_dir, vocab = data
    other = tmp_path / "vocab"
    other.mkdir()
    lines = (vocab / "vocab.txt").read_text().splitlines()
    (other / "vocab.txt").write_text("\n".join([*lines, "extra1", "extra2"]) + "\n")
    with pytest.raises(ValueError, match=r"vocabulary size mismatch.*vocab_size="):
        check_inputs(small_params(), data_dir, other)
    (other / "vocab.txt").write_text("\n".join([*lines[:-1], "different"]) + "\n")
    with pytest.raises(ValueError, match="another vocabulary of the same size"):
        check_inputs(small_params(), data_dir, other)


def test_sequence_length_and_position_table_come_from_the_data(data):
    from bert_core.pretrain.inputs import read_inputs

    inputs = read_inputs(small_params(), *data)
    assert [p.max_seq_length for p in inputs.phases] == [128, 512]
    assert inputs.max_position_embeddings == 512
    assert small_params().model.config(inputs.vocab_size, 384).max_position_embeddings == 384


def _edit_index(data_dir, tmp_path, phase, split, **changes):
    """A copy of the data whose ``<phase>/<split>/index.json`` has ``changes`` (``params.<key>`` nests)."""
    import shutil

    copy = tmp_path / "pd"
    shutil.copytree(data_dir, copy)
    (copy / OUTPUT_MARK).unlink()  # index.json edited by hand below: no recorded checksums
    path = copy / phase / split / "index.json"
    index = json.loads(path.read_text())
    for key, value in changes.items():
        node, *rest = key.split("__")
        if rest:
            index[node][rest[0]] = value
        else:
            index[node] = value
    path.write_text(json.dumps(index))
    return copy


def test_data_longer_than_its_position_table_is_refused(data, tmp_path):
    data_dir, vocab = data
    copy = _edit_index(data_dir, tmp_path, "seq512", "train", params__max_position_embeddings=256)
    with pytest.raises(ValueError, match=r"seq512/train was built for max_position_embeddings = 256 but"):
        check_inputs(small_params(), copy, vocab)
    copy = _edit_index(data_dir, tmp_path / "b", "seq512", "train", max_seq_length=1024)
    with pytest.raises(
        ValueError, match=r"sequences of 1024 tokens but the model has max_position_embeddings=512"
    ):
        check_inputs(small_params(), copy, vocab)
    copy = _edit_index(data_dir, tmp_path / "c", "seq128", "heldout", params__max_position_embeddings=None)
    with pytest.raises(
        ValueError, match=r"seq128/heldout/index.json records no params.max_position_embeddings"
    ):
        check_inputs(small_params(), copy, vocab)


def test_each_index_is_read_once_per_phase(data, tmp_path, monkeypatch):
    """The stage reads every index.json once (checks, fingerprint, loaders and evaluations share it)."""
    from bert_core.pretrain_data import storage

    reads: list[str] = []
    real = storage.read_index_with_digest

    def counting(data_dir):
        reads.append(str(data_dir))
        return real(data_dir)

    monkeypatch.setattr(storage, "read_index_with_digest", counting)
    pretrain(small_params(max_steps=4, eval_every=1, checkpoint_every=0), *data, tmp_path / "model")
    assert sorted(reads) == sorted(
        str(data[0] / p / s) for p in ("seq128", "seq512") for s in ("train", "heldout")
    )


def test_data_without_prediction_slots_is_refused(data, tmp_path):
    """The static-shape MLM batches are (B, max_predictions_per_seq): the index must say how many."""
    import json
    import shutil

    data_dir, vocab = data
    copy = tmp_path / "pd"
    shutil.copytree(data_dir, copy)
    (copy / OUTPUT_MARK).unlink()  # index.json edited by hand below: no recorded checksums
    index_path = copy / "seq128" / "heldout" / "index.json"
    index = json.loads(index_path.read_text())
    index["max_predictions_per_seq"] = None
    index_path.write_text(json.dumps(index))
    with pytest.raises(
        ValueError, match=r"seq128/heldout/index.json has max_predictions_per_seq = None.*rebuild"
    ):
        check_inputs(small_params(), copy, vocab)


def test_global_batch_that_processes_cannot_split(data):
    with pytest.raises(ValueError, match=r"phases\[0\].global_batch = 8 cannot be split over 3 process"):
        check_inputs(small_params(), *data, world_size=3)


@pytest.mark.parametrize(
    ("global_batch", "micro_batch", "world_size", "split"),
    [
        (256, 128, 1, (128, 2)),  # gpu-base on one GPU
        (256, 128, 2, (128, 1)),
        (256, 128, 8, (32, 1)),  # eight GPUs keep the paper's 256, not 8 x 128
        (256, 32, 8, (32, 1)),  # the seq-512 phase
        (384, 128, 2, (96, 2)),  # the largest micro batch up to 128 that divides 192
        (8, 8, 1, (8, 1)),
    ],
)
def test_each_process_takes_its_share_of_the_global_batch_in_micro_batches_up_to_micro_batch(
    global_batch, micro_batch, world_size, split
):
    from bert_core.pretrain.params import PhaseParams

    phase = PhaseParams(name="seq128", share=1.0, micro_batch=micro_batch, global_batch=global_batch)
    assert phase.split(world_size) == split
    micro, accum = split
    assert micro * accum * world_size == global_batch and micro <= micro_batch
    params = small_params(phases=[phase.model_dump()], max_steps=10)
    assert params.train_config(0, world_size=world_size).grad_accum == accum


def test_processes_auto_is_one_per_gpu_as_many_as_split_every_global_batch(monkeypatch, caplog):
    """``auto``: 1 on a CPU (or with ``device: cpu``); on 8 GPUs 8 for the paper's 256, but 6 for a batch
    of 36 and 4 for a phase of 4; a number is taken as it is."""
    import torch

    def phases(*batches: int) -> list[dict]:
        share = 1 / len(batches)
        return [
            {"name": f"p{i}", "share": share, "micro_batch": 1, "global_batch": b}
            for i, b in enumerate(batches)
        ]

    auto = small_params(processes="auto", device="auto")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert auto.process_count() == 1 and small_params(processes=3).process_count() == 3
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 8)
    assert small_params(processes="auto", device="auto", phases=phases(256, 256)).process_count() == 8
    with caplog.at_level(logging.WARNING, logger="bert_core.pretrain.params"):
        assert small_params(processes="auto", device="auto", phases=phases(36)).process_count() == 6
    assert "processes: auto uses 6 of the 8 GPUs: global_batch 36 splits evenly over 6" in caplog.text
    assert small_params(processes="auto", device="auto", phases=phases(256, 4)).process_count() == 4
    assert small_params(processes="auto", device="cpu", phases=phases(256)).process_count() == 1
    with pytest.raises(ValueError, match=r"processes: 2 with device cuda:1: each process takes a GPU"):
        small_params(processes=2, device="cuda:1")


@pytest.mark.parametrize(
    ("change", "msg"),
    [
        ({"phases.0.global_batch": 6}, "not a multiple of micro_batch"),
        ({"phases.0.max_seq_length": 128}, "unknown key 'pretrain.phases.0.max_seq_length'"),
        (
            {"model.overrides": {"max_position_embeddings": 1024}},
            "max_position_embeddings is read from the pretraining data",
        ),
        (
            {"phases.0.warmup_ratio": None, "phases.0.warmup_steps": 8},
            "warmup must be shorter than the phase",
        ),
        ({"phases.0.share": 0.5}, "shares must add up to 1"),
        ({"max_steps": None}, "set max_steps or time_budget_minutes"),
        (
            {"time_budget_minutes": 5, "max_steps": None, "phases.1.warmup_steps": 1},
            "give the warmup as warmup_ratio",
        ),
        ({"phases.0.micro_batch": 0}, "greater than or equal to 1"),
        ({"optimizer.lr": -1}, "greater than 0"),
        ({"model.preset": "huge"}, "preset"),
        ({"model.overrides": {"vocab_size": 10}}, "vocab_size is read from the vocabulary"),
        ({"model.overrides": {"hidden_sise": 10}}, "unknown BertConfig field"),
        ({"registry_alias": "latest"}, "reserved"),
        ({"unknown_key": 1}, "unknown key 'pretrain.unknown_key'"),
    ],
)
def test_impossible_params_are_refused_with_the_key(change, msg):
    raw = small_params().model_dump(mode="json")
    for dotted, value in change.items():
        node, *path = raw, *dotted.split(".")
        for part in path[:-1]:
            node = node[int(part)] if part.isdigit() else node[part]
        node[path[-1]] = value
    with pytest.raises(ParamsError, match=msg):
        parse_params(raw, PretrainParams, where="params/pretrain.yaml", prefix="pretrain")


def test_the_shipped_params_file_parses():
    params = load_params(REPO / "params" / "pretrain.yaml", "pretrain", PretrainParams)
    assert params.model.preset == "tiny" and [p.name for p in params.phases] == ["seq128"] and not params.nsp
    assert params.model.overrides == {"hidden_dropout_prob": 0.0, "attention_probs_dropout_prob": 0.0}


# ---------------------------------------------------------------------------------------------- the flow
def test_flow_tracks_metrics_writes_outputs_and_registers_versions(data, tmp_path, monkeypatch):
    from mlflow import MlflowClient

    from flows.pretrain import pretrain_flow_fn

    data_dir, vocab = data
    params_file = tmp_path / "pretrain.yaml"
    raw = small_params().model_dump(mode="json")
    params_file.write_text(json.dumps({"pretrain": raw}))
    paths = {
        "out_dir": tmp_path / "models" / "pretrained",
        "checkpoint_root": tmp_path / "ckpt",
        "loss_plot": tmp_path / "plots" / "pretrain_loss.csv",
        "heldout_plot": tmp_path / "plots" / "pretrain_heldout.csv",
        "metrics_path": tmp_path / "metrics" / "pretrain.json",
    }
    kwargs = {k: str(v) for k, v in paths.items()}
    metrics = pretrain_flow_fn(str(params_file), str(data_dir), str(vocab), **kwargs)
    assert metrics["registry"] == {"registered_model": "bert-pretrained", "version": 1, "alias": "newest"}
    on_disk = json.loads(paths["metrics_path"].read_text())  # the headline figures, flat
    assert on_disk["heldout.baseline_mlm_acc"] == metrics["heldout"]["baseline_mlm_acc"]
    assert on_disk["heldout.mlm_acc"] == metrics["heldout"]["mlm_acc"] and on_disk["registry.version"] == 1
    assert len(on_disk) <= 20 and list(on_disk)[:2] == ["heldout.mlm_loss", "heldout.mlm_acc"]
    details = json.loads((paths["metrics_path"].parent / "details" / "pretrain.json").read_text())
    assert details == json.loads(json.dumps(metrics))  # every statistic, nested as the stage reports them
    assert paths["loss_plot"].read_text().startswith("step,phase,loss")
    assert (paths["out_dir"] / "model.safetensors").is_file()

    client = MlflowClient()
    version = client.get_model_version_by_alias("bert-pretrained", "newest")
    assert str(version.version) == "1"
    assert {"git_commit", "dvc_params", "data_stats", "heldout_mlm_acc"} <= set(version.tags)
    assert json.loads(version.tags["dvc_params"])["model"]["preset"] == "tiny"
    # fine-tuning from the local output directory finds this registered version (provenance tags)
    from bert_core.tracking import resolve_model_source

    resolved = resolve_model_source(str(paths["out_dir"]), tmp_path / "dl")
    assert (resolved.info["model"], resolved.info["model_version"]) == ("bert-pretrained", "1")
    run = client.get_run(version.run_id)
    assert run.data.tags["stage"] == "pretrain"
    history = client.get_metric_history(version.run_id, "train/loss")
    assert [m.step for m in history] == [2, 4, 6, 8, 10]  # streamed through the sink, global steps
    assert client.get_metric_history(version.run_id, "heldout/baseline_mlm_acc")
    # an MLflow Model (fill-mask pyfunc) with the Hugging Face directory inside (docs/serving.md)
    assert "model/MLmodel" in {a.path for a in client.list_artifacts(version.run_id, "model")}
    hf = {a.path for a in client.list_artifacts(version.run_id, "model/artifacts/hf_model")}
    assert {f"model/artifacts/hf_model/{f}" for f in ("config.json", "model.safetensors", "vocab.txt")} <= hf

    # a second run registers version 2 and moves the alias (the checkpoints make it instant)
    pretrain_flow_fn(str(params_file), str(data_dir), str(vocab), **kwargs)
    assert str(client.get_model_version_by_alias("bert-pretrained", "newest").version) == "2"


def test_train_config_of_the_shipped_params():
    """``PretrainParams.train_config`` gives each phase the values the stage always trained with."""
    from bert_core.training import TrainConfig

    params = load_params(REPO / "params/pretrain.yaml", "pretrain", PretrainParams)
    shared = dict(
        weight_decay=0.01,
        optimizer="adamw",
        betas=(0.9, 0.999),
        eps=1e-6,
        max_grad_norm=1.0,
        precision="auto",
        compile=False,
        checkpoint_every=200,
        keep_last=2,
        eval_every=0,
        max_eval_batches=10,
        log_every=25,
        deterministic=False,
        device="auto",
    )
    assert params.train_config(0) == TrainConfig(
        max_steps=4000, time_budget_s=600.0, lr=2e-3, warmup_ratio=0.05, grad_accum=1, seed=0, **shared
    )
    seq512 = {
        "name": "seq512",
        "share": 0.1,
        "micro_batch": 8,
        "global_batch": 8,
        "lr": 1e-3,
        "warmup_ratio": 0.1,
    }
    phases = [{**params.phases[0].model_dump(), "share": 0.9}, seq512]  # the paper's two (gpu-base)
    two = PretrainParams.model_validate({**params.model_dump(), "phases": phases})
    assert two.train_config(0).max_steps == 3600 and two.train_config(1) == TrainConfig(
        max_steps=400, time_budget_s=60.0, lr=1e-3, warmup_ratio=0.1, grad_accum=1, seed=1000, **shared
    )
    two = small_params().train_config(0, world_size=2)
    assert (two.grad_accum, two.warmup_steps, two.max_steps) == (1, None, 8)
    # a cadence in minutes of training as well as in steps (gpu-base: minutes alone)
    assert params.train_config(0).checkpoint_every_s is None
    by_clock = params.model_copy(update={"checkpoint_every": 0, "checkpoint_minutes": 10.0})
    assert (by_clock.train_config(0).checkpoint_every, by_clock.train_config(0).checkpoint_every_s) == (
        0,
        600.0,
    )
