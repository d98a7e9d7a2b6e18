"""The Trainer: learning, accumulation, exact resume after SIGTERM, NaN handling, time budget, validation."""

from __future__ import annotations

import dataclasses
import itertools
import os
import signal
import time

import pytest
import torch
from torch import nn
from training_fakes import FakePretrainLoader, run, tiny_model

from bert_core.training import (
    NonFiniteLossError,
    Objective,
    StepOutput,
    TrainConfig,
    Trainer,
    TrainingInterrupted,
    build_optimizer,
)
from bert_core.training import checkpoint as ckpt


@pytest.fixture(autouse=True)
def _one_thread():
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


def _weights(model):
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def _assert_same(a, b):
    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k], b[k]), k


def _sigterm_at_micro(n: int):
    """An ``on_micro`` that sends SIGTERM to this process at micro-step ``n`` (2 per optimizer step)."""
    calls = {"n": 0}

    def send_sigterm():
        calls["n"] += 1
        if calls["n"] == n:
            os.kill(os.getpid(), signal.SIGTERM)

    return send_sigterm


def test_learns_and_reports_metrics_next_to_baselines():
    seen = []
    _, result = run(
        None,
        max_steps=300,
        micro=16,
        accum=1,
        dropout=0.0,
        warmup_steps=20,
        log_every=50,
        lr=5e-3,
        on_metrics=lambda s, m: seen.append((s, m)),
    )
    train = [h for h in result.history if h["kind"] == "train"]
    assert [h["step"] for h in train] == [50, 100, 150, 200, 250, 300]
    assert train[-1]["loss"] < train[0]["loss"] - 0.5
    for key in ("mlm_loss", "mlm_acc", "nsp_loss", "nsp_acc", "lr", "grad_norm", "seq_per_s", "tokens_per_s"):
        assert key in result.train_metrics, key
    assert "mfu" not in result.train_metrics  # CPU: no peak to compare with
    ev = result.eval_metrics
    assert ev["eval_mlm_acc"] > 5 * ev["eval_baseline_mlm_acc"]
    assert ev["eval_mlm_ppl"] < ev["eval_baseline_mlm_ppl"]
    assert 0.5 <= ev["eval_baseline_nsp_acc"] <= 1.0
    assert seen[-1] == (300, ev)
    assert result.stop_reason == "max_steps" and result.step == 300


def test_the_throughput_of_a_segments_first_window_starts_after_its_first_step(monkeypatch):
    """The first step holds compilation and warm-up (here: a clock that jumps 100 s during it)."""
    real, jump = time.perf_counter, {"s": 0.0, "calls": 0}

    def clock():
        return real() + jump["s"]

    def compile_once():
        jump["calls"] += 1
        if jump["calls"] == 1:
            jump["s"] += 100.0

    monkeypatch.setattr(time, "perf_counter", clock)
    _, result = run(None, max_steps=10, accum=1, log_every=5, checkpoint_every=0, on_micro=compile_once)
    first = next(h for h in result.history if h["kind"] == "train")
    assert first["step"] == 5 and first["step_time_s"] < 10.0  # 4 timed steps, not 100 s / 5
    assert first["seq_per_s"] > 1.0


class _Regression(Objective):
    """Mean squared error of a linear model: a loss that is a plain mean over equal examples."""

    def step(self, model, batch):
        loss = (model(batch["x"]) - batch["y"]).pow(2).mean()
        return StepOutput(loss, {"n": torch.tensor(batch["x"].shape[0])})

    def count(self, batch):
        return batch["x"].shape[0], batch["x"].numel()


def _regression_batches(n_batches, size):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(n_batches * 8, 4, generator=g)
    y = x @ torch.tensor([[1.0], [-2.0], [0.5], [3.0]])
    return [{"x": x[i : i + size], "y": y[i : i + size]} for i in range(0, len(x), size)]


def test_gradient_accumulation_equals_the_large_batch():
    models = []
    for micro, accum in ((8, 1), (4, 2), (2, 4)):
        torch.manual_seed(0)
        model = nn.Linear(4, 1)
        cfg = TrainConfig(max_steps=6, lr=0.05, warmup_steps=1, grad_accum=accum, device="cpu", log_every=1)
        Trainer(model, _Regression(), _regression_batches(6, micro), cfg).fit()
        models.append(model)
    for m in models[1:]:
        torch.testing.assert_close(m.weight, models[0].weight, rtol=1e-6, atol=1e-6)


OVERLAP = pytest.mark.parametrize("overlap", [False, True], ids=["checks-at-once", "checks-overlapped"])


