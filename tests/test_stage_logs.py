"""Stage flows show the library's INFO lines (progress, metrics) on the console and in Prefect's run logs,
although Prefect's logging configuration leaves the root logger at WARNING (flows._stage.library_logs)."""

from __future__ import annotations

import json
import logging
import os
import re
import subprocess
import sys
import warnings

import pytest

from bert_core.constants import REPO_ROOT
from flows._stage import library_logs


@pytest.fixture
def prefect_like_levels(monkeypatch):
    """The levels Prefect's logging.yml sets: root at WARNING, bert_core unset (inherits it)."""
    root, bert = logging.getLogger(), logging.getLogger("bert_core")
    monkeypatch.setattr(root, "level", logging.WARNING)
    monkeypatch.setattr(bert, "level", logging.NOTSET)


def _infos(caplog) -> list[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if r.name.startswith("bert_core.") and r.levelno == logging.INFO
    ]


def test_library_info_lines_are_shown_in_the_block_only(prefect_like_levels, caplog):
    log = logging.getLogger("bert_core.training.loop")
    bert = logging.getLogger("bert_core")
    handlers = list(bert.handlers)  # PREFECT_LOGGING_EXTRA_LOGGERS (flows/__init__) may have added one
    log.info("before")
    with library_logs():
        log.info("step 10 train: loss=2.3")
    log.info("after")
    assert _infos(caplog) == ["step 10 train: loss=2.3"]
    assert bert.level == logging.NOTSET and bert.handlers == handlers


def test_an_api_handler_is_attached_where_prefect_did_not(prefect_like_levels, monkeypatch):
    from prefect.logging.handlers import APILogHandler
    from prefect.settings import PREFECT_LOGGING_TO_API_WHEN_MISSING_FLOW, temporary_settings

    bert = logging.getLogger("bert_core")
    monkeypatch.setattr(bert, "handlers", [h for h in bert.handlers if not isinstance(h, APILogHandler)])
    # Outside a flow run nothing is sent: no "without a flow run id" warning (here: error) per record.
    with (
        temporary_settings(updates={PREFECT_LOGGING_TO_API_WHEN_MISSING_FLOW: "error"}),
        warnings.catch_warnings(),
    ):
        warnings.simplefilter("error")
        with library_logs():
            assert sum(isinstance(h, APILogHandler) for h in bert.handlers) == 1
            logging.getLogger("bert_core.x").info("not in a flow run")
    assert not any(isinstance(h, APILogHandler) for h in bert.handlers)


_FLOW_LOGS = """
import asyncio, json, logging
import flows  # the stage's environment defaults (PREFECT_LOGGING_EXTRA_LOGGERS)
from prefect import flow
from prefect.client.orchestration import get_client
from prefect.client.schemas.filters import LogFilter, LogFilterFlowRunId
from prefect.logging.handlers import APILogHandler
from prefect.testing.utilities import prefect_test_harness
from bert_core.tracking import stage_run
from flows._stage import library_logs

@flow(name="logs-demo")
def demo() -> None:
    with library_logs(), stage_run("logs-demo", {"a": 1}):  # as every stage flow opens its run
        logging.getLogger("bert_core.finetune.run").info("sst2 train: step 5/10 (50.0%), ETA 3s")

async def read(run_id) -> list[str]:
    async with get_client() as client:
        flt = LogFilter(flow_run_id=LogFilterFlowRunId(any_=[run_id]))
        return [entry.message for entry in await client.read_logs(log_filter=flt)]

with prefect_test_harness(server_startup_timeout=120):
    state = demo(return_state=True)
    assert state.is_completed(), state
    APILogHandler().flush()  # send what is queued
    print(json.dumps(asyncio.run(read(state.state_details.flow_run_id))))
"""


def _python(script: str, env: dict[str, str], timeout: int, **kw) -> subprocess.CompletedProcess:
    """``script`` in a fresh interpreter at the repository root, its output captured."""
    return subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        env=env,
        cwd=REPO_ROOT,
        timeout=timeout,
        **kw,
    )


