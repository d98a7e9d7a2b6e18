"""flows/_cli.py::exit_command: a command ends with its exit code and a normal exit, minus the last GC passes."""

from __future__ import annotations

import subprocess
import sys

import pytest

from bert_core.constants import REPO_ROOT
from flows.stages import STAGES

SCRIPT = """
import atexit, gc, sys, threading, time
from flows._cli import exit_command

def late():
    time.sleep(0.2)
    print("thread done", flush=True)

atexit.register(lambda: print("atexit ran, frozen:", gc.get_freeze_count() > 0))
threading.Thread(target=late).start()
sys.stdout.write("buffered, no newline")
exit_command(7)
"""


def test_exit_code_threads_atexit_and_buffered_output_are_kept():
    proc = subprocess.run(
        [sys.executable, "-c", SCRIPT], cwd=REPO_ROOT, capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 7, proc.stderr
    assert proc.stdout.startswith("buffered, no newline")
    assert "thread done" in proc.stdout  # non-daemon threads are joined first, as on a normal exit
    assert proc.stdout.rstrip().endswith("atexit ran, frozen: True")


def test_every_stage_command_and_the_pipeline_exit_through_exit_command():
    for module in [s.flow_module for s in STAGES] + ["flows.pipeline"]:
        source = (REPO_ROOT / (module.replace(".", "/") + ".py")).read_text()
        main_block = source.split('if __name__ == "__main__":', 1)[1]
        assert "exit_command(main())" in main_block, module


def test_the_console_shows_a_refusal_without_its_traceback_and_a_bug_with_it():
    """Prefect logs every flow failure with its traceback; on the console that hid the one line that says
    what to fix. The project's own errors lose it there (their message is the point); a bug keeps it."""
    import logging
    import sys

    from bert_core.params import ParamsError
    from flows._cli import _without_traceback

    def record(err: BaseException) -> logging.LogRecord:
        try:
            raise err
        except BaseException:
            info = sys.exc_info()
        return logging.LogRecord("prefect.flow_runs", logging.ERROR, "f", 1, "Encountered %r", (err,), info)

    refused, bug = record(ParamsError("p.yaml: params file not found")), record(KeyError("x"))
    assert _without_traceback(refused) and _without_traceback(bug)
    assert refused.exc_info is None and "Traceback" not in logging.Formatter().format(refused)
    assert "Traceback" in logging.Formatter().format(bug)


def test_an_unknown_task_is_refused_before_prefect_starts(monkeypatch, capsys):
    from flows import _prefect_api, finetune

    def no_server(*args, **kwargs):
        raise AssertionError("a Prefect API was settled for a refused task")

    monkeypatch.setattr(_prefect_api, "prefect_api", no_server)
    assert finetune.main(["sentiment"]) == 1
    err = capsys.readouterr().err
    assert err.startswith(
        "finetune stage failed (sentiment): KeyError: unknown task 'sentiment'; valid tasks:"
    )


@pytest.mark.parametrize(
    ("module", "argv", "flag", "producer"),
    [
        ("vocab", ["--corpus", "nowhere/corpus"], "--corpus nowhere/corpus", "corpus"),
        ("pretrain_data", [], "--corpus data/corpus", "corpus"),  # run before its upstream stage
        ("pretrain", ["--data", "nowhere"], "--data nowhere", "pretrain_data"),
    ],
)
def test_a_missing_input_is_refused_before_prefect_starts(
    monkeypatch, capsys, tmp_path, module, argv, flag, producer
):
    import importlib

    from flows import _prefect_api

    def no_server(*args, **kwargs):
        raise AssertionError("a Prefect API was settled for a missing input")

    monkeypatch.setattr(_prefect_api, "prefect_api", no_server)
    monkeypatch.chdir(tmp_path)
    main = importlib.import_module(f"flows.{module}").main
    assert main(["--params", str(REPO_ROOT / "params" / f"{module}.yaml"), *argv]) == 1
    assert capsys.readouterr().err.strip() == (
        f"{module} stage failed: FileNotFoundError: {flag} does not exist: it is the {producer} stage's "
        f"output; run `dvc repro {producer}` first, or give {flag.split()[0]} the path of one"
    )


@pytest.mark.parametrize("stage", ["corpus", "pretrain_data"])
def test_a_worker_count_below_one_is_refused_by_the_parser(stage, capsys):
    from flows._cli import build_parser
    from flows.stages import get

    parser = build_parser(get(stage))
    assert parser.parse_args(["--workers", "3"]).workers == 3
    with pytest.raises(SystemExit) as exit_:
        parser.parse_args(["--workers", "0"])
    assert exit_.value.code == 2
    assert "argument --workers: invalid positive_int value: '0'" in capsys.readouterr().err


@pytest.mark.parametrize("stage", ["corpus", "pretrain_data"])
def test_a_worker_count_below_one_is_refused_by_the_run_form(stage):
    """A run from the Prefect UI gets the command line's rule: the form's field has a minimum of 1, and a
    run given 0 fails its parameter validation before the flow starts (no silent change to 1)."""
    import importlib

    from prefect.exceptions import ParameterTypeError

    flow = getattr(importlib.import_module(f"flows.{stage}"), f"{stage}_flow")
    field = flow.parameters.model_dump()["properties"]["workers"]
    assert {"minimum": 1, "type": "integer"} in field["anyOf"]
    assert flow.validate_parameters({"workers": 2})["workers"] == 2
    with pytest.raises(ParameterTypeError, match="workers: Input should be greater than or equal to 1"):
        flow.validate_parameters({"workers": 0})


def test_evaluate_before_fine_tuning_is_refused_before_prefect_starts(monkeypatch, capsys, tmp_path):
    from flows import _prefect_api, evaluate

    def no_server(*args, **kwargs):
        raise AssertionError("a Prefect API was settled with no fine-tuning results")

    monkeypatch.setattr(_prefect_api, "prefect_api", no_server)
    params = tmp_path / "evaluate.yaml"
    params.write_text(f"evaluate:\n  results_dir: {tmp_path / 'results'}\n")
    (tmp_path / "results" / "sst2").mkdir(parents=True)  # a task's folder, its summary not written
    assert evaluate.main(["--params", str(params)]) == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith(
        f"evaluate stage failed: FileNotFoundError: no summary.json under {tmp_path}/results"
    )
    assert "run 'dvc repro finetune@" in err


def test_a_corpus_source_that_matches_no_file_is_refused_before_prefect_starts(monkeypatch, capsys, tmp_path):
    from flows import _prefect_api, corpus

    def no_server(*args, **kwargs):
        raise AssertionError("a Prefect API was settled for a source that matches nothing")

    monkeypatch.setattr(_prefect_api, "prefect_api", no_server)
    (tmp_path / "corpus" / "gutenberg").mkdir(parents=True)  # the first source is there, the second mistyped
    (tmp_path / "corpus" / "gutenberg" / "a.txt").write_text("One sentence. Another one.\n", encoding="utf-8")
    params = tmp_path / "corpus.yaml"
    text = (REPO_ROOT / "params" / "corpus.yaml").read_text(encoding="utf-8")
    params.write_text(text.replace("corpus/wikipedia/*.jsonl", "corpus/wikipedia/*.jsnl"), encoding="utf-8")
    monkeypatch.setenv("BERT_DATA_ROOT", str(tmp_path))
    assert corpus.main(["--params", str(params), "--out", str(tmp_path / "out")]) == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith(
        "corpus stage failed: SourceNotFoundError: source 'wikipedia' (jsonl): path 'corpus/wikipedia/*.jsnl' "
        f"under data root {tmp_path} matches no files"
    )
    assert not (tmp_path / "out").exists()


def test_a_task_whose_data_is_missing_is_refused_before_prefect_starts(monkeypatch, capsys, tmp_path):
    from flows import _prefect_api, finetune

    def no_server(*args, **kwargs):
        raise AssertionError("a Prefect API was settled for a task whose data is missing")

    monkeypatch.setattr(_prefect_api, "prefect_api", no_server)
    (tmp_path / "glue" / "RTE").mkdir(parents=True)
    (tmp_path / "glue" / "RTE" / "dev.tsv").write_text("")  # the train file is missing
    monkeypatch.setenv("BERT_DATA_ROOT", str(tmp_path))
    argv = ["rte", "--params", str(REPO_ROOT / "params" / "finetune.yaml"), "--model-source", str(tmp_path)]
    assert finetune.main([*argv, "--out", str(tmp_path / "out")]) == 1
    assert capsys.readouterr().err.strip() == (
        f"finetune stage failed (rte): TaskDataError: rte/train: {tmp_path}/glue/RTE/train.tsv does not exist. "
        "Put the official file there (layout of shared/data: glue/RTE/train.tsv under the data root), or unset "
        "BERT_DATA_ROOT to load rte from the Hugging Face Hub."
    )
    assert not (tmp_path / "out").exists()
