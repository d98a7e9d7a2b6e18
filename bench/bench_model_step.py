"""One pretraining step (forward + backward + AdamW) of our BertForPreTraining vs transformers'.

Both models get the same config, the same initial weights and the same batch (15% of positions
masked with MLM labels, NSP labels, two segments), in one process, timed interleaved; the report
gives the median seconds per step of each and the median of the per-repetition ratio
theirs / ours (our speed-up). A third line, ``ours_positions``, is our model on the same batch in the
pretraining stage's form (Google's static-shape ``masked_lm_positions`` / ``ids`` / ``weights``)
instead of ``labels``; ``positions_speedup`` is the median per-repetition ratio ours / ours_positions.
``--data DIR`` takes the batch from a ``pretrain_data`` output instead (real lengths, padding and
masked counts; vocab size and slots from its index). Usage::

    python -m bench.bench_model_step --preset tiny --batch-size 32 --seq-len 128 --steps 20 --threads 2
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics
import sys
from pathlib import Path

import torch

from bench._common import CLOCKS, interleaved_timing, machine_info, median, paired_ratios, print_table
from bert_core.config import PRESETS, BertConfig
from bert_core.constants import IGNORE_INDEX
from bert_core.model import BertForPreTraining
from bert_core.pretrain_data.loader import PretrainingLoader, mlm_positions

DEFAULT_VOCAB = (
    Path(__file__).resolve().parents[2]
    / "shared"
    / "data"
    / "checkpoints"
    / "bert-base-uncased"
    / "vocab.txt"
)
MASK_ID = 103  # [MASK] in the uncased vocab


def make_batch(
    vocab_size: int, batch_size: int, seq_len: int, mask_prob: float, pad_frac: float, seed: int
) -> dict[str, torch.Tensor]:
    """A synthetic pretraining batch: ids, two segments, ``mask_prob`` masked positions, NSP labels.

    ``pad_frac`` of the sequences are padded to between half and all of ``seq_len``.
    """
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(999, vocab_size, (batch_size, seq_len), generator=g)
    ids[:, 0] = 101  # [CLS]
    token_type_ids = torch.zeros_like(ids)
    token_type_ids[:, seq_len // 2 :] = 1
    attention_mask = torch.ones_like(ids)
    for i in range(round(pad_frac * batch_size)):
        length = int(torch.randint(seq_len // 2, seq_len + 1, (1,), generator=g))
        attention_mask[i, length:] = 0
        ids[i, length:] = 0
        token_type_ids[i, length:] = 0
    n_masked = max(1, round(mask_prob * seq_len))
    labels = torch.full_like(ids, IGNORE_INDEX)
    for i in range(batch_size):
        length = int(attention_mask[i].sum())
        pos = torch.randperm(length - 1, generator=g)[: min(n_masked, length - 1)] + 1
        labels[i, pos] = ids[i, pos]
        ids[i, pos] = MASK_ID
    return {
        "input_ids": ids,
        "attention_mask": attention_mask,
        "token_type_ids": token_type_ids,
        "labels": labels,
        "next_sentence_label": torch.randint(0, 2, (batch_size,), generator=g),
    }


def vocab_size_from(path: Path) -> int:
    if path.is_file():
        with open(path, encoding="utf-8") as fh:
            return sum(1 for _ in fh)
    return 30522


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--preset", default="tiny", choices=list(PRESETS))
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--seq-len", type=int, default=128)
    parser.add_argument("--steps", type=int, default=20, help="timed steps per implementation")
    parser.add_argument("--warmup", type=int, default=2, help="untimed steps per implementation")
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    parser.add_argument("--mask-prob", type=float, default=0.15)
    parser.add_argument("--pad-frac", type=float, default=0.0, help="fraction of padded sequences")
    parser.add_argument(
        "--max-predictions",
        type=int,
        default=None,
        help="slots per row of the positions form (default round(mask_prob * seq_len) + 1: 20 at 128)",
    )
    parser.add_argument("--vocab", type=Path, default=DEFAULT_VOCAB, help="vocab.txt (sets vocab_size)")
    parser.add_argument("--data", type=Path, default=None, help="a pretrain_data dir, e.g. .../seq128/train")
    parser.add_argument(
        "--clock",
        choices=list(CLOCKS),
        default="wall",
        help="wall time, or this process's CPU time (robust on a busy shared machine; use --threads 1)",
    )
    parser.add_argument("--json", type=Path, default=None, help="also write the result as JSON here")
    args = parser.parse_args(argv)

    import transformers

    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    loader = None
    if args.data is not None:
        loader = PretrainingLoader(args.data, args.batch_size, seed=0, mlm_format="labels")
        args.seq_len, args.max_predictions = loader.max_seq_length, loader.max_predictions_per_seq
    vocab_size = loader.vocab_size if loader is not None else vocab_size_from(args.vocab)
    config = BertConfig.from_preset(args.preset, vocab_size=vocab_size)
    ours = BertForPreTraining(config).train()
    theirs = transformers.BertForPreTraining(transformers.BertConfig(**config.to_hf_dict())).train()
    theirs.load_state_dict(ours.state_dict())
    if loader is not None:
        batch = next(iter(loader))
    else:
        batch = make_batch(
            config.vocab_size, args.batch_size, args.seq_len, args.mask_prob, args.pad_frac, seed=1
        )

    # Same weights and no dropout randomness in eval mode: the losses must agree before timing.
    with torch.no_grad():
        ours.eval(), theirs.eval()
        loss_ours, loss_theirs = ours(**batch).loss.item(), theirs(**batch).loss.item()
        ours.train(), theirs.train()
    if abs(loss_ours - loss_theirs) > 1e-4 * max(1.0, abs(loss_theirs)):
        sys.exit(f"losses differ before timing: ours {loss_ours} vs transformers {loss_theirs}")
    slots = args.max_predictions or round(args.mask_prob * args.seq_len) + 1
    pos_batch = {k: v for k, v in batch.items() if k != "labels"}
    pos_batch |= {k: torch.from_numpy(v) for k, v in mlm_positions(batch["labels"].numpy(), slots).items()}
    ours_pos = copy.deepcopy(ours)
    with torch.no_grad():
        ours_pos.eval()
        loss_pos = ours_pos(**pos_batch).loss.item()
        ours_pos.train()
    if abs(loss_pos - loss_ours) > 1e-5 * max(1.0, abs(loss_ours)):
        sys.exit(f"losses differ before timing: labels form {loss_ours} vs positions form {loss_pos}")

    def stepper(model: torch.nn.Module, inputs: dict[str, torch.Tensor]):
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.01)

        def step() -> None:
            opt.zero_grad(set_to_none=True)
            model(**inputs).loss.backward()
            opt.step()

        return step

    steppers = {
        "ours": stepper(ours, batch),
        "transformers": stepper(theirs, batch),
        "ours_positions": stepper(ours_pos, pos_batch),
    }
    times = interleaved_timing(steppers, args.steps, args.warmup, clock=CLOCKS[args.clock])
    speedup = paired_ratios(times["transformers"], times["ours"])
    pos_speedup = paired_ratios(times["ours"], times["ours_positions"])
    tokens = args.batch_size * args.seq_len
    result = {
        "preset": args.preset,
        "batch": args.batch_size,
        "seq_len": args.seq_len,
        "steps": args.steps,
        "threads": args.threads,
        "clock": args.clock,
        "ours_s": median(times["ours"]),
        "transformers_s": median(times["transformers"]),
        "speedup": median(speedup),
        "speedup_iqr": [round(q, 3) for q in statistics.quantiles(speedup, n=4)[::2]]
        if len(speedup) > 1
        else None,
        "ours_positions_s": median(times["ours_positions"]),
        "positions_speedup": median(pos_speedup),
        "positions_speedup_iqr": [round(q, 3) for q in statistics.quantiles(pos_speedup, n=4)[::2]]
        if len(pos_speedup) > 1
        else None,
        "max_predictions": slots,
        "predictions": int((batch["labels"] != IGNORE_INDEX).sum()),
        "data": str(args.data) if args.data else "synthetic",
        "ours_tok_s": tokens / median(times["ours"]),
        "transformers_tok_s": tokens / median(times["transformers"]),
        "attn_impl": theirs.config._attn_implementation,
        "params": ours.num_parameters(),
        **machine_info(),
    }
    print_table(
        [result],
        [
            "preset",
            "batch",
            "seq_len",
            "steps",
            "threads",
            "clock",
            "ours_s",
            "transformers_s",
            "speedup",
            "ours_positions_s",
            "positions_speedup",
            "ours_tok_s",
            "transformers_tok_s",
        ],
    )
    hidden = ("ours_s", "transformers_s", "ours_positions_s")
    print(json.dumps({k: v for k, v in result.items() if k not in hidden}, default=str))
    if args.json is not None:
        args.json.write_text(json.dumps(result, indent=2, default=str) + "\n", encoding="utf-8")
    return result


if __name__ == "__main__":
    main()
