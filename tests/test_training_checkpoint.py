"""Checkpoints: exact round trip, atomic writes, keep-last-K, and refusal of unsafe or foreign files."""

from __future__ import annotations

import os
import random

import numpy as np
import pytest
import torch
from training_fakes import tiny_model

from bert_core.config import BertConfig
from bert_core.model import BertForPreTraining
from bert_core.owned import OUTPUT_MARK
from bert_core.training import checkpoint as ckpt
from bert_core.training.optim import build_optimizer


def _train_a_bit(model, opt, steps=2):
    for _ in range(steps):
        ids = torch.randint(5, 99, (2, 8))
        out = model(input_ids=ids, labels=ids, next_sentence_label=torch.tensor([0, 1]))
        out.loss.backward()
        opt.step()
        opt.zero_grad()


def _save(root, step, model, opt, keep_last=2, data=None):
    return ckpt.save_checkpoint(
        root,
        step=step,
        model=model,
        optimizer=opt,
        state={"elapsed_s": 1.5, "note": "x"},
        rng_states=[ckpt.capture_rng_state()],
        data_states=[data],
        keep_last=keep_last,
    )


def test_round_trip_restores_weights_optimizer_rng_and_data_position(tmp_path):
    model = tiny_model()
    opt = build_optimizer(model, lr=1e-3)
    _train_a_bit(model, opt)
    data = {"epoch": 2, "pos": np.int64(7), "perm": np.arange(5, dtype=np.int64)}
    path = _save(tmp_path, 2, model, opt, data=data)
    expected = (random.random(), np.random.rand(), torch.rand(3))

    other = tiny_model(seed=1)
    other_opt = build_optimizer(other, lr=1e-3)
    state, rngs, datas = ckpt.load_checkpoint(path, model=other, optimizer=other_opt)
    ckpt.restore_rng_state(rngs[0])
    assert (random.random(), np.random.rand()) == expected[:2]
    assert torch.equal(torch.rand(3), expected[2])
    assert state["step"] == 2 and state["elapsed_s"] == 1.5
    assert datas[0]["epoch"] == 2 and datas[0]["pos"] == 7 and datas[0]["perm"].tolist() == list(range(5))
    for (n, a), b in zip(model.state_dict().items(), other.state_dict().values()):
        assert torch.equal(a, b), n
    # optimizer moments restored: one more identical step keeps the models identical
    torch.manual_seed(3)
    _train_a_bit(model, opt, 1)
    torch.manual_seed(3)
    _train_a_bit(other, other_opt, 1)
    assert torch.equal(
        model.bert.embeddings.word_embeddings.weight, other.bert.embeddings.word_embeddings.weight
    )


def test_keep_last_k(tmp_path):
    model = tiny_model()
    opt = build_optimizer(model, lr=1e-3)
    for step in (1, 2, 3, 4):
        _save(tmp_path, step, model, opt, keep_last=2)
    assert [p.name for p in ckpt.list_checkpoints(tmp_path)] == ["step-00000003", "step-00000004"]


def test_crash_while_saving_leaves_previous_checkpoint_intact(tmp_path, monkeypatch):
    model = tiny_model()
    opt = build_optimizer(model, lr=1e-3)
    first = _save(tmp_path, 1, model, opt)
    real_save = torch.save

    def failing_save(obj, path, *a, **k):
        if str(path).endswith("rng.pt"):
            raise OSError(28, "No space left on device")
        return real_save(obj, path, *a, **k)

    monkeypatch.setattr(ckpt.torch, "save", failing_save)
    with pytest.raises(OSError, match="No space"):
        _save(tmp_path, 2, model, opt)
    monkeypatch.setattr(ckpt.torch, "save", real_save)
    assert ckpt.list_checkpoints(tmp_path) == [first]
    assert not [p for p in tmp_path.iterdir() if p.name != first.name]  # no partial directory left
    ckpt.load_checkpoint(first, model=tiny_model(), optimizer=build_optimizer(tiny_model(), lr=1e-3))


