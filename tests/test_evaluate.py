"""The evaluate stage: summary metrics (GLUE average without WNLI, gaps, spread), references, the report."""

from __future__ import annotations

import base64
import json
import logging
import re

import pytest
import yaml

from bert_core.evaluate import SummaryCheckError, evaluate_results, summarize
from bert_core.evaluate.crosscheck import dvc_dir_hash
from bert_core.evaluate.references import HF_BASE_CASED_DEV, REFERENCES, glue_average, headline_metric
from bert_core.finetune.results import FinetuneResult, TrialResult
from bert_core.tasks import get_task

TINY = {"source": "models/pretrained", "num_hidden_layers": 2, "hidden_size": 128, "preset": "tiny"}


def _trial(init, lr, seed, dev, **kw) -> TrialResult:
    history = [{"step": s, "epoch": s / 10, "loss": 1.0 / s, "learning_rate": lr} for s in range(1, 11)]
    evals = [{"step": 10, "epoch": 1.0, **dev}]
    return TrialResult(
        init,
        lr,
        seed,
        dev,
        history=history,
        evals=evals,
        train_examples=320,
        train_seconds=2.0,
        steps=10,
        epochs=1.0,
        **kw,
    )


def _write(results_dir, result: FinetuneResult) -> None:
    path = results_dir / result.task / "summary.json"
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps(result.to_json()))


@pytest.fixture
def results_dir(tmp_path):
    root = tmp_path / "results"
    _write(
        root,
        FinetuneResult(
            "mnli",
            "classification",
            "accuracy",
            TINY,
            [
                _trial(
                    "pretrained",
                    1e-4,
                    1,
                    {"accuracy": 60.0},
                    other_splits={"dev_mismatched": {"accuracy": 62.0}},
                ),
            ],
        ),
    )
    _write(
        root,
        FinetuneResult(
            "sst2",
            "classification",
            "accuracy",
            TINY,
            [
                _trial("pretrained", 1e-4, 1, {"accuracy": 80.0}),
                _trial("pretrained", 3e-4, 1, {"accuracy": 82.0}),
                _trial("random", 1e-4, 1, {"accuracy": 70.0}),
                _trial("random", 3e-4, 1, {"accuracy": 65.0}),
            ],
        ),
    )
    _write(
        root,
        FinetuneResult(
            "cola",
            "classification",
            "matthews_corr",
            TINY,
            [
                _trial("pretrained", 1e-4, 1, {"matthews_corr": 10.0}),
                _trial("pretrained", 1e-4, 2, {"matthews_corr": 20.0}),
                _trial("pretrained", 3e-4, 1, {"matthews_corr": float("nan")}),  # undefined: never selected
            ],
        ),
    )
    _write(
        root,
        FinetuneResult(
            "wnli",
            "classification",
            "accuracy",
            TINY,
            [
                _trial("pretrained", 1e-4, 1, {"accuracy": 0.0}),
            ],
        ),
    )
    _write(
        root,
        FinetuneResult(
            "squad_v1",
            "span_qa",
            "f1",
            TINY,
            [
                _trial("pretrained", 1e-4, 1, {"f1": 30.0, "exact_match": 20.0}),
            ],
        ),
    )
    return root


def test_published_glue_averages_match_the_paper():
    for size, expected in (("base", 79.6), ("large", 82.1)):
        ref = REFERENCES[size]
        avg, rows = glue_average({r: next(iter(ref.scores[r].values())) for r in ref.scores})
        assert len(rows) == 9 and round(avg, 1) == expected
    assert (
        REFERENCES["tiny"].scores["sst2"]["accuracy"] == 83.2
        and REFERENCES["tiny"].scores["cola"]["matthews_corr"] == 0.0
    )
    assert HF_BASE_CASED_DEV["wnli"]["accuracy"] == 56.3


def test_a_chart_rows_headline_metric_is_its_tasks():
    assert headline_metric("stsb", "accuracy") == "spearman"
    assert headline_metric("mnli_mm", "f1") == get_task("mnli").main_metric == "accuracy"
    assert headline_metric("not_a_task", "f1") == "f1"


