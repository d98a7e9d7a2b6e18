"""The three data stages (corpus -> vocab -> pretrain_data) at growing corpus sizes, and a projection.

**Subsets.** Nested subsets of the real corpus (``corpus/gutenberg`` books + ``corpus/wikipedia`` files
under the data root) of about ``--sizes`` MB of text each (default 4 20 40 80). Recipe: the books in
file-name order and the Wikipedia files in file-name order, each taken as the prefix whose text is
nearest the target times that part's share of the whole corpus (books are ~75% of the text). Prefixes of
fixed orders grow with the target, so every subset contains the smaller ones; a target above the corpus
takes all of it. Text size: a book file's bytes, a Wikipedia record's ``text`` bytes (no JSON overhead).
Each subset is a data root of symlinks, laid out as ``params/corpus.yaml``'s ``local_sources`` expect.

**Stages.** The committed params with every size cap lifted (``corpus``: each source's and the global
``max_bytes``/``max_documents``; ``vocab``: ``sample_max_bytes``/``sample_max_documents``) and, for
``pretrain_data``, the paper's objective (``bench_cpu_recipe.PAPER``, as ``gpu-base`` builds it), defaults
otherwise (worker counts included). Each stage runs in a fresh child process calling the library entry
(:func:`bert_core.corpus.build_corpus`, :func:`bert_core.vocab.train_vocab`,
:func:`bert_core.pretrain_data.build.build_pretrain_data`; no DVC, no Prefect, no MLflow). The parent samples
the RSS of the child and all its descendants every 50 ms (peak of the sum), and takes CPU time from
``getrusage(RUSAGE_CHILDREN)`` (the child and every worker it waited for). pretrain_data builds without its
checks and then runs the same checks (:func:`bert_core.pretrain_data.checks.check_output`) in the same
child: the cost is the stage's, and a failed check is reported beside the figures instead of discarding
the output.

**Google.** With ``--google-script PATH`` (``create_pretraining_data.py``, ``tokenization.py`` beside it),
the script runs unchanged under ``bench/tf1_shim.py`` (a stand-in for the few TensorFlow 1.x names it uses)
on the same text (our corpus's train split written one sentence per line, a blank line between documents),
with our vocab and the settings of our ``seq128`` phase.

**Fit and projection.** Least squares (``numpy.polyfit``, degree 1) of CPU time, wall time, peak memory
and output size against MB of text, per stage; then a projection for ``--project-mb`` of text on one
``--cores``-core machine (assumptions printed with it).

    .venv/bin/python bench/bench_scale.py --sizes 4 20 40 80 --work /tmp/bench_scale \\
        --google-script /tmp/google_cpd.py --json /tmp/bench_scale.json
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import shutil
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # run as a script: make `bench` importable

from bench._common import format_table, run_monitored  # noqa: E402

STAGES = ("corpus", "vocab", "pretrain_data")
GOOGLE = "google_cpd"
MB = 1e6


# --- subsets -------------------------------------------------------------------------------------------
@dataclass
class Subset:
    """One nested subset: its files and text bytes."""

    target_mb: float
    books: list[str] = field(default_factory=list)
    wiki: list[str] = field(default_factory=list)
    book_bytes: int = 0
    wiki_bytes: int = 0

    @property
    def name(self) -> str:
        return f"{self.target_mb:g}mb"

    @property
    def text_mb(self) -> float:
        return (self.book_bytes + self.wiki_bytes) / MB

    def describe(self) -> str:
        return (
            f"{self.name}: {self.text_mb:.1f} MB text = {len(self.books)} books "
            f"({self.books[0]}..{self.books[-1]}, {self.book_bytes / MB:.1f} MB) + {len(self.wiki)} "
            f"Wikipedia files ({self.wiki[0]}..{self.wiki[-1]}, {self.wiki_bytes / MB:.1f} MB)"
        )


def _wiki_text_bytes(path: Path) -> int:
    with path.open(encoding="utf-8") as fh:
        return sum(len(json.loads(line).get("text", "").encode("utf-8")) for line in fh if line.strip())


def _prefix(sizes: list[int], target: float) -> int:
    """Length (at least 1) of the prefix of ``sizes`` whose sum is nearest ``target`` (the shorter on a tie).

    The nearest prefix never shrinks as ``target`` grows, so the subsets stay nested.
    """
    best, total = 1, 0
    for i, n in enumerate(sizes):
        total += n
        if i == 0 or abs(total - target) < abs(sum(sizes[:best]) - target):
            best = i + 1
    return best


def choose_subsets(corpus_dir: Path, sizes_mb: list[float]) -> list[Subset]:
    """The nested subsets (recipe in the module docstring), smallest first.

    Raises:
        FileNotFoundError: ``corpus_dir`` lacks ``gutenberg/*.txt`` or ``wikipedia/*.jsonl``.
    """
    books = sorted((corpus_dir / "gutenberg").glob("*.txt"))
    wiki = sorted((corpus_dir / "wikipedia").glob("*.jsonl"))
    if not books or not wiki:
        raise FileNotFoundError(
            f"{corpus_dir}: expected gutenberg/*.txt and wikipedia/*.jsonl (the real corpus, see "
            "shared/data/PROVENANCE.md); pass --data-root DIR holding corpus/"
        )
    book_sizes = [p.stat().st_size for p in books]
    wiki_sizes = [_wiki_text_bytes(p) for p in wiki]
    share = sum(book_sizes) / (sum(book_sizes) + sum(wiki_sizes))
    out = []
    for t in sorted(sizes_mb):
        nb, nw = _prefix(book_sizes, t * MB * share), _prefix(wiki_sizes, t * MB * (1 - share))
        out.append(
            Subset(
                t,
                [p.name for p in books[:nb]],
                [p.name for p in wiki[:nw]],
                sum(book_sizes[:nb]),
                sum(wiki_sizes[:nw]),
            )
        )
    return out


def materialize(subset: Subset, data_root: Path, work: Path) -> Path:
    """A data root of symlinks holding the subset (plus the reference vocab the vocab stage compares with)."""
    root = work / "roots" / subset.name
    shutil.rmtree(root, ignore_errors=True)
    for part, names in (("gutenberg", subset.books), ("wikipedia", subset.wiki)):
        d = root / "corpus" / part
        d.mkdir(parents=True)
        for name in names:
            (d / name).symlink_to((data_root / "corpus" / part / name).resolve())
    ref = data_root / "checkpoints" / "bert-base-uncased" / "vocab.txt"
    if ref.is_file():
        (root / "checkpoints" / "bert-base-uncased").mkdir(parents=True)
        (root / "checkpoints" / "bert-base-uncased" / "vocab.txt").symlink_to(ref.resolve())
    return root


# --- params --------------------------------------------------------------------------------------------
def stage_params(stage: str):
    """The committed params of ``stage`` with every size cap lifted (see the module docstring)."""
    from bert_core.params import load_params

    if stage == "corpus":
        from bert_core.corpus import CorpusParams

        p = load_params(REPO / "params" / "corpus.yaml", "corpus", CorpusParams).model_dump()
        for src in (*p["sources"], *p["local_sources"]):
            src["max_bytes"] = src["max_documents"] = None
        p["cap"] = {"max_bytes": None, "max_documents": None}
        return CorpusParams.model_validate(p)
    if stage == "vocab":
        from bert_core.vocab import VocabParams

        p = load_params(REPO / "params" / "vocab.yaml", "vocab", VocabParams).model_dump()
        p["sample_max_bytes"], p["sample_max_documents"] = 2**62, None  # an int field: "no bound"
        return VocabParams.model_validate(p)
    from bench.bench_cpu_recipe import PAPER
    from bench.bench_cpu_recipe import stage_params as cpu_recipe_params
    from bert_core.pretrain_data.params import PretrainDataParams

    # The paper's objective (both phases, 15% masking, NSP pairs at 50%), as gpu-base builds it: the data a
    # corpus of this size is for, and the NSP balance the suite must see kept. One spelling: the recipe bench's.
    return cpu_recipe_params("params/pretrain_data.yaml", "pretrain_data", PretrainDataParams, PAPER)


def run_corpus(root: Path, out: Path, reports: Path | None = None) -> dict[str, Any]:
    """The corpus stage on the data root ``root``; its figures (raises on a failed critical check)."""
    from bert_core.corpus import build_corpus

    stats = build_corpus(stage_params("corpus"), out, data_root=root, report_dir=reports)
    m = stats.as_metrics()
    return {
        "input_mb": m["input_bytes"] / MB,
        "documents": m["documents"],
        "sentences": m["sentences"],
        "checks_passed": stats.check_report.success,
        "checks_failed": stats.check_report.summary()["failed"],
    }


def run_vocab(root: Path, corpus: Path, out: Path, reports: Path | None = None) -> dict[str, Any]:
    """The vocab stage on ``corpus``; its figures (raises on a failed critical check)."""
    from bert_core.vocab import train_vocab

    params = stage_params("vocab")
    ref = root / params.reference_local if params.reference_local else None
    stats = train_vocab(
        params, corpus, out, reference_vocab=ref if ref and ref.is_file() else None, report_dir=reports
    )
    return {
        "vocab_size": stats.vocab_size,
        "sample_mb": stats.sample_bytes / MB,
        "checks_passed": stats.check_report.success,
        "checks_failed": stats.check_report.summary()["failed"],
    }


def run_pretrain_data(corpus: Path, vocab: Path, out: Path, reports: Path | None = None) -> dict[str, Any]:
    """The pretrain_data stage, then its data checks on every output; figures per phase and split."""
    from bert_core.pretrain_data.build import SPLITS, build_pretrain_data
    from bert_core.pretrain_data.checks import check_output

    params = stage_params("pretrain_data")
    result = build_pretrain_data(params, corpus_dir=corpus, vocab_dir=vocab, output_dir=out, run_checks=False)
    outputs: dict[str, Any] = {}
    for phase in params.phases:
        for split in SPLITS:
            rd = reports / f"{phase}-{split}" if reports is not None else None
            report, sample = check_output(
                out / phase / split, sample_size=params.check_sample, seed=params.seed, report_dir=rd
            )
            m = result.metrics[phase][split]
            outputs[f"{phase}/{split}"] = {
                "instances": m["instances"],
                "is_next_share": m["is_next_share"],
                "target_is_next_share": 1 - params.random_next_prob,
                "checks_passed": report.success,
                "checks_failed_critical": report.summary()["failed_critical"],
                "checks_failed": report.summary()["failed"],
                "check_sample": sample["instances"],
            }
    return {
        "outputs": outputs,
        "instances": sum(o["instances"] for o in outputs.values()),
        "checks_passed": all(o["checks_passed"] for o in outputs.values()),
    }


def write_google_input(corpus: Path, path: Path) -> dict[str, int]:
    """Our train split as Google's input: one sentence per line, a blank line between documents."""
    from bert_core.corpus.shards import iter_documents

    docs = lines = 0
    with path.open("w", encoding="utf-8") as fh:
        for doc in iter_documents(corpus, "train", columns=["sentences"]):
            sents = [" ".join(s.split()) for s in doc["sentences"]]
            sents = [s for s in sents if s]
            if sents:
                fh.write("\n".join(sents) + "\n\n")
                docs, lines = docs + 1, lines + len(sents)
    return {"documents": docs, "sentences": lines, "bytes": path.stat().st_size}


def google_flags(vocab: Path) -> dict[str, Any]:
    """Google's flags matching our ``seq128`` phase and params."""

    pd, voc = stage_params("pretrain_data"), stage_params("vocab")
    spec = pd.phase_specs["seq128"]
    return {
        "vocab_file": str(vocab / "vocab.txt"),
        "do_lower_case": voc.lowercase,
        "do_whole_word_mask": pd.whole_word_masking,
        "max_seq_length": spec.max_seq_length,
        "max_predictions_per_seq": spec.max_predictions_per_seq,
        "random_seed": pd.seed,
        "dupe_factor": pd.dupe_factor,
        "masked_lm_prob": pd.masked_lm_prob,
        "short_seq_prob": pd.short_seq_prob,
    }


# --- child processes -----------------------------------------------------------------------------------
def child(args: argparse.Namespace) -> None:
    """One stage in this (fresh) process; prints its figures as one JSON line."""
    d, root = Path(args.dir), Path(args.root)
    (d / "reports").mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    if args.child == "corpus":
        res = run_corpus(root, d / "corpus", d / "reports" / "corpus")
    elif args.child == "vocab":
        res = run_vocab(root, d / "corpus", d / "vocab", d / "reports" / "vocab")
    else:
        res = run_pretrain_data(
            d / "corpus", d / "vocab", d / "pretrain_data", d / "reports" / "pretrain_data"
        )
    me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    res |= {
        "wall_s": time.perf_counter() - t0,  # the stage's own wall time (imports excluded)
        "parent_cpu_s": me.ru_utime + me.ru_stime,  # this process, its threads included
        "workers_cpu_s": kids.ru_utime + kids.ru_stime,  # its worker processes
    }
    print(json.dumps(res), flush=True)


def disk_mb(path: Path) -> float:
    """Bytes of the files under ``path`` (apparent sizes), in MB."""
    if path.is_file():
        return path.stat().st_size / MB
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file() and not f.is_symlink()) / MB


def monitored(cmd: list[str], stderr_path: Path) -> dict[str, Any]:
    """Run ``cmd`` under :func:`bench._common.run_monitored`; add process-tree CPU and wall time."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    with stderr_path.open("w") as err:
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=err, text=True)
        try:
            res = run_monitored(proc)
        except SystemExit as exc:
            raise SystemExit(f"{exc}; command: {' '.join(cmd)}; its log: {stderr_path}") from None
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    res["process_wall_s"] = time.perf_counter() - t0  # interpreter start and imports included
    res["cpu_s"] = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    res["load_1m"] = os.getloadavg()[0]
    return res


def run_size(subset: Subset, args: argparse.Namespace) -> dict[str, Any]:
    """Every stage (and Google's script) on one subset; results per stage."""
    root = materialize(subset, args.data_root, args.work)
    d = args.work / subset.name
    shutil.rmtree(d, ignore_errors=True)
    d.mkdir(parents=True)
    results: dict[str, Any] = {}
    outs = {"corpus": d / "corpus", "vocab": d / "vocab", "pretrain_data": d / "pretrain_data"}
    for stage in STAGES:
        cmd = [sys.executable, __file__, "--child", stage, "--dir", str(d), "--root", str(root)]
        res = monitored(cmd, d / f"{stage}.log")
        res["output_mb"] = disk_mb(outs[stage])
        results[stage] = res
        print(f"  {subset.name} {stage}: {summary_line(res)}", file=sys.stderr, flush=True)
    if args.google_script is not None:
        g = d / "google"
        g.mkdir()
        results[GOOGLE + "_input"] = write_google_input(outs["corpus"], g / "input.txt")
        flags = google_flags(outs["vocab"]) | {
            "input_file": str(g / "input.txt"),
            "output_file": str(g / "seq128.tfrecord"),
        }
        shim = Path(__file__).with_name("tf1_shim.py")
        cmd = [sys.executable, str(shim), str(args.google_script), *(f"--{k}={v}" for k, v in flags.items())]
        res = monitored(cmd, g / "google.log")
        res["wall_s"], res["parent_cpu_s"], res["workers_cpu_s"] = res["process_wall_s"], res["cpu_s"], 0.0
        res["output_mb"] = disk_mb(g / "seq128.tfrecord")
        res["flags"] = flags
        results[GOOGLE] = res
        print(f"  {subset.name} {GOOGLE}: {summary_line(res)}", file=sys.stderr, flush=True)
    if not args.keep:  # the corpus and vocab are small; the instances are not
        shutil.rmtree(outs["pretrain_data"], ignore_errors=True)
        shutil.rmtree(d / "google", ignore_errors=True)
    return results


def summary_line(r: dict[str, Any]) -> str:
    return (
        f"wall {r['wall_s']:.1f}s, CPU {r['cpu_s']:.1f}s, peak {r['peak_rss_mb']:.0f} MB, "
        f"out {r['output_mb']:.1f} MB"
    )


# --- report --------------------------------------------------------------------------------------------
def instances_cell(stage: str, r: dict[str, Any]) -> str:
    if stage == "pretrain_data":
        return "; ".join(f"{k} {o['instances']:,}" for k, o in r["outputs"].items())
    if stage == GOOGLE:
        return f"seq128/train {r['instances']:,}"
    return ""


def checks_cell(stage: str, r: dict[str, Any]) -> str:
    if stage == GOOGLE:
        return f"(none; IsNext {r['is_next_share']:.3f})"
    if stage == "pretrain_data":
        cells = []
        for key, o in r["outputs"].items():
            crit, advisory = (
                o["checks_failed_critical"],
                len(o["checks_failed"]) - len(o["checks_failed_critical"]),
            )
            verdict = f"FAIL {_columns(crit)}" if crit else "pass"
            cells.append(
                f"{key} {verdict}{f' ({advisory} advisory)' if advisory else ''}, IsNext {o['is_next_share']:.3f}"
            )
        return "; ".join(cells)
    return "pass" if r["checks_passed"] else f"advisory failed: {_columns(r['checks_failed'])}"


def _columns(checks: list[str]) -> str:
    """The columns named in check names (``expect_...(column='is_next', ...)`` -> ``is_next``)."""
    return ",".join(m.group(1) if (m := re.search(r"column='([^']+)'", c)) else c for c in checks)


def results_table(subsets: list[Subset], results: dict[str, dict[str, Any]]) -> str:
    rows = []
    for s in subsets:
        for stage, r in results[s.name].items():
            if stage.endswith("_input"):
                continue
            rows.append(
                {
                    "MB text": f"{s.text_mb:.1f}",
                    "stage": stage,
                    "wall s": r["wall_s"],
                    "CPU s (tree)": r["cpu_s"],
                    "CPU s workers": r["workers_cpu_s"],
                    "peak RSS MB (procs)": f"{r['peak_rss_mb']:,.0f} ({r['processes_at_peak']})",
                    "output MB": r["output_mb"],
                    "instances": instances_cell(stage, r),
                    "checks": checks_cell(stage, r),
                }
            )
    return format_table(rows)


def fit(results: dict[str, dict[str, Any]], subsets: list[Subset]) -> dict[str, dict[str, list[float]]]:
    """Per stage and figure: ``[slope per MB of text, intercept]`` from ``numpy.polyfit(deg=1)``."""
    import numpy as np

    x = np.array([s.text_mb for s in subsets])
    figures = {
        "cpu_s": "cpu_s",
        "serial_cpu_s": "parent_cpu_s",
        "parallel_cpu_s": "workers_cpu_s",
        "wall_s": "wall_s",
        "peak_rss_mb": "peak_rss_mb",
        "output_mb": "output_mb",
    }
    fits: dict[str, dict[str, list[float]]] = {}
    for stage in (*STAGES, GOOGLE):
        if not all(stage in results[s.name] for s in subsets):
            continue
        fits[stage] = {}
        for name, key in figures.items():
            y = np.array([results[s.name][stage][key] for s in subsets], dtype=float)
            slope, icpt = np.polyfit(x, y, 1)
            fits[stage][name] = [float(slope), float(icpt)]
    return fits


def fits_table(fits: dict[str, dict[str, list[float]]]) -> str:
    rows = []
    for stage, f in fits.items():
        rows.append(
            {
                "stage": stage,
                "CPU s/MB": f["cpu_s"][0],
                "of which serial (parent) s/MB": f["serial_cpu_s"][0],
                "wall s/MB (this machine)": f["wall_s"][0],
                "peak RSS MB/MB": f["peak_rss_mb"][0],
                "peak RSS at 0 MB": f["peak_rss_mb"][1],
                "output MB/MB": f["output_mb"][0],
            }
        )
    return format_table(rows)


def workers_used(stage: str) -> int:
    if stage == "corpus":
        return stage_params("corpus").workers
    if stage == "pretrain_data":
        return stage_params("pretrain_data").num_workers
    return 1


def per_worker_rss(stage: str, results: dict[str, dict[str, Any]], subsets: list[Subset]) -> float:
    """Largest RSS of one descendant in any peak sample of ``stage`` (0 when it has none)."""
    return max((max(results[s.name][stage]["rss_at_peak_mb"][1:], default=0.0) for s in subsets), default=0.0)


def project(
    fits: dict[str, dict[str, list[float]]],
    results: dict[str, dict[str, Any]],
    subsets: list[Subset],
    mb: float,
    cores: int,
) -> tuple[str, list[str]]:
    """The projection table and its assumptions."""

    def at(stage: str, name: str) -> float:
        slope, icpt = fits[stage][name]
        return max(0.0, slope * mb + icpt)

    rows = []
    for stage in fits:
        serial, parallel = at(stage, "serial_cpu_s"), at(stage, "parallel_cpu_s")
        if stage in ("vocab", GOOGLE):  # one process: its serial part is not known, give both ends
            low, high = (serial + parallel) / cores, serial + parallel
        else:
            low, high = max(serial, (serial + parallel) / cores), serial + parallel / cores
        extra = max(0, cores - workers_used(stage)) * per_worker_rss(stage, results, subsets)
        if stage in ("vocab", GOOGLE):
            extra = 0.0
        peak = at(stage, "peak_rss_mb") + extra
        if stage == "pretrain_data":  # bounded by design (one window per worker): no growth with the text
            parent = max(results[s.name][stage]["rss_at_peak_mb"][0] for s in subsets)
            peak = parent + cores * per_worker_rss(stage, results, subsets)
        rows.append(
            {
                "stage": stage,
                "CPU h": (serial + parallel) / 3600,
                f"wall h on {cores} cores": f"{low / 3600:.2f} .. {high / 3600:.2f}",
                "peak memory GB": peak / 1000,
                "disk GB": at(stage, "output_mb") / 1000,
            }
        )
    notes = [
        f"- Text: {mb:,.0f} MB (Wikipedia + BooksCorpus), linear in MB of text (the fits above).",
        f"- corpus, pretrain_data: the workers' CPU-seconds split over {cores} cores; the parent "
        "process's CPU-seconds (planning, merge/de-dup/held-out/shard writing, index, checks) are serial. "
        "Range: all overlapped (max(serial, total/cores)) .. none overlapped (serial + workers/cores).",
        f"- Peak memory of corpus: the fitted peak of the measured run (corpus.workers="
        f"{workers_used('corpus')}) plus, per extra worker up to {cores}, the largest single worker RSS "
        "measured (a worker holds one work unit, not the corpus).",
        "- Peak memory of pretrain_data: no linear term (a worker holds one window of "
        "pretrain_data.window_tokens tokens, the parent only the plan): the largest parent RSS measured at "
        f"any size plus {cores} times the largest single worker RSS measured.",
        "- vocab: one process; the tokenizer counts words on Rust threads, the merges are learned in one "
        f"Python thread, and the split is not measured here: range CPU/{cores} .. CPU. With the committed "
        "vocab.sample_max_bytes "
        f"({stage_params_default_vocab_cap() / MB:,.0f} MB) instead of no cap, its cost stops growing at "
        "that sample size.",
        f"- {GOOGLE}: one single-threaded process holding every instance in memory until it writes; the "
        f"low end is the usual workaround (input split {cores} ways, {cores} processes; memory stays the "
        "sum). It builds the seq128 phase only; ours builds both of the paper's phases.",
        "- Wall times taken on a shared or small machine are not used: the hours come from CPU-seconds.",
        "- A linear fit carries any growth seen between the measured sizes a few hundred times further: "
        "read the per-size peaks above before trusting a memory figure (few sizes, or RSS noise of tens "
        "of MB, move the slope a lot). The vocab's word counts grow slower than the text (new words get "
        "rarer), so its linear memory figure is an upper bound.",
    ]
    return format_table(rows), notes


def stage_params_default_vocab_cap() -> int:
    from bert_core.params import load_params
    from bert_core.vocab import VocabParams

    return load_params(REPO / "params" / "vocab.yaml", "vocab", VocabParams).sample_max_bytes


# --- main ----------------------------------------------------------------------------------------------
def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--data-root",
        type=Path,
        default=Path(os.environ.get("BERT_DATA_ROOT", REPO.parent / "shared" / "data")),
        help="holds corpus/gutenberg and corpus/wikipedia (default: $BERT_DATA_ROOT or ../shared/data)",
    )
    ap.add_argument("--sizes", type=float, nargs="+", default=[4, 20, 40, 80], help="MB of text per subset")
    ap.add_argument("--work", type=Path, default=Path("/tmp/bench_scale"), help="outputs go here")
    ap.add_argument("--json", type=Path, help="write every figure here")
    ap.add_argument("--google-script", type=Path, help="Google's create_pretraining_data.py (optional)")
    ap.add_argument("--project-mb", type=float, default=16_000, help="corpus size to project to (MB of text)")
    ap.add_argument("--cores", type=int, default=16, help="cores of the machine projected to")
    ap.add_argument("--keep", action="store_true", help="keep the pretrain_data and Google outputs")
    ap.add_argument("--child", choices=STAGES, help=argparse.SUPPRESS)
    ap.add_argument("--dir", help=argparse.SUPPRESS)
    ap.add_argument("--root", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        child(args)
        return
    args.data_root = args.data_root.resolve()
    args.work = args.work.resolve()
    if args.google_script is not None:
        gs = args.google_script
        if not gs.is_file() or not gs.with_name("tokenization.py").is_file():
            print(f"Google's script: skipped ({gs} or tokenization.py beside it not found)")
            args.google_script = None
        else:
            args.google_script = gs.resolve()
    subsets = choose_subsets(args.data_root / "corpus", args.sizes)
    args.work.mkdir(parents=True, exist_ok=True)
    print(f"Subsets (nested; books and Wikipedia files in file-name order) of {args.data_root / 'corpus'}:")
    for s in subsets:
        print(f"- {s.describe()}")
    print("Caps lifted: corpus sources' and cap's max_bytes/max_documents -> none; vocab sample_max_bytes ->")
    print(
        f"  unbounded, sample_max_documents -> none. Machine: {os.cpu_count()} cores; load {os.getloadavg()}"
    )
    results: dict[str, dict[str, Any]] = {}
    for s in subsets:
        results[s.name] = run_size(s, args)
    if args.google_script is not None:
        flags = {k: v for k, v in results[subsets[0].name][GOOGLE]["flags"].items() if "file" not in k}
        print(f"\nGoogle's create_pretraining_data.py flags (our seq128 phase): {json.dumps(flags)}")
    print("\n" + results_table(subsets, results))
    out: dict[str, Any] = {
        "subsets": [asdict(s) | {"text_mb": s.text_mb} for s in subsets],
        "results": results,
    }
    if len(subsets) >= 2:
        fits = fit(results, subsets)
        table, notes = project(fits, results, subsets, args.project_mb, args.cores)
        print("\nPer MB of text (least squares, numpy.polyfit deg 1):\n\n" + fits_table(fits))
        print(
            f"\nProjection: {args.project_mb / 1000:g} GB of text on one {args.cores}-core machine:\n\n{table}"
        )
        print("\n" + "\n".join(notes))
        out |= {"fits": fits, "projection_notes": notes}
    else:
        print("\nFit and projection: skipped (they need at least two sizes).")
    if args.json:
        args.json.write_text(json.dumps(out, indent=2))
        print(f"\nwrote {args.json}")


if __name__ == "__main__":
    main()
