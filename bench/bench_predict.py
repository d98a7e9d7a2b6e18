"""Prediction speed: our served model's predict (the MLflow ``pyfunc`` of a registered version) vs a plain
transformers ``pipeline("text-classification")`` on the same Hugging Face directory and the same inputs.

What is timed, interleaved in one process (ours/theirs alternate, order flipped every repetition), medians:

- throughput: all inputs in one call (ours: ``model.predict(DataFrame)``; theirs: ``pipe(list, batch_size)``),
  sentences per second;
- latency: one sentence per call (a served request), milliseconds;
- the forward alone: the same sentences, already tokenised, through each side's torch model (ours:
  ``bert_core.model``; theirs: the pipeline's ``model``), milliseconds: what the rest of a request costs is
  the latency minus this.

Both read the same model (a random BERT of the ``--preset`` shape with SST-2's head, or ``--model-dir``, a
fine-tuned SST-2 directory), use the same batch size, and return the label and the class probabilities
(``top_k=None`` for the pipeline). Inputs: SST-2 dev sentences from ``$BERT_DATA_ROOT`` / ``../shared/data``
when present, else synthetic sentences. Both answers are checked to agree before timing.

    python -m bench.bench_predict [--preset mini] [--batch-size 32] [--repeats 5] [--threads N] [--clock cpu]
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import random
import tempfile
from pathlib import Path

from bench._common import CLOCKS, interleaved_timing, machine_info, median, paired_ratios, print_table

PRESETS = {  # layers, hidden, heads
    "tiny": (2, 128, 2),
    "mini": (4, 256, 4),
    "small": (4, 512, 8),
    "base": (12, 768, 12),
}


def data_root() -> Path | None:
    for root in (
        os.environ.get("BERT_DATA_ROOT"),
        Path(__file__).resolve().parents[1].parent / "shared" / "data",
        "/work/shared/data",
    ):
        if root and (Path(root) / "glue" / "SST-2" / "dev.tsv").is_file():
            return Path(root)
    return None


def sentences(limit: int) -> tuple[list[str], str]:
    root = data_root()
    if root is not None:
        with open(root / "glue" / "SST-2" / "dev.tsv", encoding="utf-8", newline="") as fh:
            rows = [r["sentence"].strip() for r in csv.DictReader(fh, delimiter="\t", quoting=csv.QUOTE_NONE)]
        return rows[:limit], f"SST-2 dev ({root})"
    rng = random.Random(0)
    words = [
        "the",
        "a",
        "film",
        "movie",
        "good",
        "bad",
        "great",
        "dull",
        "plot",
        "actors",
        "story",
        "long",
        "short",
        "funny",
        "sad",
        "charming",
    ]
    return [" ".join(rng.choice(words) for _ in range(rng.randint(4, 40))) for _ in range(limit)], "synthetic"


def build_model(preset: str, out: Path) -> Path:
    """A random SST-2 classifier of the preset's shape with the bert-base-uncased vocab (timing only)."""
    import torch

    from bert_core.config import BertConfig
    from bert_core.kinds import get_kind
    from bert_core.tasks import get_task

    root = data_root()
    vocab = root / "checkpoints" / "bert-base-uncased" / "vocab.txt" if root else None
    if vocab is None or not vocab.is_file():
        raise SystemExit("needs ../shared/data/checkpoints/bert-base-uncased/vocab.txt, or --model-dir")
    from tokenizers.implementations import BertWordPieceTokenizer

    layers, hidden, heads = PRESETS[preset]
    config = BertConfig(
        vocab_size=30522,
        hidden_size=hidden,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        intermediate_size=4 * hidden,
    )
    spec = get_task("sst2")
    kind = get_kind(spec)
    torch.manual_seed(0)
    kind.model_class(kind.head_config(spec, config)).save_pretrained(out)
    (out / "vocab.txt").write_bytes(vocab.read_bytes())
    BertWordPieceTokenizer(str(vocab), lowercase=True).save(str(out / "tokenizer.json"))
    (out / "tokenizer_config.json").write_text(
        json.dumps({"tokenizer_class": "BertTokenizer", "do_lower_case": True, "model_max_length": 512})
    )
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--preset", choices=sorted(PRESETS), default="mini")
    parser.add_argument("--model-dir", type=Path, help="a fine-tuned SST-2 Hugging Face directory")
    parser.add_argument("--limit", type=int, default=872, help="sentences (SST-2 dev has 872)")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--latency-calls", type=int, default=50)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument(
        "--clock",
        choices=sorted(CLOCKS),
        default="wall",
        help="cpu: this process's CPU time (robust on a shared machine; use with --threads 1)",
    )
    parser.add_argument("--json", type=Path, help="also write the results here")
    args = parser.parse_args(argv)

    import mlflow.pyfunc
    import numpy as np
    import pandas as pd
    import torch
    from transformers import pipeline

    from bert_core.finetune.params import TaskSettings
    from bert_core.hf import load_pretrained
    from bert_core.model import BertForSequenceClassification
    from bert_core.serving import serving_task
    from bert_core.serving.pyfunc import save_model
    from bert_core.tasks import get_task

    if args.threads:
        torch.set_num_threads(args.threads)
    texts, source = sentences(args.limit)
    with tempfile.TemporaryDirectory(prefix="bench-predict-") as tmp:
        hf_dir = args.model_dir or build_model(args.preset, Path(tmp) / "hf")
        task = serving_task(get_task("sst2"), TaskSettings(), batch_size=args.batch_size)
        ours = mlflow.pyfunc.load_model(str(save_model(Path(tmp) / "mlflow-model", hf_dir, task)))
        device = 0 if torch.cuda.is_available() else -1
        theirs = pipeline(
            "text-classification", model=str(hf_dir), tokenizer=str(hf_dir), device=device, top_k=None
        )
        frame = pd.DataFrame({"text": texts})

        # Same answers (probabilities of the first 64 sentences) before timing.
        a = np.array(ours.predict(frame.head(64))["probabilities"].tolist())
        b = np.array(
            [
                [d["score"] for d in sorted(o, key=lambda d: d["label"] != "negative")]
                for o in theirs(texts[:64], batch_size=args.batch_size, truncation=True)
            ]
        )
        assert np.allclose(a, b, atol=1e-4), float(np.abs(a - b).max())

        bulk = interleaved_timing(
            {
                "ours": lambda: ours.predict(frame),
                "theirs": lambda: theirs(texts, batch_size=args.batch_size, truncation=True),
            },
            repeats=args.repeats,
            warmup=1,
            clock=CLOCKS[args.clock],
        )
        one = [{"text": t} for t in texts[: args.latency_calls]]
        calls = iter(range(10**9))
        single = interleaved_timing(
            {
                "ours": lambda: ours.predict([one[next(calls) % len(one)]]),
                "theirs": lambda: theirs([texts[next(calls) % len(one)]], truncation=True),
            },
            repeats=args.latency_calls,
            warmup=3,
            clock=CLOCKS[args.clock],
        )
        ours_model = load_pretrained(BertForSequenceClassification, hf_dir)[0].eval()
        encoded = [theirs.tokenizer([t], return_tensors="pt") for t in texts[: args.latency_calls]]

        def forward(model: torch.nn.Module) -> None:
            with torch.inference_mode():
                model(**encoded[next(calls) % len(encoded)])

        alone = interleaved_timing(
            {"ours": lambda: forward(ours_model), "theirs": lambda: forward(theirs.model)},
            repeats=args.latency_calls,
            warmup=3,
            clock=CLOCKS[args.clock],
        )
    rows = [
        {
            "measure": f"throughput, {len(texts)} sentences, batch {args.batch_size} (sentences/s)",
            "ours": len(texts) / median(bulk["ours"]),
            "transformers pipeline": len(texts) / median(bulk["theirs"]),
            "ours / pipeline": median(paired_ratios(bulk["theirs"], bulk["ours"])),
        },
        {
            "measure": "latency, 1 sentence per call (ms, median)",
            "ours": 1000 * median(single["ours"]),
            "transformers pipeline": 1000 * median(single["theirs"]),
            "ours / pipeline": median(paired_ratios(single["theirs"], single["ours"])),
        },
        {
            "measure": "the forward alone, 1 sentence (ms, median)",
            "ours": 1000 * median(alone["ours"]),
            "transformers pipeline": 1000 * median(alone["theirs"]),
            "ours / pipeline": median(paired_ratios(alone["theirs"], alone["ours"])),
        },
    ]
    info = {
        **machine_info(),
        "inputs": source,
        "preset": None if args.model_dir else args.preset,
        "repeats": args.repeats,
        "latency_calls": args.latency_calls,
        "clock": args.clock,
    }
    print(json.dumps(info))
    print_table(rows)
    print("(ours / pipeline > 1: ours is faster)")
    if args.json:
        args.json.write_text(json.dumps({"machine": info, "rows": rows}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
