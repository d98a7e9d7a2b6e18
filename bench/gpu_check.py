"""One command for a GPU machine's first run: environment, GPU tests, pretraining and fine-tuning throughput.

Parts, each in its own process under its own time cap (a part that fails or runs over is recorded in the
summary with its error and output tail; the others still run), about 10 minutes in all on one H100, most
of it ``torch.compile``'s compilation (about a minute per model and shape); ``make gpu-check`` bounds it
with ``--budget-s``:

- ``env``: Python, torch, CUDA, cuDNN, transformers, the device, ``nvidia-smi``;
- ``tests``: ``pytest -m gpu`` on the GPU tests (``tests/test_gpu_training.py``, the model's CUDA test);
- ``pretrain_loop``: the pretraining stage's loop (``bench/bench_gpu_pretrain.py``): BERT-Base, bf16,
  compiled, full-length synthetic batches at 128 (micro 256) and 512 (micro 64): tokens/s, seq/s, MFU
  (``bert_core/training/flops.py``), peak memory; and the top kernels of one profiled window at 128;
- ``pretrain_large``: the same loop for BERT-Large at 128 (micro 128), beside NVIDIA's published per-GPU rates;
- ``pretrain_compare_128`` / ``_512``: one step of ours eager, compiled and unpadded and of transformers'
  ``BertForPreTraining`` (SDPA) eager and compiled, interleaved (``bench/bench_unpadded.py``), on batches
  with real pretraining lengths (from the corpus sample of ``.gpu/data``; full length without it);
  ``--compare-variants`` picks others (``compiled+unpad``);
- ``pretrain_ablate``: the loop at 128 with one change at a time against the recipe (:data:`ABLATIONS`;
  ``--ablations`` picks some);
- ``finetune``: SST-2-shaped fine-tuning, ours vs ``transformers.Trainer`` (``bench/gpu_finetune.py``);
- ``smoke`` (only when asked for): ``bench/gpu_smoke.py``, the ``gpu-base`` recipe on capped data, ending
  with the load check in transformers.

Writes ``summary.json`` (everything) and ``summary.md`` (the tables) into ``--out`` after every part, and
prints that folder; each part's own files (result, log, test report) go to ``--work`` (default ``--out``).
``--budget-s`` bounds the whole run for a machine held for a fixed time: the parts run in the order given,
each capped by what is left, and those the budget cannot reach are recorded as not run, with the command
that runs them next (``make gpu-run``: the check and the smoke in one command, most telling first).

    python -m bench.gpu_check                        # on the GPU machine (make gpu-check)
    python -m bench.gpu_check --parts env,tests,smoke,pretrain_loop --budget-s 540 --out DIR --work /tmp/w
    python -m bench.gpu_check --parts tests,smoke --tests tests/test_model.py --smoke-args "--steps 100"
    python -m bench.gpu_check --device cpu --tiny    # seconds on a CPU: the dry run CI keeps alive
"""

from __future__ import annotations

import bench._gpu_env as gpu_env  # first: the bundle's wheels before any other import

BUNDLE = gpu_env.activate()

import argparse  # noqa: E402
import contextlib  # noqa: E402
import json  # noqa: E402
import math  # noqa: E402
import os  # noqa: E402
import platform  # noqa: E402
import shlex  # noqa: E402
import shutil  # noqa: E402
import signal  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
import xml.etree.ElementTree as ET  # noqa: E402
from datetime import UTC, datetime  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

REPO = gpu_env.REPO
GPU_TESTS = ("tests/test_gpu_training.py", "tests/test_model.py::test_cuda_matches_cpu")
# Seconds per part on a GPU, about 1.5 times what each took on an H100 (seconds: env 9, tests 76, the
# loop's row at 128 60 with its compilation, the smoke's pretraining 171 of its ~245, three eager compare
# variants 33, our fine-tuning 13 of a Trainer comparison that needs ~60); --tiny: well under a minute.
CAPS = {
    "env": 25,
    "tests": 150,
    "pretrain_loop": 200,
    "pretrain_large": 180,
    "pretrain_ablate": 420,
    "pretrain_compare_128": 240,
    "pretrain_compare_512": 240,
    "finetune": 100,
    "smoke": 360,
}
#: The parts ``make gpu-check`` runs (the smoke has its own command, ``make gpu-smoke``).
DEFAULT_PARTS = (
    "env",
    "tests",
    "pretrain_loop",
    "pretrain_large",
    "pretrain_compare_128",
    "pretrain_compare_512",
    "finetune",
)
#: The compare parts' variants on a GPU: ours and transformers' each eager and compiled, and ours unpadded.
COMPARE_VARIANTS = "eager,compiled,unpad,transformers,compiled+transformers"
#: Under ``--budget-s``, a part is not started with less than this left (seconds): it could only time out.
MIN_PART_S = 20.0


