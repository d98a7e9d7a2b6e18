"""The loader: batches for BertForPreTraining, DDP split, shuffling, exact resume, dynamic masking, errors."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from bert_core.pretrain_data.build import build_pretrain_data
from bert_core.pretrain_data.loader import (
    PretrainingLoader,
    check_max_seq_length,
    check_vocab_size,
    mlm_positions,
)
from bert_core.pretrain_data.params import PretrainDataParams
from bert_core.pretrain_data.storage import InstanceStore
from bert_core.pretrain_data.testing import make_synthetic_inputs

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    root = tmp_path_factory.mktemp("pd-loader")
    corpus, vocab = make_synthetic_inputs(root, n_train=300, n_heldout=60)
    out = {}
    for masking in ("static", "dynamic"):
        p = PretrainDataParams(
            phases=["seq128"],
            dupe_factor=1,
            masking=masking,
            num_workers=1,
            min_window_docs=16,
            task_bytes=50_000,
        )
        build_pretrain_data(
            p, corpus_dir=corpus, vocab_dir=vocab, output_dir=root / masking, run_checks=False
        )
        out[masking] = root / masking / "seq128" / "train"
    return out


def all_indices(loader: PretrainingLoader, epoch: int = 0) -> list[np.ndarray]:
    return [loader.indices(epoch, s) for s in range(loader.steps_per_epoch)]


def test_batch_matches_bertforpretraining(data):
    from transformers import BertConfig, BertForPreTraining

    loader = PretrainingLoader(data["static"], 8, seed=0, mlm_format="labels")
    batch = next(iter(loader))
    assert set(batch) == {"input_ids", "token_type_ids", "attention_mask", "labels", "next_sentence_label"}
    for k in ("input_ids", "token_type_ids", "attention_mask", "labels"):
        assert batch[k].shape == (8, 128) and batch[k].dtype == torch.long
    assert batch["next_sentence_label"].shape == (8,) and set(batch["next_sentence_label"].tolist()) <= {0, 1}
    masked = batch["labels"] != -100
    assert masked.any() and (batch["labels"][masked] < loader.vocab_size).all()
    assert (batch["attention_mask"].sum(1) >= 5).all() and (
        batch["token_type_ids"] <= batch["attention_mask"]
    ).all()
    cfg = BertConfig(
        vocab_size=loader.vocab_size,
        hidden_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=37,
    )
    out = BertForPreTraining(cfg)(**batch)
    assert torch.isfinite(out.loss)


@pytest.mark.parametrize("masking", ["static", "dynamic"])
def test_positions_form_holds_the_same_targets_as_labels(data, masking):
    """The default batches carry Google's masked_lm_positions/ids/weights (B, max_predictions_per_seq):
    the same predictions as the labels form, positions ascending, padded slots 0 with weight 0."""
    pos_loader = PretrainingLoader(data[masking], 8, seed=5)
    lab_loader = PretrainingLoader(data[masking], 8, seed=5, mlm_format="labels")
    P = pos_loader.max_predictions_per_seq
    for got, ref in zip(pos_loader, lab_loader):
        assert set(got) == {
            "input_ids",
            "token_type_ids",
            "attention_mask",
            "next_sentence_label",
            "masked_lm_positions",
            "masked_lm_ids",
            "masked_lm_weights",
        }
        assert all(
            torch.equal(got[k], ref[k]) for k in ("input_ids", "attention_mask", "next_sentence_label")
        )
        pos, ids, w = got["masked_lm_positions"], got["masked_lm_ids"], got["masked_lm_weights"]
        assert pos.shape == ids.shape == w.shape == (8, P) and w.dtype == torch.float32
        real = w > 0
        rebuilt = torch.full_like(ref["labels"], -100)
        rows = torch.arange(8)[:, None].expand(8, P)
        rebuilt[rows[real], pos[real]] = ids[real]
        assert torch.equal(rebuilt, ref["labels"])
        assert int(real.sum()) == int((ref["labels"] != -100).sum())  # no duplicate positions
        assert (pos[~real] == 0).all() and (ids[~real] == 0).all()
        assert (real[:, :-1] >= real[:, 1:]).all()  # real slots first
        assert (torch.where(real[:, 1:], pos[:, 1:] - pos[:, :-1], 1) > 0).all()  # ascending


def test_mlm_positions_rejects_more_predictions_than_slots():
    labels = np.full((2, 6), -100)
    labels[0, [1, 2, 3]] = 7
    out = mlm_positions(labels, 8)  # more slots than positions: padded
    assert out["masked_lm_positions"].tolist()[0] == [1, 2, 3, 0, 0, 0, 0, 0]
    assert out["masked_lm_weights"].sum() == 3 and out["masked_lm_ids"][1].tolist() == [0] * 8
    with pytest.raises(ValueError, match="3 masked positions, more than max_predictions_per_seq=2"):
        mlm_positions(labels, 2)
    with pytest.raises(ValueError, match="mlm_format must be one of"):
        PretrainingLoader.__init__(object.__new__(PretrainingLoader), "x", 1, mlm_format="dense")


@pytest.mark.parametrize("world_size", [1, 2, 3])
def test_ddp_ranks_never_overlap_and_have_equal_batches(data, world_size):
    loaders = [PretrainingLoader(data["static"], 7, rank=r, world_size=world_size) for r in range(world_size)]
    steps = {ld.steps_per_epoch for ld in loaders}
    assert len(steps) == 1
    seen = np.concatenate([np.concatenate(all_indices(ld)) for ld in loaders])
    n = loaders[0].num_instances
    assert len(seen) == len(np.unique(seen)) == steps.pop() * 7 * world_size > n - 7 * world_size
    assert seen.max() < n


def test_drop_last_false_covers_every_instance(data):
    one = PretrainingLoader(data["static"], 16, drop_last=False)
    idx = np.concatenate(all_indices(one))
    assert sorted(idx.tolist()) == list(range(one.num_instances))  # the last batch is just smaller
    two = [PretrainingLoader(data["static"], 16, rank=r, world_size=2, drop_last=False) for r in range(2)]
    per_rank = [all_indices(ld) for ld in two]
    assert [len(b) for b in per_rank[0]] == [len(b) for b in per_rank[1]]  # padded by wrapping around
    assert set(np.concatenate(per_rank[0] + per_rank[1]).tolist()) == set(range(one.num_instances))


def test_shuffle_is_seeded_per_epoch(data):
    a, b = PretrainingLoader(data["static"], 8, seed=1), PretrainingLoader(data["static"], 8, seed=1)
    assert all((x == y).all() for x, y in zip(all_indices(a, 0), all_indices(b, 0)))
    e0, e1 = np.concatenate(all_indices(a, 0)), np.concatenate(all_indices(a, 1))
    assert (e0 != e1).mean() > 0.9
    c = PretrainingLoader(data["static"], 8, seed=2)
    assert (np.concatenate(all_indices(c, 0)) != e0).mean() > 0.9
    plain = PretrainingLoader(data["static"], 8, shuffle=False)
    assert (np.concatenate(all_indices(plain)) == np.arange(plain.steps_per_epoch * 8)).all()


@pytest.mark.parametrize("masking", ["static", "dynamic"])
def test_resume_from_state_dict_gives_the_same_batches(data, masking):
    ref = PretrainingLoader(data[masking], 16, seed=3)
    steps = ref.steps_per_epoch
    stream = [b for _ in range(2) for b in ref]  # two epochs, uninterrupted
    assert len(stream) == 2 * steps
    for stop in (1, steps - 1, steps, steps + 2):
        run = PretrainingLoader(data[masking], 16, seed=3)
        it, got = iter(run), []
        while len(got) < stop:
            try:
                got.append(next(it))
            except StopIteration:
                it = iter(run)
        state = run.state_dict()
        resumed = PretrainingLoader(data[masking], 16, seed=3)
        resumed.load_state_dict(state)
        rest = list(resumed) + list(resumed)
        expected = stream[stop:]
        assert len(rest) >= len(expected) > 0 or stop == 2 * steps
        for x, y in zip(expected, rest):
            assert all(torch.equal(x[k], y[k]) for k in x)


def test_resume_with_another_world_size_keeps_the_global_batch(data):
    single = PretrainingLoader(data["static"], 8, seed=4)
    pair = [PretrainingLoader(data["static"], 4, rank=r, world_size=2, seed=4) for r in range(2)]
    for step in range(3):
        union = np.concatenate([ld.indices(0, step) for ld in pair])
        assert (union == single.indices(0, step)).all()
    it = iter(single)
    next(it), next(it)
    state = single.state_dict()
    for ld in pair:
        ld.load_state_dict(state)
        assert ld.offset == 16
    with pytest.raises(ValueError, match="not a multiple of the global batch 24"):
        PretrainingLoader(data["static"], 24, seed=4).load_state_dict(state)
    with pytest.raises(ValueError, match="seed=4 but this loader has 5"):
        PretrainingLoader(data["static"], 8, seed=5).load_state_dict(state)


def test_dynamic_masks_differ_per_epoch_and_are_deterministic(data):
    ld = PretrainingLoader(data["dynamic"], 32, seed=7, shuffle=False, mlm_format="labels")
    assert ld.masking == "dynamic"
    e0, e1 = next(iter(ld)), None
    ld.set_epoch(1)
    e1 = next(iter(ld))
    assert torch.equal(e0["attention_mask"], e1["attention_mask"])  # same instances
    assert not torch.equal(e0["labels"] != -100, e1["labels"] != -100)  # fresh masks
    again = PretrainingLoader(data["dynamic"], 32, seed=7, shuffle=False, mlm_format="labels")
    assert all(torch.equal(e0[k], v) for k, v in next(iter(again)).items())
    # statistics of the load-time masks over the whole epoch
    ids, labels = [], []
    for b in PretrainingLoader(data["dynamic"], 32, seed=7, drop_last=False, mlm_format="labels"):
        ids.append(b["input_ids"][b["labels"] != -100])
        labels.append(b["labels"][b["labels"] != -100])
    ids, labels = torch.cat(ids), torch.cat(labels)
    store = InstanceStore(data["dynamic"])
    mask_id = store.index["special_token_ids"]["[MASK]"]
    assert abs((ids == mask_id).float().mean().item() - 0.8) < 0.02
    assert abs((ids == labels).float().mean().item() - 0.1) < 0.02


def test_dynamic_padding(data):
    ld = PretrainingLoader(data["static"], 8, pad_to_multiple_of=8, seed=0)
    for b in ld:
        width = b["input_ids"].shape[1]
        assert width % 8 == 0 and width <= 128
        assert b["attention_mask"].sum(1).max() > width - 8


def test_vocab_size_mismatch_is_refused(data):
    n = InstanceStore(data["static"]).vocab_size
    check_vocab_size(data["static"], n)
    with pytest.raises(
        ValueError, match=rf"vocabulary of {n} tokens.*vocab_size=30522.*Set the model's vocab_size to {n}"
    ):
        check_vocab_size(data["static"], 30522)
    with pytest.raises(ValueError, match="vocab_size=30522"):
        PretrainingLoader(data["static"], 8, expected_vocab_size=30522)
    check_max_seq_length(data["static"], 512)
    with pytest.raises(ValueError, match="max_position_embeddings=64"):
        check_max_seq_length(data["static"], 64)


def test_bad_arguments_and_damaged_data(data, tmp_path):
    with pytest.raises(ValueError, match="rank"):
        PretrainingLoader(data["static"], 8, rank=2, world_size=2)
    with pytest.raises(ValueError, match="fewer than one global batch"):
        PretrainingLoader(data["static"], 10**6)
    with pytest.raises(FileNotFoundError, match="dvc repro pretrain_data"):
        PretrainingLoader(tmp_path, 8)
    import shutil

    copy = tmp_path / "copy"
    shutil.copytree(data["static"], copy)
    (copy / "shard-00001.tokens.bin").write_bytes(b"\0" * 10)
    with pytest.raises(ValueError, match=r"shard-00001.tokens.bin: expected \d+ bytes"):
        PretrainingLoader(copy, 8)


def test_an_index_read_once_is_passed_along(data, monkeypatch):
    """A caller that read ``index.json`` (and its digest) hands it to the loader and checks: no re-read."""
    import hashlib

    from bert_core.pretrain_data import storage

    index, digest = storage.read_index_with_digest(data["static"])
    assert digest == hashlib.sha256((data["static"] / "index.json").read_bytes()).hexdigest()
    assert index == storage.read_index(data["static"])

    def no_read(data_dir):
        raise AssertionError(f"{data_dir}/index.json read again")

    monkeypatch.setattr(storage, "read_index_with_digest", no_read)
    loader = PretrainingLoader(data["static"], 8, expected_vocab_size=index["vocab_size"], index=index)
    assert loader.max_seq_length == index["max_seq_length"] and next(iter(loader))["input_ids"].shape[0] == 8
    check_vocab_size(data["static"], index["vocab_size"], index)
    check_max_seq_length(data["static"], 512, index)