@OVERLAP
def test_sigterm_writes_a_checkpoint_and_the_resumed_run_is_exact(tmp_path, overlap):
    """Overlapped runs (flags read a step late) are compared with a reference that reads them at once."""
    reference, ref_result = run(tmp_path / "ref", max_steps=8)
    with pytest.raises(TrainingInterrupted) as info:
        run(
            tmp_path / "ck",
            max_steps=8,
            checkpoint_every=100,
            on_micro=_sigterm_at_micro(7),
            overlap_checks=overlap,
        )
    assert info.value.step == 4 and info.value.exit_code == 128 + signal.SIGTERM
    assert [p.name for p in ckpt.list_checkpoints(tmp_path / "ck")] == ["step-00000004"]
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL or callable(signal.getsignal(signal.SIGTERM))

    resumed, result = run(tmp_path / "ck", max_steps=8, overlap_checks=overlap)
    assert result.resumed_from_step == 4
    _assert_same(_weights(resumed), _weights(reference))
    assert [h.get("loss") for h in result.history] == [h.get("loss") for h in ref_result.history]


def test_checkpoints_by_the_training_clock_and_without_the_final_one(tmp_path, caplog):
    """``checkpoint_every_s``: a checkpoint once that much training time has passed since the last one (here
    after every step); ``final_checkpoint=False``: none at the end, for a caller that keeps the result itself.
    The seconds spent in evaluations and checkpoints between steps are reported apart (``paused_s``), and
    those spent writing checkpoints too (``checkpoint_s``, each in the log with the checkpoint's size)."""
    with caplog.at_level("INFO", logger="bert_core.training"):
        _, result = run(
            tmp_path,
            max_steps=4,
            checkpoint_every=0,
            checkpoint_every_s=1e-9,
            final_checkpoint=False,
            keep_last=9,
        )
    assert [p.name for p in ckpt.list_checkpoints(tmp_path)] == [f"step-{s:08d}" for s in (1, 2, 3)]
    assert 0 < result.checkpoint_s < result.paused_s < result.elapsed_s
    size = ckpt.size_bytes(ckpt.step_dir(tmp_path, 3)) / 1e9
    assert f"step-00000003 ({size:.2f} GB in " in caplog.text
    _, hourly = run(tmp_path / "none", max_steps=4, checkpoint_every=0, checkpoint_every_s=3600.0)
    assert hourly.checkpoint == ckpt.step_dir(tmp_path / "none", 4)  # an hour: only the final one


def test_a_resumed_run_can_hand_its_history_to_a_new_tracking_run(tmp_path):
    """``replay_to`` gets the checkpoint's records, then ``on_metrics`` the rest, so a tracking run opened by
    the resumed process holds the whole curve."""
    logged = []
    run(
        tmp_path / "ref",
        max_steps=6,
        on_metrics=lambda s, m: logged.append((s, m.get("loss"))),
    )
    with pytest.raises(TrainingInterrupted):
        run(tmp_path / "ck", max_steps=6, checkpoint_every=100, on_micro=_sigterm_at_micro(7))
    again, replayed = [], []
    run(
        tmp_path / "ck",
        max_steps=6,
        replay_to=lambda s, m: replayed.append((s, m.get("loss"))),
        on_metrics=lambda s, m: again.append((s, m.get("loss"))),
    )
    assert replayed + again == logged and [s for s, _ in replayed] == [1, 2, 3, 4]


def test_a_run_resumed_mid_window_logs_the_rows_of_an_uninterrupted_one(tmp_path):
    """Interrupted at step 4 with a 3-step logging window: the row at step 6 averages steps 4-6 as the
    uninterrupted run's does (the window's sums travel in the checkpoint); only timing differs."""
    _, ref = run(tmp_path / "ref", max_steps=8, log_every=3)
    with pytest.raises(TrainingInterrupted):
        run(tmp_path / "ck", max_steps=8, checkpoint_every=100, log_every=3, on_micro=_sigterm_at_micro(7))
    _, resumed = run(tmp_path / "ck", max_steps=8, log_every=3)
    from bert_core.training.window import CLOCK_METRICS

    def rows(result):
        return [
            {k: v for k, v in h.items() if k not in CLOCK_METRICS}
            for h in result.history
            if h["kind"] == "train"
        ]

    assert [h["step"] for h in rows(ref)] == [3, 6, 8] and rows(resumed) == rows(ref)


def test_resume_of_a_loader_without_state_dict_skips_consumed_batches(tmp_path):
    def train(ckdir, on_micro=None):
        torch.manual_seed(0)
        model = nn.Linear(4, 1)
        objective = _Regression()
        if on_micro:
            inner = objective.step
            objective.step = lambda m, b: (on_micro(), inner(m, b))[1]
        cfg = TrainConfig(
            max_steps=9, lr=0.05, warmup_steps=1, grad_accum=1, device="cpu", checkpoint_every=2
        )
        Trainer(
            model, objective, _regression_batches(4, 8), cfg, checkpoint_dir=ckdir
        ).fit()  # 4 batches/epoch
        return model

    reference = train(tmp_path / "ref")
    n = {"calls": 0}

    def stop_at_6():
        n["calls"] += 1
        if n["calls"] == 6:
            os.kill(os.getpid(), signal.SIGINT)

    with pytest.raises(TrainingInterrupted):
        train(tmp_path / "ck", stop_at_6)
    resumed = train(tmp_path / "ck")
    torch.testing.assert_close(resumed.weight, reference.weight, rtol=0, atol=0)