# ---------------------------------------------------------------------------------------- the parts


def part_env(args: argparse.Namespace) -> dict:
    import torch
    import transformers

    info: dict[str, Any] = {
        "python": sys.version.split()[0],
        "executable": sys.executable,
        "platform": platform.platform(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version(),
        "transformers": transformers.__version__,
        "cuda_available": torch.cuda.is_available(),
        "bundle": BUNDLE,
    }
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        info |= {
            "device": props.name,
            "capability": f"{props.major}.{props.minor}",
            "sms": props.multi_processor_count,
            "memory_gib": round(props.total_memory / 2**30, 1),
            "bf16": torch.cuda.is_bf16_supported(),
            "devices": torch.cuda.device_count(),
        }
    smi = shutil.which("nvidia-smi")
    if smi:
        proc = subprocess.run([smi], capture_output=True, text=True, timeout=20)
        info["nvidia_smi"] = proc.stdout or proc.stderr
    return info


#: What ``nvidia-smi`` reports of the GPU as a part starts: clocks and temperature (a throttled card times
#: slow) and the memory other processes hold (a leftover process shares the card).
GPU_QUERY = "clocks.sm,clocks.max.sm,temperature.gpu,power.draw,utilization.gpu,memory.used"


def gpu_state() -> dict[str, Any]:
    """The GPU's clocks, temperature, load and memory now, and the processes computing on it (empty without
    ``nvidia-smi``)."""
    smi = shutil.which("nvidia-smi")
    if not smi:
        return {}
    try:
        query = [smi, f"--query-gpu={GPU_QUERY}", "--format=csv,noheader,nounits"]
        values = subprocess.run(query, capture_output=True, text=True, timeout=10).stdout.splitlines()[0]
        apps = [smi, "--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"]
        procs = [
            line
            for line in subprocess.run(apps, capture_output=True, text=True, timeout=10).stdout.splitlines()
            if line.strip()
        ]
    except (OSError, subprocess.SubprocessError, IndexError):
        return {}
    state: dict[str, Any] = dict(
        zip(GPU_QUERY.split(","), (v.strip() for v in values.split(",")), strict=False)
    )
    state["compute_processes"] = len(procs)
    return state


def part_tests(args: argparse.Namespace) -> dict:
    xml = Path(args.part_json).with_suffix(".xml")
    cmd = [
        sys.executable,
        "-m",
        "pytest",
        "-v",
        "-p",
        "no:cacheprovider",
        "-m",
        "gpu",
        "--junitxml",
        str(xml),
        *(args.tests.split(",") if args.tests else GPU_TESTS),
    ]
    # No third-party plugins: whatever the machine has installed (some fail to load without their package's
    # extras) has no part in these tests.
    env = {**os.environ, "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"}
    proc = subprocess.run(cmd, cwd=REPO, env=env)  # its lines go to the part's log as they come
    out: dict[str, Any] = {"exit_code": proc.returncode}
    if xml.is_file():
        cases = []
        for case in ET.parse(xml).getroot().iter("testcase"):
            status, message = "passed", ""
            for kind in ("failure", "error", "skipped"):
                node = case.find(kind)
                if node is not None:
                    status, message = kind, (node.get("message") or "")[:300]
            cases.append(
                {
                    "test": f"{case.get('classname')}::{case.get('name')}",
                    "status": status,
                    "seconds": float(case.get("time") or 0),
                    "message": message,
                }
            )
        out["cases"] = cases
        out["counts"] = {
            s: sum(c["status"] == s for c in cases) for s in ("passed", "failure", "error", "skipped")
        }
    if proc.returncode not in (0, 5):  # 5: nothing collected/ran is not a failure on a CPU dry run
        raise PartFailed(f"pytest exit code {proc.returncode}", out)
    return out


def _loop_settings(args: argparse.Namespace) -> dict:
    """``bench_gpu_pretrain.run``'s steps, compilation and precision: a GPU's timed rows, or ``--tiny``'s few
    fp32 steps."""
    if args.tiny:
        return {"steps": 2, "warm": 1, "compile_": False, "precision": "fp32"}
    return {"steps": 20, "warm": 10, "compile_": True, "precision": "bf16"}


def _loop_rows(args: argparse.Namespace, preset: str, plan: list[tuple[int, int]], profile: bool) -> dict:
    """The stage's loop (``bench_gpu_pretrain.run``) at each (seq_len, micro batch) of ``plan``, bf16 and
    compiled; ``profile``: the first row also profiles one window (where a step's time goes). ``--tiny``:
    one tiny fp32 row instead."""
    from bench.bench_gpu_pretrain import run

    if args.tiny:
        preset, plan = "tiny", [(64, 4)]
    kw = _loop_settings(args)
    rows = []
    for seq_len, batch in plan:
        top = 15 if profile and not rows else 0
        row = run(preset=preset, seq_len=seq_len, batch=batch, device=args.device, profile_top=top, **kw)
        rows.append(row)
        _progress(row)
    return {"rows": rows}


def part_pretrain_loop(args: argparse.Namespace) -> dict:
    return _loop_rows(args, "base", [(128, 256), (512, 64)], profile=True)


#: Where BERT-Base's step at 128 loses to the matrix products, one change at a time against the recipe:
#: dropout's share of the fused elementwise kernels, and the host's share (a batch twice as large halves the
#: per-sequence cost of whatever the host does once a step; CUDA graphs replace hundreds of launches by a
#: few; reading the step's flags before its update makes the device wait for the host every step, which the
#: recipe avoids). (variant, micro batch, BertConfig overrides, TrainConfig overrides)
ABLATIONS = (  # the most telling first: a part cut off at its cap keeps the rows it finished
    ("recipe", 256, {}, {}),
    ("flags read at once", 256, {}, {"overlap_checks": False}),
    ("CUDA graphs", 256, {}, {"compile_mode": "reduce-overhead"}),
    ("no dropout", 256, {"hidden_dropout_prob": 0.0, "attention_probs_dropout_prob": 0.0}, {}),
    ("micro batch 512", 512, {}, {}),
    # Inductor picks each product's kernel by timing Triton and cuBLAS candidates (minutes of compilation)
    ("max-autotune", 256, {}, {"compile_mode": "max-autotune-no-cudagraphs"}),
)


def part_pretrain_ablate(args: argparse.Namespace) -> dict:
    from bench.bench_gpu_pretrain import run

    preset, seq_len, scale = ("tiny", 64, 1 / 64) if args.tiny else ("base", 128, 1)
    kw = _loop_settings(args)
    rows = []
    chosen = args.ablations.split(",") if args.ablations else [a[0] for a in ABLATIONS]
    for variant, batch, overrides, train in [a for a in ABLATIONS if a[0] in chosen]:
        try:
            row = run(
                preset=preset,
                seq_len=seq_len,
                batch=max(1, int(batch * scale)),
                device=args.device,
                profile_top=3,
                overrides=overrides,
                train=train,
                **kw,
            )
        except Exception as err:  # one variant failing (a graph that cannot be captured) leaves the others
            rows.append({"variant": variant, "error": f"{type(err).__name__}: {err}"[:500]})
            _progress(rows[-1])
            continue
        groups = row.pop("kernel_groups")
        row = {"variant": variant, **row, **{f"{g} ms": v["ms_per_step"] for g, v in groups.items()}}
        row["host_gap_ms"] = row["step_time_ms"] - row["busy_ms_per_step"]
        rows.append(row)
        _progress(row)
    return {"rows": rows}


def part_pretrain_large(args: argparse.Namespace) -> dict:
    return _loop_rows(args, "large", [(128, 128)], profile=True)


def _compare(args: argparse.Namespace, seq_len: int, batch: int) -> dict:
    from bench import bench_unpadded

    if args.tiny:
        argv = [
            "--preset",
            "tiny",
            "--seq-len",
            "64",
            "--batch-size",
            "4",
            "--steps",
            "1",
            "--warmup",
            "1",
            "--lengths",
            "full",
            "--n-batches",
            "1",
        ]
    else:
        real = (bench_unpadded.SHARED / "corpus").is_dir() and bench_unpadded.VOCAB.is_file()
        argv = [
            "--preset",
            "base",
            "--seq-len",
            str(seq_len),
            "--batch-size",
            str(batch),
            "--steps",
            "10",
            "--warmup",
            "2",
            "--n-batches",
            "2",
            "--dtype",
            "bf16",
            "--lengths",
            "real" if real else "full",
            "--corpus-docs",
            "200",
        ]
    argv += [
        "--variants",
        args.compare_variants or ("eager,unpad,transformers" if args.tiny else COMPARE_VARIANTS),
    ]
    table = Path(args.part_json).with_suffix(".table.json")
    argv += ["--device", args.device, "--json", str(table)]
    bench_unpadded.main(argv)
    out = json.loads(table.read_text())
    for row in out["rows"]:
        row["seq_per_s"] = out["batch"] / row["s_per_step"]
    if args.device == "cuda":
        import torch

        out["peak_mem_gib_all_variants"] = torch.cuda.max_memory_allocated() / 2**30
    return out


def part_pretrain_compare_128(args: argparse.Namespace) -> dict:
    return _compare(args, 128, 256)


def part_pretrain_compare_512(args: argparse.Namespace) -> dict:
    return _compare(args, 512, 64)


def part_finetune(args: argparse.Namespace) -> dict:
    from bench import gpu_finetune

    argv = ["--device", args.device] + (
        ["--preset", "tiny", "--steps", "4", "--warm-steps", "2", "--batch-size", "8"] if args.tiny else []
    )
    return gpu_finetune.main(argv)


def part_smoke(args: argparse.Namespace) -> dict:
    from bench import gpu_smoke

    out = Path(args.part_json).with_suffix("")  # <work>/smoke/: the stages' outputs, models included
    try:
        code = gpu_smoke.main(
            [
                "--device",
                args.device,
                "--out",
                str(out),
                *(["--tiny"] if args.tiny else []),
                *shlex.split(args.smoke_args or ""),
            ]
        )
    except SystemExit as err:  # refused before it started (no data root, no CUDA): its message says why
        raise PartFailed(f"smoke did not start: {err}", {}) from None
    summary = json.loads((out / "summary.json").read_text())
    stages = {name: {k: v for k, v in s.items() if k != "traceback"} for name, s in summary["stages"].items()}
    result = {"ok": summary["ok"], "profile": summary["profile"], "stages": stages}
    if code != 0:
        failed = next((n for n, s in stages.items() if not s["ok"]), "?")
        raise PartFailed(f"smoke stage {failed} failed: {stages.get(failed, {}).get('error')}", result)
    return result


PARTS = {name.removeprefix("part_"): fn for name, fn in globals().items() if name.startswith("part_")}


class PartFailed(RuntimeError):
    """A part ran but its outcome is a failure; ``details`` still go into the summary."""

    def __init__(self, message: str, details: dict) -> None:
        super().__init__(message)
        self.details = details


def _progress(row: dict) -> None:
    """A finished row on its own line of the part's log (:func:`_progress_rows` reads them back)."""
    print(json.dumps(row, default=str), flush=True)


def _progress_rows(log: str) -> list[dict]:
    """The rows a part printed with :func:`_progress` into its ``log`` before it was stopped."""
    rows = []
    for line in log.splitlines():
        with contextlib.suppress(ValueError):
            if line.startswith("{") and isinstance(row := json.loads(line), dict):
                rows.append(row)
    return rows


# ------------------------------------------------------------------------------------- the driver


def run_part(name: str, args: argparse.Namespace, work: Path, cap: float) -> dict:
    """``name`` in a child process under ``cap`` seconds; its JSON, or the failure with the output's tail."""
    result_file = work / f"{name}.json"
    log_file = work / f"{name}.log"
    cmd = [
        sys.executable,
        "-m",
        "bench.gpu_check",
        "--part",
        name,
        "--part-json",
        str(result_file),
        "--device",
        args.device,
        *(["--tiny"] if args.tiny else []),
        *_part_options(args),
    ]
    before = gpu_state()
    t0 = time.perf_counter()
    print(f"[gpu-check] {name} (cap {cap:.0f} s) ...", flush=True)
    with log_file.open("w") as log:
        # Its own process group: at the cap the part goes with everything it started (pytest, torchrun's
        # workers, compile workers), so nothing keeps the GPU busy while the next part is timed.
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}  # a killed part's last lines are in its log
        proc = subprocess.Popen(
            cmd, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
        try:
            code = proc.wait(timeout=cap)
            status = "ok" if code == 0 else f"failed (exit {code})"
        except subprocess.TimeoutExpired:
            status = f"timeout after {cap:.0f} s"
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    entry: dict[str, Any] = {"status": status, "seconds": round(time.perf_counter() - t0, 1)}
    if before:
        entry["gpu_before"] = before
    log_text = "" if status == "ok" else log_file.read_text(errors="replace")
    if result_file.is_file():
        entry |= json.loads(result_file.read_text())
    elif rows := _progress_rows(log_text):  # cut off at the cap: the rows it finished
        entry["result"] = {"rows": rows, "partial": True}
    if status != "ok":
        entry["log_tail"] = log_text[-4000:]
    print(f"[gpu-check] {name}: {status} in {entry['seconds']} s", flush=True)
    return entry


def _part_options(args: argparse.Namespace) -> list[str]:
    """The options that shape what a part runs, as its child process (and the next command) takes them."""
    options = []
    for flag, value in (
        ("--tests", args.tests),
        ("--compare-variants", args.compare_variants),
        ("--ablations", args.ablations),
        ("--smoke-args", args.smoke_args),
    ):
        if value:
            options.append(f"{flag}={value}")
    return options


def child(args: argparse.Namespace) -> int:
    try:
        result = {"result": PARTS[args.part](args)}
        code = 0
    except PartFailed as err:
        result, code = {"error": str(err), "result": err.details}, 1
    except Exception as err:
        import traceback

        traceback.print_exc()
        result, code = {"error": f"{type(err).__name__}: {err}"}, 1
    Path(args.part_json).write_text(json.dumps(result, indent=2, default=str) + "\n", encoding="utf-8")
    return code


def _clean(value: Any) -> Any:
    """NaN/inf as null (strict JSON: the MFU of a CPU run, peak memory without CUDA)."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _clean(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_clean(v) for v in value]
    return value


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:,.3g}" if abs(value) < 100 else f"{value:,.0f}"
    return str(value)


def _table(rows: list[dict], columns: list[str]) -> list[str]:
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(_fmt(r.get(c, "")) for c in columns) + " |" for r in rows]
    return lines


def markdown(summary: dict) -> str:
    parts = summary["parts"]
    env = summary["platform"] | parts.get("env", {}).get("result", {})
    lines = [
        f"# GPU check {summary['started']}",
        "",
        f"Device: {env['device']}; Python {env['python']}, torch {env['torch']}, CUDA {env['cuda']}, "
        f"transformers {env.get('transformers', '(see env)')}.",
        "",
        "| part | status | seconds | GPU as it started: SM MHz (max), °C, W, busy %, MiB used, processes |",
        "|---|---|---|---|",
    ]

    def started(p: dict) -> str:
        g = p.get("gpu_before")
        if not g:
            return ""
        return (
            f"{g.get('clocks.sm')} ({g.get('clocks.max.sm')}), {g.get('temperature.gpu')}, {g.get('power.draw')}, "
            f"{g.get('utilization.gpu')}, {g.get('memory.used')}, {g.get('compute_processes')}"
        )

    lines += [f"| {name} | {p['status']} | {p['seconds']} | {started(p)} |" for name, p in parts.items()]
    if summary.get("next"):
        lines += ["", f"Not reached within the budget; run them next with `{summary['next']}`."]
    tests = parts.get("tests", {}).get("result", {})
    if tests.get("cases"):
        lines += ["", "## GPU tests", "", *_table(tests["cases"], ["test", "status", "seconds", "message"])]
    loop_rows = [
        row
        for name in ("pretrain_loop", "pretrain_large")
        for row in parts.get(name, {}).get("result", {}).get("rows", [])
    ]
    if loop_rows:
        cols = [
            "preset",
            "seq_len",
            "batch",
            "precision",
            "compile",
            "tokens_per_s",
            "seq_per_s",
            "mfu",
            "step_time_ms",
            "peak_mem_gib",
        ]
        lines += [
            "",
            "## Pretraining, the stage's loop (full-length batches)",
            "",
            *_table(loop_rows, cols),
        ]
        for row in loop_rows:
            if row.get("top_kernels"):
                lines += [
                    "",
                    f"### Where a step goes: {row['preset']}, seq {row['seq_len']} (one profiled window: "
                    f"{row['top_kernels'][0]['clock']} busy {row['busy_ms_per_step']:.1f} ms of a "
                    f"{row['step_time_ms']:.1f}-ms step)",
                    "",
                    *_table(row["top_kernels"], ["name", "ms_per_step", "share", "calls_per_step", "clock"]),
                    "",
                    "All of them by what they do:",
                    "",
                    *_table(
                        [{"group": g, **v} for g, v in row.get("kernel_groups", {}).items()],
                        ["group", "ms_per_step", "share"],
                    ),
                ]
    ablate = parts.get("pretrain_ablate", {}).get("result", {}).get("rows", [])
    if ablate:
        cols = ["variant", "batch", "seq_per_s", "mfu", "step_time_ms", "busy_ms_per_step", "host_gap_ms"]
        cols += ["matmul ms", "fused elementwise (compiled) ms", "attention ms", "error"]
        lines += [
            "",
            "## Where the step loses, one change at a time (the loop, profiled)",
            "",
            *_table(ablate, cols),
        ]
    for seq in (128, 512):
        cmp = parts.get(f"pretrain_compare_{seq}", {}).get("result", {})
        if cmp.get("rows"):
            head = (
                f"seq {cmp['seq_len']}, batch {cmp['batch']}, {cmp['dtype']}, lengths {cmp['lengths']} "
                f"(padding {cmp['padding_share']:.0%})"
            )
            cols = [
                "variant",
                "s_per_step",
                "seq_per_s",
                "real_tok_s",
                "mfu",
                "speedup_vs_eager",
                "graph_breaks",
                "compile_s",
            ]
            lines += ["", f"## Pretraining step: {head}", "", *_table(cmp["rows"], cols)]
    fine = parts.get("finetune", {}).get("result", {})
    if fine.get("rows"):
        lines += [
            "",
            f"## Fine-tuning, SST-2-shaped (batch {fine['batch']}, timed after step {fine['warm_steps']} of "
            f"{fine['steps']}; ours / transformers = {fine['ours_over_transformers']:.2f}, at exact widths: "
            f"{fine['ours_exact_widths_over_transformers']:.2f})",
            "",
            *_table(fine["rows"], ["contender", "examples_per_s", "seconds", "widths", "peak_mem_gib"]),
        ]
    smoke = parts.get("smoke", {}).get("result", {})
    if smoke.get("stages"):
        from bench.gpu_smoke import stage_table

        lines += ["", f"## Smoke: the {smoke['profile']} recipe on capped data", ""]
        lines += stage_table(smoke["stages"])
    failed = {n: p for n, p in parts.items() if p["status"] not in ("ok", NOT_RUN)}
    for name, p in failed.items():
        lines += [
            "",
            f"## {name}: {p['status']}",
            "",
            "```",
            (p.get("error") or "") + "\n" + p.get("log_tail", "")[-1500:],
            "```",
        ]
    return "\n".join(lines) + "\n"


NOT_RUN = "not run: out of budget"


def _next_command(args: argparse.Namespace, parts: list[str]) -> str:
    """The command that runs ``parts`` (those the budget did not reach) with this run's other options."""
    options = [f"--device {args.device}", *(["--tiny"] if args.tiny else []), f"--parts {','.join(parts)}"]
    options += [shlex.quote(o) for o in _part_options(args)]
    return "python3 -m bench.gpu_check " + " ".join(options)


def _write_summary(out: Path, summary: dict) -> None:
    """``summary.json`` and ``summary.md``, each replaced whole (a run stopped from outside keeps the last)."""
    from bert_core.atomic import write_text_atomic

    write_text_atomic(out / "summary.json", json.dumps(_clean(summary), indent=2, default=str) + "\n")
    write_text_atomic(out / "summary.md", markdown(summary))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.gpu_check", description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=None, help="default: reports/gpu-check/<UTC time>")
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    ap.add_argument(
        "--tiny", action="store_true", help="tiny sizes and a few steps: a CPU dry run in seconds"
    )
    ap.add_argument(
        "--parts",
        default=",".join(DEFAULT_PARTS),
        help=f"comma-separated, run in this order; from {', '.join(CAPS)} (default: all but smoke)",
    )
    ap.add_argument("--cap-scale", type=float, default=1.0, help="multiply every part's time cap")
    ap.add_argument(
        "--budget-s",
        type=float,
        default=None,
        help="seconds for the whole run: each part capped by what is left; the rest recorded as not run",
    )
    ap.add_argument("--work", type=Path, default=None, help="the parts' own files (default: --out)")
    ap.add_argument(
        "--tests", default=None, help="tests: comma-separated pytest ids (default: every GPU test)"
    )
    ap.add_argument(
        "--compare-variants", default=None, help="pretrain_compare_*: a subset of bench_unpadded's variants"
    )
    ap.add_argument(
        "--ablations",
        default=None,
        help=f"pretrain_ablate: comma-separated variants (default: all of {', '.join(a[0] for a in ABLATIONS)})",
    )
    ap.add_argument(
        "--smoke-args", default=None, help='smoke: more options for bench.gpu_smoke ("--steps 100")'
    )
    ap.add_argument("--part", choices=list(PARTS), help=argparse.SUPPRESS)
    ap.add_argument("--part-json", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.ablations and (unknown := set(args.ablations.split(",")) - {a[0] for a in ABLATIONS}):
        ap.error(
            f"--ablations: no variant {', '.join(sorted(unknown))}; from {', '.join(a[0] for a in ABLATIONS)}"
        )
    if args.part:
        return child(args)
    parts = [p for p in args.parts.split(",") if p]
    unknown = sorted(set(parts) - set(CAPS))
    if unknown:
        sys.exit(f"--parts: unknown {', '.join(unknown)}; choose from {', '.join(CAPS)}")
    import torch

    if args.device == "cuda" and not torch.cuda.is_available():
        sys.exit("no CUDA device: run on the GPU machine, or `--device cpu --tiny` for the dry run")
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    out = (args.out or REPO / "reports" / "gpu-check" / stamp).resolve()
    work = (args.work or out).resolve()
    for folder in (out, work):
        folder.mkdir(parents=True, exist_ok=True)
    print(f"[gpu-check] -> {out}", flush=True)
    summary: dict[str, Any] = {
        "started": stamp,
        "device": args.device,
        "tiny": args.tiny,
        "platform": {
            "device": torch.cuda.get_device_name() if args.device == "cuda" else "cpu",
            "python": platform.python_version(),
            "torch": torch.__version__,
            "cuda": torch.version.cuda,
        },
        "budget_s": args.budget_s,
        "parts": {},
    }
    deadline = None if args.budget_s is None else time.monotonic() + args.budget_s
    for name in parts:
        cap = CAPS[name] * args.cap_scale
        left = math.inf if deadline is None else deadline - time.monotonic()
        if left < min(cap, MIN_PART_S):
            summary["parts"][name] = {"status": NOT_RUN, "seconds": 0.0}
            print(f"[gpu-check] {name}: {NOT_RUN} ({max(left, 0):.0f} s left)", flush=True)
        else:
            summary["parts"][name] = run_part(name, args, work, min(cap, left))
        skipped = [n for n, p in summary["parts"].items() if p["status"] == NOT_RUN]
        summary["next"] = _next_command(args, skipped) if skipped else None
        _write_summary(out, summary)
    bad = [n for n, p in summary["parts"].items() if p["status"] != "ok"]
    print(
        f"[gpu-check] {'all parts ok' if not bad else 'not ok: ' + ', '.join(bad)}; summary: {out / 'summary.md'}"
    )
    print(out)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
