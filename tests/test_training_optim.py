"""Optimizers, parameter groups, the LR schedule and the FLOPs formula."""

from __future__ import annotations

import itertools
import math

import pytest
import torch
from torch import nn
from training_fakes import tiny_model

from bert_core.training.flops import bert_train_flops, mfu, peak_tflops
from bert_core.training.optim import Lamb, build_optimizer, param_groups
from bert_core.training.schedule import LinearWarmupDecay


def test_param_groups_exclude_bias_and_layernorm_and_count_tied_once():
    model = tiny_model()
    groups = param_groups(model, 0.01)
    decay, no_decay = groups
    assert decay["weight_decay"] == 0.01 and no_decay["weight_decay"] == 0.0
    names = {id(p): n for n, p in model.named_parameters()}
    for p in no_decay["params"]:
        assert names[id(p)].endswith("bias") or "LayerNorm" in names[id(p)], names[id(p)]
    for p in decay["params"]:
        assert p.ndim == 2, names[id(p)]
    assert "bert.embeddings.word_embeddings.weight" in {names[id(p)] for p in decay["params"]}
    total = sum(p.numel() for g in groups for p in g["params"])
    assert total == sum(p.numel() for p in model.parameters())  # tied decoder counted once


def test_adamw_fused_matches_foreach():
    torch.manual_seed(0)
    a, b = nn.Linear(8, 4), nn.Linear(8, 4)
    b.load_state_dict(a.state_dict())
    opt_a = build_optimizer(a, lr=1e-2, fused=True)
    opt_b = torch.optim.AdamW(param_groups(b, 0.01), lr=1e-2, eps=1e-6, foreach=False)
    assert opt_a.defaults.get("fused")
    for _ in range(5):
        x = torch.randn(16, 8)
        for m, o in ((a, opt_a), (b, opt_b)):
            o.zero_grad()
            m(x).pow(2).sum().backward()
            o.step()
    torch.testing.assert_close(a.weight, b.weight, rtol=1e-5, atol=1e-6)


def _lamb_reference(w, g_seq, lr, b1, b2, eps, wd):
    """Scalar-loop LAMB as in the paper (bias-corrected moments, trust ratio over the whole tensor)."""
    w = w.clone()
    m, v = torch.zeros_like(w), torch.zeros_like(w)
    for t, g in enumerate(g_seq, 1):
        m = b1 * m + (1 - b1) * g
        v = b2 * v + (1 - b2) * g * g
        u = (m / (1 - b1**t)) / ((v / (1 - b2**t)).sqrt() + eps) + wd * w
        r = w.norm() / u.norm()
        w = w - lr * r * u
    return w


def test_lamb_matches_reference():
    torch.manual_seed(0)
    w0 = torch.randn(5, 3)
    grads = [torch.randn(5, 3) for _ in range(4)]
    p = nn.Parameter(w0.clone())
    opt = Lamb([{"params": [p], "weight_decay": 0.01}], lr=0.1, eps=1e-6)
    for g in grads:
        p.grad = g.clone()
        opt.step()
    torch.testing.assert_close(p.data, _lamb_reference(w0, grads, 0.1, 0.9, 0.999, 1e-6, 0.01))


def test_lamb_trains_and_no_decay_group_is_not_adapted():
    model = tiny_model()
    opt = build_optimizer(model, name="lamb", lr=1e-3)
    assert isinstance(opt, Lamb)
    assert [g.get("adapt", g["weight_decay"] > 0) for g in opt.param_groups] == [True, False]


def test_unknown_optimizer_is_refused():
    with pytest.raises(ValueError, match=r"adamw.*lamb"):
        build_optimizer(tiny_model(), name="sgd", lr=1e-3)  # type: ignore[arg-type]


def test_schedule_warmup_then_linear_decay_by_steps():
    s = LinearWarmupDecay.from_warmup_steps(1.0, max_steps=10, warmup_steps=4)
    lrs = [s.lr_for_step(i) for i in range(10)]
    assert lrs[:4] == pytest.approx([0.25, 0.5, 0.75, 1.0])
    assert lrs[4] == pytest.approx(1.0)  # first decay step is still at the peak
    assert lrs[-1] == pytest.approx(1 / 6)
    assert all(a > b for a, b in itertools.pairwise(lrs[4:]))
    assert all(lr > 0 for lr in lrs)