class _NanAt(Objective):
    def __init__(self, inner: Objective, bad_step: int, accum: int):
        self.inner, self.bad_micro, self.calls = inner, (bad_step - 1) * accum + 1, 0

    def step(self, model, batch):
        self.calls += 1
        out = self.inner.step(model, batch)
        if self.calls == self.bad_micro:
            out.loss = out.loss * float("nan")
        return out

    def summarize(self, sums):
        return self.inner.summarize(sums)


@OVERLAP
@pytest.mark.parametrize("bad_step", [5, 4])
def test_nan_loss_stops_with_the_step_and_keeps_the_last_good_checkpoint(tmp_path, overlap, bad_step):
    """The model is left as the last good step made it, also when the flags are read a step late (the
    update is skipped on the device, the next step's never applied) and when the bad step is due a
    checkpoint (none is written)."""
    from bert_core.pretrain.objective import PretrainingObjective

    model = tiny_model()
    objective = _NanAt(PretrainingObjective.for_config(model.config), bad_step=bad_step, accum=2)
    cfg = TrainConfig(
        max_steps=10,
        lr=1e-3,
        warmup_steps=1,
        grad_accum=2,
        checkpoint_every=2,
        log_every=3,
        device="cpu",
        overlap_checks=overlap,
    )
    trainer = Trainer(model, objective, FakePretrainLoader(batch_size=4), cfg, checkpoint_dir=tmp_path)
    good = bad_step - 1
    saved = [f"step-0000000{s}" for s in range(2, good + 1, 2)]  # every second step, the bad one's not
    with pytest.raises(NonFiniteLossError, match=rf"optimizer step {bad_step} .*{saved[-1]}") as info:
        trainer.fit()
    assert info.value.step == bad_step and trainer.step == good
    assert [p.name for p in ckpt.list_checkpoints(tmp_path)] == saved
    assert all(torch.isfinite(p).all() for p in model.parameters())  # the bad update was not applied
    state = trainer.optimizer.state[next(model.parameters())]
    assert int(state["step"]) == good  # the skipped update's step count was taken back as well
    # exactly where a clean run is after the good steps: its weights as the next step starts
    clean, snapshot = tiny_model(), {}
    inner = PretrainingObjective.for_config(clean.config)
    step, calls = inner.step, itertools.count(1)

    def watched(m, batch):
        if next(calls) == good * 2 + 1:
            snapshot.update(_weights(m))
        return step(m, batch)

    inner.step = watched
    clean_cfg = dataclasses.replace(cfg, checkpoint_every=0, overlap_checks=False)
    Trainer(clean, inner, FakePretrainLoader(batch_size=4), clean_cfg).fit()
    _assert_same(_weights(model), snapshot)


def test_time_budget_stops_the_run_and_the_schedule_follows_it():
    _, result = run(None, time_budget_s=1.0, max_steps=None, warmup_steps=None, warmup_ratio=0.1, lr=1e-3)
    assert result.stop_reason == "time_budget"
    assert result.elapsed_s >= 1.0
    lrs = [h["lr"] for h in result.history if h["kind"] == "train"]
    peak = max(lrs)
    assert peak <= 1e-3
    after = lrs[lrs.index(peak) :]
    assert all(a >= b for a, b in itertools.pairwise(after))
    assert lrs[-1] < 0.5 * 1e-3


def test_a_complete_run_is_not_trained_again(tmp_path):
    model, first = run(tmp_path, max_steps=4)
    again, second = run(tmp_path, max_steps=4, on_micro=lambda: pytest.fail("trained again"))
    _assert_same(_weights(model), _weights(again))
    assert second.eval_metrics == first.eval_metrics and second.resumed_from_step == 4


def test_resume_refuses_a_checkpoint_of_other_settings(tmp_path):
    run(tmp_path, max_steps=3)
    model = tiny_model()
    from bert_core.pretrain.objective import PretrainingObjective

    cfg = TrainConfig(max_steps=4, lr=1e-3, device="cpu")
    trainer = Trainer(
        model,
        PretrainingObjective.for_config(model.config),
        FakePretrainLoader(),
        cfg,
        checkpoint_dir=tmp_path,
        fingerprint="other-settings",
    )
    with pytest.raises(ckpt.TrainingCheckpointError, match="other settings"):
        trainer.fit()


