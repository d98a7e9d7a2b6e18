"""The Prefect UI in a real browser: open the deployment, start a custom run with changed parameters, see it
complete.

Playwright drives Debian's Chromium (``/usr/bin/chromium``, headless; Playwright's own browser downloads are
never used) against ``python -m flows.serve`` on a free loopback port. Two repositories: the stand-in
pipeline (the UI path on its own, about two minutes) and a copy of the real one with the ``tiny`` profile
on ../shared/data. Screenshots of every step land in the test's temporary directory (printed on failure).
"""

from __future__ import annotations

import re
import shutil
import time
from pathlib import Path

import mlflow
import pytest

from tests.e2e.conftest import copy_repository, serve_repository
from tests.e2e.standin import make_standin_repo

pytestmark = [pytest.mark.browser, pytest.mark.timeout(3600)]

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
RUN_TIMEOUT_S = {"standin": 600, "real": 1800}


@pytest.fixture(scope="module")
def browser():
    playwright = pytest.importorskip(
        "playwright.sync_api", reason="pip install playwright (make test-browser)"
    )
    if not CHROMIUM.is_file():
        pytest.skip("Debian's Chromium is not installed (apt-get install -y chromium)")
    with playwright.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS, headless=True)
        try:
            yield browser
        finally:
            browser.close()


@pytest.fixture(params=["standin", "real"])
def served(request, tmp_path_factory):
    tmp = tmp_path_factory.mktemp(f"browser-{request.param}")
    extra = {}
    if request.param == "standin":
        root = make_standin_repo(tmp / "repo", sleep=0.5)
    else:
        from tests.conftest import shared_data_root

        data = shared_data_root()
        if data is None:
            pytest.skip("../shared/data is not present on this machine")
        root = copy_repository(tmp / "repo")
        extra["BERT_DATA_ROOT"] = str(data)
    with serve_repository(root, tmp, extra) as served:
        served.kind = request.param
        served.shots = tmp / "screenshots"
        served.shots.mkdir()
        yield served


def _prop(page, name: str):
    """One field of Prefect's parameter form, by its label."""
    label = page.locator(".schema-form-property__label", has_text=re.compile(rf"^{name}( \(Optional\))?$"))
    return page.locator(".schema-form-property", has=label)