@pytest.mark.slow
def test_a_stage_run_under_prefect_sends_bert_core_info_lines_to_its_logs(tmp_path):
    """A flow that opens its MLflow run as every stage flow does (flows._stage.stage) and logs on a bert_core logger: the line is
    on the console (Prefect's console handler) and in the flow run's logs on the Prefect server. In a
    process of its own: a test process's logging is whatever the modules it collected configured."""
    env = {**os.environ, "PREFECT_HOME": str(tmp_path), "PYTHONPATH": str(REPO_ROOT)}
    proc = _python(_FLOW_LOGS, env, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    line = "sst2 train: step 5/10 (50.0%), ETA 3s"
    assert f"bert_core.finetune.run - {line}" in proc.stderr, proc.stderr[-3000:]
    messages = json.loads(proc.stdout.strip().splitlines()[-1])
    assert any(line in m for m in messages), messages


_TIME = re.compile(r"\d{2}:\d{2}:\d{2}[.,]\d{3}")

_STAGE_LOGS = """
import logging
import flows  # the stage's environment defaults (PREFECT_LOGGING_EXTRA_LOGGERS)
from flows._cli import configure_logging
configure_logging()  # as run_stage(log_to_stderr=True) does, before Prefect configures logging
from prefect.logging.configuration import setup_logging
setup_logging()
from flows._stage import library_logs
with library_logs():
    logging.getLogger("bert_core.training.loop").info("step 25/100 train: loss=2.3")
"""


def test_a_stage_prints_a_library_line_once_with_one_time_stamp(tmp_path):
    env = {**os.environ, "PREFECT_HOME": str(tmp_path), "PYTHONPATH": str(REPO_ROOT)}
    proc = _python(_STAGE_LOGS, env, timeout=120, check=True)
    lines = [line for line in proc.stderr.splitlines() if "step 25/100" in line]
    assert len(lines) == 1, proc.stderr
    assert len(_TIME.findall(lines[0])) == 1 and lines[0].count("INFO") == 1, lines[0]
    assert "bert_core.training.loop" in lines[0]


@pytest.mark.parametrize(
    "line",
    [
        "21:43:43.399 | INFO    | bert_core.training.loop - step 25 train: loss=2.3",
        "2026-11-24 21:43:43,399 INFO bert_core.training.loop: step 25 train: loss=2.3",
        "2026/11/24 21:43:43 INFO bert_core.training.loop: step 25 train: loss=2.3",  # MLflow's own format
    ],
)
def test_the_pipeline_relays_a_stage_line_without_its_stamp(line):
    from flows._driver import relayed

    level, text = relayed(line)
    assert level == logging.INFO and not _TIME.search(text) and "INFO" not in text
    assert text.startswith("bert_core.training.loop") and text.endswith("step 25 train: loss=2.3")


def test_a_relayed_warning_stays_a_warning_and_an_unstamped_line_is_kept():
    from flows._driver import relayed

    assert relayed("09:00:01.002 | WARNING | bert_core.x - low disk")[0] == logging.WARNING
    assert relayed("Running stage 'pretrain':") == (logging.INFO, "Running stage 'pretrain':")


def test_a_stage_registering_a_model_prints_no_artifact_progress_bars(tmp_path):
    """A registration reads back the model it has just logged; MLflow's progress bars for that copy said
    nothing, twice per stage, in every stage log."""
    script = (
        "import sys, mlflow, flows\n"
        "sys.path.insert(0, 'tests')\n"
        "from serving_models import register_all\n"
        f"mlflow.set_tracking_uri('sqlite:///{tmp_path}/mlflow.db')\n"
        f"register_all(__import__('pathlib').Path('{tmp_path}'), {{'bert-sst2': 'sst2'}})\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR"}
    proc = _python(script, env, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "Downloading artifacts" not in proc.stderr + proc.stdout, proc.stderr[-3000:]


def test_the_relay_drops_dvcs_empty_lines(tmp_path, monkeypatch):
    from flows import _driver

    logged: list[tuple[int, str]] = []
    logger = type("L", (), {"log": lambda self, level, text: logged.append((level, text))})()
    monkeypatch.setattr(_driver, "get_run_logger", lambda: logger)
    feed = _driver.StageFeed()
    for line in ("Running stage 'vocab':", "09:00:01.002 | INFO    | bert_core.x - done", "", "  "):
        feed.put(line)
    feed.close("ran")
    _driver.follow_stage.fn("vocab", feed, str(tmp_path), ())
    assert logged == [(logging.INFO, "Running stage 'vocab':"), (logging.INFO, "bert_core.x - done")]


_REFUSAL_LOGS = """
import asyncio
import flows  # the stage's environment defaults
from prefect import flow
from prefect.client.orchestration import get_client
from prefect.client.schemas.filters import LogFilter, LogFilterFlowRunId
from prefect.logging.handlers import APILogHandler
from prefect.testing.utilities import prefect_test_harness
from bert_core.params import ParamsError
from flows._cli import quiet_refusals

@flow(name="refusal-demo")
def demo() -> None:
    raise ParamsError("p.yaml: params file not found")

async def read(run_id) -> list[str]:
    async with get_client() as client:
        flt = LogFilter(flow_run_id=LogFilterFlowRunId(any_=[run_id]))
        return [entry.message for entry in await client.read_logs(log_filter=flt)]

with prefect_test_harness(server_startup_timeout=120):
    quiet_refusals()
    state = demo(return_state=True)
    APILogHandler().flush()
    print("UI_TRACEBACK", any("Traceback" in m for m in asyncio.run(read(state.state_details.flow_run_id))))
"""


@pytest.mark.slow
def test_a_refusal_has_its_traceback_in_the_prefect_ui_only(tmp_path):
    env = {**os.environ, "PREFECT_HOME": str(tmp_path), "PYTHONPATH": str(REPO_ROOT)}
    proc = _python(_REFUSAL_LOGS, env, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "UI_TRACEBACK True" in proc.stdout
    assert "Encountered exception during execution: ParamsError" in proc.stderr
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
