"""The structure docs/architecture.md describes, held against the code's import graph (grimp's static read of
every import statement, function-level ones included: nothing is imported).

- ``bert_core`` never imports Prefect or DVC (the orchestrators live in ``flows/``);
- shared libraries never import a stage package, and a stage package never imports a later stage;
- no import circles among the modules of ``bert_core`` and ``flows`` (function-level imports included),
  and ``bert_core.tasks`` and ``bert_core.metrics`` never import each other both ways (tasks never imports
  metrics);
- no module over 500 lines except ``bert_core/model.py`` (a deliberate mirror of transformers' heads).
"""

from __future__ import annotations

import ast

import pytest

from bert_core.constants import REPO_ROOT

PACKAGES = ("bert_core", "flows")
#: The stage packages of bert_core, in pipeline order, then ``serving`` (registered models as MLflow
#: Models, batch prediction): it sits on top of what fine-tuning produces and may use all of it.
STAGES = ("corpus", "vocab", "pretrain_data", "pretrain", "finetune", "evaluate", "serving")
MAX_LINES = 500
LONGER_ALLOWED = {"bert_core/model.py"}


@pytest.fixture(scope="module")
def graph() -> dict[str, list[tuple[str, int]]]:
    """Module of ours -> (imported module of ours, or ``prefect`` / ``dvc`` / ..., line) for each import."""
    import grimp

    imports = grimp.build_graph(*PACKAGES, include_external_packages=True, cache_dir=None)
    return {
        name: [
            (target, detail["line_number"])
            for target in sorted(imports.find_modules_directly_imported_by(name))
            for detail in imports.get_import_details(importer=name, imported=target)
        ]
        for name in sorted(imports.modules)
        if name.split(".")[0] in PACKAGES
    }


def test_bert_core_never_imports_an_orchestrator(graph):
    bad = [
        f"{name} line {line}: imports {target}"
        for name, edges in graph.items()
        if name.startswith("bert_core")
        for target, line in edges
        if target.split(".")[0] in {"prefect", "dvc"}
    ]
    assert not bad, "bert_core must stay free of Prefect and DVC (move it to flows/):\n" + "\n".join(bad)


def _stage_of(name: str) -> str | None:
    parts = name.split(".")
    return parts[1] if parts[0] == "bert_core" and len(parts) > 1 and parts[1] in STAGES else None


def test_layers_point_down(graph):
    bad = []
    for name, edges in graph.items():
        if not name.startswith("bert_core."):
            continue
        own = _stage_of(name)
        for target, line in edges:
            other = _stage_of(target)
            if other is None or other == own:
                continue
            if own is None:
                bad.append(f"{name} line {line}: a shared library imports the stage package {target}")
            elif STAGES.index(other) > STAGES.index(own):
                bad.append(f"{name} line {line}: stage {own} imports the later stage {target}")
    assert not bad, "\n".join(bad)


def test_no_import_circles(graph):
    import networkx as nx

    edges = [(name, t) for name, targets in graph.items() for t, _ in targets if t in graph and t != name]
    circles = [sorted(c) for c in nx.strongly_connected_components(nx.DiGraph(edges)) if len(c) > 1]
    assert not circles, "import circles:\n" + "\n".join(" <-> ".join(c) for c in sorted(circles))


def _package_edges(graph, source: str, target: str) -> list[str]:
    """``module line N: imports X`` for every import from package ``source`` into package ``target``."""

    def inside(name: str, package: str) -> bool:
        return name == package or name.startswith(package + ".")

    found = {
        f"{name} line {line}: imports {imported}"
        for name, edges in graph.items()
        if inside(name, source)
        for imported, line in edges
        if inside(imported, target)
    }
    return sorted(found)


def test_tasks_and_metrics_do_not_import_each_other(graph):
    """The two shared packages depend one way only, counted per package (module-level circle checks
    miss a package that imports another whose ``__main__`` imports it back): the task registry states each
    task's headline metric and never imports ``bert_core.metrics``; the metrics' command line may read task
    files through ``bert_core.tasks``."""
    tasks_to_metrics = _package_edges(graph, "bert_core.tasks", "bert_core.metrics")
    metrics_to_tasks = _package_edges(graph, "bert_core.metrics", "bert_core.tasks")
    assert not (tasks_to_metrics and metrics_to_tasks), (
        "bert_core.tasks and bert_core.metrics import each other:\n"
        + "\n".join(tasks_to_metrics + metrics_to_tasks)
    )
    assert not tasks_to_metrics, (
        "bert_core.tasks must not import bert_core.metrics (a task's headline metric is TaskSpec.metric_keys[0] "
        "in bert_core/tasks/registry.py):\n" + "\n".join(tasks_to_metrics)
    )


def test_no_module_over_500_lines():
    long = {
        str(path.relative_to(REPO_ROOT)): n
        for package in PACKAGES
        for path in (REPO_ROOT / package).rglob("*.py")
        if (n := len(path.read_text(encoding="utf-8").splitlines())) > MAX_LINES
    }
    assert not {k: v for k, v in long.items() if k not in LONGER_ALLOWED}, long


def test_no_package_exports_names_through_getattr():
    """A package ``__init__`` with a module-level ``__getattr__`` loads a module that no import statement
    names, so the stages' code deps (flows/stages/deps.py, from the import graph) could miss it."""
    lazy = [
        str(path.relative_to(REPO_ROOT))
        for package in PACKAGES
        for path in (REPO_ROOT / package).rglob("__init__.py")
        if any(
            isinstance(node, ast.FunctionDef) and node.name == "__getattr__"
            for node in ast.parse(path.read_text(encoding="utf-8")).body
        )
    ]
    assert not lazy, f"import the modules themselves instead of exporting through __getattr__: {lazy}"
