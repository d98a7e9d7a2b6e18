"""SST-2 fine-tuning throughput: our finetune stage's training vs transformers' ``Trainer``, in one run.

Same model (a ``tiny`` BERT, L=2 H=128, with identical initial weights including the classifier head),
same data (the first ``--train-rows`` rows of SST-2 train from shared/data, tokenised once), same
hyperparameters (batch 32, AdamW, lr, 10% warmup then linear decay, weight decay 0.01, clipping 1.0,
``--epochs`` epochs), same torch threads. Per seed, every contender trains from the same weights,
interleaved (order alternates between seeds), and is then scored on the full SST-2 dev set (872 rows).

Contenders:

- ``ours``: the stage's training path - :class:`bert_core.training.Trainer` with the fine-tuning
  objective, dynamic padding and length-grouped batches (``bert_core.finetune.collate``), our model;
- ``hf-dynamic``: ``transformers.Trainer`` + ``DataCollatorWithPadding`` (dynamic padding, random order);
- ``hf-grouped``: the same with ``train_sampling_strategy="group_by_length"`` (transformers' own length
  grouping; ``group_by_length=True`` before transformers 5);
- ``hf-padded``: pad every example to 128 tokens, as ``run_glue.py`` does by default (``--with-padded``).

Throughput is training examples per second of the training call only (evaluation excluded); the
speed-up is the median over seeds of ours / theirs. Usage::

    python -m bench.bench_finetune_sst2 --train-rows 3000 --epochs 2 --seeds 3 --threads 2
"""

from __future__ import annotations

import argparse
import json
import logging
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from bench._common import machine_info, median, print_table

SHARED = Path(__file__).resolve().parents[2] / "shared" / "data"


def _features(data_root: Path, tokenizer: Any, train_rows: int, max_len: int) -> tuple[list, list, list]:
    from bert_core.kinds.sequence import encode_sequence_pairs
    from bert_core.tasks import get_task, load_task_split

    spec = get_task("sst2")
    label2id = {lab: i for i, lab in enumerate(spec.labels)}
    train = load_task_split(spec, "train", data_root=data_root, limit=train_rows)
    dev = load_task_split(spec, "dev", data_root=data_root)
    train_f = encode_sequence_pairs(list(train), tokenizer, max_seq_length=max_len, label2id=label2id)
    dev_f = encode_sequence_pairs(list(dev), tokenizer, max_seq_length=max_len, label2id=label2id)
    return train_f, dev_f, [r["label"] for r in dev]


def _init_model_dir(vocab: Path, out: Path, seed: int) -> Path:
    """A tiny BERT with a seeded classifier head, in HF format: both frameworks load these exact weights."""
    import shutil

    from bert_core.config import BertConfig
    from bert_core.model import BertForSequenceClassification

    torch.manual_seed(seed)
    config = BertConfig.from_preset("tiny", vocab_size=30522, num_labels=2)
    path = out / f"init-seed{seed}"
    BertForSequenceClassification(config).save_pretrained(path)
    shutil.copy(vocab, path / "vocab.txt")
    return path


