"""A CPU pretraining recipe that learns more per minute: the paper's recipe against efficiency changes that keep
the Hugging Face BERT architecture, at the default profile's fixed wall-clock budget.

Each variant is a set of params overrides on the committed default profile (``params/*.yaml``) with
``PAPER`` applied first, so every option it exercises is an ordinary params key (``VARIANTS`` below):

- ``paper``: the paper's recipe on the default profile's model and data (two phases, 15% masking, 80/10/10,
  NSP, dropout), spelled out in ``PAPER`` so that it stays the paper's whatever the committed profile holds;
- ``no512``: no seq-512 phase (the paper spends its last 10% of steps there for position embeddings beyond
  128, which the default fine-tuning never uses): the whole budget at 128 tokens;
- ``mask30`` / ``mask40``: a higher masking rate (Wettig et al., 2023, "Should You Mask 15% in Masked
  Language Modeling?"), with the prediction budget per sequence raised to match;
- ``nonsp``: MLM alone (RoBERTa; the paper's "No NSP" ablation): ``pretrain_data.random_next_prob: 0``
  and ``pretrain.nsp: false``;
- ``nodropout``: no dropout during pretraining (Geiping & Goldstein, 2023, "Cramming");
- ``split100``: the paper's masking ablation, always ``[MASK]`` (``pretrain_data.mask_split``);
- learning rate and batch size around the default's.

Per variant: its pretraining data (built once per distinct data params, from one corpus and vocab built
with the default params); pretraining for ``--budget-minutes`` of wall clock (the step cap of the default
profile is lifted, so every variant gets the same time, not the same steps); then, on ONE held-out set
built once with the default masking (15%, 80/10/10, seq 128, static), the MLM loss and accuracy (the
variant's own held-out figures depend on its own masking and are not comparable); then SST-2 (2,000
training rows) and CoNLL-2003 fine-tuned with the default profile's protocol (its learning-rate grid, epochs
and rows) over ``--seeds`` seeds. A task's figure is the mean and standard deviation over the seeds at the
learning rate whose mean dev score is best (the grid's selection, made on the seeds' mean).

The library entries are called directly (no Prefect, MLflow or DVC). Results: a Markdown table on stdout and
``<work>/results.json``; each variant's record is kept in ``<work>/variants/<name>.json`` and reused with
``--resume`` (pretraining also resumes from its checkpoints after an interruption). Usage::

    BERT_DATA_ROOT=../shared/data OMP_WAIT_POLICY=PASSIVE .venv/bin/python -m bench.bench_cpu_recipe \\
        --budget-minutes 10 --seeds 3 --work /tmp/cpu_recipe
    .venv/bin/python -m bench.bench_cpu_recipe --tiny --work /tmp/cpu_recipe_tiny     # a dry run, minutes
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import json
import logging
import math
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
SHARED = REPO.parent / "shared" / "data"
TASKS = ("sst2", "conll2003")
NO_DROPOUT = {"hidden_dropout_prob": 0.0, "attention_probs_dropout_prob": 0.0}

# The paper's pretraining recipe (appendix A.2, at the default profile's model size, batches and rates): the
# base layer of every variant, so "paper" means the paper even where the committed profile differs.
PAPER = {
    "params/pretrain_data.yaml": {
        "pretrain_data.phases": ["seq128", "seq512"],
        "pretrain_data.masked_lm_prob": 0.15,
        "pretrain_data.phase_specs.seq128.max_predictions_per_seq": 20,
        "pretrain_data.mask_split": {"mask": 0.8, "random": 0.1, "keep": 0.1},
        "pretrain_data.random_next_prob": 0.5,
    },
    "params/pretrain.yaml": {
        "pretrain.phases": [
            {
                "name": "seq128",
                "share": 0.9,
                "micro_batch": 32,
                "global_batch": 32,
                "lr": 2.0e-3,
                "warmup_ratio": 0.05,
            },
            {
                "name": "seq512",
                "share": 0.1,
                "micro_batch": 8,
                "global_batch": 8,
                "lr": 1.0e-3,
                "warmup_ratio": 0.1,
            },
        ],
        "pretrain.nsp": True,
        "pretrain.model.overrides": {},
    },
}

# name -> {params file: {dotted key: value}}; "@seq128" stands for the paper's seq128 phase, alone, with
# the whole budget (its batch and learning rate as committed, changed by the keys after it).
NO512 = {
    "params/pretrain_data.yaml": {"pretrain_data.phases": ["seq128"]},
    "params/pretrain.yaml": {"@seq128": {}},
}


def _variant(*parts: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    for part in parts:
        for file, keys in part.items():
            merged = out.setdefault(file, {})
            for k, v in keys.items():
                merged[k] = {**merged[k], **v} if k == "@seq128" and k in merged else v
    return out


def _mask(rate: float) -> dict[str, dict[str, Any]]:
    """Masking rate ``rate`` with the seq128 prediction budget raised to fit it (20 at 15%, as Google's)."""
    preds = 4 * math.ceil(rate * 125 / 4)
    return {
        "params/pretrain_data.yaml": {
            "pretrain_data.masked_lm_prob": rate,
            "pretrain_data.phase_specs.seq128.max_predictions_per_seq": preds,
        }
    }


NONSP = {
    "params/pretrain_data.yaml": {"pretrain_data.random_next_prob": 0.0},
    "params/pretrain.yaml": {"pretrain.nsp": False},
}
NODROPOUT = {"params/pretrain.yaml": {"pretrain.model.overrides": NO_DROPOUT}}
SPLIT100 = {
    "params/pretrain_data.yaml": {"pretrain_data.mask_split": {"mask": 1.0, "random": 0.0, "keep": 0.0}}
}


def _seq128(**phase: Any) -> dict[str, dict[str, Any]]:
    return {"params/pretrain.yaml": {"@seq128": phase}}


VARIANTS: dict[str, dict[str, dict[str, Any]]] = {
    "paper": {},
    "no512": NO512,
    "no512_mask30": _variant(NO512, _mask(0.3)),
    "no512_nonsp": _variant(NO512, NONSP),
    "no512_nodropout": _variant(NO512, NODROPOUT),
    "no512_mask30_nonsp_nodropout": _variant(NO512, _mask(0.3), NONSP, NODROPOUT),
    # further options, run with --variants
    "no512_mask40": _variant(NO512, _mask(0.4)),
    "no512_split100": _variant(NO512, SPLIT100),
    "no512_lr1e-3": _variant(NO512, _seq128(lr=1.0e-3)),
    "no512_lr4e-3": _variant(NO512, _seq128(lr=4.0e-3)),
    "no512_batch16": _variant(NO512, _seq128(micro_batch=16, global_batch=16)),
    "no512_batch64": _variant(NO512, _seq128(micro_batch=32, global_batch=64)),
}
DEFAULT_VARIANTS = list(VARIANTS)[:6]

# --tiny: the tiny profile's data sizes (params/profiles/tiny.yaml) and one short fine-tuning trial per task
TINY = {
    "params/corpus.yaml": {
        "corpus.local_sources.0.max_bytes": 250_000,
        "corpus.local_sources.1.max_bytes": 250_000,
        "corpus.sources.0.max_bytes": 500_000,
        "corpus.cap.max_bytes": 500_000,
        "corpus.clean.min_sentences": 10,
        "corpus.heldout.fraction": 0.2,
        "corpus.heldout.max_documents": 50,
    },
    "params/vocab.yaml": {"vocab.vocab_size": 3000, "vocab.eval_max_sentences": 2000},
    "params/pretrain_data.yaml": {"pretrain_data.dupe_factor": 1, "pretrain_data.check_sample": 2000},
    "params/pretrain.yaml": {"pretrain.checkpoint_every": 0, "pretrain.eval_batches": 2},
}
TINY_TASK = {"train_limit": 200, "eval_limit": 200, "epochs": 1, "learning_rates": [3.0e-4]}

log = logging.getLogger("bench.cpu_recipe")


# ------------------------------------------------------------------------------------------------ params
def _set(data: dict[str, Any], dotted: str, value: Any, file: str) -> None:
    """Set ``a.b.0.c`` in ``data``; the key must exist (a misspelt override fails here, naming it)."""
    parts = dotted.split(".")
    node: Any = data
    for i, part in enumerate(parts):
        key: Any = int(part) if isinstance(node, list) and part.isdigit() else part
        if not (
            (isinstance(node, dict) and key in node)
            or (isinstance(node, list) and isinstance(key, int) and key < len(node))
        ):
            raise SystemExit(f"{file}: no key '{dotted}' to override (check its spelling against {file})")
        if i == len(parts) - 1:
            node[key] = copy.deepcopy(value)
        else:
            node = node[key]


def stage_params(file: str, section: str, model: type, *layers: dict[str, dict[str, Any]]) -> Any:
    """``section`` of the committed ``file`` with the layers' overrides applied, parsed by ``model``."""
    from bert_core.params import parse_params, read_yaml

    data = read_yaml(REPO / file)
    for layer in layers:
        for key, value in layer.get(file, {}).items():
            if key == "@seq128":
                phase = next(p for p in data[section]["phases"] if p["name"] == "seq128")
                data[section]["phases"] = [{**phase, "share": 1.0, **value}]
            else:
                _set(data, key, value, file)
    return parse_params(data[section], model, where=f"{file} (+ overrides)", prefix=section)


# ------------------------------------------------------------------------------------------------ stages
def build_inputs(work: Path, layers: list[dict]) -> tuple[Path, Path]:
    """The corpus and vocab of the default params (built once into ``work``)."""
    from bert_core.corpus import CorpusParams, build_corpus
    from bert_core.sources import data_root
    from bert_core.vocab import VocabParams, train_vocab

    corpus, vocab = work / "corpus", work / "vocab"
    if not (corpus / "manifest.json").is_file():
        params = stage_params("params/corpus.yaml", "corpus", CorpusParams, *layers)
        log.info("building the corpus into %s", corpus)
        build_corpus(params, corpus, data_root=data_root())
    if not (vocab / "vocab.txt").is_file():
        params = stage_params("params/vocab.yaml", "vocab", VocabParams, *layers)
        log.info("training the vocab into %s", vocab)
        train_vocab(params, corpus, vocab)
    return corpus, vocab


def data_for(work: Path, params: Any, corpus: Path, vocab: Path) -> Path:
    """Pretraining data for ``params``, built once per distinct data params (phases apart: a phase built
    beside another is byte-identical to the phase built alone, so a variant reuses a wider build)."""
    import hashlib

    from bert_core.pretrain_data.build import build_pretrain_data

    key = {k: v for k, v in params.data_params().items() if k != "phases"}
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:12]
    for d in sorted(work.glob(f"pretrain_data-{digest}-*")):
        if all((d / phase / "train" / "index.json").is_file() for phase in params.phases):
            return d
    out = work / f"pretrain_data-{digest}-{'+'.join(params.phases)}"
    log.info("building pretraining data %s", out.name)
    build_pretrain_data(
        params, corpus_dir=corpus, vocab_dir=vocab, output_dir=out, report_dir=out.with_suffix(".checks")
    )
    return out


