"""The structure docs/architecture.md describes, held against the code (static: nothing is imported).

- ``bert_core`` never imports Prefect or DVC (the orchestrators live in ``flows/``);
- shared libraries never import a stage package, and a stage package never imports a later stage;
- no import circles among the modules of ``bert_core`` and ``flows`` (function-level imports included),
  and ``bert_core.tasks`` and ``bert_core.metrics`` never import each other both ways (tasks never imports
  metrics);
- no module over 500 lines except ``bert_core/model.py`` (a deliberate mirror of transformers' heads).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from bert_core.constants import REPO_ROOT

PACKAGES = ("bert_core", "flows")
#: The stage packages of bert_core, in pipeline order, then ``serving`` (registered models as MLflow
#: Models, batch prediction): it sits on top of what fine-tuning produces and may use all of it.
STAGES = ("corpus", "vocab", "pretrain_data", "pretrain", "finetune", "evaluate", "serving")
MAX_LINES = 500
LONGER_ALLOWED = {"bert_core/model.py"}


def _modules(root: Path = REPO_ROOT) -> dict[str, Path]:
    out = {}
    for package in PACKAGES:
        for path in sorted((root / package).rglob("*.py")):
            parts = list(path.relative_to(root).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            out[".".join(parts)] = path
    return out


def _imports(path: Path, name: str, modules: dict[str, Path]) -> list[tuple[str, int]]:
    """(module of ours, line) for every import statement in the file, resolved to the deepest module."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                base = ".".join([*parts[: len(parts) - node.level + 1], *([base] if base else [])])
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names]
        else:
            continue
        for target in targets:
            while target and target not in modules and target.split(".")[0] in PACKAGES:
                target = target.rpartition(".")[0]
            if target in modules or target.split(".")[0] in {"prefect", "dvc"}:
                found.append((target, node.lineno))
    return found


@pytest.fixture(scope="module")
def graph() -> dict[str, list[tuple[str, int]]]:
    modules = _modules()
    return {name: _imports(path, name, modules) for name, path in modules.items()}


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
    edges = {
        name: sorted({t for t, _ in targets if t in graph and t != name}) for name, targets in graph.items()
    }
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    circles: list[list[str]] = []

    def visit(v: str) -> None:  # Tarjan's strongly connected components
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in edges[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                circles.append(sorted(component))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    assert not circles, "import circles:\n" + "\n".join(" <-> ".join(c) for c in circles)


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
        for path in _modules().values()
        if (n := len(path.read_text(encoding="utf-8").splitlines())) > MAX_LINES
    }
    assert not {k: v for k, v in long.items() if k not in LONGER_ALLOWED}, long
