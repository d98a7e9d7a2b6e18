"""The ``pretrain_data`` builder: corpus shards -> MLM + NSP instances, in parallel, streaming, bounded memory.

Work is split into *tasks* of consecutive documents holding about ``task_bytes`` of text (a shard may hold
several tasks, a task may span shards; :mod:`.plan`). Tasks are planned from the Parquet metadata alone, so
the plan, every seed and therefore every output byte are the same whatever ``num_workers`` is. A worker
(:mod:`.worker`) streams its task's documents and holds one window of about ``window_tokens`` tokens at a
time, so peak memory is a function of ``window_tokens`` and the number of workers, never of the corpus size
(Google's generator keeps every instance of every pass in memory: 64-70 GB for its users).

NSP balance over the whole output. Google's rule draws a document's target length once, so a whole book
can draw a short target and yield thousands of single-sentence chunks, all forced to NotNext. The balancer
in :func:`.instances.create_pairs` offsets forced NotNext only inside one task (~``task_bytes`` of text),
so such a task ends far from ``random_next_prob`` while its neighbours, balanced on their own, cannot
help. Balancing strictly in corpus order would need the tasks to run one after another; instead every
task first runs in parallel as it is, and then, per phase and split, the builder sums each task's
residual (``random_next - random_next_prob * instances``). When the total exceeds what rounding leaves
(about one instance per task), it walks the tasks in order and gives those that still made choices the
other way (NotNext by the balancer or the coin in multi-sentence chunks, or IsNext) a starting
:attr:`.instances.NspCounter.offset` that makes their balancer lean that many instances the other way,
and runs just those tasks again, for just that phase, rewriting their shards. Leaning changes how chunks
are cut, so the figure is measured again and the step repeated, at most :data:`NSP_MAX_ROUNDS` times.
Every decision depends on the tasks' deterministic results only, so the output stays the same for any
``num_workers``; Google's per-document statistics (short targets, chunking) are untouched, only the
NotNext/IsNext choice of multi-sentence chunks moves. When forced NotNext alone exceed
``random_next_prob`` no choice is left to make: the NotNext share is then the forced share, and the
build says so (a warning and the ``nsp_*`` metrics); the data checks hold the output to that derived
share (:mod:`.checks`).

Every task's shards go to a work directory beside the output, where each finished task is recorded as it
ends, so that a build stopped by a crash or a signal continues after its finished tasks (:mod:`.partial`).
The output is validated by the data checks (:mod:`.checks`) there and only then moved into place through
:func:`bert_core.atomic.atomic_path`: a crash or a failed check leaves no output.
"""

from __future__ import annotations

import contextlib
import json
import logging
import multiprocessing as mp
import os
import shutil
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bert_core.atomic import atomic_path
from bert_core.pretrain_data.params import PretrainDataParams
from bert_core.pretrain_data.partial import PartialBuild, build_identity, partial_dir
from bert_core.pretrain_data.plan import plan_tasks
from bert_core.pretrain_data.storage import FORMAT, FORMAT_VERSION
from bert_core.pretrain_data.worker import BuildUnit, Job, run_task
from bert_core.progress import Progress
from bert_core.vocab.info import load_tokenizer, read_vocab

log = logging.getLogger(__name__)

SPLITS = ("train", "heldout")


@dataclass
class BuildResult:
    """Metrics per phase and split (``metrics[phase][split][name]``) and the data-check reports."""

    metrics: dict[str, Any]
    reports: list[Any] = field(default_factory=list)
    seconds: float = 0.0
    workers: int = 1

    def as_metrics(self) -> dict[str, Any]:
        """The stage's metrics: per phase and split, plus the build's time and throughput."""
        per_output = [m for phase in self.metrics.values() for m in phase.values()]
        seconds = max(self.seconds, 1e-9)
        return {
            **self.metrics,
            "elapsed_s": round(self.seconds, 3),
            "instances_per_s": sum(m["instances"] for m in per_output) / seconds,
            "tokens_per_s": sum(m["tokens"] for m in per_output) / seconds,
            "workers": self.workers,
        }