def heldout_mlm(model_dir: Path, heldout: Path, nsp: bool, batches: int | None) -> dict[str, float]:
    """MLM loss/accuracy (and NSP accuracy with NSP) of the model in ``model_dir`` on ``heldout``."""
    import torch

    from bert_core.hf import load_pretrained
    from bert_core.model import BertForPreTraining
    from bert_core.pretrain.objective import PretrainingObjective
    from bert_core.pretrain_data.loader import PretrainingLoader
    from bert_core.training.distributed import DistContext
    from bert_core.training.evaluation import evaluate_objective

    model, _ = load_pretrained(BertForPreTraining, model_dir)  # eval mode
    objective = PretrainingObjective.for_config(model.config, nsp=nsp)
    loader = PretrainingLoader(
        heldout,
        64,
        shuffle=False,
        drop_last=False,
        mlm_format="labels",
        expected_vocab_size=model.config.vocab_size,
    )
    metrics = evaluate_objective(
        model,
        objective,
        loader,
        device=torch.device("cpu"),
        dist=DistContext(),
        max_batches=batches,
        autocast=contextlib.nullcontext,
    )
    return {k.removeprefix("eval_"): v for k, v in metrics.items()}


def finetune(model_dir: Path, out: Path, seeds: list[int], tiny: bool) -> dict[str, Any]:
    """SST-2 and CoNLL-2003 with the default profile's protocol, over ``seeds``: per task the best
    learning rate by mean dev score, its mean and standard deviation, and every trial's score."""
    from bert_core.finetune.params import FinetuneParams
    from bert_core.finetune.run import finetune_task
    from bert_core.params import load_params, parse_params

    base = load_params(REPO / "params/finetune.yaml", "finetune", FinetuneParams).model_dump(mode="json")
    results: dict[str, Any] = {}
    for task in TASKS:
        task_keys = {
            **base["tasks"].get(task, {}),
            "seeds": seeds,
            "random_init_baseline": False,  # the comparison is between pretrained models
            "reference_baseline": False,
            "predict_test": False,
            **(TINY_TASK if tiny else {}),
        }
        data = base | {"tasks": {task: {k: v for k, v in task_keys.items() if v is not None}}}
        data["registry"] = base["registry"] | {"enabled": False}
        params = parse_params(
            data, FinetuneParams, where="params/finetune.yaml (+ bench overrides)", prefix="finetune"
        )
        t0 = time.perf_counter()
        res = finetune_task(task, params, model_dir, out / task, model_out=out / task / "model")
        by_lr: dict[float, list[float]] = {}
        for trial in res.trials:
            if trial.init == "pretrained":
                by_lr.setdefault(trial.learning_rate, []).append(
                    float(trial.dev.get(res.main_metric, math.nan))
                )
        lr, scores = max(by_lr.items(), key=lambda kv: statistics.fmean(kv[1]))
        results[task] = {
            "metric": res.main_metric,
            "lr": lr,
            "mean": statistics.fmean(scores),
            "std": statistics.stdev(scores) if len(scores) > 1 else 0.0,
            "scores": scores,
            "by_lr": {str(k): v for k, v in by_lr.items()},
            "baselines": res.baselines,
            "seconds": round(time.perf_counter() - t0, 1),
        }
    return results