def test_leftover_of_a_killed_save_is_ignored_and_cleaned(tmp_path):
    model = tiny_model()
    opt = build_optimizer(model, lr=1e-3)
    first = _save(tmp_path, 1, model, opt)
    partial = tmp_path / ".step-00000002.tmp-abc123"
    partial.mkdir()
    (partial / "model.safetensors").write_bytes(b"half")
    assert ckpt.latest_loadable(tmp_path) == [first]
    assert not partial.exists()


class _Evil:
    def __reduce__(self):
        return (os.system, ("touch PWNED",))


def test_pickled_code_in_a_checkpoint_is_refused_not_executed(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    model = tiny_model()
    opt = build_optimizer(model, lr=1e-3)
    path = _save(tmp_path / "ck", 1, model, opt)
    torch.save({"state": _Evil()}, path / "optimizer.pt")  # a pickle that would run a shell command
    (path / OUTPUT_MARK).unlink()  # no checksums to catch it first: the safe loader must refuse it
    with pytest.raises(ckpt.TrainingCheckpointError, match=r"optimizer\.pt cannot be loaded safely"):
        ckpt.load_checkpoint(path, model=model, optimizer=opt)
    assert not (tmp_path / "PWNED").exists()


def test_truncated_weights_give_a_clear_error(tmp_path):
    model = tiny_model()
    opt = build_optimizer(model, lr=1e-3)
    path = _save(tmp_path, 1, model, opt)
    weights = path / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:100])
    with pytest.raises(
        ckpt.TrainingCheckpointError, match=r"model\.safetensors is damaged: expected \d+ bytes"
    ):
        ckpt.load_checkpoint(path, model=model, optimizer=opt)
    (path / OUTPUT_MARK).unlink()  # a checkpoint without checksums: safetensors' own error, with the name
    with pytest.raises(ckpt.TrainingCheckpointError, match="cannot load model weights"):
        ckpt.load_checkpoint(path, model=model, optimizer=opt)


@pytest.mark.parametrize("name", ["model.safetensors", "optimizer.pt", "state.json"])
def test_a_file_damaged_in_place_is_refused_by_name_and_resume_falls_back(tmp_path, name):
    """Same size, other bytes: the checksum written with the checkpoint refuses it; resume takes the older one."""
    from bert_core.training.distributed import DistContext

    model = tiny_model()
    opt = build_optimizer(model, lr=1e-3)
    first = _save(tmp_path, 1, model, opt)
    second = _save(tmp_path, 2, model, opt)
    target = second / name
    data = bytearray(target.read_bytes())
    middle = len(data) // 2
    data[middle : middle + 4] = bytes(b ^ 0xFF for b in data[middle : middle + 4])
    target.write_bytes(bytes(data))
    with pytest.raises(
        ckpt.TrainingCheckpointError, match=rf"{second / name} is damaged: its content changed"
    ):
        ckpt.load_checkpoint(second, model=model, optimizer=opt)
    resumed = ckpt.resume_newest(
        tmp_path, model=model, optimizer=opt, scaler=None, dist=DistContext(), fingerprint=""
    )
    assert resumed is not None and resumed[0] == first
    ckpt.save_checkpoint(
        tmp_path,
        step=2,
        model=model,
        optimizer=opt,
        state={},
        rng_states=[ckpt.capture_rng_state()],
        data_states=[None],
    )
    ckpt.load_checkpoint(second, model=model, optimizer=opt)  # a re-written checkpoint passes again


def test_checkpoint_of_another_model_size_is_refused(tmp_path):
    model = tiny_model()
    path = _save(tmp_path, 1, model, build_optimizer(model, lr=1e-3))
    bigger = BertForPreTraining(
        BertConfig(vocab_size=99, hidden_size=64, num_hidden_layers=2, num_attention_heads=2)
    )
    with pytest.raises(ckpt.TrainingCheckpointError, match="different model"):
        ckpt.load_checkpoint(path, model=bigger)