def test_custom_run_from_the_ui_completes(browser, served):
    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    page.set_default_timeout(60_000)
    step = 0

    def shot(name: str) -> None:
        nonlocal step
        step += 1
        page.screenshot(path=str(served.shots / f"{step:02d}-{name}.png"), full_page=True)

    exp_name = f"browser-{served.kind}-{int(time.time())}"
    try:
        # Open the deployment from the deployments list.
        page.goto(f"{served.ui_url}/deployments", wait_until="networkidle")
        page.locator("tr", has_text="bert-pipeline").get_by_role("link", name="local").click()
        page.wait_for_url("**/deployments/deployment/**")
        shot("deployment")

        # Run -> Custom run: change the profile (a select) and the experiment name (a text field).
        page.get_by_role("button", name="Run", exact=True).click()
        page.get_by_text("Custom run", exact=True).click()
        page.wait_for_url("**/run**")
        select = _prop(page, "profile").locator("button.p-select-button__control")
        select.click()
        select.press("ArrowDown")  # opens the options list
        page.locator(".p-select-option", has_text=re.compile(r"^tiny$")).click()
        assert select.inner_text().strip() == "tiny"
        name_field = _prop(page, "experiment_name")
        name_field.get_by_role("button", name="str", exact=True).click()
        name_field.locator("textarea").fill(exp_name)
        run_name = page.locator(".p-label", has_text="Run Name").locator("input").first
        run_name.fill(exp_name)
        shot("custom-run-form")
        page.get_by_role("button", name="Submit", exact=True).click()

        # Back on the deployment page the new run is listed by its name; open it and watch its state badge.
        page.get_by_role("link", name=exp_name).first.click()
        page.wait_for_url("**/runs/flow-run/**")
        flow_run_id = page.url.rstrip("/").split("/")[-1].split("?")[0]
        shot("flow-run")
        badge = page.locator(".state-badge").first
        deadline = time.monotonic() + RUN_TIMEOUT_S[served.kind]
        while True:
            classes = badge.get_attribute("class") or ""
            if re.search(r"state--(completed|failed|crashed|cancelled)", classes):
                break
            assert time.monotonic() < deadline, f"the run did not finish in time:\n{served.log_tail()}"
            page.wait_for_timeout(5000)
            page.reload(wait_until="networkidle")
            badge = page.locator(".state-badge").first
        shot("final-state")
        assert "state--completed" in classes, f"{badge.inner_text()}\n{served.log_tail(120)}"
        assert badge.inner_text().strip() == "Completed"

        # The artifacts tab shows the pipeline summary.
        page.get_by_text("Artifacts", exact=True).first.click()
        page.get_by_text("pipeline-summary").first.wait_for()
        shot("artifacts")
    except Exception:
        shot("failure")
        print(f"screenshots: {served.shots}")
        raise
    finally:
        page.close()

    # The run used the form's values: a DVC experiment of that name, MLflow stage runs tagged with it.
    run = served.wait(flow_run_id, 60)
    assert run.parameters["profile"] == "tiny" and run.parameters["experiment_name"] == exp_name
    from prefect.client.orchestration import get_client

    with served.settings(), get_client(sync_client=True) as prefect_client:
        created = [
            r for r in prefect_client.read_flow_runs() if r.parameters.get("experiment_name") == exp_name
        ]
    assert len(created) == 1, "one click on Submit must create one flow run"
    client = mlflow.MlflowClient(served.mlflow_uri)
    runs = client.search_runs(
        [e.experiment_id for e in client.search_experiments()], f"tags.pipeline_run_id = '{flow_run_id}'"
    )
    assert runs and {r.data.tags["dvc_experiment"] for r in runs} == {exp_name}
    if served.kind == "standin":
        assert {r.data.params["size"] for r in runs} == {"1"}  # the stand-in's tiny profile
    shutil.rmtree(served.shots, ignore_errors=True)


# ====================================================================== the MLflow UI
def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def mlflow_ui(tmp_path):
    """``mlflow ui`` on a free loopback port over a store holding two fine-tuning task runs (sst2, cola),
    each with two nested trial runs, logged through the pipeline's own tracking code."""
    import os
    import subprocess
    import sys
    import urllib.request

    from bert_core.tracking import FINETUNE_EXPERIMENT, stage_run
    from bert_core.tracking.trials import MlflowTrialTracker
    from bert_core.tracking.ui import log_dataset, log_headline_metric

    uri = os.environ["MLFLOW_TRACKING_URI"]  # the test's own store (tests/conftest.py)
    for task, key, value in (("sst2", "accuracy", 91.25), ("cola", "matthews_corr", 47.5)):
        with stage_run(
            "finetune",
            {"task": task},
            experiment=FINETUNE_EXPERIMENT,
            run_name=f"finetune-{task}",
            tags={"task": task},
        ) as run:
            log_dataset(
                f"{task}-train",
                source=str(tmp_path / f"{task}.tsv"),
                digest=f"{task}0001",
                rows=100,
                context="training",
                tags={"task": task, "split": "train"},
            )
            trials = MlflowTrialTracker(run.run_id, main_metric=key)
            for seed in (1, 2):
                with trials.trial(f"{task}-trial-seed{seed}", {"seed": seed}, {"task": task}) as trial:
                    trial.log_metrics({f"dev.{key}": value - seed})
            run.log_metrics({f"dev.{key}": value})
            log_headline_metric(key, {f"dev.{key}": value})
    experiment_id = mlflow.MlflowClient().get_experiment_by_name(FINETUNE_EXPERIMENT).experiment_id
    port = _free_port()
    log = open(tmp_path / "mlflow-ui.log", "w")  # noqa: SIM115 - closed below
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "mlflow",
            "ui",
            "--backend-store-uri",
            uri,
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--workers",
            "1",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
        cwd=tmp_path,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                with urllib.request.urlopen(f"{url}/health", timeout=5) as resp:
                    if resp.status == 200:
                        break
            except OSError:
                pass
            assert proc.poll() is None, (tmp_path / "mlflow-ui.log").read_text()[-3000:]
            assert time.monotonic() < deadline, "mlflow ui did not start in 120 s"
            time.sleep(1)
        yield url, experiment_id, tmp_path, uri
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except Exception:
            proc.kill()
        log.close()