def test_summary_metrics(results_dir, tmp_path):
    metrics, paths = evaluate_results(
        results_dir, tmp_path / "metrics" / "evaluate.json", tmp_path / "reports"
    )
    # GLUE average: mnli, mnli_mm, sst2, cola (WNLI excluded); cola's selected trial is the best seed (20)
    assert metrics["glue.average"] == pytest.approx((60.0 + 62.0 + 82.0 + 20.0) / 4)
    assert metrics["glue.tasks"] == 4
    assert metrics["glue.reference_average"] == pytest.approx((70.2 + 70.3 + 83.2 + 0.0) / 4)
    assert metrics["wnli.accuracy"] == 0.0 and metrics["squad_v1.f1"] == 30.0
    assert metrics["gap.sst2.accuracy"] == pytest.approx(82.0 - 70.0)
    assert metrics["random_init.sst2.accuracy"] == 70.0 and metrics["gap.mean"] == pytest.approx(12.0)
    assert metrics["glue.random_init_average"] == 70.0 and metrics["gap.glue_average"] == pytest.approx(12.0)
    assert metrics["cola.matthews_corr_std"] == pytest.approx(7.0710678)
    assert metrics["mnli_mm.accuracy"] == 62.0 and metrics["tasks"] == 5
    on_disk = json.loads(paths["metrics"].read_text())
    assert on_disk == pytest.approx(metrics) and all(isinstance(v, float) for v in on_disk.values())


def test_report_renders_with_plots(results_dir, tmp_path):
    _, paths = evaluate_results(results_dir, tmp_path / "evaluate.json", tmp_path / "reports")
    html = paths["html"].read_text()
    images = re.findall(r"src='data:image/png;base64,([A-Za-z0-9+/=]+)'", html)
    assert len(images) == 3
    assert all(base64.b64decode(img)[:8] == b"\x89PNG\r\n\x1a\n" for img in images)
    assert "GLUE average" in html and "BERT-Tiny (Turc et al. 2019)" in html
    md = paths["markdown"].read_text()
    for link in re.findall(r"\]\((evaluate/[a-z_]+\.png)\)", md):
        assert (tmp_path / "reports" / link).read_bytes()[:4] == b"\x89PNG"
    assert md.count(".png)") == 3 and "| sst2 | dev | accuracy | 82.0 |" in re.sub(r" {2,}", " ", md)


def test_task_filter_reference_choice_and_errors(results_dir, tmp_path):
    summary = summarize(results_dir, tasks=["sst2", "wnli"], reference_size="base")
    assert sorted(summary.results) == ["sst2", "wnli"] and summary.reference is REFERENCES["base"]
    sst2 = next(r for r in summary.rows if r.name == "sst2")
    assert sst2.reference == 93.5 and sst2.reference_split == "test"
    assert summarize(results_dir, reference_size="none").reference is None
    with pytest.raises(FileNotFoundError, match=r"dvc repro finetune@rte"):
        summarize(results_dir, tasks=["sst2", "rte"])
    with pytest.raises(FileNotFoundError, match="run the finetune stages"):
        summarize(tmp_path / "nothing")
    bad = results_dir / "qqp" / "summary.json"
    bad.parent.mkdir()
    bad.write_text("{not json")
    with pytest.raises(ValueError, match=r"qqp/summary\.json"):
        summarize(results_dir)


# ------------------------------------------------------------------ cross-checks of the summaries


def _with_sha(result: FinetuneResult, sha: str, uri: str = "models/pretrained") -> FinetuneResult:
    result.model = {**result.model, "sha": sha, "uri": uri}
    return result


def _glue(task: str, sha: str = "aaaa1111", uri: str = "models/pretrained") -> FinetuneResult:
    spec = get_task(task)  # the registry's kind and main metric
    trials = [_trial("pretrained", 1e-4, 1, {spec.main_metric: 70.0})]
    return _with_sha(FinetuneResult(task, spec.kind, spec.main_metric, dict(TINY), trials), sha, uri)


@pytest.fixture
def five_tasks(tmp_path):
    root = tmp_path / "results"
    for task in ("cola", "mrpc", "rte", "sst2", "stsb"):
        _write(root, _glue(task))
    return root