def run_variant(
    name: str, args: argparse.Namespace, base: list[dict], inputs: tuple[Path, Path], heldout: Path
) -> dict:
    """Data, pretraining, held-out MLM on the common set, fine-tuning: one variant's record."""
    import torch

    from bert_core.pretrain import PretrainParams, pretrain
    from bert_core.pretrain_data.params import PretrainDataParams

    layers = [*base, VARIANTS[name]]
    dparams = stage_params("params/pretrain_data.yaml", "pretrain_data", PretrainDataParams, *layers)
    pparams = stage_params("params/pretrain.yaml", "pretrain", PretrainParams, *layers)
    pparams = pparams.model_copy(
        update={"time_budget_minutes": args.budget_minutes, "max_steps": None, "num_threads": args.threads}
    )
    pparams = PretrainParams.model_validate(pparams.model_dump())  # validated again with the budget
    vdir = args.work / "variants" / name
    t0 = time.perf_counter()
    data = data_for(args.work, dparams, *inputs)
    data_s = time.perf_counter() - t0
    torch.manual_seed(0)
    t0 = time.perf_counter()
    result = pretrain(pparams, data, inputs[1], vdir / "model", checkpoint_root=vdir / "checkpoints")
    pretrain_s = time.perf_counter() - t0
    common = heldout_mlm(vdir / "model", heldout, pparams.nsp, args.eval_batches)
    tasks = finetune(vdir / "model", vdir / "finetune", list(range(1, args.seeds + 1)), args.tiny)
    return {
        "variant": name,
        "overrides": VARIANTS[name],
        "steps": result.metrics["steps"],
        "phases": {k: v.get("steps") for k, v in result.metrics["phases"].items()},
        "train_seconds": result.metrics["train_seconds"],
        "own_heldout": result.metrics["heldout"],
        "common_heldout": common,
        "tasks": tasks,
        "seconds": {"data": round(data_s, 1), "pretrain": round(pretrain_s, 1)},
    }