def _cell(page, run_name: str, column: str):
    """The runs table's cell of ``column`` in the row of ``run_name`` (the grid draws a row's pinned
    columns, Run Name and Created, and its other columns as two elements with one ``row-id``)."""
    row_id = page.locator('[role="row"]', has_text=run_name).first.get_attribute("row-id")
    return page.locator(f'[role="row"][row-id="{row_id}"] [col-id="{column}"]').first


def test_mlflow_ui_opens_the_experiment_on_the_runs_table(browser, mlflow_ui):
    url, experiment_id, tmp, uri = mlflow_ui
    from bert_core.tracking import FINETUNE_EXPERIMENT
    from flows import ui

    # The link `make ui` prints for the fine-tuning experiment (it saves the experiment's view first).
    [link] = [
        line.split(": ", 1)[1].strip()
        for line in ui.links(url, ui.pipeline_experiments(uri))
        if line.strip().startswith(f"{FINETUNE_EXPERIMENT}:")
    ]
    # An ordinary screen: the view puts dev.main in the first column after the run's name and time.
    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    page.set_default_timeout(60_000)
    task_rows = page.locator('[role="row"]', has_text=re.compile(r"finetune-(sst2|cola)"))
    trial_rows = page.locator('[role="row"]', has_text=re.compile(r"-trial-seed\d"))
    try:
        page.goto(link, wait_until="load")
        page.wait_for_url(f"**/experiments/{experiment_id}**")
        page.get_by_text("finetune-sst2").first.wait_for()
        page.get_by_text("finetune-cola").first.wait_for()
        page.get_by_text("6 matching runs").first.wait_for()  # 2 task runs + 4 trials, of which ...
        page.screenshot(path=str(tmp / "experiment.png"), full_page=True)
        assert "traces" not in page.url and "genai" not in page.url.lower(), page.url
        page.get_by_text("Sort: Created").first.wait_for()  # the sort that keeps trials under their task
        # ... one row per task run, the trials collapsed under it, newest task first.
        assert task_rows.count() == 2 and trial_rows.count() == 0, page.locator("body").inner_text()[:3000]
        assert "finetune-cola" in task_rows.nth(0).inner_text()
        # dev.main is a column with no column picked, each task run showing its own score.
        assert page.locator('[role="columnheader"]', has_text="dev.main").first.is_visible()
        header = page.locator('[role="columnheader"]', has_text="dev.main").first.bounding_box()
        assert header is not None and header["x"] + header["width"] <= 1400, header
        for name, score, metric in (("sst2", "91.25", "accuracy"), ("cola", "47.5", "matthews")):
            value = _cell(page, f"finetune-{name}", "metrics.`dev.main`")
            assert value.inner_text().strip() == score and value.is_visible()
            assert _cell(page, f"finetune-{name}", "tags.`main_metric`").inner_text().startswith(metric)
        assert "sst2-train" in page.locator("body").inner_text()  # the Dataset column
        # Expanding a task run shows its trials, each with its own dev.main.
        _cell(page, "finetune-sst2", "attributes.`Run Name`").locator("button").first.click()
        page.get_by_text("sst2-trial-seed1").first.wait_for()
        assert trial_rows.count() == 2 and task_rows.count() == 2
        assert "cola-trial" not in page.locator("body").inner_text()
        for seed, score in ((1, "90.25"), (2, "89.25")):
            assert _cell(page, f"sst2-trial-seed{seed}", "metrics.`dev.main`").inner_text().strip() == score
        page.screenshot(path=str(tmp / "runs-expanded.png"), full_page=True)
    except Exception:
        page.screenshot(path=str(tmp / "failure.png"), full_page=True)
        print(f"screenshots: {tmp}")
        raise
    finally:
        page.close()