def run_ours(
    init_dir: Path, train_f: list, dev_f: list, dev_labels: list, args: argparse.Namespace, seed: int
) -> dict:
    from bert_core.finetune.collate import make_loader
    from bert_core.finetune.inference import predict
    from bert_core.finetune.trial import EpochLoader, FinetuneObjective
    from bert_core.model import BertForSequenceClassification
    from bert_core.training import TrainConfig, Trainer

    model = BertForSequenceClassification.from_pretrained(init_dir)
    model.train()
    steps_per_epoch = -(-len(train_f) // args.batch_size)
    config = TrainConfig(
        max_steps=steps_per_epoch * args.epochs,
        lr=args.lr,
        warmup_ratio=0.1,
        weight_decay=0.01,
        max_grad_norm=1.0,
        log_every=steps_per_epoch,
        seed=seed,
        device="cpu",
        precision="fp32",
    )
    loader = EpochLoader(make_loader(train_f, args.batch_size, shuffle=True, seed=seed))
    t0 = time.perf_counter()
    Trainer(model, FinetuneObjective(), loader, config).fit()
    seconds = time.perf_counter() - t0
    logits = predict(model, dev_f, batch_size=128)
    acc = 100.0 * sum(int(o.argmax() == y) for o, y in zip(logits, dev_labels)) / len(dev_labels)
    return {"seconds": seconds, "examples_per_s": len(train_f) * args.epochs / seconds, "dev_accuracy": acc}


def run_hf(
    init_dir: Path,
    train_f: list,
    dev_f: list,
    dev_labels: list,
    args: argparse.Namespace,
    seed: int,
    mode: str,
) -> dict:
    import transformers
    from transformers import (
        BertForSequenceClassification,
        DataCollatorWithPadding,
        Trainer,
        TrainingArguments,
    )

    tokenizer = transformers.BertTokenizerFast.from_pretrained(str(init_dir))
    model = BertForSequenceClassification.from_pretrained(str(init_dir))

    def rows(features: list, pad_to: int | None) -> list[dict]:
        out = []
        for f in features:
            n = len(f["input_ids"])
            pad = (pad_to - n) if pad_to else 0
            out.append(
                {
                    "input_ids": f["input_ids"] + [0] * pad,
                    "token_type_ids": f["token_type_ids"] + [0] * pad,
                    "attention_mask": [1] * n + [0] * pad,
                    "labels": f["labels"],
                }
            )
        return out

    pad_to = args.max_len if mode == "hf-padded" else None
    with tempfile.TemporaryDirectory() as tmp:
        targs = TrainingArguments(
            output_dir=tmp,
            per_device_train_batch_size=args.batch_size,
            per_device_eval_batch_size=128,
            num_train_epochs=args.epochs,
            learning_rate=args.lr,
            warmup_steps=0.1,  # transformers 5: a float in [0, 1) is a ratio of the total steps
            weight_decay=0.01,
            max_grad_norm=1.0,
            adam_epsilon=1e-6,
            lr_scheduler_type="linear",
            eval_strategy="no",
            save_strategy="no",
            logging_strategy="no",
            report_to=[],
            seed=seed,
            use_cpu=True,
            dataloader_num_workers=0,
            train_sampling_strategy="group_by_length" if mode == "hf-grouped" else "random",
            disable_tqdm=True,
        )
        trainer = Trainer(
            model=model,
            args=targs,
            train_dataset=rows(train_f, pad_to),
            data_collator=DataCollatorWithPadding(tokenizer),
        )
        t0 = time.perf_counter()
        trainer.train()
        seconds = time.perf_counter() - t0
        logits = trainer.predict(rows(dev_f, pad_to)).predictions
    acc = 100.0 * float((logits.argmax(-1) == torch.tensor(dev_labels).numpy()).mean())
    return {"seconds": seconds, "examples_per_s": len(train_f) * args.epochs / seconds, "dev_accuracy": acc}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.bench_finetune_sst2", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--data-root", type=Path, default=SHARED)
    parser.add_argument("--train-rows", type=int, default=3000)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--lr", type=float, default=5e-4)
    parser.add_argument("--max-len", type=int, default=128)
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    parser.add_argument("--with-padded", action="store_true", help="also run hf-padded (run_glue's default)")
    parser.add_argument("--json", type=Path, default=None, help="write the raw results here")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.ERROR)
    for name in ("bert_core", "transformers"):
        logging.getLogger(name).setLevel(logging.ERROR)
    if args.threads:
        torch.set_num_threads(args.threads)
    vocab = args.data_root / "checkpoints" / "bert-base-uncased" / "vocab.txt"
    from transformers import BertTokenizerFast

    tokenizer = BertTokenizerFast(vocab=str(vocab))
    train_f, dev_f, dev_labels = _features(args.data_root, tokenizer, args.train_rows, args.max_len)
    contenders = ["ours", "hf-dynamic", "hf-grouped"] + (["hf-padded"] if args.with_padded else [])
    results: dict[str, list[dict]] = {c: [] for c in contenders}
    with tempfile.TemporaryDirectory() as tmp:
        for seed in range(1, args.seeds + 1):
            init_dir = _init_model_dir(vocab, Path(tmp), seed)
            order = contenders if seed % 2 else contenders[::-1]
            for name in order:
                if name == "ours":
                    res = run_ours(init_dir, train_f, dev_f, dev_labels, args, seed)
                else:
                    res = run_hf(init_dir, train_f, dev_f, dev_labels, args, seed, name)
                results[name].append(res)
                print(
                    f"seed {seed} {name}: {res['examples_per_s']:.0f} ex/s, dev acc {res['dev_accuracy']:.1f}",
                    file=sys.stderr,
                    flush=True,
                )
    ours = results["ours"]
    rows = []
    for name in contenders:
        runs = results[name]
        accs = [r["dev_accuracy"] for r in runs]
        speedup = [o["examples_per_s"] / r["examples_per_s"] for o, r in zip(ours, runs)]
        rows.append(
            {
                "contender": name,
                "examples/s (median)": median([r["examples_per_s"] for r in runs]),
                "ours / this (median)": median(speedup),
                "dev acc mean": statistics.fmean(accs),
                "dev acc std": statistics.stdev(accs) if len(accs) > 1 else 0.0,
            }
        )
    info = machine_info()
    print(
        f"# SST-2 fine-tuning, tiny preset: {args.train_rows} train rows x {args.epochs} epochs, batch "
        f"{args.batch_size}, lr {args.lr:g}, {args.seeds} seeds; dev = 872 rows"
    )
    print(json.dumps(info))
    print_table(rows)
    if args.json:
        args.json.write_text(
            json.dumps(
                {
                    "args": {k: str(v) for k, v in vars(args).items()},
                    "machine": info,
                    "results": results,
                    "table": rows,
                },
                indent=2,
            )
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
