"""The ``gpu-base`` recipe on capped data, through the library's stage entries alone (no Prefect, MLflow, DVC).

corpus -> vocab -> pretrain_data -> pretrain (a few hundred steps of BERT-Base, both phases, bf16,
compiled) -> fine-tuning of one task, then the check that matters to a user: the pretrained and the
fine-tuned model directories load in transformers (``AutoModelForPreTraining``, ``BertForSequenceClassification``,
``AutoTokenizer``) with no missing or unexpected weights, and run. The params are the committed
``params/<stage>.yaml`` with ``params/profiles/gpu-base.yaml`` applied (``--tiny``: ``tiny.yaml``), then
the caps of :func:`smoke_caps`; each stage's data checks run as in the pipeline.

Writes ``summary.json`` and ``summary.md`` (per stage: seconds, headline figures, or the error) and the
stages' outputs under ``--out`` (printed). Exit status 0 only when every stage and the load check passed.

    python -m bench.gpu_smoke                          # on the GPU machine (make gpu-smoke)
    python -m bench.gpu_smoke --device cpu --tiny      # seconds on a CPU: the dry run CI keeps alive
"""

from __future__ import annotations

import bench._gpu_env as gpu_env  # first: the bundle's wheels before any other import

BUNDLE = gpu_env.activate()

import argparse  # noqa: E402
import copy  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
import traceback  # noqa: E402
from datetime import UTC, datetime  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

import yaml  # noqa: E402

REPO = gpu_env.REPO
STAGES = ("corpus", "vocab", "pretrain_data", "pretrain", "finetune")


def set_dotted(data: dict, key: str, value: Any) -> None:
    """``data[a][b][0][c] = value`` for ``key = "a.b.0.c"`` (list indices as digits)."""
    *path, last = key.split(".")
    node: Any = data
    for part in path:
        node = node[int(part)] if isinstance(node, list) else node.setdefault(part, {})
    if isinstance(node, list):
        node[int(last)] = value
    else:
        node[last] = value


def recipe(profile: str) -> dict[str, dict]:
    """Every stage's params section: the committed file with the profile's overrides applied."""
    sections = {}
    for stage in STAGES:
        sections[stage] = yaml.safe_load((REPO / "params" / f"{stage}.yaml").read_text(encoding="utf-8"))[
            stage
        ]
    overrides = yaml.safe_load((REPO / "params" / "profiles" / f"{profile}.yaml").read_text(encoding="utf-8"))
    for file, keys in overrides.items():
        if not file.startswith("params/"):
            continue  # e.g. `targets:`
        for key, value in keys.items():
            stage, rest = key.split(".", 1)
            set_dotted(sections[stage], rest, copy.deepcopy(value))
    return sections


