"""CPU throughput of the pretraining stage loop vs. a transformers + torch.optim.AdamW loop, in one run.

Ours: :class:`bert_core.training.Trainer` with :class:`PretrainingObjective` on ``bert_core.model.BertForPreTraining``
(sparse MLM head, fused AdamW, the stage's logging/metrics) — the loop ``pretrain`` runs.
Reference: ``transformers.BertForPreTraining`` (same config and initial weights, SDPA attention) with
``torch.optim.AdamW`` (its default implementation), gradient clipping at 1.0, the same batches from the
same :class:`PretrainingLoader` (ours in its default static-shape MLM form, the reference with
transformers' ``labels``), one optimizer step per batch.

The two alternate in short rounds (so a change in machine load hits both) and the first steps of each
round are not timed. Reported: sequences/s by wall clock and by process CPU time (the CPU figure is
less sensitive to other processes on a shared machine), and ours / reference.

    python bench/bench_pretrain_loop.py --data /tmp/realptd            # a pretrain_data output dir
    python bench/bench_pretrain_loop.py --synthetic                      # generated instances, no data needed

Prints a Markdown table and, with ``--json``, writes the numbers.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bert_core.config import BertConfig  # noqa: E402
from bert_core.model import BertForPreTraining  # noqa: E402
from bert_core.pretrain.objective import PretrainingObjective  # noqa: E402
from bert_core.pretrain_data.loader import PretrainingLoader  # noqa: E402
from bert_core.training import TrainConfig, Trainer  # noqa: E402


def synthetic_data(root: Path) -> Path:
    """Pretraining instances from a generated corpus (the data stage's own test generator)."""
    from bert_core.pretrain_data.build import build_pretrain_data
    from bert_core.pretrain_data.params import PretrainDataParams
    from bert_core.pretrain_data.testing import make_synthetic_inputs

    corpus, vocab = make_synthetic_inputs(root, n_train=600, n_heldout=60)
    params = PretrainDataParams(phases=["seq128"], dupe_factor=2, num_workers=1)
    build_pretrain_data(params, corpus_dir=corpus, vocab_dir=vocab, output_dir=root / "pd", run_checks=False)
    return root / "pd"


def ours_round(
    model, data_dir: Path, batch: int, warm: int, steps: int, seed: int
) -> tuple[float, float, int]:
    """(wall s, cpu s, sequences) of ``steps`` timed Trainer steps after ``warm`` untimed ones."""
    loader = PretrainingLoader(data_dir / "seq128" / "train", batch, seed=seed)
    marks: list[tuple[int, float, float]] = []

    def on_metrics(step: int, metrics: dict) -> None:
        marks.append((step, time.perf_counter(), time.process_time()))

    cfg = TrainConfig(
        max_steps=warm + steps,
        lr=1e-4,
        warmup_ratio=0.1,
        log_every=warm,
        device="cpu",
        seed=seed,
        max_grad_norm=1.0,
    )
    if steps % warm:
        raise ValueError("--steps must be a multiple of --warm")
    objective = PretrainingObjective.for_config(model.config)
    Trainer(model, objective, loader, cfg, on_metrics=on_metrics).fit()
    (_, w0, c0), (_, w1, c1) = marks[0], marks[-1]
    return w1 - w0, c1 - c0, steps * batch


def reference_round(
    model, data_dir: Path, batch: int, warm: int, steps: int, seed: int
) -> tuple[float, float, int]:
    loader = PretrainingLoader(data_dir / "seq128" / "train", batch, seed=seed, mlm_format="labels")
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.01, eps=1e-6)
    model.train()
    it = iter(loader)
    w0 = c0 = 0.0
    for i in range(warm + steps):
        if i == warm:
            w0, c0 = time.perf_counter(), time.process_time()
        b = next(it)
        out = model(**b)
        out.loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        _ = float(out.loss.detach())  # the loss leaves the device each step, as in any logging loop
    return time.perf_counter() - w0, time.process_time() - c0, steps * batch


def bench(
    preset: str, data_dir: Path, vocab_size: int, batch: int, warm: int, steps: int, rounds: int
) -> dict:
    import transformers

    cfg = BertConfig.from_preset(preset, vocab_size=vocab_size)
    torch.manual_seed(0)
    ours = BertForPreTraining(cfg)
    theirs = transformers.BertForPreTraining(transformers.BertConfig(**cfg.to_hf_dict()))
    theirs.load_state_dict(ours.state_dict(), strict=False)
    rows = {"ours": [], "reference": []}
    for r in range(rounds):
        for name, fn, model in (("ours", ours_round, ours), ("reference", reference_round, theirs)):
            wall, cpu, seqs = fn(model, data_dir, batch, warm, steps, seed=r)
            rows[name].append((seqs / wall, seqs / cpu))
            print(
                f"  {preset} round {r} {name:9s}: {seqs / wall:7.1f} seq/s wall, {seqs / cpu:7.1f} seq/s CPU",
                flush=True,
            )
    out = {"preset": preset, "batch": batch, "seq_len": 128, "timed_steps": steps, "rounds": rounds}
    for name, vals in rows.items():
        out[f"{name}_seq_per_s_wall"] = statistics.median(v[0] for v in vals)
        out[f"{name}_seq_per_s_cpu"] = statistics.median(v[1] for v in vals)
    out["ratio_wall"] = out["ours_seq_per_s_wall"] / out["reference_seq_per_s_wall"]
    out["ratio_cpu"] = out["ours_seq_per_s_cpu"] / out["reference_seq_per_s_cpu"]
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", type=Path, help="a pretrain_data output directory (holds seq128/train)")
    ap.add_argument("--synthetic", action="store_true", help="generate a small dataset instead")
    ap.add_argument("--presets", nargs="+", default=["tiny", "mini"])
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--warm", type=int, default=3)
    ap.add_argument("--steps", type=int, default=12, help="timed steps per round (multiple of --warm)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.synthetic:
        data_dir = synthetic_data(Path(tempfile.mkdtemp(prefix="bench-pretrain-")))
    elif args.data:
        data_dir = args.data
    else:
        ap.error("give --data DIR or --synthetic")
    vocab_size = PretrainingLoader(data_dir / "seq128" / "train", 1).vocab_size
    import transformers

    print(
        f"torch {torch.__version__}, transformers {transformers.__version__}, {torch.get_num_threads()} "
        f"threads, vocab {vocab_size}, data {data_dir}"
    )
    results = [
        bench(p, data_dir, vocab_size, args.batch, args.warm, args.steps, args.rounds) for p in args.presets
    ]
    print(
        "\n| preset | batch x seq | ours seq/s (wall / CPU) | transformers+AdamW seq/s (wall / CPU) | ratio (wall / CPU) |"
    )
    print("|---|---|---|---|---|")
    for r in results:
        print(
            f"| {r['preset']} | {r['batch']} x 128 | {r['ours_seq_per_s_wall']:.1f} / {r['ours_seq_per_s_cpu']:.1f} | "
            f"{r['reference_seq_per_s_wall']:.1f} / {r['reference_seq_per_s_cpu']:.1f} | "
            f"{r['ratio_wall']:.2f}x / {r['ratio_cpu']:.2f}x |"
        )
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
