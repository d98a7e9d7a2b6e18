"""The declared stage table against dvc.yaml, and the code deps derived from the stages' real imports."""

from __future__ import annotations

import inspect
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from bert_core.constants import REPO_ROOT
from flows import stages
from flows.stages import STAGES
from flows.stages import deps as _deps


def _dvc_stages() -> dict:
    return yaml.safe_load((REPO_ROOT / "dvc.yaml").read_text(encoding="utf-8"))["stages"]


def _names(entries) -> list[str]:
    return [e if isinstance(e, str) else next(iter(e)) for e in entries or []]


def test_the_table_and_dvc_yaml_agree():
    dvc = _dvc_stages()
    assert list(dvc) == [stages.INPUTS, *(s.name for s in STAGES)], "stages (and their order) differ"
    assert dvc[stages.INPUTS]["always_changed"] is True
    assert _names(dvc[stages.INPUTS]["outs"]) == [stages.INPUTS_DIR]
    for stage in STAGES:
        body = dvc[stage.name]
        if stage.foreach:
            assert body["foreach"] == "${" + stage.foreach + "}", stage.name
            body = body["do"]
        else:
            assert "foreach" not in body, stage.name
        cmd = body["cmd"].split()
        # exec: no shell between DVC and the stage (a dash left there dies at Ctrl-C, see dvc.yaml)
        assert cmd[:4] == ["exec", "python", "-m", stage.flow_module], f"{stage.name}: cmd {body['cmd']!r}"
        params = {}
        for entry in body["params"]:
            (file, keys), *_ = entry.items()
            params[file] = keys
        assert set(params) == {stage.params_file, *(f for f, _ in stage.extra_params)}, stage.name
        own = params[stage.params_file]
        bad = [k for k in own if k != stage.section and not k.startswith(stage.section + ".")]
        assert not bad, f"{stage.name}: keys outside section {stage.section}: {bad}"
        for file, key in stage.extra_params:
            assert key in params[file], f"{stage.name}: {file} does not list {key}"
        assert _names(body.get("outs")) == [*stage.outs, *stage.details], f"{stage.name}: outs"
        assert _names(body.get("metrics")) == list(stage.metrics), f"{stage.name}: metrics"
        assert _names(body.get("plots")) == list(stage.plots), f"{stage.name}: plots"
        deps = _names(body.get("deps"))
        data = [d for d in deps if not d.startswith(_deps.CODE_PACKAGES)]
        assert data == [*filter(None, [stage.record]), *stage.data_deps], f"{stage.name}: data deps"
        for entry in (*body.get("outs", []), *body.get("metrics", []), *body.get("plots", [])):
            options = next(iter(entry.values())) if isinstance(entry, dict) else {}
            assert options.get("persist") is True, f"{stage.name}: {entry} is not persist: true"


def test_every_stage_resolves_to_its_model_entry_and_flow():
    from prefect import Flow

    for stage in STAGES:
        model = stage.model()
        assert model.__name__.endswith("Params"), stage.name
        assert callable(stage.entry_function()), stage.name
        flow = stages.resolve(stage.flow)
        flow = flow if isinstance(flow, Flow) else flow()
        assert isinstance(flow, Flow) and flow.name == stage.name
        # The flow's defaults are the table's: default paths are spelled in one place.
        signature = inspect.signature(flow.fn)
        for option in stage.options:
            if not option.positional:
                assert signature.parameters[option.dest].default == option.default, (stage.name, option)
        assert stages.get(f"{stage.name}@x") is stage
        assert stages.by_params_file(stage.params_file) is stage


def test_dvc_yaml_code_deps_are_in_sync():
    result = _deps.sync(REPO_ROOT)
    assert not result.problems, (
        "dvc.yaml deps differ from the stages' imports; run `python -m flows.stages sync-deps`:\n"
        + "\n".join(result.problems)
    )


def test_a_removed_dep_is_caught():
    text = (REPO_ROOT / "dvc.yaml").read_text(encoding="utf-8")
    evaluate = text.index("  evaluate:")
    line = "    - bert_core/config.py\n"
    at = text.index(line, evaluate)
    broken = text[:at] + text[at + len(line) :] + ""
    result = _deps.sync(REPO_ROOT, text=broken)
    assert result.problems == ["stage evaluate: missing dep bert_core/config.py"]
    assert result.wrong_stages == ["evaluate"]
    assert result.text == text  # the rewrite puts it back, nothing else changes
    extra = text.replace("    - flows/evaluate.py\n", "    - flows/evaluate.py\n    - flows/serve.py\n")
    assert _deps.sync(REPO_ROOT, text=extra).problems == ["stage evaluate: superfluous dep flows/serve.py"]


def test_the_check_command_names_stage_and_path(tmp_path, capsys):
    for name in ("bert_core", "flows"):
        (tmp_path / name).symlink_to(REPO_ROOT / name)
    text = (REPO_ROOT / "dvc.yaml").read_text(encoding="utf-8")
    (tmp_path / "dvc.yaml").write_text(text.replace("    - flows/vocab.py\n", ""))
    assert _deps.main(["sync-deps", "--check"], root=tmp_path) == 1
    assert "stage vocab: missing dep flows/vocab.py" in capsys.readouterr().err
    assert _deps.main(["sync-deps"], root=tmp_path) == 0
    assert (tmp_path / "dvc.yaml").read_text() == text
    assert _deps.main(["sync-deps", "--check"], root=tmp_path) == 0