def _copy_summary(root, src: str, dst: str) -> None:
    (root / dst / "summary.json").write_bytes((root / src / "summary.json").read_bytes())


def test_another_tasks_summary_copied_in_is_refused_by_name(five_tasks, tmp_path):
    _copy_summary(five_tasks, "mrpc", "rte")
    reports = tmp_path / "reports"
    for tasks in (["cola", "mrpc", "rte", "sst2", "stsb"], None):  # configured, or every summary found
        with pytest.raises(SummaryCheckError) as err:
            evaluate_results(five_tasks, tmp_path / "metrics.json", reports, tasks=tasks)
        msg = str(err.value)
        assert f"{five_tasks}/rte/summary.json is the summary of task 'mrpc', not 'rte'" in msg
        assert "re-run `dvc repro finetune@rte`" in msg and len(err.value.problems) == 1
    assert not reports.exists() and not (tmp_path / "metrics.json").exists()  # never a partial report


def test_kind_or_main_metric_that_disagrees_with_the_registry(five_tasks):
    path = five_tasks / "rte" / "summary.json"
    data = json.loads(path.read_text())
    path.write_text(json.dumps({**data, "kind": "span_qa"}))
    with pytest.raises(
        SummaryCheckError,
        match=r"rte/summary\.json records kind 'span_qa' for task 'rte', but "
        r"the task registry \(bert_core.tasks\) says 'classification'.*finetune@rte",
    ):
        summarize(five_tasks)
    path.write_text(json.dumps({**data, "main_metric": "f1"}))
    with pytest.raises(SummaryCheckError, match=r"records main_metric 'f1' for task 'rte'.*'accuracy'"):
        summarize(five_tasks)


def test_unknown_task_directory_and_incomplete_summaries(five_tasks):
    _write(five_tasks, _glue("qqp"))
    (five_tasks / "qqp").rename(five_tasks / "foo")
    with pytest.raises(
        SummaryCheckError,
        match=r"foo/summary\.json lies in a directory named 'foo', which is "
        "no task of the registry",
    ):
        summarize(five_tasks)
    (five_tasks / "foo" / "summary.json").unlink()
    path = five_tasks / "rte" / "summary.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), "trials": []}))
    with pytest.raises(
        SummaryCheckError,
        match=r"rte/summary\.json: not a complete fine-tuning summary \(no "
        r"trials\); re-run `dvc repro finetune@rte`",
    ):
        summarize(five_tasks, tasks=["rte", "sst2"])


def test_summaries_from_different_pretrained_models_are_named(five_tasks):
    _write_over = five_tasks / "rte" / "summary.json"
    _write_over.write_text(
        json.dumps(_glue("rte", sha="bbbb2222", uri="models:/bert-pretrained@newest").to_json())
    )
    with pytest.raises(SummaryCheckError) as err:
        summarize(five_tasks)
    msg = str(err.value)
    assert len(err.value.problems) == 1 and msg.startswith(
        f"{five_tasks}/rte/summary.json was fine-tuned from "
        "pretrained model bbbb2222 (models:/bert-pretrained@newest)"
    )
    assert "but cola, mrpc, sst2, stsb from aaaa1111 (models/pretrained)" in msg and "finetune@rte" in msg
    # a tie names every side; summaries without a fingerprint (older runs) are not compared
    with pytest.raises(SummaryCheckError) as err:
        summarize(five_tasks, tasks=["rte", "sst2"])
    assert len(err.value.problems) == 2
    data = json.loads(_write_over.read_text())
    del data["model"]["sha"]
    _write_over.write_text(json.dumps(data))
    assert sorted(summarize(five_tasks).results) == ["cola", "mrpc", "rte", "sst2", "stsb"]


def test_every_problem_is_named_and_the_message_is_bounded(five_tasks):
    for task in ("cola", "mrpc", "rte", "sst2", "stsb"):
        other = "sst2" if task != "sst2" else "cola"
        (five_tasks / task / "summary.json").write_text(json.dumps(_glue(other).to_json()))
    (five_tasks / "wnli").mkdir()
    (five_tasks / "wnli" / "summary.json").write_text("{" + "x" * 100_000)
    with pytest.raises(SummaryCheckError) as err:
        summarize(five_tasks)
    assert len(err.value.problems) == 6 and "and 1 more problem(s)" in str(err.value)
    assert len(str(err.value)) < 3000