def test_schedule_follows_the_time_budget():
    s = LinearWarmupDecay(peak_lr=2.0, budget_s=600.0, warmup=0.1)
    assert s.lr_for_step(0, 30.0) == pytest.approx(1.0)  # half-way through warmup
    assert s.lr_for_step(999, 60.0) == pytest.approx(2.0)  # steps do not matter, time does
    assert s.lr_for_step(5, 330.0) == pytest.approx(1.0)
    assert s.lr_for_step(5, 600.0) == 0.0
    assert s.lr_for_step(5, 900.0) == 0.0  # past the budget: clamped


def test_with_steps_and_budget_the_schedule_follows_the_limit_that_is_closer():
    s = LinearWarmupDecay(peak_lr=1.0, max_steps=100, budget_s=100.0, warmup=0.0)
    assert s.lr_for_step(10, 50.0) == pytest.approx(0.5)  # time is further along
    assert s.lr_for_step(80, 50.0) == pytest.approx(0.2)  # steps are further along


@pytest.mark.parametrize(
    ("kw", "msg"),
    [
        ({"max_steps": 10, "warmup": 1.0}, "shorter than the run"),
        ({"max_steps": 0}, "max_steps must be >= 1"),
        ({"budget_s": -1.0}, "budget must be > 0"),
        ({}, "max_steps, a time budget, or both"),
        ({"max_steps": 10, "warmup": -0.1}, ">= 0"),
    ],
)
def test_schedule_rejects_impossible_settings(kw, msg):
    with pytest.raises(ValueError, match=msg):
        LinearWarmupDecay(peak_lr=1e-4, **kw)
    with pytest.raises(ValueError, match="less than max_steps"):
        LinearWarmupDecay.from_warmup_steps(1e-4, 10, 10)


def test_flops_formula_by_hand():
    # L=1, H=2, I=8, V=10, T=4, B=1, 1 masked token:
    # layer matmul params = 4*4 + 2*2*8 = 48; 6*48*4 tokens = 1152; attention 12*1*2*4*4 = 384;
    # MLM head 6*(4 + 20)*1 = 144; NSP 6*(4 + 4)*1 = 48.
    f = bert_train_flops(
        num_layers=1,
        hidden_size=2,
        intermediate_size=8,
        vocab_size=10,
        seq_len=4,
        sequences=1,
        masked_tokens=1,
    )
    assert f == 1152 + 384 + 144 + 48


def test_flops_base_model_close_to_6n():
    # BERT-base at T=128: the encoder dominates, so FLOPs/token ~ 6 * 85M (+ attention).
    f = bert_train_flops(
        num_layers=12,
        hidden_size=768,
        intermediate_size=3072,
        vocab_size=30522,
        seq_len=128,
        sequences=1,
        masked_tokens=20,
    )
    per_token = f / 128
    assert 6 * 85e6 < per_token < 6 * 100e6


def test_peak_table_and_mfu(monkeypatch):
    monkeypatch.delenv("BERT_PEAK_TFLOPS", raising=False)
    assert peak_tflops("NVIDIA H100 80GB HBM3") == pytest.approx(989.4)
    assert peak_tflops("NVIDIA H100 PCIe") == pytest.approx(756.5)
    assert peak_tflops("NVIDIA H200") == pytest.approx(989.4)
    assert peak_tflops("NVIDIA A100-SXM4-80GB") == 312.0
    assert peak_tflops("NVIDIA A100-SXM4-80GB", "fp32") == 156.0
    assert peak_tflops("Some Unknown GPU") is None
    monkeypatch.setenv("BERT_PEAK_TFLOPS", "100")
    assert peak_tflops("Some Unknown GPU") == 100.0
    assert mfu(50e12, 1.0, 100.0) == pytest.approx(0.5)
    assert mfu(50e12, 1.0, 100.0, world_size=2) == pytest.approx(0.25)
    assert mfu(1.0, 1.0, None) is None
    assert math.isfinite(mfu(1.0, 1.0, 1.0))
