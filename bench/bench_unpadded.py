"""One pretraining step, padded vs unpadded, eager vs compiled, ours vs transformers, in one interleaved run.

Variants (same config, same initial weights, same batches; the script checks that every variant gives the
same eval-mode loss as ``eager`` before timing):

    eager             bert_core BertForPreTraining, padded (today's default step)
    compiled          the same under torch.compile
    unpad             config.unpad=True: embeddings/projections/FFN/LayerNorms on the real tokens only
    compiled+unpad    the same under torch.compile (N symbolic: capture_dynamic_output_shape_ops)
    transformers      transformers.BertForPreTraining, attn_implementation="sdpa", padded
    compiled+transformers  the same under torch.compile (ours and theirs compared at their best)

Batches have a realistic length distribution: the lengths of real pretraining instances, built with the
repo's own pair generator (``bert_core.pretrain_data.instances.create_pairs``, Google's algorithm, the
``pretrain_data`` defaults) from the first documents of ``$BERT_SHARED_DATA/corpus`` tokenised with the
bert-base-uncased vocab (``--lengths real``); ``--lengths full`` makes every row full-length (no padding).
15% of each instance's real tokens are masked (at most 20 per sequence at 128, 80 at 512), NSP labels 50/50.

Reported per variant: median seconds per step (forward + backward + AdamW), real (non-pad) tokens/s, MFU
(FLOPs of ``bert_core/training/flops.py`` counted over the real tokens of each sequence, divided by the
device's dense peak: the table for CUDA, ``--peak-tflops`` on CPU, else n/a), graph breaks of compiled
variants (Dynamo's counter), and the median of the per-round ratio ``eager / variant`` (speed-up over
today's eager step). Usage::

    python -m bench.bench_unpadded --preset tiny --seq-len 128 --batch-size 32 --steps 10 --threads 1 --clock cpu
    python -m bench.bench_unpadded --preset base --seq-len 512 --batch-size 4 --steps 2 --warmup 1
    python -m bench.bench_unpadded --device cuda --dtype bf16 --preset base --seq-len 128 --batch-size 256
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import sys
import time
from pathlib import Path

import numpy as np
import torch

from bench._common import CLOCKS, interleaved_timing, machine_info, median, paired_ratios, print_table
from bert_core.config import PRESETS, BertConfig
from bert_core.constants import IGNORE_INDEX
from bert_core.model import BertForPreTraining
from bert_core.training.flops import bert_train_flops, peak_tflops
from bert_core.unpad import allow_data_dependent_shapes

SHARED = Path(os.environ.get("BERT_SHARED_DATA", Path(__file__).resolve().parents[2] / "shared" / "data"))
VOCAB = SHARED / "checkpoints" / "bert-base-uncased" / "vocab.txt"
VARIANTS = ("eager", "compiled", "unpad", "compiled+unpad", "transformers", "compiled+transformers")
CLS, SEP, MASK, PAD = 101, 102, 103, 0


def real_lengths(seq_len: int, n_docs: int = 400, seed: int = 0) -> np.ndarray:
    """Lengths (incl. [CLS]/[SEP]) of the instances Google's algorithm makes from the first ``n_docs``
    documents of the shared corpus (Wikipedia then Gutenberg, half each), one pass, default params."""
    from tokenizers import BertWordPieceTokenizer

    from bert_core.pretrain_data.instances import Window, create_pairs
    from bert_core.pretrain_data.testing import real_documents

    if not VOCAB.is_file() or not (SHARED / "corpus").is_dir():
        sys.exit(
            f"--lengths real needs {VOCAB} and {SHARED / 'corpus'} (set BERT_SHARED_DATA), or use --lengths full"
        )
    tok = BertWordPieceTokenizer(str(VOCAB), lowercase=True)
    docs = []
    for wiki in (True, False):
        for i, doc in enumerate(real_documents(SHARED, wikipedia=wiki, gutenberg=not wiki)):
            if i >= n_docs // 2:
                break
            docs.append(doc[:300])  # a book's first 300 sentences: books do not swamp articles
    ids, sent_lens, doc_sents = [], [], [0]
    for doc in docs:
        enc = [e.ids for e in tok.encode_batch(doc, add_special_tokens=False)]
        enc = [e for e in enc if e]
        ids.extend(t for e in enc for t in e)
        sent_lens.extend(len(e) for e in enc)
        doc_sents.append(doc_sents[-1] + len(enc))
    window = Window(
        tokens=np.asarray(ids, dtype=np.int32),
        sent_starts=np.concatenate([[0], np.cumsum(sent_lens)]).astype(np.int64),
        doc_sents=np.asarray(doc_sents, dtype=np.int64),
        doc_rows=np.arange(len(docs), dtype=np.int64),
    )
    pairs = create_pairs(
        window,
        max_seq_length=seq_len,
        short_seq_prob=0.1,
        random_next_prob=0.5,
        nsp_balance=True,
        rng=random.Random(seed),
    )
    return (pairs.a_len + pairs.b_len + 3).astype(np.int64)


def make_batches(lengths: np.ndarray, n: int, batch: int, seq_len: int, vocab: int, seed: int) -> list[dict]:
    """``n`` padded MLM + NSP batches whose row lengths are drawn from ``lengths``."""
    g = torch.Generator().manual_seed(seed)
    rng = np.random.default_rng(seed)
    max_pred = 20 if seq_len <= 128 else 80
    out = []
    for _ in range(n):
        lens = rng.choice(lengths, size=batch)
        ids = torch.randint(999, vocab, (batch, seq_len), generator=g)
        mask = torch.zeros(batch, seq_len, dtype=torch.long)
        types = torch.zeros(batch, seq_len, dtype=torch.long)
        labels = torch.full((batch, seq_len), IGNORE_INDEX)
        for i, n_tok in enumerate(int(x) for x in lens):
            mask[i, :n_tok] = 1
            ids[i, n_tok:] = PAD
            ids[i, 0], ids[i, n_tok - 1] = CLS, SEP
            types[i, n_tok // 2 : n_tok] = 1
            k = min(max_pred, max(1, round(0.15 * (n_tok - 2))))
            pos = torch.randperm(n_tok - 2, generator=g)[:k] + 1
            labels[i, pos] = ids[i, pos]
            ids[i, pos] = MASK
        out.append(
            {
                "input_ids": ids,
                "attention_mask": mask,
                "token_type_ids": types,
                "labels": labels,
                "next_sentence_label": torch.randint(0, 2, (batch,), generator=g),
            }
        )
    return out


def useful_flops(config: BertConfig, batch: dict) -> float:
    """The FLOPs formula over the real tokens of each sequence (padding is not useful work)."""
    lens = batch["attention_mask"].sum(1).tolist()
    masked = (batch["labels"] != IGNORE_INDEX).sum(1).tolist()
    sizes = {
        "num_layers": config.num_hidden_layers,
        "hidden_size": config.hidden_size,
        "intermediate_size": config.intermediate_size,
        "vocab_size": config.vocab_size,
    }
    return sum(
        bert_train_flops(**sizes, seq_len=t, sequences=1, masked_tokens=m) for t, m in zip(lens, masked)
    )


def main(argv: list[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--preset", default="tiny", choices=list(PRESETS))
    parser.add_argument("--seq-len", type=int, default=128)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--steps", type=int, default=10, help="timed steps per variant")
    parser.add_argument(
        "--warmup", type=int, default=2, help="untimed interleaved rounds (after compilation)"
    )
    parser.add_argument(
        "--variants", default=",".join(VARIANTS), help=f"comma-separated subset of {VARIANTS}"
    )
    parser.add_argument("--lengths", choices=("real", "full"), default="real")
    parser.add_argument("--corpus-docs", type=int, default=400, help="documents read for --lengths real")
    parser.add_argument("--n-batches", type=int, default=4, help="distinct batches, cycled")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", choices=("fp32", "bf16"), default="fp32", help="bf16: autocast")
    parser.add_argument("--peak-tflops", type=float, default=None, help="device peak for MFU (CPU: no table)")
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    parser.add_argument("--clock", choices=list(CLOCKS), default="wall", help="cpu: this process's CPU time")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    variants = [v for v in args.variants.split(",") if v]
    unknown = sorted(set(variants) - set(VARIANTS))
    if unknown or "eager" not in variants:
        sys.exit(f"--variants {args.variants!r}: must include 'eager' and use only {', '.join(VARIANTS)}")

    import transformers

    torch.set_num_threads(args.threads)
    allow_data_dependent_shapes()  # nonzero in the graph, not a break (as the Trainer does with compile)
    device = torch.device(args.device)
    vocab_size = sum(1 for _ in VOCAB.open(encoding="utf-8")) if VOCAB.is_file() else 30522
    config = BertConfig.from_preset(args.preset, vocab_size=vocab_size)
    if args.lengths == "real":
        lengths = real_lengths(args.seq_len, args.corpus_docs)
    else:
        lengths = np.full(1, args.seq_len)
    batches = make_batches(lengths, args.n_batches, args.batch_size, args.seq_len, vocab_size, seed=1)
    batches = [{k: v.to(device) for k, v in b.items()} for b in batches]

    torch.manual_seed(0)
    base = BertForPreTraining(config)
    models: dict[str, torch.nn.Module] = {}
    for name in variants:
        if "transformers" in name:
            hf = transformers.BertConfig(**config.to_hf_dict(), attn_implementation="sdpa")
            m = transformers.BertForPreTraining(hf)
        else:
            m = BertForPreTraining(config.replace(unpad="unpad" in name))
        m.load_state_dict(base.state_dict())
        models[name] = m.to(device).train()
    autocast = (
        (lambda: torch.autocast(device.type, dtype=torch.bfloat16))
        if args.dtype == "bf16"
        else contextlib.nullcontext
    )

    # Equal loss before timing (eval mode: no dropout), on every batch.
    with torch.no_grad(), autocast():
        for i, b in enumerate(batches):
            ref = None
            for name, m in models.items():
                loss = float(m.eval()(**b).loss)
                m.train()
                ref = loss if ref is None else ref
                tol = 1e-4 if args.dtype == "fp32" else 3e-2
                if abs(loss - ref) > tol * max(1.0, abs(ref)):
                    sys.exit(f"batch {i}: {name} loss {loss} differs from eager {ref}")

    steppers, compile_info = {}, {}
    for name, m in models.items():
        net = torch.compile(m) if name.startswith("compiled") else m
        opt = torch.optim.AdamW(m.parameters(), lr=1e-4, weight_decay=0.01)
        state = {"i": 0}

        def step(net=net, opt=opt, state=state) -> None:
            b = batches[state["i"] % len(batches)]
            state["i"] += 1
            opt.zero_grad(set_to_none=True)
            with autocast():
                loss = net(**b).loss
            loss.backward()
            opt.step()

        if name.startswith("compiled"):  # compile (every batch shape) outside the timed rounds
            from torch._dynamo.utils import counters

            counters.clear()
            t0 = time.perf_counter()
            for _ in batches:
                step()
            compile_info[name] = {
                "compile_s": time.perf_counter() - t0,
                "graph_breaks": sum(counters["graph_break"].values()),
            }
            state["i"] = 0
        steppers[name] = step

    sync = torch.cuda.synchronize if device.type == "cuda" else None
    times = interleaved_timing(steppers, args.steps, args.warmup, sync=sync, clock=CLOCKS[args.clock])
    real_tokens = median([float(b["attention_mask"].sum()) for b in batches])
    flops = median([useful_flops(config, b) for b in batches])
    peak = args.peak_tflops
    if peak is None and device.type == "cuda":
        peak = peak_tflops(torch.cuda.get_device_name(device), args.dtype)
    rows = []
    for name in variants:
        s = median(times[name])
        rows.append(
            {
                "variant": name,
                "s_per_step": s,
                "real_tok_s": real_tokens / s,
                "mfu": f"{flops / s / (peak * 1e12):.4f}" if peak else "n/a",
                "speedup_vs_eager": median(paired_ratios(times["eager"], times[name])),
                "graph_breaks": compile_info.get(name, {}).get("graph_breaks", ""),
                "compile_s": compile_info.get(name, {}).get("compile_s", ""),
            }
        )
    pad_share = 1 - real_tokens / (args.batch_size * args.seq_len)
    header = {
        "preset": args.preset,
        "seq_len": args.seq_len,
        "batch": args.batch_size,
        "steps": args.steps,
        "dtype": args.dtype,
        "device": str(device),
        "lengths": args.lengths,
        "clock": args.clock,
        "threads": args.threads,
        "padding_share": round(pad_share, 3),
        "short_share": {
            f"<{args.seq_len}": float(np.mean(lengths < args.seq_len)),
            f"<{args.seq_len // 2}": float(np.mean(lengths < args.seq_len // 2)),
        },
        **machine_info(),
    }
    print(json.dumps(header, default=str))
    print_table(rows)
    if args.json is not None:
        args.json.write_text(
            json.dumps({**header, "rows": rows}, indent=2, default=str) + "\n", encoding="utf-8"
        )
    return rows


if __name__ == "__main__":
    main()
