"""GPU pretraining throughput and MFU of the stage loop: BERT-Base at sequence length 128 and 512, bf16.

Self-contained (synthetic instances: random token ids, 15% of positions masked with at most
``max_predictions`` per sequence, 50/50 NSP labels — throughput does not depend on the text). It runs
the same :class:`Trainer` + :class:`PretrainingObjective` that the ``pretrain`` stage runs, and reads
tokens/s and MFU from the loop's own metrics (the FLOPs formula is in ``bert_core/training/flops.py``:
6 x matmul parameters x tokens + attention + the MLM head at masked positions; peak = the device's dense
bf16 tensor-core figure).

    python bench/bench_gpu_pretrain.py                      # base, seq 128 and 512, bf16, torch.compile
    python bench/bench_gpu_pretrain.py --no-compile --steps 30
    python bench/bench_gpu_pretrain.py --preset large --batch128 64 --batch512 16

Prints the device name and a Markdown table; ``--json`` writes the numbers.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
from pathlib import Path
from typing import Any

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bert_core.config import BertConfig  # noqa: E402
from bert_core.model import BertForPreTraining  # noqa: E402
from bert_core.pretrain.objective import PretrainingObjective  # noqa: E402
from bert_core.training import TrainConfig, Trainer  # noqa: E402
from bert_core.training.flops import peak_tflops  # noqa: E402

VOCAB = 30522


class SyntheticLoader:
    """Endless synthetic MLM + NSP batches (CPU tensors, pinned), a few distinct ones cycled."""

    def __init__(self, batch: int, seq_len: int, max_predictions: int, n_distinct: int = 8, seed: int = 0):
        g = torch.Generator().manual_seed(seed)
        self.batches = []
        for _ in range(n_distinct):
            ids = torch.randint(1000, VOCAB, (batch, seq_len), generator=g)
            ids[:, 0], ids[:, seq_len // 2], ids[:, -1] = 101, 102, 102
            types = torch.zeros(batch, seq_len, dtype=torch.long)
            types[:, seq_len // 2 + 1 :] = 1
            scores = torch.rand(batch, seq_len, generator=g)
            scores[:, [0, seq_len // 2, seq_len - 1]] = 2.0
            n_pred = min(max_predictions, max(1, round(0.15 * seq_len)))
            chosen = torch.zeros(batch, seq_len, dtype=torch.bool)
            chosen.scatter_(1, scores.argsort(dim=1)[:, :n_pred], True)
            labels = torch.where(chosen, ids, torch.full_like(ids, -100))
            inputs = torch.where(chosen, torch.full_like(ids, 103), ids)
            b = {
                "input_ids": inputs,
                "token_type_ids": types,
                "attention_mask": torch.ones(batch, seq_len, dtype=torch.long),
                "labels": labels,
                "next_sentence_label": torch.randint(0, 2, (batch,), generator=g),
            }
            self.batches.append({k: v.pin_memory() if torch.cuda.is_available() else v for k, v in b.items()})

    def __iter__(self):
        while True:
            yield from self.batches


#: Kernel (or, on a CPU, operator) names by what they do, first match wins: where a step's time goes.
KERNEL_GROUPS = [
    (group, re.compile(p, re.I))
    for group, p in (
        ("attention", r"flash|fmha|attention|mem_eff|scaled_dot_product"),
        ("matmul", r"gemm|cutlass|nvjet|xmma|cublas|aten::(mm|addmm|bmm|matmul|linear)\b"),
        ("optimizer", r"multi_tensor|adam|foreach"),
        ("fused elementwise (compiled)", r"^triton_"),
        ("copy and fill", r"memcpy|memset|copy_|fill_"),
        ("reduction and elementwise (eager)", r"elementwise|reduce|vectorized|softmax|norm|dropout|gelu"),
        ("communication", r"nccl"),
    )
]


def _kernel_table(prof: Any, steps: int, top: int) -> tuple[list[dict], float, dict]:
    """The ``top`` kernels by time on the device (without one: operators by self time on the host), per step;
    the milliseconds a step that all of them take together (against the step time, how busy the device is);
    and every kernel's time summed by what it does (``KERNEL_GROUPS``).

    On a device only the device's own events count, not the host operators that launched them nor the
    annotations around them (both carry the same time again): the rule of torch's own ``table()`` total.
    """
    from torch.autograd import DeviceType

    events = [e for e in prof.key_averages() if e.key]
    kernels = [e for e in events if e.device_type != DeviceType.CPU and not e.is_user_annotation]
    on_device = bool(kernels)
    rows = kernels if on_device else events

    def own(e: Any) -> float:  # microseconds over the profiled steps
        return float(e.self_device_time_total if on_device else e.self_cpu_time_total)

    total = sum(own(e) for e in rows) or 1.0
    groups: dict[str, float] = {}
    for e in rows:
        group = next((g for g, pattern in KERNEL_GROUPS if pattern.search(e.key)), "other")
        groups[group] = groups.get(group, 0.0) + own(e)
    by_group = {g: {"ms_per_step": t / 1000 / steps, "share": t / total} for g, t in groups.items()}
    table = [
        {
            "name": e.key if len(e.key) <= 100 else e.key[:99] + "…",
            "ms_per_step": own(e) / 1000 / steps,
            "share": own(e) / total,
            "calls_per_step": e.count / steps,
            "clock": "device" if on_device else "host",
        }
        for e in sorted(rows, key=own, reverse=True)[:top]
    ]
    return table, total / 1000 / steps, dict(sorted(by_group.items(), key=lambda kv: -kv[1]["ms_per_step"]))


def run(
    preset: str,
    seq_len: int,
    batch: int,
    steps: int,
    warm: int,
    compile_: bool,
    precision: str,
    device: str,
    profile_top: int = 0,
    overrides: dict[str, Any] | None = None,
    train: dict[str, Any] | None = None,
) -> dict:
    """``warm`` untimed steps, ``steps`` timed ones; with ``profile_top``, one more window of ``warm`` steps under
    ``torch.profiler`` (after the timed ones, so its overhead stays out of the figures): the top kernels.
    ``overrides``: ``BertConfig`` fields changed from the preset's (an ablation: ``hidden_dropout_prob=0``);
    ``train``: ``TrainConfig`` fields changed (``compile_mode="reduce-overhead"``: the step replayed as CUDA
    graphs; ``overlap_checks=False``: the step's flags read before its update, the host waiting for the device)."""
    cfg = BertConfig.from_preset(
        preset, vocab_size=VOCAB, **{"hidden_dropout_prob": 0.1, **(overrides or {})}
    )
    torch.manual_seed(0)
    model = BertForPreTraining(cfg)
    objective = PretrainingObjective.for_config(cfg)
    max_pred = 20 if seq_len <= 128 else 80
    logs: list[dict] = []
    windows = 1 + steps // warm  # logged windows before the profiled one
    activities = [torch.profiler.ProfilerActivity.CPU]
    if device == "cuda":
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    profiler = torch.profiler.profile(activities=activities) if profile_top else None

    def on_metrics(step: int, metrics: dict) -> None:
        logs.append(metrics)
        if profiler is not None and len(logs) == windows:
            profiler.start()

    tc = TrainConfig(
        max_steps=warm + steps + (warm if profile_top else 0),
        lr=1e-4,
        warmup_ratio=0.01,
        precision=precision,
        compile=compile_,
        log_every=warm,
        device=device,
        **(train or {}),
    )
    t0 = time.perf_counter()
    Trainer(
        model,
        objective,
        SyntheticLoader(batch, seq_len, max_pred),
        tc,
        on_metrics=on_metrics,
    ).fit()
    if profiler is not None:
        if device == "cuda":
            torch.cuda.synchronize()
        profiler.stop()
    total = time.perf_counter() - t0
    timed = logs[1:windows]  # the first window holds compilation and warm-up; the last, the profiler
    seconds = sum(m["step_time_s"] for m in timed) * warm
    tokens = batch * seq_len * warm * len(timed)
    out = {
        "preset": preset,
        "seq_len": seq_len,
        "batch": batch,
        "precision": precision,
        "compile": compile_,
        "train_overrides": train or {},
        "timed_steps": warm * len(timed),
        "tokens_per_s": tokens / seconds,
        "seq_per_s": tokens / seq_len / seconds,
        "mfu": sum(m.get("mfu", float("nan")) for m in timed) / len(timed),
        "step_time_ms": 1000 * seconds / (warm * len(timed)),
        "peak_mem_gib": torch.cuda.max_memory_allocated() / 2**30 if device == "cuda" else float("nan"),
        "wall_s": total,
    }
    if profiler is not None:
        out["top_kernels"], out["busy_ms_per_step"], out["kernel_groups"] = _kernel_table(
            profiler, warm, profile_top
        )
    del model
    if device == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--preset", default="base")
    ap.add_argument("--batch128", type=int, default=256, help="micro batch at sequence length 128")
    ap.add_argument("--batch512", type=int, default=64, help="micro batch at sequence length 512")
    ap.add_argument("--steps", type=int, default=60, help="timed steps (multiple of --warm)")
    ap.add_argument("--warm", type=int, default=10, help="untimed warm-up steps (and log window)")
    ap.add_argument("--no-compile", action="store_true")
    ap.add_argument("--precision", default="bf16", choices=["bf16", "fp16", "fp32"])
    ap.add_argument("--device", default="cuda", help="cpu: a smoke test of the script only")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    if args.device == "cuda" and not torch.cuda.is_available():
        sys.exit("no CUDA device: this benchmark needs a GPU (--device cpu runs a smoke test)")
    name = torch.cuda.get_device_name() if args.device == "cuda" else "cpu"
    print(
        f"device: {name}; torch {torch.__version__}; CUDA {torch.version.cuda}; "
        f"peak bf16 dense {peak_tflops(name, 'bf16')} TFLOP/s (table)",
        flush=True,
    )
    results = []
    for seq_len, batch in ((128, args.batch128), (512, args.batch512)):
        r = run(
            args.preset,
            seq_len,
            batch,
            args.steps,
            args.warm,
            not args.no_compile,
            args.precision,
            args.device,
        )
        r["device"] = name
        results.append(r)
        print(json.dumps(r), flush=True)
    print(f"\n{name}\n")
    print(
        "| preset | seq | micro batch | precision | compile | tokens/s | seq/s | MFU | step ms | peak mem GiB |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in results:
        print(
            f"| {r['preset']} | {r['seq_len']} | {r['batch']} | {r['precision']} | {r['compile']} | "
            f"{r['tokens_per_s']:,.0f} | {r['seq_per_s']:,.0f} | {100 * r['mfu']:.1f}% | "
            f"{r['step_time_ms']:.1f} | {r['peak_mem_gib']:.1f} |"
        )
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