NSP_MAX_ROUNDS = 4  # re-runs of compensating tasks per phase and split (one or two suffice in practice)


def nsp_tolerance(num_tasks: int) -> float:
    """NotNext instances by which a balanced output may miss ``random_next_prob * instances``: each
    task's balancer stops within about one instance of its target."""
    return float(max(num_tasks, 1))


def nsp_residual(stats: dict[str, int], random_next_prob: float) -> float:
    """NotNext instances above (positive) or below the ``random_next_prob`` share of ``stats``."""
    return stats["random_next"] - random_next_prob * stats["instances"]


def plan_nsp_compensation(
    stats: list[dict[str, int]], offsets: list[float], random_next_prob: float
) -> dict[int, float]:
    """Which tasks to run again, and with which NSP offset, so the tasks' total residual goes to zero.

    Args:
        stats: Each task's counters for one phase and split, in task order.
        offsets: The offset each task last ran with.
        random_next_prob: The NotNext share asked for.

    Returns:
        ``{task position: new offset}``; empty when the total is within :func:`nsp_tolerance` or no task
        has a choice left to move.
    """
    need = sum(nsp_residual(s, random_next_prob) for s in stats)
    if abs(need) <= nsp_tolerance(len(stats)):
        return {}
    sign = 1.0 if need > 0 else -1.0
    picks: dict[int, float] = {}
    for k, s in enumerate(stats):
        # the choices this task made the way the total is off: they can go the other way
        spare = s["random_next"] - s["forced_random"] if sign > 0 else s["instances"] - s["random_next"]
        take = min(abs(need), float(spare))
        if take < 1:
            continue
        picks[k] = offsets[k] + sign * take
        need -= sign * take
        if abs(need) < 1:
            break
    return picks


def _init_worker(threads: int, parent: int) -> None:
    """Worker start-up: size the tokenizer's thread pool (before its first use) and die with the parent.

    A killed build must not leave workers running on (Linux: ``PR_SET_PDEATHSIG``; elsewhere they stop
    when their task queue closes).
    """
    os.environ["RAYON_NUM_THREADS"] = str(threads)
    with contextlib.suppress(Exception):
        import ctypes

        ctypes.CDLL("libc.so.6").prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    if os.getppid() != parent:  # the parent died before prctl took effect
        os._exit(1)


