"""Stand-ins for the training tests: a tiny BERT, a synthetic MLM+NSP loader, and a worker entry point.

The loader follows the ``PretrainingLoader`` protocol (re-iterable, continues where it stopped,
``state_dict`` / ``load_state_dict``, rank/world_size sharding by interleaving global batches), and
its "language" is learnable: sentence A repeats one word ``w`` and sentence B repeats ``w + 1``
(IsNext) or a random word (NotNext).

Run as a script it trains once and writes the final weights; the fault tests start it as a
subprocess and kill it (``python tests/training_fakes.py --help``).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from bert_core.config import BertConfig  # noqa: E402
from bert_core.model import BertForPreTraining  # noqa: E402
from bert_core.pretrain.objective import PretrainingObjective  # noqa: E402
from bert_core.training import TrainConfig, Trainer, TrainingInterrupted  # noqa: E402

VOCAB = 99
SPECIAL = 5  # ids 0..4: [PAD] [UNK] [CLS] [SEP] [MASK]
CLS, SEP, MASK = 2, 3, 4


def tiny_config(dropout: float = 0.1) -> BertConfig:
    """transformers' "model tester" size: hidden 32, 2 layers, vocab 99."""
    return BertConfig(
        vocab_size=VOCAB,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=37,
        hidden_dropout_prob=dropout,
        attention_probs_dropout_prob=dropout,
        max_position_embeddings=64,
    )


def tiny_model(seed: int = 0, dropout: float = 0.1) -> BertForPreTraining:
    torch.manual_seed(seed)
    return BertForPreTraining(tiny_config(dropout))


class FakePretrainLoader:
    """Deterministic synthetic batches; global batch ``g`` of epoch ``e`` goes to rank ``g % world_size``."""

    def __init__(
        self,
        *,
        batch_size: int = 8,
        seq_len: int = 16,
        batches_per_epoch: int = 16,
        rank: int = 0,
        world_size: int = 1,
        seed: int = 0,
        pad_tail: bool = True,
    ) -> None:
        assert batches_per_epoch % world_size == 0
        self.batch_size, self.seq_len, self.seed = batch_size, seq_len, seed
        self.rank, self.world_size = rank, world_size
        self.per_rank = batches_per_epoch // world_size
        self.pad_tail = pad_tail
        self.epoch = 0
        self.pos = 0

    @property
    def steps_per_epoch(self) -> int:
        return self.per_rank

    @property
    def vocab_size(self) -> int:
        return VOCAB

    def make_batch(self, epoch: int, index: int) -> dict[str, torch.Tensor]:
        g = torch.Generator().manual_seed(self.seed * 1_000_003 + epoch * 10_007 + index)
        b, t = self.batch_size, self.seq_len
        half = (t - 3) // 2
        n_words = VOCAB - SPECIAL
        start_a = torch.randint(0, n_words, (b, 1), generator=g)
        nsp = torch.randint(0, 2, (b,), generator=g)
        start_b = torch.where(nsp[:, None] == 0, start_a + 1, torch.randint(0, n_words, (b, 1), generator=g))
        zero = torch.zeros(1, half, dtype=torch.long)
        a = (start_a + zero) % n_words + SPECIAL  # sentence A repeats one word
        bb = (start_b + zero) % n_words + SPECIAL  # B repeats the next word (IsNext) or a random one
        ids = torch.cat(
            [torch.full((b, 1), CLS), a, torch.full((b, 1), SEP), bb, torch.full((b, 1), SEP)], dim=1
        )
        length = ids.shape[1]
        types = torch.cat([torch.zeros(b, half + 2), torch.ones(b, half + 1)], dim=1).long()
        attn = torch.ones(b, length, dtype=torch.long)
        if self.pad_tail:  # a padded tail on every other row
            ids[1::2, -2:] = 0
            types[1::2, -2:] = 0
            attn[1::2, -2:] = 0
        word = (ids >= SPECIAL) & (attn == 1)
        chosen = word & (torch.rand(b, length, generator=g) < 0.15)
        chosen[:, 1] = True  # at least one prediction per row
        labels = torch.where(chosen, ids, torch.full_like(ids, -100))
        inputs = torch.where(chosen, torch.full_like(ids, MASK), ids)
        pad = t - length
        if pad > 0:
            z = torch.zeros(b, pad, dtype=torch.long)
            inputs, types, attn = (torch.cat([x, z], 1) for x in (inputs, types, attn))
            labels = torch.cat([labels, torch.full((b, pad), -100)], 1)
        return {
            "input_ids": inputs,
            "token_type_ids": types,
            "attention_mask": attn,
            "labels": labels,
            "next_sentence_label": nsp,
        }

    def __iter__(self):
        while self.pos < self.per_rank:
            index = self.pos * self.world_size + self.rank
            batch = self.make_batch(self.epoch, index)
            self.pos += 1
            yield batch
        self.epoch += 1
        self.pos = 0

    def __len__(self) -> int:
        return self.per_rank

    def state_dict(self) -> dict[str, int]:
        return {"epoch": self.epoch, "pos": self.pos}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.epoch, self.pos = int(state["epoch"]), int(state["pos"])


