"""``make gpu-check`` and ``make gpu-smoke`` in their CPU dry mode (``--device cpu --tiny``), so the commands a
GPU machine's first run depends on cannot rot; and their import path stays free of the orchestration stack,
which the GPU machine does not have (Prefect, MLflow, DVC: blocked here in every process they start)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

from bert_core.constants import REPO_ROOT

ABSENT_ON_THE_GPU_MACHINE = ("prefect", "mlflow", "dvc", "dvc_data", "dvc_objects")


@pytest.fixture
def bare_env(tmp_path) -> dict[str, str]:
    """An environment whose Python processes (children included) cannot import the orchestration stack."""
    hook = tmp_path / "hook"
    hook.mkdir()
    (hook / "sitecustomize.py").write_text(
        textwrap.dedent(
            f"""
            # As if absent: the path finder does not see them (so `find_spec` probes, e.g. transformers',
            # answer None instead of raising) and importing them raises ModuleNotFoundError.
            from importlib.machinery import PathFinder
            BLOCKED = {ABSENT_ON_THE_GPU_MACHINE!r}
            _find = PathFinder.find_spec.__func__
            def _find_spec(cls, name, path=None, target=None):
                return None if name.split(".")[0] in BLOCKED else _find(cls, name, path, target)
            PathFinder.find_spec = classmethod(_find_spec)
            """
        )
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith(("BERT_", "MLFLOW_"))}
    env["PYTHONPATH"] = os.pathsep.join([str(hook), str(REPO_ROOT)])
    return env


def _run(args: list[str], env: dict[str, str], timeout: int = 300) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, *args], cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=timeout
    )


def test_the_blocking_hook_works(bare_env):
    proc = _run(["-c", "import mlflow"], bare_env)
    assert proc.returncode != 0 and "No module named 'mlflow'" in proc.stderr


def test_entry_modules_import_without_the_orchestration_stack_or_great_expectations(bare_env):
    """Great Expectations travels as a wheel for the data checks, but no module needs it at import."""
    modules = [
        "bench.gpu_check",
        "bench.gpu_smoke",
        "bench.gpu_finetune",
        "bench.bench_gpu_pretrain",
        "bench.bench_unpadded",
        "bert_core.corpus",
        "bert_core.vocab",
        "bert_core.pretrain_data.build",
        "bert_core.pretrain",
        "bert_core.finetune.run",
    ]
    code = f"import importlib, sys\nfor m in {modules!r}: importlib.import_module(m)\n"
    code += "print(sorted({m.split('.')[0] for m in sys.modules} & {'great_expectations', 'prefect', 'mlflow', 'dvc'}))"
    proc = _run(["-c", code], bare_env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip().splitlines()[-1] == "[]"


def test_gpu_check_dry_run_writes_its_summary(bare_env, tmp_path):
    out = tmp_path / "check"
    parts = (
        "env",
        "tests",
        "pretrain_loop",
        "pretrain_large",
        "pretrain_ablate",
        "pretrain_compare_512",
        "finetune",
    )  # _128: same code
    args = [
        "-m",
        "bench.gpu_check",
        "--device",
        "cpu",
        "--tiny",
        "--parts",
        ",".join(parts),
        "--out",
        str(out),
    ]
    proc = _run(args, bare_env)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert proc.stdout.strip().splitlines()[-1] == str(out)
    summary = json.loads((out / "summary.json").read_text())
    assert {n: p["status"] for n, p in summary["parts"].items()} == dict.fromkeys(parts, "ok")
    tests = summary["parts"]["tests"]["result"]
    assert tests["counts"]["skipped"] >= 8 and tests["counts"]["failure"] == tests["counts"]["error"] == 0
    fine = summary["parts"]["finetune"]["result"]["rows"]
    assert [r["contender"] for r in fine] == ["ours", "ours_exact_widths", "transformers"]
    assert all(r["examples_per_s"] > 0 and r["widths"] >= 1 for r in fine)
    assert [r["preset"] for r in summary["parts"]["pretrain_large"]["result"]["rows"]] == ["tiny"]
    top = summary["parts"]["pretrain_loop"]["result"]["rows"][0]["top_kernels"]
    assert len(top) == 15 and top[0]["ms_per_step"] >= top[-1]["ms_per_step"] > 0
    groups = summary["parts"]["pretrain_loop"]["result"]["rows"][0]["kernel_groups"]
    assert "matmul" in groups and abs(sum(g["share"] for g in groups.values()) - 1) < 1e-6
    ablate = summary["parts"]["pretrain_ablate"]["result"]["rows"]
    assert [r["variant"] for r in ablate] == [
        "recipe",
        "flags read at once",
        "CUDA graphs",
        "no dropout",
        "micro batch 512",
        "max-autotune",
    ]
    assert all(r["seq_per_s"] > 0 and "matmul ms" in r and "host_gap_ms" in r for r in ablate)
    md = (out / "summary.md").read_text()
    assert "## Where the step loses" in md
    assert "## Fine-tuning" in md and "Device: cpu; Python 3." in md and "### Where a step goes" in md
    assert "All of them by what they do" in md


def test_the_part_options_reach_the_parts_and_the_command_for_the_rest(bare_env, tmp_path):
    out = tmp_path / "check"
    one_test = "tests/test_model.py::test_cuda_matches_cpu"
    parts = "tests,pretrain_compare_128,pretrain_ablate"
    args = ["-m", "bench.gpu_check", "--device", "cpu", "--tiny", "--parts", parts]
    options = [
        "--tests",
        one_test,
        "--compare-variants",
        "eager,transformers",
        "--ablations",
        "recipe,max-autotune",
    ]
    options += ["--smoke-args", "--steps 100"]
    proc = _run([*args, *options, "--out", str(out)], bare_env)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    parts = json.loads((out / "summary.json").read_text())["parts"]
    assert [c["test"] for c in parts["tests"]["result"]["cases"]] == [
        "tests.test_model::test_cuda_matches_cpu"
    ]
    assert [r["variant"] for r in parts["pretrain_compare_128"]["result"]["rows"]] == [
        "eager",
        "transformers",
    ]
    assert [r["variant"] for r in parts["pretrain_ablate"]["result"]["rows"]] == ["recipe", "max-autotune"]
    proc = _run([*args, *options, "--budget-s", "0", "--out", str(out)], bare_env)
    assert proc.returncode == 1
    assert json.loads((out / "summary.json").read_text())["next"].endswith(
        f"--tests={one_test} --compare-variants=eager,transformers --ablations=recipe,max-autotune "
        "'--smoke-args=--steps 100'"
    )


def test_gpu_smoke_dry_run_trains_and_loads_in_transformers(bare_env, tmp_path, shared_data):
    """Through ``gpu_check``'s ``smoke`` part (what ``make gpu-run`` runs), which calls ``gpu_smoke.main``
    (``make gpu-smoke``): the summaries in ``--out``, the stages' outputs in ``--work``."""
    out, work = tmp_path / "out", tmp_path / "work"
    env = bare_env | {"BERT_DATA_ROOT": str(shared_data)}
    args = ["-m", "bench.gpu_check", "--device", "cpu", "--tiny", "--parts", "smoke", "--budget-s", "600"]
    proc = _run([*args, "--out", str(out), "--work", str(work)], env)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert sorted(p.name for p in out.iterdir()) == ["summary.json", "summary.md"]
    smoke = json.loads((out / "summary.json").read_text())["parts"]["smoke"]
    stages = ["corpus", "vocab", "pretrain_data", "pretrain", "finetune", "load_in_transformers"]
    assert smoke["status"] == "ok" and smoke["result"]["ok"]
    assert list(smoke["result"]["stages"]) == stages
    pretrained = smoke["result"]["stages"]["pretrain"]
    assert pretrained["phases.seq128.checkpoint_s"] > 0  # what a checkpoint costs on the device, in the table
    loaded = smoke["result"]["stages"]["load_in_transformers"]
    assert loaded["finetuned_class"] == "BertForSequenceClassification"
    assert (work / "smoke" / "models" / "pretrained" / "model.safetensors").is_file()
    assert "## Smoke: the tiny recipe" in (out / "summary.md").read_text()


