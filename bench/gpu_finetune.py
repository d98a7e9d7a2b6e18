"""Fine-tuning throughput on SST-2-shaped batches: our stage's training path vs transformers' ``Trainer``.

Synthetic single sentences with SST-2 train's short lengths (4-66 tokens incl. [CLS]/[SEP], median about
11: a log-normal draw), two labels, batch 32, the same initial weights for both; no data files needed, so
the GPU machine runs it bare. ``ours`` is :class:`bert_core.training.Trainer` with the fine-tuning
objective and the stage's loader (dynamic padding, length-grouped batches: ``bert_core.finetune.collate``);
``transformers`` is ``transformers.Trainer`` with per-batch dynamic padding (random order), bf16 on a GPU.
Throughput counts training examples over the whole training call of each (start-up and the first,
slower steps included alike: ``Trainer.train`` cannot be timed from its tenth step), so use enough
``--steps`` that start-up is small.

    python -m bench.gpu_finetune --device cuda --steps 150
"""

from __future__ import annotations

import argparse
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


def _pad_batch(features: list[dict]) -> dict[str, torch.Tensor]:
    width = max(len(f["input_ids"]) for f in features)
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


def run_ours(init: Path, features: list[dict], args: argparse.Namespace) -> dict:
    from bert_core.finetune.collate import make_loader
    from bert_core.finetune.trial import EpochLoader, FinetuneObjective
    from bert_core.model import BertForSequenceClassification
    from bert_core.training import TrainConfig, Trainer

    model = BertForSequenceClassification.from_pretrained(init)
    config = TrainConfig(
        max_steps=args.steps,
        lr=2e-5,
        warmup_ratio=0.1,
        log_every=args.steps,
        device=args.device,
        precision="bf16" if args.device == "cuda" else "fp32",
    )
    loader = EpochLoader(make_loader(features, args.batch_size, shuffle=True, seed=1))
    t0 = time.perf_counter()
    Trainer(model, FinetuneObjective(), loader, config).fit()
    if args.device == "cuda":
        torch.cuda.synchronize()
    return {"seconds": time.perf_counter() - t0}


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
        trainer = transformers.Trainer(
            model=model, args=targs, train_dataset=features, data_collator=_pad_batch
        )
        t0 = time.perf_counter()
        trainer.train()
        if args.device == "cuda":
            torch.cuda.synchronize()
        return {"seconds": time.perf_counter() - t0}


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(prog="python -m bench.gpu_finetune", description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    ap.add_argument("--preset", default="base")
    ap.add_argument("--steps", type=int, default=150)
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args(argv)
    from bert_core.config import BertConfig
    from bert_core.model import BertForSequenceClassification

    vocab = 30522
    features = sst2_shaped(args.steps * args.batch_size, vocab)
    result: dict = {
        "preset": args.preset,
        "batch": args.batch_size,
        "steps": args.steps,
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
        for name, fn in (("ours", run_ours), ("transformers", run_transformers)):
            if args.device == "cuda":
                torch.cuda.reset_peak_memory_stats()
            row = {"contender": name, **fn(init, features, args), "peak_mem_gib": _peak_gib(args.device)}
            row["examples_per_s"] = args.steps * args.batch_size / row["seconds"]
            result["rows"].append(row)
            print(json.dumps(row), flush=True)
    ours, theirs = (r["examples_per_s"] for r in result["rows"])
    result["ours_over_transformers"] = ours / theirs
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    return result


if __name__ == "__main__":
    main()
    sys.exit(0)