def _execute(
    jobs: list[Job], num_workers: int, on_result: Callable[[int, dict[str, Any]], None] | None = None
) -> list[dict[str, Any]]:
    """Run the jobs; results in job order, each also given to ``on_result(position, result)`` as it ends.

    Raises:
        RuntimeError: a worker process died (e.g. killed for memory) instead of hanging the build.
    """
    results: list[dict[str, Any]] = [{} for _ in jobs]

    def done(i: int, result: dict[str, Any]) -> None:
        results[i] = result
        if on_result is not None:
            on_result(i, result)

    if num_workers == 1 or len(jobs) <= 1:  # none: every task was kept by an earlier run
        for i, job in enumerate(jobs):
            done(i, run_task(job))
        return results
    from concurrent.futures import ProcessPoolExecutor, as_completed
    from concurrent.futures.process import BrokenProcessPool

    workers = min(num_workers, len(jobs))
    threads = max(1, (os.cpu_count() or 1) // workers)
    ctx = mp.get_context("spawn")  # fresh interpreters: no inherited tokenizer threads or locks
    try:
        with ProcessPoolExecutor(
            workers, mp_context=ctx, initializer=_init_worker, initargs=(threads, os.getpid())
        ) as ex:
            futures = {ex.submit(run_task, job): i for i, job in enumerate(jobs)}
            try:
                for future in as_completed(futures):
                    done(futures[future], future.result())
            except BaseException:
                ex.shutdown(wait=False, cancel_futures=True)
                raise
    except BrokenProcessPool as err:
        raise RuntimeError(
            f"a pretrain_data worker process died ({err}); it may have been killed for memory (lower "
            f"window_tokens or num_workers), or the calling script lacks an `if __name__ == '__main__':` "
            f"guard (worker processes are spawned and re-import the main module)"
        ) from err
    return results


def summarize(stats: dict[str, int], corpus: dict[str, int], max_seq_length: int) -> dict[str, Any]:
    """Turn the workers' counters into the stage's metrics for one phase and split."""
    n = max(stats["instances"], 1)
    preds = stats["predictions"]
    forced = stats.get("forced_random", 0) / n
    out: dict[str, Any] = {
        "instances": stats["instances"],
        "tokens": stats["tokens"],
        "mean_length": stats["tokens"] / n,
        "padding_share": 1 - stats["tokens"] / max(stats["slots"], 1),
        "truncated_share": stats["truncated"] / n,
        "short_target_share": stats["short_target"] / n,
        "is_next_share": 1 - stats["random_next"] / n,
        "forced_not_next_share": forced,
        "mean_a_tokens": stats["a_tokens"] / n,
        "mean_b_tokens": stats["b_tokens"] / n,
        "corpus_documents": corpus["documents"],
        "corpus_sentences": corpus["sentences"],
        "corpus_tokens": corpus["tokens"],
        "windows": corpus["windows"],
        "max_seq_length": max_seq_length,
    }
    if preds:
        out |= {
            "predictions": preds,
            "predictions_per_instance": preds / n,
            "masked_share": preds / max(stats["eligible"], 1),
            "mask_share": stats["pred_mask"] / preds,
            "random_share": stats["pred_random"] / preds,
            "keep_share": stats["pred_keep"] / preds,
        }
    return out


def _sum(dicts: list[dict[str, int]]) -> dict[str, int]:
    out: dict[str, int] = {}
    for d in dicts:
        for k, v in d.items():
            out[k] = out.get(k, 0) + v
    return out


def _balance_nsp(
    params: PretrainDataParams,
    plans: dict[str, list[BuildUnit]],
    by_split: dict[str, list[dict[str, Any]]],
    out_dir: str,
    vocab_dir: str,
) -> dict[str, dict[str, dict[str, Any]]]:
    """Balance NSP over each whole output (module docstring): re-run compensating tasks, replacing their
    entries in ``by_split`` in place; return the ``nsp_*`` metrics per phase and split."""
    p = params.random_next_prob
    metrics: dict[str, dict[str, dict[str, Any]]] = {phase: {} for phase in params.phases}
    pending = [(phase, split) for phase in params.phases for split in SPLITS] if params.nsp_balance else []
    rounds = dict.fromkeys(pending, 0)
    rerun = dict.fromkeys(pending, 0)
    for _ in range(NSP_MAX_ROUNDS):
        redo: dict[tuple[str, int], dict[str, float]] = {}  # (split, task position) -> phase -> offset
        for phase, split in pending:
            rs = by_split[split]
            picks = plan_nsp_compensation(
                [r["phases"][phase]["stats"] for r in rs], [r["phases"][phase]["nsp_offset"] for r in rs], p
            )
            for k, offset in picks.items():
                redo.setdefault((split, k), {})[phase] = offset
            if picks:
                rounds[phase, split] += 1
                rerun[phase, split] += len(picks)
        if not redo:
            break
        keys = sorted(redo, key=lambda sk: (SPLITS.index(sk[0]), sk[1]))
        jobs = [
            Job(
                plans[split][k],
                out_dir,
                vocab_dir,
                params.model_dump(mode="json"),
                phases=tuple(ph for ph in params.phases if ph in redo[split, k]),
                nsp_offset=redo[split, k],
            )
            for split, k in keys
        ]
        log.info("pretrain_data: NSP balance: running %d task(s) again with an offset", len(jobs))
        for (split, k), r in zip(keys, _execute(jobs, params.num_workers), strict=True):
            by_split[split][k]["phases"] |= r["phases"]
        pending = sorted({(ph, split) for split, k in keys for ph in redo[split, k]})
    for phase in params.phases:
        for split in SPLITS:
            rs = by_split[split]
            stats = _sum([r["phases"][phase]["stats"] for r in rs])
            n = max(stats["instances"], 1)
            forced = stats["forced_random"] / n
            residual = nsp_residual(stats, p)
            tol = nsp_tolerance(len(rs))
            m: dict[str, Any] = {
                "nsp_residual": residual,
                "nsp_rounds": rounds.get((phase, split), 0),
                "nsp_tasks_rerun": rerun.get((phase, split), 0),
            }
            if params.nsp_balance:
                expected = max(p, forced)
                m["nsp_balanced"] = bool(abs(residual) <= tol)
                if p == 0:  # data for MLM alone (pretrain.nsp: false): the pair layout stays, no choice made
                    log.info(
                        "pretrain_data %s/%s: random_next_prob = 0: every multi-sentence chunk is IsNext; "
                        "the %.4f single-sentence chunks still take B from another document",
                        phase,
                        split,
                        forced,
                    )
                elif forced > p:
                    log.warning(
                        "pretrain_data %s/%s: %.4f of the instances are single-sentence chunks, forced to "
                        "NotNext: more than random_next_prob = %s, so nsp_balance cannot reach it; every "
                        "other chunk is IsNext and the NotNext share is %.4f. The corpus has unusually "
                        "short documents or sentences (check the corpus stage's segmentation)",
                        phase,
                        split,
                        forced,
                        p,
                        stats["random_next"] / n,
                    )
                elif abs(residual) > tol:
                    log.warning(
                        "pretrain_data %s/%s: NotNext share %.4f misses random_next_prob = %s by %.0f "
                        "instances after %d NSP balance round(s)",
                        phase,
                        split,
                        stats["random_next"] / n,
                        p,
                        residual,
                        NSP_MAX_ROUNDS,
                    )
            else:
                expected = forced + p * (1 - forced)  # Google's rule: forced, else a coin
            m["expected_not_next_share"] = expected
            metrics[phase][split] = m
    return metrics


def build_pretrain_data(
    params: PretrainDataParams,
    *,
    corpus_dir: str | Path,
    vocab_dir: str | Path,
    output_dir: str | Path,
    report_dir: str | Path | None = None,
    run_checks: bool = True,
    work_dir: str | Path | None = None,
) -> BuildResult:
    """Build ``<output_dir>/<phase>/{train,heldout}/`` for every phase in ``params.phases``.

    Args:
        params: The stage's params.
        corpus_dir: Holds ``train/part-*.parquet`` and ``heldout/part-*.parquet`` (column ``sentences``).
        vocab_dir: Holds ``vocab.txt`` (and ``tokenizer.json`` for the tokenizer, if present).
        output_dir: Replaced atomically when the build and its checks succeed.
        report_dir: Where the checks' Data Docs HTML goes (one folder per phase/split); kept on failure.
        run_checks: Validate the output with the Great Expectations suites (:mod:`.checks`).
        work_dir: Where the finished tasks wait, kept across a crash so that the same build continues after
            them (:mod:`.partial`); default :func:`.partial.partial_dir` (``.<output name>.partial`` beside it).

    Returns:
        The metrics and check reports.

    Raises:
        FileNotFoundError, ValueError: missing or unusable inputs (the message names the file).
        bert_core.checks.DataCheckError: a critical data check failed (nothing is written).
    """
    t0 = time.perf_counter()
    vocab_dir = Path(vocab_dir)
    vocab = read_vocab(vocab_dir / "vocab.txt")
    load_tokenizer(vocab_dir, vocab)  # fail here, not in a worker, on a mismatched tokenizer.json
    plans = {split: plan_tasks(corpus_dir, split, params.task_bytes) for split in SPLITS}
    result = BuildResult(metrics={}, workers=params.num_workers)
    work = Path(work_dir) if work_dir is not None else partial_dir(output_dir)
    identity = build_identity(params, corpus_dir, vocab_dir, SPLITS)
    jobs = [
        Job(task, str(work), str(vocab_dir), params.model_dump(mode="json"))
        for split in SPLITS
        for task in plans[split]
    ]
    with PartialBuild(work, identity, len(jobs)) as partial:
        results: list[dict[str, Any] | None] = [partial.finished(job) for job in jobs]
        todo = [k for k, r in enumerate(results) if r is None]
        if kept := len(jobs) - len(todo):
            log.info("pretrain_data: continuing an unfinished build: %d of %d task(s) kept", kept, len(jobs))
        log.info("pretrain_data: %d tasks on %d worker(s)", len(todo), params.num_workers)
        progress = Progress("pretrain_data", len(jobs), noun="task", unit="tasks", initial=kept, logger=log)

        def finished(i: int, r: dict[str, Any]) -> None:
            partial.record(jobs[todo[i]], r)
            progress.advance()

        for k, r in zip(todo, _execute([jobs[k] for k in todo], params.num_workers, finished), strict=True):
            results[k] = r
        progress.finish()
        by_split = {split: [r for r in results if r is not None and r["split"] == split] for split in SPLITS}
        nsp = _balance_nsp(params, plans, by_split, str(work), str(vocab_dir))
        for phase in params.phases:
            spec = params.phase_specs[phase]
            result.metrics[phase] = {}
            for split in SPLITS:
                rs = by_split[split]
                shards = [r["phases"][phase]["shard"] for r in rs]
                stats = _sum([r["phases"][phase]["stats"] for r in rs])
                summary = summarize(stats, _sum([r["corpus"] for r in rs]), spec.max_seq_length)
                summary |= nsp[phase][split]
                d = work / phase / split
                static = params.masking == "static" or split == "heldout"
                index = {
                    "format": FORMAT,
                    "format_version": FORMAT_VERSION,
                    "phase": phase,
                    "split": split,
                    "max_seq_length": spec.max_seq_length,
                    "max_predictions_per_seq": spec.max_predictions_per_seq,
                    "masked_lm_prob": params.masked_lm_prob,
                    **params.index_fields(),
                    "whole_word_masking": params.whole_word_masking,
                    "masking": "static" if static else "dynamic",
                    "dupe_factor": params.dupe_factor if split == "train" else params.heldout_dupe_factor,
                    "vocab_size": vocab.size,
                    "vocab_sha256": vocab.sha256,
                    "token_dtype": vocab.token_dtype,
                    "special_token_ids": vocab.special_ids,
                    "track_docs": params.track_docs,
                    "num_instances": sum(s["num_instances"] for s in shards),
                    "num_tokens": sum(s["num_tokens"] for s in shards),
                    "num_predictions": sum(s["num_predictions"] for s in shards),
                    "shards": shards,
                    "stats": summary,
                    "params": params.data_params(),
                }
                (d / "index.json").write_text(json.dumps(index, indent=2, sort_keys=True) + "\n")
                shutil.copyfile(vocab.path, d / "vocab.txt")
                summary["disk_bytes"] = sum(f.stat().st_size for f in d.iterdir())
                result.metrics[phase][split] = summary
        if run_checks:
            from bert_core.pretrain_data.checks import check_output

            for phase in params.phases:
                for split in SPLITS:
                    rd = Path(report_dir) / f"{phase}-{split}" if report_dir is not None else None
                    report, sample = check_output(
                        work / phase / split, sample_size=params.check_sample, seed=params.seed, report_dir=rd
                    )
                    result.reports.append(report)
                    result.metrics[phase][split]["check_sample"] = sample
            for report in result.reports:
                report.raise_for_critical()
        with atomic_path(output_dir, is_dir=True) as tmp:
            for phase in params.phases:
                shutil.move(work / phase, tmp / phase)  # a rename; a copy when work_dir is on another disk
    result.seconds = time.perf_counter() - t0
    for phase, m in result.metrics.items():
        t, held_out = m["train"], f"{m['heldout']['instances']:,}"
        made = (
            f"{t['instances']:,} train instances ({t['tokens']:,} tokens, mean length {t['mean_length']:.0f} "
            f"of {t['max_seq_length']}, IsNext {t['is_next_share']:.1%})"
        )
        log.info("pretrain_data %s: %s, %s held out, in %.1f s", phase, made, held_out, result.seconds)
    return result
