"""The training path on a CUDA device: what CPU tests cannot exercise (skipped where torch sees no GPU).

Each case is small (the tiny model, a few steps) so that ``pytest -m gpu`` fits in a minute or two of
``bench/gpu_check.py``: autocast in bf16 and fp16 (with loss scaling), the fused AdamW kernel, the
compiled pretraining step with ``fullgraph=True`` under Inductor, the unpadded encoder against the
padded one, a checkpoint saved and resumed on the GPU, DDP with one process over NCCL, and the loop and
prediction queuing work without waiting for the device.
"""

from __future__ import annotations

import itertools
import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from test_compile import encoder_inputs, pretraining_batch, tiny_config
from training_fakes import run as fake_run

from bert_core.model import BertForPreTraining, BertModel
from bert_core.pretrain.objective import PretrainingObjective
from bert_core.training import TrainConfig, Trainer, build_optimizer
from bert_core.training.distributed import DistContext
from bert_core.unpad import set_unpad

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]
TESTS = Path(__file__).resolve().parent


def _cuda(batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {k: v.cuda() for k, v in batch.items()}


class _Cycle:
    """A few fixed pretraining batches, forever (the loop stops at ``max_steps``)."""

    def __init__(self, padded: bool = True) -> None:
        self.batches = [pretraining_batch(padded, seed) for seed in range(3)]

    def __iter__(self):
        while True:
            yield from self.batches


def _fit(
    precision: str, steps: int = 4, compile_: bool = False, mode: str | None = None
) -> tuple[BertForPreTraining, dict]:
    torch.manual_seed(0)
    model = BertForPreTraining(tiny_config())
    cfg = TrainConfig(
        max_steps=steps,
        lr=1e-3,
        precision=precision,
        compile=compile_,
        compile_mode=mode,
        log_every=1,
        device="cuda",
    )
    result = Trainer(model, PretrainingObjective.for_config(model.config), _Cycle(), cfg).fit()
    return model, result.train_metrics


@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_autocast_training_steps_are_finite_and_update_the_weights(precision):
    if precision == "bf16" and not torch.cuda.is_bf16_supported():
        pytest.skip("this GPU has no bf16")
    torch.manual_seed(0)
    before = BertForPreTraining(tiny_config()).state_dict()
    model, metrics = _fit(precision, steps=10)  # fp16: the loss scaler skips the first steps (scale 2**16)
    assert next(model.parameters()).device.type == "cuda"
    assert torch.isfinite(torch.tensor(metrics["loss"])), metrics
    moved = [n for n, p in model.state_dict().items() if not torch.equal(p.cpu(), before[n])]
    assert len(moved) > len(before) // 2, "most weights should change in 10 steps"


def test_fused_adamw_is_used_on_cuda_and_matches_foreach():
    torch.manual_seed(0)
    model = BertForPreTraining(tiny_config()).cuda()
    twin = BertForPreTraining(tiny_config()).cuda()
    twin.load_state_dict(model.state_dict())
    fused = build_optimizer(model, lr=1e-3)
    plain = build_optimizer(twin, lr=1e-3, fused=False)
    assert fused.defaults.get("fused") is True
    assert not plain.defaults.get("fused")
    batch = _cuda(pretraining_batch(padded=True))
    for m, opt in ((model, fused), (twin, plain)):
        for _ in range(3):
            opt.zero_grad(set_to_none=True)
            m(**batch).loss.backward()
            opt.step()
    for (name, a), b in zip(model.named_parameters(), twin.parameters(), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5, msg=name)


def test_compiled_pretraining_step_is_one_graph_under_inductor_and_matches_eager():
    """``fullgraph=True`` raises on any graph break; bf16 autocast as the stage runs it."""
    torch.manual_seed(0)
    model = BertForPreTraining(tiny_config()).cuda()
    objective = PretrainingObjective.for_config(model.config)
    compiled = torch.compile(model, fullgraph=True)
    batch = _cuda(pretraining_batch(padded=True))
    with torch.autocast("cuda", dtype=torch.bfloat16):
        eager = objective.step(model, batch).loss
        for _ in range(2):  # a second call must not recompile into a break either
            comp = objective.step(compiled, batch).loss
    comp.backward()
    assert all(p.grad is not None for p in model.parameters() if p.requires_grad)
    torch.testing.assert_close(comp.float(), eager.float(), rtol=2e-2, atol=2e-2)


def test_compiled_training_loop_runs():
    _, metrics = _fit("bf16" if torch.cuda.is_bf16_supported() else "fp16", steps=3, compile_=True)
    assert torch.isfinite(torch.tensor(metrics["loss"])), metrics


def test_the_loop_replaying_cuda_graphs_trains_as_the_default_compile():
    precision = "bf16" if torch.cuda.is_bf16_supported() else "fp16"
    _, plain = _fit(precision, steps=6, compile_=True)
    torch._dynamo.reset()
    _, graphed = _fit(precision, steps=6, compile_=True, mode="reduce-overhead")
    assert torch.isfinite(torch.tensor(graphed["loss"])), graphed
    assert graphed["loss"] == pytest.approx(plain["loss"], rel=5e-2)


def test_an_objective_step_never_waits_for_the_device():
    """Each objective's step (forward with padding, loss, statistics) only queues work: a synchronising copy
    (a host tensor moved over, ``.item()``, asking whether a mask has padding) would idle the GPU once a step."""
    from bert_core.finetune.trial import FinetuneObjective
    from bert_core.model import BertForSequenceClassification

    torch.manual_seed(0)
    pretraining = BertForPreTraining(tiny_config()).cuda()
    pre_batch = _cuda(pretraining_batch(padded=True))
    classifier = BertForSequenceClassification(tiny_config(num_labels=2)).cuda()
    fine_batch = {k: pre_batch[k] for k in ("input_ids", "token_type_ids", "attention_mask")}
    fine_batch["labels"] = torch.zeros(fine_batch["input_ids"].shape[0], dtype=torch.long, device="cuda")
    steps = [
        (PretrainingObjective.for_config(pretraining.config), pretraining, pre_batch),
        (FinetuneObjective(), classifier, fine_batch),
    ]
    for objective, model, batch in steps:
        objective.step(model, batch)  # first use: kernels load, handles are made
        torch.cuda.synchronize()
        torch.cuda.set_sync_debug_mode("error")
        try:
            out = objective.step(model, batch)
        finally:
            torch.cuda.set_sync_debug_mode("default")
        assert all(v.device.type == "cuda" for v in out.stats.values()), type(objective).__name__


def test_the_loop_queues_the_next_step_while_the_device_runs_one():
    """On a GPU the loop reads each step's flags one step late and copies batches from pinned memory, so
    from one step's forward to the one after next nothing waits for the device (sync debug mode raises at
    any wait but the late read's event)."""
    torch.manual_seed(0)
    model = BertForPreTraining(tiny_config())
    objective = PretrainingObjective.for_config(model.config)
    step, calls = objective.step, itertools.count(1)

    def watched(net, batch):
        n = next(calls)
        torch.cuda.set_sync_debug_mode("error" if n in (3, 4) else "default")
        return step(net, batch)

    objective.step = watched  # type: ignore[method-assign]
    precision = "bf16" if torch.cuda.is_bf16_supported() else "fp32"
    cfg = TrainConfig(max_steps=6, lr=1e-3, precision=precision, log_every=100, device="cuda")
    trainer = Trainer(model, objective, _Cycle(), cfg)
    try:
        trainer.fit()
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert trainer._check.overlap and trainer.step == 6


def test_prediction_queues_the_next_batch_while_the_device_runs_one():
    """Prediction copies each batch's outputs back through pinned memory behind an event and reads them while
    the device runs the next batch: no wait but that event's (sync debug mode raises at any other), and the
    outputs are the CPU's."""
    from test_finetune_features import _features

    from bert_core.finetune.inference import predict
    from bert_core.model import BertForTokenClassification

    torch.manual_seed(0)
    model = BertForTokenClassification(tiny_config(num_labels=3)).eval()
    features = _features([5, 17, 9, 30, 2, 11, 23])
    on_cpu = predict(model, features, batch_size=3)
    model.cuda()
    predict(model, features, batch_size=3, device="cuda", precision="fp32")  # first use: kernels load
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        on_gpu = predict(model, features, batch_size=3, device="cuda", precision="fp32")
    finally:
        torch.cuda.set_sync_debug_mode("default")
    for cpu, gpu in zip(on_cpu, on_gpu, strict=True):
        assert gpu.shape == cpu.shape
        assert abs(gpu - cpu).max() < 1e-3


def test_fit_turns_tf32_on_for_its_run_and_back_off_after_it(monkeypatch):
    monkeypatch.setattr(torch.backends.cuda.matmul, "allow_tf32", False)
    monkeypatch.setattr(torch.backends.cudnn, "allow_tf32", False)
    seen = []
    step = PretrainingObjective.step

    def spy(self, net, batch):
        seen.append((torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32))
        return step(self, net, batch)

    monkeypatch.setattr(PretrainingObjective, "step", spy)
    _fit("bf16" if torch.cuda.is_bf16_supported() else "fp16", steps=2)
    assert seen and all(flags == (True, True) for flags in seen)
    assert (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32) == (False, False)


@pytest.fixture
def exact_fp32():
    """TF32 off for the test: padded and unpadded matmuls of other shapes would round differently under it
    (the equivalence is checked in true fp32, as on the CPU)."""
    old = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    yield
    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = old


def test_unpadded_encoder_matches_padded_at_real_tokens_on_cuda(exact_fp32):
    torch.manual_seed(0)
    config = tiny_config()  # no dropout
    padded = BertModel(config).cuda().eval()
    unpadded = set_unpad(BertModel(config).cuda().eval())
    unpadded.load_state_dict(padded.state_dict())
    batch = _cuda(encoder_inputs(padded=True))
    real = batch["attention_mask"].bool()
    with torch.no_grad():
        a = padded(**batch).last_hidden_state
        b = unpadded(**batch).last_hidden_state
    torch.testing.assert_close(b[real], a[real], rtol=1e-4, atol=1e-4)
    assert torch.count_nonzero(b[~real]) == 0


def test_checkpoint_saved_on_the_gpu_resumes_there(tmp_path):
    """A 6-step run with checkpoints at 2, 4, 6; the last removed, a new run resumes at 4 and ends where the
    uninterrupted one did (no dropout, so no dependence on the CUDA generator; equal to rounding)."""
    import shutil

    gpu = DistContext(device=torch.device("cuda"))
    whole, first = fake_run(
        tmp_path / "ck", max_steps=6, checkpoint_every=2, dist=gpu, deterministic=False, dropout=0.0
    )
    assert first.step == 6 and first.checkpoint is not None
    shutil.rmtree(first.checkpoint)
    model, resumed = fake_run(
        tmp_path / "ck", max_steps=6, checkpoint_every=2, dist=gpu, deterministic=False, dropout=0.0
    )
    assert resumed.resumed_from_step == 4 and resumed.step == 6
    assert next(model.parameters()).device.type == "cuda"
    for (name, a), b in zip(model.named_parameters(), whole.parameters(), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-3, atol=1e-4, msg=name)


def test_ddp_with_one_process_over_nccl(tmp_path):
    """torchrun with one process: an NCCL group, an all-reduce, and DistributedDataParallel around our
    model for a few optimizer steps (``setup_distributed`` joins no group for one process, so the
    worker joins it itself; one GPU cannot hold two NCCL ranks)."""
    script = tmp_path / "ddp_worker.py"
    script.write_text(
        textwrap.dedent(
            f"""
            import json, sys
            sys.path[:0] = [{str(TESTS.parent)!r}, {str(TESTS)!r}]
            import torch, torch.distributed as dist
            from torch.nn.parallel import DistributedDataParallel
            from bert_core.pretrain.objective import PretrainingObjective
            from bert_core.training import build_optimizer
            from test_compile import pretraining_batch
            from training_fakes import tiny_model
            torch.cuda.set_device(0)
            dist.init_process_group("nccl")
            try:
                ones = torch.ones(4, device="cuda")
                dist.all_reduce(ones)
                model = tiny_model(dropout=0.0).cuda()
                net = DistributedDataParallel(model, device_ids=[0], gradient_as_bucket_view=True)  # as the Trainer
                objective = PretrainingObjective.for_config(model.config)
                opt = build_optimizer(model, lr=1e-3)
                batch = {{k: v.cuda() for k, v in pretraining_batch(padded=True).items()}}
                losses = []
                for _ in range(4):
                    opt.zero_grad(set_to_none=True)
                    with torch.autocast("cuda", dtype=torch.bfloat16):
                        loss = objective.step(net, batch).loss
                    loss.backward()
                    opt.step()
                    losses.append(loss.item())
                print(json.dumps({{"backend": dist.get_backend(), "world": dist.get_world_size(),
                                  "sum": ones.tolist(), "losses": losses}}))
            finally:
                dist.destroy_process_group()
            """
        )
    )
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=1", str(script)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["backend"] == "nccl" and out["world"] == 1 and out["sum"] == [1.0] * 4, out
    assert all(torch.isfinite(torch.tensor(out["losses"]))) and out["losses"][-1] < out["losses"][0], out