def test_the_report_says_which_tasks_it_covers(results_dir, tmp_path):
    _, paths = evaluate_results(
        results_dir, tmp_path / "m.json", tmp_path / "reports", tasks=["sst2", "wnli"]
    )
    assert "Tasks: the tasks of finetune.tasks (sst2, wnli)" in paths["markdown"].read_text()
    _, paths = evaluate_results(results_dir, tmp_path / "m.json", tmp_path / "reports")
    assert "finetune.tasks lists none" in paths["markdown"].read_text()


def test_dvc_dir_hash_is_the_one_dvc_records(tmp_path):
    # recorded by `dvc repro` (DVC 3) in dvc.lock for exactly this directory: a nested file, CRLF kept as is
    (tmp_path / "out" / "sub").mkdir(parents=True)
    (tmp_path / "out" / "summary.json").write_bytes(b'{"v": 2}')
    (tmp_path / "out" / "sub" / "x.tsv").write_bytes(b"a\tb\r\n2\n")
    assert dvc_dir_hash(tmp_path / "out") == "dbfb9bc26cbe19deffb81c8f5d57f89f.dir"


def _lock(repo, hashes: dict[str, str], algo: str = "md5") -> None:
    stages = {
        f"finetune@{t}": {
            "cmd": f"python -m flows.finetune {t}",
            "outs": [{"path": f"results/finetune/{t}", "hash": algo, "md5": h}],
        }
        for t, h in hashes.items()
    }
    (repo / "dvc.lock").write_text(yaml.safe_dump({"schema": "2.0", "stages": stages}))


def test_results_that_differ_from_what_dvc_lock_recorded_are_named(tmp_path):
    root = tmp_path / "results" / "finetune"
    for task in ("rte", "sst2"):
        _write(root, _glue(task))
    _lock(tmp_path, {t: dvc_dir_hash(root / t) for t in ("rte", "sst2")})
    lock = tmp_path / "dvc.lock"
    assert sorted(summarize(root, lock_path=lock).results) == ["rte", "sst2"]  # as committed
    # the right task, but not the file finetune@rte committed (restored from elsewhere, edited)
    rte = root / "rte" / "summary.json"
    rte.write_text(json.dumps({**json.loads(rte.read_text()), "outputs": {"model": "elsewhere"}}))
    with pytest.raises(SummaryCheckError) as err:
        summarize(root, lock_path=lock)
    msg = str(err.value)
    assert msg.startswith(f"{root}/rte is not what finetune@rte committed ({lock} records ")
    assert (
        "re-run `dvc repro finetune@rte`, or `dvc commit finetune@rte`" in msg
        and len(err.value.problems) == 1
    )
    # not compared: no lock, a task the lock does not record, results outside the lock's repository,
    # a pre-3.0 entry (md5-dos2unix)
    assert summarize(root, lock_path=tmp_path / "absent.lock").results
    _lock(tmp_path, {"sst2": dvc_dir_hash(root / "sst2")})
    assert summarize(root, lock_path=lock).results
    _lock(tmp_path, {"rte": "0" * 32 + ".dir"}, algo="md5-dos2unix")
    assert summarize(root, lock_path=lock).results
    (tmp_path / "elsewhere").mkdir()
    _lock(tmp_path / "elsewhere", {"rte": "0" * 32 + ".dir"})
    assert summarize(root, lock_path=tmp_path / "elsewhere" / "dvc.lock").results
    (tmp_path / "dvc.lock").write_text("stages: [not: a mapping")  # DVC itself reports a broken lock
    assert summarize(root, lock_path=lock).results