def smoke_caps(sections: dict[str, dict], args: argparse.Namespace) -> None:
    """Cap the recipe to minutes: a corpus sample, one duplication, ``--steps`` pretraining steps with the
    recipe's phases, batches and precision, one task on ``--train-rows`` rows for one epoch."""
    cpus = os.cpu_count() or 2
    corpus = sections["corpus"]
    corpus["cap"]["max_bytes"] = int(args.corpus_mb * 1e6)
    for src in corpus["local_sources"]:
        src["max_bytes"] = int(args.corpus_mb * 1e6 / 2)
    corpus["workers"] = min(8, cpus)
    try:
        import blingfire  # noqa: F401
    except ImportError:  # a 42 MB wheel the bundle leaves behind
        corpus["segmenter"] = "lines"
    vocab = sections["vocab"]
    vocab["sample_max_bytes"] = int(args.corpus_mb * 1e6)
    data = sections["pretrain_data"]
    data["dupe_factor"] = 1
    data["num_workers"] = min(8, cpus)
    pre = sections["pretrain"]
    pre["max_steps"] = args.steps
    pre["time_budget_minutes"] = None
    pre["checkpoint_every"] = max(1, args.steps // 2)
    pre["eval_every"] = 0
    pre["eval_batches"] = 5
    pre["log_every"] = max(1, args.steps // 10)
    pre["device"] = args.device
    for phase in pre["phases"]:  # the recipe's warmup (10k steps) exceeds a smoke's length
        phase.pop("warmup_steps", None)
        phase["warmup_ratio"] = 0.1
    if args.device == "cpu":
        pre["precision"], pre["compile"] = "fp32", False
    if args.no_compile:  # each phase's first compiled step costs about a minute on BERT-Base
        pre["compile"] = False
    fine = sections["finetune"]
    settings = {
        "train_limit": args.train_rows,
        "eval_limit": args.eval_rows,
        "epochs": 1,
        "learning_rates": [fine["defaults"]["learning_rates"][0]],
        "predict_test": False,
        "random_init_baseline": False,
        "reference_baseline": False,
    }
    fine["tasks"] = {args.task: settings}
    fine["small_task_seeds"] = [1]
    fine["device"] = args.device
    fine["registry"] = {**fine.get("registry", {}), "enabled": False}


def _run_stage(name: str, fn, summary: dict) -> Any:
    t0 = time.perf_counter()
    print(f"[gpu-smoke] {name} ...", flush=True)
    try:
        result, figures = fn()
    except Exception as err:  # recorded; the later stages need this one's output, so they are skipped
        summary["stages"][name] = {
            "ok": False,
            "seconds": round(time.perf_counter() - t0, 1),
            "error": f"{type(err).__name__}: {err}",
            "traceback": traceback.format_exc(),
        }
        print(f"[gpu-smoke] {name} FAILED: {type(err).__name__}: {err}", flush=True)
        raise
    summary["stages"][name] = {"ok": True, "seconds": round(time.perf_counter() - t0, 1), **figures}
    print(f"[gpu-smoke] {name} ok in {summary['stages'][name]['seconds']} s: {figures}", flush=True)
    return result


def _flat(metrics: dict, keep: tuple[str, ...]) -> dict:
    out = {}

    def walk(prefix: str, node: Any) -> None:
        if isinstance(node, dict):
            for k, v in node.items():
                walk(f"{prefix}.{k}" if prefix else str(k), v)
        elif isinstance(node, (int, float)) and any(s in prefix for s in keep):
            out[prefix] = node

    walk("", metrics)
    return dict(list(out.items())[:20])


def load_in_transformers(pretrained: Path, finetuned: Path) -> dict:
    """Both directories load in transformers (the pretraining heads too) with every weight matched, and run."""
    import torch
    import transformers

    figures: dict[str, Any] = {"transformers": transformers.__version__}
    for label, cls, path in (
        ("pretrained", transformers.AutoModelForPreTraining, pretrained),
        ("finetuned", transformers.BertForSequenceClassification, finetuned),
    ):
        model, info = cls.from_pretrained(str(path), output_loading_info=True)
        bad = {
            k: v for k, v in info.items() if v and k in ("missing_keys", "unexpected_keys", "mismatched_keys")
        }
        if bad:
            raise AssertionError(f"{path}: transformers loads it with {bad}")
        tok = transformers.AutoTokenizer.from_pretrained(str(path))
        enc = tok(["a gripping , funny film .", "dull and far too long ."], return_tensors="pt", padding=True)
        with torch.no_grad():
            out = model.eval()(**enc)
        first = out.logits if label == "finetuned" else out.prediction_logits
        if not torch.isfinite(first).all():
            raise AssertionError(f"{path}: non-finite outputs in transformers")
        figures[f"{label}_class"] = type(model).__name__
        if label == "finetuned":
            figures["finetuned_predictions"] = first.argmax(-1).tolist()
    return figures


def stage_table(stages: dict) -> list[str]:
    """The Markdown table of the stages: ok, seconds, figures or the error (also in ``gpu_check``'s summary)."""
    lines = ["| stage | ok | seconds | figures / error |", "|---|---|---|---|"]
    for name, s in stages.items():
        detail = s.get("error") or ", ".join(
            f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}"
            for k, v in s.items()
            if k not in ("ok", "seconds", "traceback")
        )
        lines.append(f"| {name} | {'yes' if s['ok'] else 'NO'} | {s['seconds']} | {detail} |")
    return lines


def write_summary(out: Path, summary: dict) -> None:
    """``summary.json`` and ``summary.md``, each replaced whole (as ``gpu_check`` writes its own)."""
    from bert_core.atomic import write_text_atomic

    write_text_atomic(out / "summary.json", json.dumps(summary, indent=2, default=str) + "\n")
    lines = [
        f"# GPU smoke ({summary['profile']}, {summary['device']})",
        "",
        f"{summary['started']}; torch {summary['torch']}, CUDA {summary['cuda']}; device {summary['device_name']}",
        "",
        *stage_table(summary["stages"]),
    ]
    write_text_atomic(out / "summary.md", "\n".join(lines) + "\n")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.gpu_smoke", description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=None, help="default: outputs/gpu-smoke/<UTC time>")
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    ap.add_argument("--tiny", action="store_true", help="the tiny profile and caps: a CPU dry run in seconds")
    ap.add_argument("--steps", type=int, default=None, help="pretraining steps (default 300; --tiny 4)")
    ap.add_argument("--no-compile", action="store_true", help="pretrain eagerly (the recipe compiles)")
    ap.add_argument("--task", default="sst2")
    ap.add_argument("--train-rows", type=int, default=None, help="default 4000; --tiny 64")
    ap.add_argument("--eval-rows", type=int, default=None, help="default all; --tiny 64")
    ap.add_argument("--corpus-mb", type=float, default=None, help="default 6; --tiny 0.3")
    args = ap.parse_args(argv)
    tiny = args.tiny
    args.steps = args.steps or (4 if tiny else 300)
    args.train_rows = args.train_rows or (64 if tiny else 4000)
    args.eval_rows = args.eval_rows or (64 if tiny else None)
    args.corpus_mb = args.corpus_mb or (0.3 if tiny else 6.0)
    import torch

    if args.device == "cuda" and not torch.cuda.is_available():
        sys.exit("no CUDA device: run on the GPU machine, or `--device cpu --tiny` for the dry run")
    data_root = os.environ.get("BERT_DATA_ROOT") or str(REPO.parent / "shared" / "data")
    if not Path(data_root, "glue").is_dir():
        sys.exit(f"no data root at {data_root}: `make gpu-bundle` (carry .gpu) or set BERT_DATA_ROOT")
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    out = (args.out or REPO / "outputs" / "gpu-smoke" / stamp).resolve()
    out.mkdir(parents=True, exist_ok=True)
    profile = "tiny" if tiny else "gpu-base"
    sections = recipe(profile)
    smoke_caps(sections, args)
    if tiny:  # the tiny profile's own sizes, smaller still
        sections["pretrain"]["phases"] = [
            {
                "name": "seq128",
                "share": 1.0,
                "micro_batch": 8,
                "global_batch": 8,
                "lr": 2.0e-3,
                "warmup_ratio": 0.1,
            }
        ]
        sections["pretrain_data"]["phases"] = ["seq128"]
        sections["corpus"]["workers"] = sections["pretrain_data"]["num_workers"] = 1  # no pool to start
    summary: dict[str, Any] = {
        "profile": profile,
        "device": args.device,
        "started": stamp,
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "python": sys.version.split()[0],
        "data_root": data_root,
        "device_name": torch.cuda.get_device_name() if args.device == "cuda" else "cpu",
        "params": sections,
        "stages": {},
        "bundle": BUNDLE,
    }
    print(f"[gpu-smoke] {profile} on {summary['device_name']} -> {out}", flush=True)
    ok = False
    try:
        ok = run(sections, args, Path(data_root), out, summary)
    except Exception:  # already recorded by _run_stage
        ok = False
    finally:
        summary["ok"] = ok
        write_summary(out, summary)
        print(f"[gpu-smoke] {'PASSED' if ok else 'FAILED'}; summary: {out / 'summary.md'}", flush=True)
        print(out)
    return 0 if ok else 1


def run(sections: dict, args: argparse.Namespace, data_root: Path, out: Path, summary: dict) -> bool:
    from bert_core.corpus import CorpusParams, build_corpus
    from bert_core.finetune.params import FinetuneParams
    from bert_core.finetune.run import finetune_task
    from bert_core.params import parse_params
    from bert_core.pretrain import PretrainParams, pretrain
    from bert_core.pretrain_data.build import build_pretrain_data
    from bert_core.pretrain_data.params import PretrainDataParams
    from bert_core.vocab import VocabParams, train_vocab

    def params(stage: str, cls: type) -> Any:
        return parse_params(sections[stage], cls, where=f"bench/gpu_smoke ({stage})", prefix=stage)

    # The data checks run as in the pipeline; their Data Docs HTML is not rendered (only fine-tuning always
    # renders it, into a temporary folder here), which the smoke has no use for.
    corpus_dir, vocab_dir, data_dir = (
        out / "data" / "corpus",
        out / "data" / "vocab",
        out / "data" / "pretrain_data",
    )
    model_dir, fine_dir = out / "models" / "pretrained", out / "results" / args.task

    def corpus():
        stats = build_corpus(params("corpus", CorpusParams), corpus_dir, data_root=data_root)
        return stats, _flat(stats.as_metrics(), ("documents", "bytes", "sentences"))

    def vocab():
        p = params("vocab", VocabParams)
        ref = data_root / p.reference_local if p.reference_local else None
        stats = train_vocab(p, corpus_dir, vocab_dir, reference_vocab=ref if ref and ref.is_file() else None)
        return stats, _flat(stats.as_metrics(), ("vocab_size", "tokens_per_word", "unk"))

    def pretrain_data():
        result = build_pretrain_data(
            params("pretrain_data", PretrainDataParams),
            corpus_dir=corpus_dir,
            vocab_dir=vocab_dir,
            output_dir=data_dir,
        )
        return result, _flat(result.as_metrics(), ("instances", "tokens"))

    def pretraining():
        result = pretrain(
            params("pretrain", PretrainParams),
            data_dir,
            vocab_dir,
            model_dir,
            checkpoint_root=out / "checkpoints",
        )
        return result, _flat(
            result.metrics, ("loss", "accuracy", "tokens_per_s", "mfu", "seq_per_s", "step", "checkpoint_s")
        )

    def finetune():
        result = finetune_task(
            args.task, params("finetune", FinetuneParams), model_dir, fine_dir, data_root=data_root
        )
        return result, _flat(result.metrics(), ("dev", "train", "seconds", "examples"))

    for name, fn in (
        ("corpus", corpus),
        ("vocab", vocab),
        ("pretrain_data", pretrain_data),
        ("pretrain", pretraining),
        ("finetune", finetune),
    ):
        _run_stage(name, fn, summary)
    _run_stage(
        "load_in_transformers", lambda: (None, load_in_transformers(model_dir, fine_dir / "model")), summary
    )
    return True


if __name__ == "__main__":
    sys.exit(main())