def test_a_budget_runs_what_fits_and_names_the_command_for_the_rest(bare_env, tmp_path):
    out = tmp_path / "check"
    args = ["-m", "bench.gpu_check", "--device", "cpu", "--tiny", "--parts", "env,finetune"]
    proc = _run([*args, "--budget-s", "0", "--out", str(out)], bare_env)
    assert proc.returncode == 1
    summary = json.loads((out / "summary.json").read_text())
    assert {n: p["status"] for n, p in summary["parts"].items()} == dict.fromkeys(
        ("env", "finetune"), "not run: out of budget"
    )
    assert summary["next"] == "python3 -m bench.gpu_check --device cpu --tiny --parts env,finetune"
    assert f"run them next with `{summary['next']}`" in (out / "summary.md").read_text()


def test_a_failing_part_is_recorded_and_the_rest_still_run(bare_env, tmp_path):
    out = tmp_path / "check"
    proc = _run(
        [
            "-m",
            "bench.gpu_check",
            "--device",
            "cpu",
            "--tiny",
            "--parts",
            "env,finetune",
            "--cap-scale",
            "0.01",
            "--out",
            str(out),
        ],
        bare_env,
    )
    assert proc.returncode == 1
    parts = json.loads((out / "summary.json").read_text())["parts"]
    assert parts["env"]["status"].startswith("timeout") and parts["finetune"]["status"].startswith("timeout")
    assert "timeout" in (out / "summary.md").read_text()