def test_staged_outputs_give_the_same_bytes_and_commit_together(results_dir, tmp_path):
    from bert_core.atomic import atomic_outputs

    def tree_digest(path):
        files = [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file())
        return [(f.name, f.read_bytes()) for f in files]

    _, direct = evaluate_results(results_dir, tmp_path / "a" / "evaluate.json", tmp_path / "a" / "reports")
    b = tmp_path / "b"
    outs = [b / "reports" / "evaluate.md", b / "reports" / "evaluate.html", b / "reports" / "evaluate"]
    with atomic_outputs([*outs, b / "evaluate.json"], dirs=[outs[2]]) as staged:
        _, paths = evaluate_results(results_dir, b / "evaluate.json", b / "reports", outputs=staged)
        assert not any(p.exists() for p in [*outs, b / "evaluate.json"])  # nothing before the commit
    assert paths["markdown"] == outs[0] and paths["metrics"] == b / "evaluate.json"
    for a_path, b_path in [
        (direct["markdown"], outs[0]),
        (direct["html"], outs[1]),
        (direct["plot.scores"].parent, outs[2]),
        (direct["metrics"], b / "evaluate.json"),
    ]:
        assert tree_digest(a_path) == tree_digest(b_path), b_path
    assert not list(b.rglob(".*.tmp-*"))


def test_scores_not_above_their_best_baseline_are_marked_and_counted(tmp_path):
    root = tmp_path / "results"
    # sst2 beats its best baseline (82 > 72); cola ties it (0 = 0: not above); conll2003 is below (50 < 68.8)
    _write(
        root,
        FinetuneResult(
            "sst2",
            "classification",
            "accuracy",
            TINY,
            [_trial("pretrained", 1e-4, 1, {"accuracy": 82.0})],
            baselines={"majority": {"accuracy": 50.9}, "tfidf_logreg": {"accuracy": 72.0}},
        ),
    )
    _write(
        root,
        FinetuneResult(
            "cola",
            "classification",
            "matthews_corr",
            TINY,
            [_trial("pretrained", 1e-4, 1, {"matthews_corr": 0.0})],
            baselines={"majority": {"matthews_corr": 0.0}, "tfidf_logreg": {"matthews_corr": 0.0}},
        ),
    )
    _write(
        root,
        FinetuneResult(
            "conll2003",
            "token_classification",
            "f1",
            TINY,
            [_trial("pretrained", 1e-4, 1, {"f1": 50.5, "precision": 55.0, "recall": 46.0})],
            baselines={"majority": {"f1": 0.0}, "lexicon": {"f1": 68.8, "precision": 79.4}},
        ),
    )
    _write(
        root,
        FinetuneResult(
            "wnli",
            "classification",
            "accuracy",
            TINY,
            [  # no baselines: not counted
                _trial("pretrained", 1e-4, 1, {"accuracy": 56.3})
            ],
        ),
    )
    metrics, paths = evaluate_results(root, tmp_path / "m.json", tmp_path / "reports")
    md = paths["markdown"].read_text()
    assert "1 of 3 tasks beat their best trivial baseline (not: cola, conll2003, marked ≤ baseline)." in md
    assert "1 of 3 tasks beat their best trivial baseline" in paths["html"].read_text()
    main = md.split("## Per-task scores")[1].split("\n## ")[0]
    lines = [
        re.sub(r" +", " ", line) for line in main.splitlines() if line.startswith("| ")
    ]  # cells unpadded
    rows = {line.split(" | ")[0].strip("| "): line for line in lines}
    assert "| 82.0 |" in rows["sst2"] and "72.0 (tfidf_logreg)" in rows["sst2"] and "≤" not in rows["sst2"]
    assert "| 0.0 ≤ baseline |" in rows["cola"] and "0.0 (majority)" in rows["cola"]  # a tie: the first
    assert "| 50.5 ≤ baseline |" in rows["conll2003"] and "68.8 (lexicon)" in rows["conll2003"]
    assert "≤" not in rows["wnli"] and rows["wnli"].endswith("| – |")
    table = re.sub(
        r" +", " ", md.split("## Trivial baselines on the same evaluated rows")[1].split("\n## ")[0]
    )
    assert "| conll2003 | lexicon |" in table and "| 68.8 | 50.5 ≤ baseline | -18.3 |" in table
    assert "| f1 | 0.0 | 50.5 | +50.5 |" in table  # above the majority baseline: unmarked in its row
    assert metrics["baseline.tasks_compared"] == 3 and metrics["baseline.tasks_beating"] == 1
    assert metrics["sst2.beats_baseline"] == 1 and metrics["conll2003.beats_baseline"] == 0
    assert (
        metrics["conll2003.best_baseline.f1"] == 68.8
        and metrics["conll2003.baseline.lexicon.precision"] == 79.4
    )
    assert "wnli.beats_baseline" not in metrics


