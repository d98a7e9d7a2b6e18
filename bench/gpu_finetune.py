"""Fine-tuning throughput on SST-2-shaped batches: our stage's training path vs transformers' ``Trainer``.

Synthetic single sentences with SST-2 train's short lengths (4-66 tokens incl. [CLS]/[SEP], median about
11: a log-normal draw), two labels, batch 32, the same initial weights for both; no data files needed, so
the GPU machine runs it bare. ``ours`` is :class:`bert_core.training.Trainer` with the fine-tuning
objective and the stage's loader (dynamic padding, length-grouped batches, widths rounded up as the stage
rounds them on the device: ``bert_core.finetune.collate``); ``ours_exact_widths`` the same padded to each
batch's exact width (more shapes: each new width costs the attention kernels a new plan on a GPU);
``transformers`` is ``transformers.Trainer`` with per-batch
dynamic padding (random order), bf16 on a GPU. Each contender runs in-process one after the other, so
throughput counts the examples after its first ``--warm-steps`` steps over the time they take (a
callback at that step for both: the first contender's CUDA start-up and the first steps' kernel
selection stay out alike); ``seconds`` is the whole training call, start-up included, and ``widths``
the distinct padded widths it met.

    python -m bench.gpu_finetune --device cuda --steps 150
"""

from __future__ import annotations

import argparse
import functools
import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

CLS, SEP = 101, 102


def sst2_shaped(n: int, vocab: int, seed: int = 0) -> list[dict]:
    """``n`` encoded single-sentence examples with SST-2-like lengths."""
    rng = np.random.default_rng(seed)
    lengths = np.clip(np.round(rng.lognormal(2.4, 0.6, n)), 4, 66).astype(int)
    out = []
    for length in lengths:
        ids = [CLS, *rng.integers(1000, vocab, length - 2).tolist(), SEP]
        out.append({"input_ids": ids, "token_type_ids": [0] * length, "labels": int(rng.integers(0, 2))})
    return out