def heldout(batch_size: int = 16, n: int = 4, rank: int = 0, world_size: int = 1):
    """Factory of fresh held-out loaders: ``n`` batches in all, shared among the ranks (seed 999)."""
    return lambda: FakePretrainLoader(
        batch_size=batch_size, batches_per_epoch=n, rank=rank, world_size=world_size, seed=999
    )


def run(
    ckpt_dir: Path | None,
    *,
    max_steps: int = 8,
    micro: int = 4,
    accum: int = 2,
    checkpoint_every: int = 2,
    dropout: float = 0.1,
    lr: float = 3e-3,
    seed: int = 0,
    on_micro=None,
    on_metrics=None,
    dist=None,
    replay_to=None,
    **config_kw,
):
    """One deterministic CPU training run of the tiny model on the fake data; returns (model, result)."""
    model = tiny_model(seed, dropout)
    objective = PretrainingObjective.for_config(model.config)
    if on_micro is not None:
        inner = objective.step

        def step(m, batch):
            on_micro()
            return inner(m, batch)

        objective.step = step  # type: ignore[method-assign]
    rank, world = (dist.rank, dist.world_size) if dist is not None else (0, 1)
    loader = FakePretrainLoader(batch_size=micro, seed=seed, rank=rank, world_size=world)
    cfg = TrainConfig(
        max_steps=max_steps,
        lr=lr,
        warmup_steps=config_kw.pop("warmup_steps", 2),
        grad_accum=accum,
        checkpoint_every=checkpoint_every,
        log_every=config_kw.pop("log_every", 1),
        seed=seed,
        deterministic=config_kw.pop("deterministic", True),
        device="cpu",
        **config_kw,
    )
    trainer = Trainer(
        model,
        objective,
        loader,
        cfg,
        checkpoint_dir=ckpt_dir,
        eval_data=heldout(rank=rank, world_size=world),
        on_metrics=on_metrics,
        fingerprint="fake-v1",
        dist=dist,
        replay_to=replay_to,
    )
    return model, trainer.fit()


def main(argv: list[str] | None = None) -> int:
    """Worker: train, optionally kill itself with a signal at micro-step N, write final weights."""
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--ckpt", type=Path, required=True)
    ap.add_argument("--out", type=Path, required=True, help="final weights (safetensors) + result json")
    ap.add_argument("--max-steps", type=int, default=8)
    ap.add_argument(
        "--signal-at-micro", type=int, default=-1, help="send --signal to self at this micro-step"
    )
    ap.add_argument("--signal", default="SIGKILL")
    ap.add_argument("--kill-in-save", type=int, default=-1, help="SIGKILL inside the N-th checkpoint save")
    ap.add_argument("--sleep-per-micro", type=float, default=0.0, help="slow down (for external signals)")
    ap.add_argument("--micro", type=int, default=4)
    ap.add_argument("--accum", type=int, default=2)
    ap.add_argument("--dropout", type=float, default=0.1)
    ap.add_argument("--ddp", action="store_true", help="join the torchrun process group (gloo)")
    ap.add_argument("--overlap-checks", action="store_true", help="read the step flags one step late")
    ap.add_argument(
        "--checkpoint-every-s", type=float, default=None, help="checkpoints by the clock, not every 2 steps"
    )
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    sig = getattr(signal, args.signal)
    calls = {"micro": 0, "save": 0}

    def on_micro() -> None:
        calls["micro"] += 1
        if args.sleep_per_micro:
            time.sleep(args.sleep_per_micro)
        if calls["micro"] == args.signal_at_micro:
            os.kill(os.getpid(), sig)

    if args.kill_in_save >= 0:
        from bert_core.training import checkpoint as ckpt_mod

        real_save = ckpt_mod.torch.save

        def save(obj, path, *a, **k):
            real_save(obj, path, *a, **k)
            if Path(path).name == "rng.pt":
                calls["save"] += 1
                if calls["save"] == args.kill_in_save:
                    os.kill(os.getpid(), signal.SIGKILL)

        ckpt_mod.torch.save = save  # type: ignore[assignment]
    dist = None
    if args.ddp:
        from bert_core.training.distributed import setup_distributed

        dist = setup_distributed("cpu")
    try:
        model, result = run(
            args.ckpt,
            max_steps=args.max_steps,
            on_micro=on_micro,
            micro=args.micro,
            accum=args.accum,
            dropout=args.dropout,
            dist=dist,
            overlap_checks=args.overlap_checks,
            **(
                {"checkpoint_every": 0, "checkpoint_every_s": args.checkpoint_every_s}
                if args.checkpoint_every_s
                else {}
            ),
        )
    except TrainingInterrupted as exc:
        print(f"interrupted: {exc}", flush=True)
        return exc.exit_code
    finally:
        if dist is not None:
            from bert_core.training.distributed import teardown_distributed

            teardown_distributed()
    if dist is not None and not dist.is_main:
        return 0
    from safetensors.torch import save_model

    args.out.mkdir(parents=True, exist_ok=True)
    save_model(model, str(args.out / "model.safetensors"))
    losses = [h["loss"] for h in result.history if h["kind"] == "train"]
    summary = {"step": result.step, "resumed_from_step": result.resumed_from_step, "losses": losses}
    (args.out / "result.json").write_text(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