def test_the_smoke_keeps_the_recipes_compilation_unless_told_not_to(bare_env):
    code = textwrap.dedent(
        """
        import argparse
        from bench.gpu_smoke import recipe, smoke_caps
        for flag in (False, True):
            sections = recipe("gpu-base")
            args = argparse.Namespace(corpus_mb=1.0, steps=10, device="cuda", no_compile=flag, task="sst2",
                                      train_rows=64, eval_rows=None)
            smoke_caps(sections, args)
            print(sections["pretrain"]["compile"], sections["pretrain"]["precision"])
        """
    )
    proc = _run(["-c", code], bare_env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.split() == ["True", "bf16", "False", "bf16"]


def test_the_kernel_table_counts_each_kernel_once_not_the_operator_or_annotation_around_it():
    from types import SimpleNamespace

    from torch.autograd import DeviceType

    from bench.bench_gpu_pretrain import _kernel_table

    def event(key, device_type, device_us, annotation=False):
        return SimpleNamespace(
            key=key,
            device_type=device_type,
            is_user_annotation=annotation,
            self_device_time_total=device_us,
            self_cpu_time_total=50,
            count=4,
        )

    events = [
        event("aten::mm", DeviceType.CPU, 3000),  # the host operator: its kernel's time again
        event("nvjet_gemm", DeviceType.CUDA, 3000),
        event("triton_poi_fused_gelu", DeviceType.CUDA, 1000, annotation=True),  # inductor's range: again
        event("triton_poi_fused_gelu", DeviceType.CUDA, 1000),
    ]
    prof = SimpleNamespace(key_averages=lambda: events)
    rows, busy, groups = _kernel_table(prof, steps=2, top=15)
    assert [(r["name"], r["ms_per_step"], r["share"], r["calls_per_step"]) for r in rows] == [
        ("nvjet_gemm", 1.5, 0.75, 2),
        ("triton_poi_fused_gelu", 0.5, 0.25, 2),
    ]
    assert busy == 2.0 and {r["clock"] for r in rows} == {"device"}
    assert groups == {
        "matmul": {"ms_per_step": 1.5, "share": 0.75},
        "fused elementwise (compiled)": {"ms_per_step": 0.5, "share": 0.25},
    }
    host_rows, _, host_groups = _kernel_table(
        SimpleNamespace(key_averages=lambda: events[:1]), steps=2, top=15
    )
    assert host_rows[0]["clock"] == "host" and host_rows[0]["ms_per_step"] == 0.025
    assert list(host_groups) == ["matmul"]


def test_each_part_records_the_gpus_clocks_and_other_processes_as_it_starts(tmp_path, monkeypatch):
    """A part that times slow is told apart from a throttled or shared card by what ``nvidia-smi`` said."""
    from bench import gpu_check

    smi = tmp_path / "nvidia-smi"
    smi.write_text(
        "#!/bin/sh\n"
        'case "$1" in\n'
        '  --query-gpu=*) echo "1980, 1980, 41, 120.5, 0, 1024";;\n'
        '  --query-compute-apps=*) echo "4242, 900";;\n'
        "esac\n"
    )
    smi.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    state = gpu_check.gpu_state()
    assert state["clocks.sm"] == "1980" and state["temperature.gpu"] == "41"
    assert state["memory.used"] == "1024" and state["compute_processes"] == 1
    monkeypatch.setenv("PATH", str(tmp_path / "nowhere"))
    assert gpu_check.gpu_state() == {}


def test_a_part_cut_off_at_its_cap_keeps_the_rows_it_finished(tmp_path, monkeypatch):
    """The rows a part printed before the cap stopped it reach the summary, marked partial."""
    import argparse

    from bench import gpu_check

    fake = tmp_path / "python"
    fake.write_text(
        "#!/bin/sh\n"
        'echo \'{"variant": "recipe", "seq_per_s": 4000}\'\n'
        "echo 'compiling the next variant ...'\n"
        'echo \'{"variant": "flags read at once", "seq_per_s": 3500}\'\n'
        "exec sleep 30\n"
    )
    fake.chmod(0o755)
    monkeypatch.setattr(gpu_check.sys, "executable", str(fake))
    monkeypatch.setattr(gpu_check, "gpu_state", dict)
    args = argparse.Namespace(
        device="cpu", tiny=True, tests=None, compare_variants=None, ablations=None, smoke_args=None
    )
    entry = gpu_check.run_part("pretrain_ablate", args, tmp_path, cap=2)
    assert entry["status"] == "timeout after 2 s"
    assert entry["result"] == {
        "rows": [
            {"variant": "recipe", "seq_per_s": 4000},
            {"variant": "flags read at once", "seq_per_s": 3500},
        ],
        "partial": True,
    }