def _pad_batch(features: list[dict], widths: set[int]) -> dict[str, torch.Tensor]:
    width = max(len(f["input_ids"]) for f in features)
    widths.add(width)
    ids = torch.zeros(len(features), width, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, f in enumerate(features):
        ids[i, : len(f["input_ids"])] = torch.tensor(f["input_ids"])
        mask[i, : len(f["input_ids"])] = 1
    return {
        "input_ids": ids,
        "token_type_ids": torch.zeros_like(ids),
        "attention_mask": mask,
        "labels": torch.tensor([f["labels"] for f in features]),
    }


def _peak_gib(device: str) -> float | None:
    return torch.cuda.max_memory_allocated() / 2**30 if device == "cuda" else None


class _Clock:
    """Wall time at the end of the warm-up step and of the last step (the device synchronised at each), and
    the padded widths the contender met."""

    def __init__(self, device: str, warm: int, last: int) -> None:
        self.device, self.warm, self.last = device, warm, last
        self.marks: dict[int, float] = {}
        self.widths: set[int] = set()

    def at(self, step: int) -> None:
        if step in (self.warm, self.last):
            if self.device == "cuda":
                torch.cuda.synchronize()
            self.marks[step] = time.perf_counter()

    def result(self, t0: float, batch: int) -> dict:
        end = self.marks[self.last]
        return {
            "examples_per_s": (self.last - self.warm) * batch / (end - self.marks[self.warm]),
            "seconds": end - t0,
            "widths": len(self.widths),
        }


def _ours(pad_to_multiple_of: int | None):
    def run(init: Path, features: list[dict], args: argparse.Namespace) -> dict:
        from bert_core.finetune.collate import make_loader
        from bert_core.finetune.trial import FinetuneObjective
        from bert_core.model import BertForSequenceClassification
        from bert_core.training import TrainConfig, Trainer

        model = BertForSequenceClassification.from_pretrained(init)
        config = TrainConfig(
            max_steps=args.steps,
            lr=2e-5,
            warmup_ratio=0.1,
            log_every=args.warm_steps,  # on_metrics at the warm-up step and at the last
            device=args.device,
            precision="bf16" if args.device == "cuda" else "fp32",
        )
        loader = make_loader(
            features, args.batch_size, shuffle=True, seed=1, pad_to_multiple_of=pad_to_multiple_of
        )
        clock = _Clock(args.device, args.warm_steps, args.steps)

        class Batches:  # the stage's loader, noting each batch's width
            def __iter__(self):
                for batch in loader:
                    clock.widths.add(int(batch["input_ids"].shape[1]))
                    yield batch

        t0 = time.perf_counter()
        Trainer(
            model, FinetuneObjective(), Batches(), config, on_metrics=lambda step, m: clock.at(step)
        ).fit()
        return clock.result(t0, args.batch_size)

    return run


def run_transformers(init: Path, features: list[dict], args: argparse.Namespace) -> dict:
    import transformers

    model = transformers.BertForSequenceClassification.from_pretrained(str(init), attn_implementation="sdpa")
    with tempfile.TemporaryDirectory() as tmp:
        targs = transformers.TrainingArguments(
            output_dir=tmp,
            per_device_train_batch_size=args.batch_size,
            max_steps=args.steps,
            learning_rate=2e-5,
            warmup_steps=max(1, args.steps // 10),
            weight_decay=0.01,
            max_grad_norm=1.0,
            lr_scheduler_type="linear",
            eval_strategy="no",
            save_strategy="no",
            logging_strategy="no",
            report_to=[],
            seed=1,
            dataloader_num_workers=0,
            disable_tqdm=True,
            bf16=args.device == "cuda",
            use_cpu=args.device == "cpu",
        )
        clock = _Clock(args.device, args.warm_steps, args.steps)

        class Mark(transformers.TrainerCallback):
            def on_step_end(self, args_, state, control, **kwargs):
                clock.at(state.global_step)

        trainer = transformers.Trainer(
            model=model,
            args=targs,
            train_dataset=features,
            data_collator=functools.partial(_pad_batch, widths=clock.widths),
            callbacks=[Mark()],
        )
        t0 = time.perf_counter()
        trainer.train()
        return clock.result(t0, args.batch_size)


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(prog="python -m bench.gpu_finetune", description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    ap.add_argument("--preset", default="base")
    ap.add_argument("--steps", type=int, default=150)
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--warm-steps", type=int, default=30, help="steps before the clock starts")
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args(argv)
    if not 0 < args.warm_steps < args.steps or args.steps % args.warm_steps:
        ap.error(f"--warm-steps {args.warm_steps} must divide --steps {args.steps} and be smaller")
    from bert_core.config import BertConfig
    from bert_core.finetune.collate import width_multiple
    from bert_core.model import BertForSequenceClassification

    vocab = 30522
    features = sst2_shaped(args.steps * args.batch_size, vocab)
    result: dict = {
        "preset": args.preset,
        "batch": args.batch_size,
        "steps": args.steps,
        "warm_steps": args.warm_steps,
        "device": args.device,
        "mean_tokens": float(np.mean([len(f["input_ids"]) for f in features])),
        "rows": [],
    }
    with tempfile.TemporaryDirectory() as tmp:
        torch.manual_seed(0)
        init = Path(tmp) / "init"
        BertForSequenceClassification(
            BertConfig.from_preset(args.preset, vocab_size=vocab, num_labels=2)
        ).save_pretrained(init)
        contenders = (
            ("ours", _ours(width_multiple(args.device))),
            ("ours_exact_widths", _ours(None)),
            ("transformers", run_transformers),
        )
        for name, fn in contenders:
            if args.device == "cuda":
                torch.cuda.reset_peak_memory_stats()
            row = {"contender": name, **fn(init, features, args), "peak_mem_gib": _peak_gib(args.device)}
            result["rows"].append(row)
            print(json.dumps(row), flush=True)
    speed = {r["contender"]: r["examples_per_s"] for r in result["rows"]}
    result["ours_over_transformers"] = speed["ours"] / speed["transformers"]
    result["ours_exact_widths_over_transformers"] = speed["ours_exact_widths"] / speed["transformers"]
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    return result


if __name__ == "__main__":
    main()
    sys.exit(0)