# ------------------------------------------------------------------------------------------------ report
def table_rows(records: list[dict]) -> list[dict[str, Any]]:
    rows = []
    for r in records:
        h = r["common_heldout"]
        row = {
            "variant": r["variant"],
            "steps": r["steps"],
            "held-out MLM loss @15%": f"{h['mlm_loss']:.3f}",
            "held-out MLM acc @15%": f"{100 * h['mlm_acc']:.1f}",
        }
        for task, label in (("sst2", "SST-2 acc"), ("conll2003", "CoNLL F1")):
            t = r["tasks"][task]
            row[label] = f"{t['mean']:.1f} ± {t['std']:.1f} (lr {t['lr']:g})"
        rows.append(row)
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument(
        "--variants",
        default=",".join(DEFAULT_VARIANTS),
        help=f"comma-separated, or 'all' (of {', '.join(VARIANTS)})",
    )
    ap.add_argument(
        "--budget-minutes",
        type=float,
        default=None,
        help="pretraining wall clock per variant (default: the default profile's, 10; --tiny: 0.2)",
    )
    ap.add_argument(
        "--seeds", type=int, default=None, help="fine-tuning seeds per task (default 3; --tiny: 1)"
    )
    ap.add_argument(
        "--threads", type=int, default=None, help="torch CPU threads (default: the default profile's)"
    )
    ap.add_argument(
        "--eval-batches",
        type=int,
        default=None,
        help="batches of 64 of the common held-out set (default: all)",
    )
    ap.add_argument(
        "--work", type=Path, default=Path("/tmp/bench_cpu_recipe"), help="corpus, data, models, results"
    )
    ap.add_argument(
        "--resume", action="store_true", help="reuse the records of variants already done in --work"
    )
    ap.add_argument(
        "--tiny", action="store_true", help="a dry run: the tiny profile's data, 200-row fine-tuning"
    )
    ap.add_argument("--json", type=Path, default=None, help="results file (default <work>/results.json)")
    args = ap.parse_args(argv)
    names = (
        list(VARIANTS)
        if args.variants == "all"
        else [v.strip() for v in args.variants.split(",") if v.strip()]
    )
    if unknown := [n for n in names if n not in VARIANTS]:
        ap.error(f"--variants: unknown {unknown}; known: {', '.join(VARIANTS)}")
    if args.budget_minutes is None:
        args.budget_minutes = 0.2 if args.tiny else _default_budget()
    args.seeds = args.seeds or (1 if args.tiny else 3)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s", stream=sys.stderr)
    if not os.environ.get("BERT_DATA_ROOT") and SHARED.is_dir():
        os.environ["BERT_DATA_ROOT"] = str(SHARED)  # local data: no network
    if args.threads:
        import torch

        torch.set_num_threads(args.threads)
    base = [PAPER, TINY] if args.tiny else [PAPER]
    args.work.mkdir(parents=True, exist_ok=True)
    inputs = build_inputs(args.work, base)
    from bert_core.pretrain_data.params import PretrainDataParams

    # ONE held-out set for every variant: the default data params (15%, 80/10/10), seq128, static masks
    default_data = stage_params("params/pretrain_data.yaml", "pretrain_data", PretrainDataParams, *base)
    heldout = data_for(args.work, default_data, *inputs) / "seq128" / "heldout"
    records = []
    for name in names:
        record_file = args.work / "variants" / f"{name}.json"
        if args.resume and record_file.is_file():
            records.append(json.loads(record_file.read_text()))
            log.info("%s: reused %s", name, record_file)
            continue
        log.info("variant %s: %s", name, json.dumps(VARIANTS[name]))
        record = run_variant(name, args, base, inputs, heldout)
        record_file.parent.mkdir(parents=True, exist_ok=True)
        record_file.write_text(json.dumps(record, indent=2, default=str) + "\n")
        records.append(record)
    from bench._common import format_table, machine_info

    out = {
        "command": " ".join(sys.argv),
        "budget_minutes": args.budget_minutes,
        "seeds": args.seeds,
        "tiny": args.tiny,
        "heldout": str(heldout),
        "machine": machine_info(),
        "variants": records,
    }
    path = args.json or args.work / "results.json"
    path.write_text(json.dumps(out, indent=2, default=str) + "\n")
    print(format_table(table_rows(records)))
    print(f"\nresults: {path}")
    return 0


def _default_budget() -> float:
    from bert_core.params import load_params
    from bert_core.pretrain import PretrainParams

    return load_params(REPO / "params/pretrain.yaml", "pretrain", PretrainParams).time_budget_minutes or 10.0


if __name__ == "__main__":
    raise SystemExit(main())
