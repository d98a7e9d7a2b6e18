"""Pretraining recipe options: the [MASK]/random/keep split, data and loss without NSP, and the default's bytes.

The default outputs are pinned by digest (a tiny generated corpus, static and dynamic masking): the
paper's 80/10/10 draws exactly as it did before the split became a parameter, so a default build keeps
its bytes (``index.json`` included) and nothing downstream reruns for it.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import pytest
import torch

from bert_core.constants import IGNORE_INDEX
from bert_core.params import ParamsError, parse_params
from bert_core.pretrain_data.build import build_pretrain_data
from bert_core.pretrain_data.checks import check_output
from bert_core.pretrain_data.loader import build_batch, masking_spec
from bert_core.pretrain_data.params import PretrainDataParams
from bert_core.pretrain_data.storage import InstanceStore
from bert_core.pretrain_data.testing import make_synthetic_inputs
from tests.test_pretrain import small_params

#: sha256 of a default build of :func:`_inputs` (its files, and one loader batch), as built before the
#: split was a parameter. A deliberate change of the format or of the generator updates these.
GOLDEN = {
    "static": (
        "c2d2de13647d3321b7261af01cf59508985f7d2b851e4c3d14189bf1889aca91",
        "5c619c98dea6c6623aabe2e144f68aff2d1a3026d8debc05a6d2d1ac247f2714",
    ),
    "dynamic": (
        "d0a395de01175dd9e9d7ba9b87d32d8f2d183fed3224bac97bb1567cefd94e0c",
        "5add1b2a5a4ed55986f64a43cabde61eb444f946346af4a5d275703b32d2d348",
    ),
}


@pytest.fixture(scope="module")
def inputs(tmp_path_factory):
    root = tmp_path_factory.mktemp("recipe-inputs")
    corpus, vocab = make_synthetic_inputs(root, n_train=200, n_heldout=60)
    (vocab / "tokenizer_config.json").write_text(json.dumps({"tokenizer_class": "BertTokenizer"}))
    return corpus, vocab


def _params(**kw) -> PretrainDataParams:
    base = dict(dupe_factor=1, num_workers=1, window_tokens=5_000, min_window_docs=16, phases=["seq128"])
    return PretrainDataParams(**(base | kw))


def _build(inputs, out: Path, run_checks: bool = False, **kw) -> Path:
    corpus, vocab = inputs
    build_pretrain_data(
        _params(**kw), corpus_dir=corpus, vocab_dir=vocab, output_dir=out, run_checks=run_checks
    )
    return out / "seq128"


def _digest(d: Path) -> str:
    h = hashlib.sha256()
    for f in sorted(p for p in d.rglob("*") if p.is_file()):
        h.update(str(f.relative_to(d)).encode())
        h.update(f.read_bytes())
    return h.hexdigest()


def _first_batch(data_dir: Path) -> dict[str, np.ndarray]:
    store = InstanceStore(data_dir)
    spec, cont = masking_spec(store.data_dir, store.index)
    return build_batch(store, np.arange(min(len(store), 512)), seed=0, epoch=0, spec=spec, continuation=cont)


def _split_shares(batch: dict[str, np.ndarray], mask_id: int) -> tuple[float, float, float]:
    chosen = batch["labels"] != IGNORE_INDEX
    ids, labels = batch["input_ids"][chosen], batch["labels"][chosen]
    n = max(len(ids), 1)
    masked, kept = float((ids == mask_id).sum()) / n, float((ids == labels).sum()) / n
    return masked, 1 - masked - kept, kept


@pytest.mark.parametrize("masking", ["static", "dynamic"])
def test_default_outputs_keep_their_bytes(inputs, tmp_path, masking):
    out = _build(inputs, tmp_path / "pd", masking=masking).parent
    batch = _first_batch(out / "seq128" / "train")
    hb = hashlib.sha256(batch["input_ids"][:64].tobytes() + batch["labels"][:64].tobytes()).hexdigest()
    assert (_digest(out), hb) == GOLDEN[masking]
    index = json.loads((out / "seq128" / "train" / "index.json").read_text())
    assert "mask_split" not in index and "mask_split" not in index["params"]


@pytest.mark.parametrize(
    ("masking", "split"),
    [
        ("static", {"mask": 1.0, "random": 0.0, "keep": 0.0}),
        ("dynamic", {"mask": 0.5, "random": 0.2, "keep": 0.3}),
    ],
)
def test_mask_split_changes_the_observed_split_and_the_checks_follow_it(inputs, tmp_path, masking, split):
    data = _build(inputs, tmp_path / "pd", run_checks=True, masking=masking, mask_split=split)  # checks pass
    index = json.loads((data / "train" / "index.json").read_text())
    assert index["mask_split"] == split and index["params"]["mask_split"] == split
    mask_id = index["special_token_ids"]["[MASK]"]
    for part in ("train", "heldout"):
        got = _split_shares(_first_batch(data / part), mask_id)
        want = (split["mask"], split["random"], split["keep"])
        assert np.allclose(got, want, atol=0.03), (part, got, want)


def test_the_checks_are_centred_on_the_recorded_split(inputs, tmp_path):
    """An output masked 100/0/0 whose index claims the paper's 80/10/10 fails the split checks."""
    import shutil

    built = _build(inputs, tmp_path / "pd", mask_split={"mask": 1.0, "random": 0.0, "keep": 0.0})
    data = tmp_path / "d"  # a copy outside the output (its manifest would refuse the edited index)
    shutil.copytree(built / "train", data)
    index_file = data / "index.json"
    index = json.loads(index_file.read_text())
    del index["mask_split"]
    index_file.write_text(json.dumps(index))
    report, stats = check_output(data, sample_size=2000, seed=0)
    assert stats["mask_share"] == 1.0
    failed = " ".join(r.name for r in report.failed_critical)
    assert all(f"column='{c}'" in failed for c in ("mask_frac", "keep_frac", "random_frac")), failed