def test_the_closure_takes_every_import_and_the_parent_packages():
    import grimp

    graph = grimp.ImportGraph()
    for package in ("flows", "bert_core", "bert_core.sub"):
        graph.add_module(package)
    for importer, imported in [
        ("flows.helper", "flows.s"),
        ("flows.s", "bert_core.sub.c"),
        ("bert_core.sub.c", "bert_core.b"),
        ("bert_core.b", "bert_core.a"),
        ("bert_core.unused", "bert_core.never"),
    ]:
        graph.add_import(importer=importer, imported=imported)
    assert _deps.closure(graph, "flows.s") == {
        "flows",  # the parent package of flows.s, run before it
        "flows.s",
        "bert_core",
        "bert_core.sub",
        "bert_core.sub.c",
        "bert_core.b",
        "bert_core.a",
    }


def test_the_graph_sees_imports_inside_functions():
    # flows.pretrain imports the continued-pretraining init inside its flow function
    assert "bert_core.pretrain.init" in _deps.closure(_deps.import_graph(), "flows.pretrain")


def test_a_package_whose_files_are_all_imported_collapses_to_its_directory(tmp_path):
    files = ["bert_core/__init__.py", "bert_core/a.py", "bert_core/sub/__init__.py", "bert_core/sub/c.py"]
    for rel in [*files, "bert_core/sub/unused.py"]:
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text("")
    found = {tmp_path / rel for rel in files}
    assert _deps.collapse(found, tmp_path) == files  # sub/unused.py is not imported: files, one by one
    (tmp_path / "bert_core/sub/unused.py").unlink()
    assert _deps.collapse(found, tmp_path) == ["bert_core/__init__.py", "bert_core/a.py", "bert_core/sub"]


def _run(cmd: list[str], cwd: Path) -> str:
    proc = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, f"{' '.join(cmd)}: {proc.stdout}\n{proc.stderr}"
    return proc.stdout


def test_editing_an_imported_file_makes_dvc_report_the_stage(tmp_path):
    """On a scratch copy of the repository: a comment appended to bert_core/config.py (imported by evaluate
    through the finetune package) makes `dvc status` report the evaluate stage."""
    repo = tmp_path / "repo"
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    for name in ("bert_core", "flows", "params"):
        shutil.copytree(REPO_ROOT / name, repo / name, ignore=ignore)
    shutil.copy(REPO_ROOT / "dvc.yaml", repo / "dvc.yaml")
    dvc = [sys.executable, "-m", "dvc"]
    _run([*dvc, "init", "--no-scm", "-q"], repo)
    stage = stages.get("evaluate")
    for dep in stage.data_deps:
        (repo / dep).mkdir(parents=True)
        (repo / dep / "summary.json").write_text("{}")
    for out in (*stage.outs, *stage.details, *stage.metrics):
        path = repo / out
        path.parent.mkdir(parents=True, exist_ok=True)
        if path.suffix:
            path.write_text("{}" if path.suffix == ".json" else "fake")
        else:
            path.mkdir()
            (path / "scores.png").write_text("fake")
    _run([*dvc, "commit", "-f", "-q", "evaluate"], repo)
    assert "evaluate" not in _run([*dvc, "status", "evaluate"], repo)
    with (repo / "bert_core" / "config.py").open("a") as fh:
        fh.write("# touched\n")
    status = _run([*dvc, "status", "evaluate"], repo)
    assert "evaluate:" in status and "bert_core/config.py" in status, status


def test_every_output_is_kept_when_its_stage_fails_under_dvc(tmp_path):
    """DVC deletes a stage's outputs before running its command unless they are ``persist: true``: a run
    that then failed left none. On a scratch copy: evaluate's outputs, committed, survive a failed run."""
    repo = tmp_path / "repo"
    repo.mkdir()
    text = (REPO_ROOT / "dvc.yaml").read_text(encoding="utf-8")
    (repo / "dvc.yaml").write_text(text.replace("cmd: exec python -m flows.evaluate", "cmd: exit 1"))
    shutil.copytree(REPO_ROOT / "params", repo / "params")
    dvc = [sys.executable, "-m", "dvc"]
    _run([*dvc, "init", "--no-scm", "-q"], repo)
    stage = stages.get("evaluate")
    deps = [d for d in _names(_dvc_stages()["evaluate"]["deps"])]
    for dep in deps:
        path = repo / dep
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("x") if path.suffix else (path.mkdir(), (path / "f.py").write_text("x"))
    written = {}
    for out in (*stage.outs, *stage.details, *stage.metrics):
        path = repo / out
        path.parent.mkdir(parents=True, exist_ok=True)
        if path.suffix:
            path.write_text(written.setdefault(out, "{}" if path.suffix == ".json" else "report"))
        else:
            path.mkdir()
            (path / "scores.png").write_text(written.setdefault(out, "png"))
    _run([*dvc, "commit", "-f", "-q", "evaluate"], repo)
    (repo / deps[-1]).write_text("changed")  # so DVC runs the stage, whose command fails
    failed = subprocess.run(
        [*dvc, "repro", "--single-item", "evaluate"], cwd=repo, capture_output=True, text=True, timeout=120
    )
    assert failed.returncode != 0 and "exit 1" in failed.stderr + failed.stdout, failed.stderr
    for out, content in written.items():
        path = repo / out
        assert (path.read_text() if path.suffix else (path / "scores.png").read_text()) == content, out


@pytest.mark.parametrize("given, expected", [(None, "PASSIVE"), ("ACTIVE", "ACTIVE")])
def test_a_stage_process_has_openmp_wait_passively_before_torch_loads_unless_told(given, expected):
    """Stages run side by side on a CPU's cores: spinning OpenMP waits would slow each one several-fold.
    The default is set by the ``flows`` package, so every ``python -m flows.<stage>`` has it before torch."""
    code = "import os, flows.finetune; print(os.environ['OMP_WAIT_POLICY'])"
    env = {k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"}
    env |= {"OMP_WAIT_POLICY": given} if given else {}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.split() == [expected]