@pytest.mark.parametrize(
    ("kw", "msg"),
    [
        ({}, "max_steps or time_budget_s"),
        ({"max_steps": 10, "warmup_steps": 10}, r"warmup_steps \(10\) must be less than max_steps \(10\)"),
        ({"max_steps": 0}, "max_steps must be >= 1"),
        ({"time_budget_s": 60, "warmup_steps": 5}, "warmup_ratio"),
        ({"max_steps": 5, "grad_accum": 0}, "grad_accum must be >= 1"),
        ({"max_steps": 5, "lr": -1.0}, "lr must be > 0"),
        ({"max_steps": 5, "precision": "fp8"}, "precision"),
        ({"max_steps": 5, "warmup_steps": 1, "warmup_ratio": 0.1}, "not both"),
        ({"max_steps": 5, "compile_mode": "fast"}, "compile_mode must be one of default, reduce-overhead"),
    ],
)
def test_impossible_configs_are_refused(kw, msg):
    with pytest.raises(ValueError, match=msg):
        TrainConfig(**kw)


def test_only_a_compiled_model_in_a_graph_capturing_mode_replays_cuda_graphs():
    def graphs(**kw):
        return TrainConfig(max_steps=1, **kw).captures_cuda_graphs

    assert graphs(compile=True, compile_mode="reduce-overhead") and graphs(
        compile=True, compile_mode="max-autotune"
    )
    assert not graphs(compile=False, compile_mode="reduce-overhead")
    assert not graphs(compile=True) and not graphs(compile=True, compile_mode="max-autotune-no-cudagraphs")


def test_the_step_flags_are_read_a_step_late_where_the_device_can_skip_a_bad_update():
    """Auto: on a GPU with the fused AdamW and no loss scaler; asked for elsewhere, only with those."""
    from bert_core.training.distributed import DistContext
    from bert_core.training.step_check import StepCheck

    class Scaler:
        def __init__(self, on):
            self.on = on

        def is_enabled(self):
            return self.on

    def check(setting, device="cpu", optimizer="adamw", scaled=False):
        opt = build_optimizer(nn.Linear(2, 2), name=optimizer, lr=1e-3, weight_decay=0.0)
        dist = DistContext(device=torch.device(device))
        return StepCheck.for_run(setting, dist, time.perf_counter, lambda: False, opt, Scaler(scaled)).overlap

    assert check(None, "cuda") and not check(None, "cpu") and check(True, "cpu")
    assert not check(None, "cuda", optimizer="lamb") and not check(None, "cuda", scaled=True)
    assert not check(False, "cuda")
    with pytest.raises(ValueError, match=r"overlap_checks needs the fused AdamW.*Lamb"):
        check(True, optimizer="lamb")
    with pytest.raises(ValueError, match="loss scaler on"):
        check(True, scaled=True)


def test_fp16_on_cpu_is_refused():
    cfg = TrainConfig(max_steps=1, precision="fp16", device="cpu")
    with pytest.raises(ValueError, match="fp16 needs a CUDA device"):
        Trainer(nn.Linear(4, 1), _Regression(), _regression_batches(1, 8), cfg).fit()


def test_empty_training_data_is_a_clear_error():
    cfg = TrainConfig(max_steps=1, device="cpu")
    with pytest.raises(ValueError, match="yielded no batch"):
        Trainer(nn.Linear(4, 1), _Regression(), [], cfg).fit()


def test_every_statistic_of_an_objectives_step_is_made_on_the_models_device():
    """On the meta device a statistic made on the host shows as cpu: on a GPU that tensor would be copied
    over with a wait for the device in every step (``pytest -m gpu`` checks the step never waits)."""
    from test_compile import pretraining_batch, tiny_config

    from bert_core.finetune.trial import FinetuneObjective
    from bert_core.model import BertForPreTraining, BertForSequenceClassification
    from bert_core.pretrain.objective import PretrainingObjective

    classifier = BertForSequenceClassification(tiny_config(num_labels=2)).to("meta")
    ids = torch.zeros(4, 8, dtype=torch.long, device="meta")
    labels = torch.zeros(4, dtype=torch.long, device="meta")
    fine = FinetuneObjective().step(classifier, {"input_ids": ids, "labels": labels})
    pretraining = BertForPreTraining(tiny_config()).to("meta")
    batch = {k: v.to("meta") for k, v in pretraining_batch(padded=False).items() if k != "attention_mask"}
    pre = PretrainingObjective.for_config(pretraining.config).step(pretraining, batch)
    assert {k: v.device.type for k, v in {**fine.stats, **pre.stats}.items()} == dict.fromkeys(
        [*fine.stats, *pre.stats], "meta"
    )