@pytest.mark.parametrize(
    ("value", "message"),
    [
        (
            {"mask": 0.8, "random": 0.1, "keep": 0.2},
            r"'pretrain_data\.mask_split' = .*add up to 1, got 0\.8 \+ 0\.1 \+ 0\.2",
        ),
        (
            {"mask": 1.1, "random": 0.0, "keep": 0.0},
            r"'pretrain_data\.mask_split\.mask' = 1\.1: .*less than or equal to 1",
        ),
        ({"mask": 0.9, "random": -0.1, "keep": 0.2}, r"'pretrain_data\.mask_split\.random' = -0\.1"),
        ({"mask": 1.0, "rand": 0.0}, r"unknown key 'pretrain_data\.mask_split\.rand'"),
    ],
)
def test_a_bad_mask_split_is_refused_naming_the_key(value, message):
    with pytest.raises(ParamsError, match=message):
        parse_params(
            {"mask_split": value},
            PretrainDataParams,
            where="params/pretrain_data.yaml",
            prefix="pretrain_data",
        )


def test_no_nsp_data_is_all_isnext_but_forced_pairs_and_passes_its_checks(inputs, tmp_path):
    data = _build(inputs, tmp_path / "pd", run_checks=True, random_next_prob=0.0)
    for part in ("train", "heldout"):
        index = json.loads((data / part / "index.json").read_text())
        stats = index["stats"]
        # NotNext left: the single-sentence chunks only (they have no B of their own)
        assert stats["expected_not_next_share"] == stats["forced_not_next_share"] > 0
        assert stats["is_next_share"] == pytest.approx(1 - stats["forced_not_next_share"])


# ---------------------------------------------------------------------------------------------- objective
def _tiny_model():
    from bert_core.config import BertConfig
    from bert_core.model import BertForPreTraining

    torch.manual_seed(0)
    cfg = BertConfig.from_preset(
        "tiny",
        vocab_size=500,
        hidden_size=32,
        num_attention_heads=2,
        num_hidden_layers=1,
        intermediate_size=64,
    )
    return BertForPreTraining(cfg), cfg