def test_the_evaluate_headline_puts_the_task_scores_first(results_dir, tmp_path):
    from bert_core.evaluate.report import score_keys
    from flows._stage import MAX_HEADLINE, headline
    from flows.stages import get

    metrics, _ = evaluate_results(results_dir, tmp_path / "evaluate.json", tmp_path / "reports")
    keys = score_keys(metrics)
    assert {"sst2.accuracy", "mnli_mm.accuracy", "squad_v1.f1", "cola.matthews_corr"} <= set(keys)
    top = headline(metrics, [*keys, *get("evaluate").headline])
    names = [k.partition("=")[0] for k in keys]  # a dev-split row's score is shown under its own name
    assert list(top)[: len(keys)] == names and "glue.average" in top and len(top) <= MAX_HEADLINE


def test_every_task_of_the_paper_fits_the_evaluate_headline_and_dev_split_scores_say_so(caplog):
    """The ``gpu-base`` task set (GLUE, both SQuADs, SWAG, CoNLL-2003: 15 rows with MNLI-mm and CoNLL-2003's
    test), both SQuADs
    on a dev split: every row and the stage's own keys, none pushed to the details; a dev-split score is
    named as one, so that it is never diffed against an official dev score."""
    from bert_core.evaluate.references import GLUE_AVERAGE_ROWS, headline_metric
    from bert_core.evaluate.report import score_keys
    from flows._stage import MAX_HEADLINE, headline
    from flows.stages import get

    rows = [*GLUE_AVERAGE_ROWS, "wnli", "squad_v1", "squad_v2", "swag", "conll2003", "conll2003_test"]
    metrics = {f"{r}.{headline_metric(r, '')}": 50.0 + i for i, r in enumerate(rows)}
    metrics |= {"squad_v1.dev_split": 1.0, "squad_v2.dev_split": 1.0, "tasks": 13.0, "gap.glue_average": 2.0}
    metrics |= {k: 1.0 for k in get("evaluate").headline}
    with caplog.at_level(logging.WARNING):
        top = headline(metrics, [*score_keys(metrics), *get("evaluate").headline])
    assert not caplog.records and len(top) == len(rows) + len(get("evaluate").headline) <= MAX_HEADLINE
    assert top["squad_v1.dev_split.f1"] == metrics["squad_v1.f1"] and "squad_v1.f1" not in top
    assert (
        top["squad_v2.dev_split.f1"] == metrics["squad_v2.f1"]
        and top["sst2.accuracy"] == metrics["sst2.accuracy"]
    )
    assert list(top)[: len(rows)] == [k for k in top if k.split(".", 1)[0] in rows]


def test_the_scores_plot_puts_a_tasks_best_baseline_beside_its_own_dev_rows_only():
    from types import SimpleNamespace

    from bert_core.evaluate.plots import _best_baseline
    from bert_core.evaluate.summary import Row
    from bert_core.finetune.results import FinetuneResult

    baselines = {"majority": {"accuracy": 35.4}, "tfidf_logreg": {"accuracy": 52.0}}
    mnli = FinetuneResult("mnli", "classification", "accuracy", {}, [], baselines=baselines)
    summary = SimpleNamespace(results={"mnli": mnli})
    assert _best_baseline(summary, Row("mnli", "mnli", "accuracy", 80.0)) == 52.0
    mm = Row("mnli_mm", "mnli", "accuracy", 80.0, split="dev_mismatched")
    assert _best_baseline(summary, mm) is None  # no baselines on that split
    assert _best_baseline(summary, Row("mnli", "mnli", "f1", 80.0)) is None  # no baseline on that metric
    assert _best_baseline(summary, Row("sst2", "sst2", "accuracy", 90.0)) is None
