"""The CPU profile's vocab size: held-out MLM quality and pretraining speed of the tiny model, 8192 vs 30522.

For each vocab size, in its own child process (the two run side by side, one thread each, so both see the
same machine): train the WordPiece vocab on the corpus (:func:`bert_core.vocab.train_vocab`,
``params/vocab.yaml`` with the size changed), build the seq128 pretraining data
(:func:`bert_core.pretrain_data.build_pretrain_data`, ``params/pretrain_data.yaml``, phase seq128 only,
checks off), then pretrain the ``tiny`` preset with the seq128 phase of ``params/pretrain.yaml`` for
``--steps`` steps (CPU, no time budget), evaluating on the held-out set every ``--eval-every`` steps.

Printed per evaluation: held-out MLM loss, the loss of the unigram baseline *of the same vocab* and the gap
(perplexities are not comparable across vocabularies; the gap to the own baseline is), MLM accuracy; and
per size the wall and CPU seconds per step.

    .venv/bin/python bench/bench_cpu_vocab.py --corpus data/corpus --out /tmp/bench_vocab --steps 1500
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import resource
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SIZES = (8192, 30522)


def one(size: int, corpus: Path, out: Path, steps: int, eval_every: int) -> dict:
    import torch

    from bert_core.params import parse_params, read_yaml
    from bert_core.pretrain import PretrainParams, pretrain
    from bert_core.pretrain_data.build import build_pretrain_data
    from bert_core.pretrain_data.params import PretrainDataParams
    from bert_core.vocab import VocabParams, train_vocab

    torch.set_num_threads(1)
    out.mkdir(parents=True, exist_ok=True)
    vocab = read_yaml(REPO / "params" / "vocab.yaml")["vocab"]
    vocab["vocab_size"] = size
    train_vocab(parse_params(vocab, VocabParams, where="bench", prefix="vocab"), corpus, out / "vocab")
    data = read_yaml(REPO / "params" / "pretrain_data.yaml")["pretrain_data"]
    data["phases"] = ["seq128"]
    build_pretrain_data(
        parse_params(data, PretrainDataParams, where="bench", prefix="pretrain_data"),
        corpus_dir=corpus,
        vocab_dir=out / "vocab",
        output_dir=out / "data",
        run_checks=False,
    )

    pre = copy.deepcopy(read_yaml(REPO / "params" / "pretrain.yaml")["pretrain"])
    phase = {**pre["phases"][0], "share": 1.0}
    pre.update(
        max_steps=steps,
        time_budget_minutes=None,
        phases=[phase],
        eval_every=eval_every,
        eval_batches=20,
        checkpoint_every=0,
        num_threads=1,
        device="cpu",
        model={"preset": "tiny", "overrides": {}},
    )
    params = parse_params(pre, PretrainParams, where="bench", prefix="pretrain")
    evals: list[dict] = []

    def on_metrics(step: int, metrics: dict) -> None:
        if "heldout/mlm_loss" in metrics:
            evals.append({"step": step, **{k.removeprefix("heldout/"): v for k, v in metrics.items()}})
            print(f"[{size}] step {step}: {evals[-1]}", file=sys.stderr, flush=True)

    wall, cpu = time.perf_counter(), time.process_time()
    result = pretrain(params, out / "data", out / "vocab", out / "model", on_metrics=on_metrics)
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    return {
        "vocab_size": size,
        "parameters_m": result.metrics["parameters_m"],
        "steps": result.metrics["steps"],
        "batch": phase["global_batch"],
        "train_seconds": result.metrics["train_seconds"],
        "wall_s_per_step": wall / steps,  # includes the held-out evaluations
        "cpu_s_per_step": cpu / steps,
        "evals": evals,
        "max_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--corpus", type=Path, required=True, help="a corpus stage output (data/corpus)")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--steps", type=int, default=1500)
    ap.add_argument("--eval-every", type=int, default=250)
    ap.add_argument("--one", type=int, help=argparse.SUPPRESS)  # child: one vocab size
    args = ap.parse_args()
    if args.one:
        res = one(args.one, args.corpus.resolve(), args.out / str(args.one), args.steps, args.eval_every)
        (args.out / f"{args.one}.json").write_text(json.dumps(res, indent=1))
        return
    args.out.mkdir(parents=True, exist_ok=True)
    children = [
        subprocess.Popen(
            [
                sys.executable,
                __file__,
                "--one",
                str(size),
                "--corpus",
                str(args.corpus),
                "--out",
                str(args.out),
                "--steps",
                str(args.steps),
                "--eval-every",
                str(args.eval_every),
            ]
        )
        for size in SIZES
    ]
    if any(c.wait() for c in children):
        sys.exit("a child failed")
    results = {s: json.loads((args.out / f"{s}.json").read_text()) for s in SIZES}
    print(
        f"tiny preset, seq128, batch {results[SIZES[0]]['batch']}, {args.steps} steps, one thread per size\n"
    )
    print(
        "| vocab | params (M) | wall s/step | CPU s/step | step | held-out MLM loss | unigram baseline | gap | MLM acc |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for s, r in results.items():
        for e in r["evals"]:
            base = math.log(e["baseline_mlm_ppl"])  # the unigram baseline's loss
            print(
                f"| {s} | {r['parameters_m']:.2f} | {r['wall_s_per_step']:.3f} | {r['cpu_s_per_step']:.3f} | "
                f"{e['step']} | {e['mlm_loss']:.3f} | {base:.3f} | {e['mlm_loss'] - base:+.3f} | "
                f"{e['mlm_acc']:.3f} |"
            )
    ratio = results[SIZES[1]]["cpu_s_per_step"] / results[SIZES[0]]["cpu_s_per_step"]
    print(f"\nCPU time per step, {SIZES[1]} / {SIZES[0]}: {ratio:.2f}x")


if __name__ == "__main__":
    main()