def _torch_batch(data_dir: Path) -> dict[str, torch.Tensor]:
    store = InstanceStore(data_dir)
    b = build_batch(store, np.arange(8), seed=0, epoch=0, spec=None)
    return {k: torch.as_tensor(v) for k, v in b.items()}


def test_without_nsp_the_loss_is_mlm_alone_and_no_nsp_figure_is_reported(inputs, tmp_path):
    from bert_core.pretrain.objective import PretrainingObjective

    data = _build(inputs, tmp_path / "pd", random_next_prob=0.0)
    batch = _torch_batch(data / "train")
    model, cfg = _tiny_model()
    model.eval()  # no dropout: the objective's forward and the reference forward see the same model
    with_nsp, without = PretrainingObjective.for_config(cfg), PretrainingObjective.for_config(cfg, nsp=False)
    out = model(
        **{
            k: batch[k]
            for k in ("input_ids", "token_type_ids", "attention_mask", "labels", "next_sentence_label")
        }
    )
    step = without.step(model, batch)
    assert torch.allclose(step.loss, out.mlm_loss) and not torch.allclose(step.loss, out.loss)
    assert torch.allclose(with_nsp.step(model, batch).loss, out.loss)
    step.loss.backward()  # every parameter gets a gradient (DDP without find_unused_parameters needs it)
    grads = {n: p.grad for n, p in model.named_parameters()}
    assert all(g is not None for g in grads.values())
    assert not grads["cls.seq_relationship.weight"].any()  # the NSP head learns nothing
    metrics = without.summarize(without.eval_step(model, batch))
    assert {"mlm_loss", "mlm_acc", "mlm_ppl", "baseline_mlm_acc"} <= set(metrics)
    assert not any(k.startswith("nsp") or "nsp" in k for k in metrics)
    assert "nsp_acc" in with_nsp.summarize(with_nsp.eval_step(model, batch))


def test_pretrain_without_nsp_exports_the_same_tensors(inputs, tmp_path):
    from bert_core.hf import read_state_dict
    from bert_core.pretrain import pretrain

    data = _build(inputs, tmp_path / "pd", random_next_prob=0.0).parent
    _, vocab = inputs
    runs = {}
    for nsp in (True, False):
        params = small_params(
            max_steps=2,
            phases=[{"name": "seq128", "share": 1.0, "micro_batch": 4, "global_batch": 4, "lr": 1e-3}],
            checkpoint_every=0,
            eval_batches=1,
            nsp=nsp,
        )
        runs[nsp] = pretrain(
            params, data, vocab, tmp_path / f"model-{nsp}", checkpoint_root=tmp_path / "ckpt"
        )
    assert "nsp_acc" in runs[True].metrics["heldout"] and "nsp_acc" not in runs[False].metrics["heldout"]
    assert "mlm_loss" in runs[False].metrics["heldout"]
    tensors = {nsp: set(read_state_dict(tmp_path / f"model-{nsp}")[0]) for nsp in runs}
    assert tensors[True] == tensors[False] and any("seq_relationship" in k for k in tensors[False])
    # distinct checkpoint fingerprints: a run without NSP never resumes one with it
    assert len({p.name for p in (tmp_path / "ckpt").iterdir()}) == 2


def test_nsp_is_a_boolean_key():
    from bert_core.pretrain import PretrainParams

    body = {"max_steps": 1, "phases": [{"name": "seq128", "share": 1, "micro_batch": 1, "global_batch": 1}]}
    with pytest.raises(ParamsError, match=r"'pretrain\.nsp' = 'sometimes'"):
        parse_params(
            body | {"nsp": "sometimes"}, PretrainParams, where="params/pretrain.yaml", prefix="pretrain"
        )
