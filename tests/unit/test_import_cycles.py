"""The control plane's modules import each other without cycles, counting the imports made
inside functions: a cycle there (a service importing api/tasks.py, which imports the services)
works only as long as nobody moves an import to the top of a file. Services enqueue tasks by
name through api/dispatch.py instead."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("api", "web")


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph() -> dict[str, set[str]]:
    """Module -> the project modules it imports anywhere in its source (top level or in a function)."""
    files = {_module_name(p): p for pkg in PACKAGES for p in (ROOT / pkg).rglob("*.py") if "migrations" not in p.parts}
    graph: dict[str, set[str]] = {}
    for module, path in files.items():
        package = module if path.name == "__init__.py" else module.rpartition(".")[0]
        deps: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                deps.update(alias.name for alias in node.names if alias.name in files)
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    up = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join([*up, base] if base else up)
                for alias in node.names:
                    if f"{base}.{alias.name}" in files:  # ``from api.services import runs``
                        deps.add(f"{base}.{alias.name}")
                    elif base in files:  # ``from api.services.runs import create_run``
                        deps.add(base)
        graph[module] = deps - {module}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for start in graph:
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, edges = work[-1]
            for nxt in edges:
                if nxt not in index:
                    index[nxt] = low[nxt] = len(index)
                    stack.append(nxt)
                    on_stack.add(nxt)
                    work.append((nxt, iter(sorted(graph[nxt]))))
                    break
                if nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == node:
                            break
                    if len(component) > 1:
                        found.append(sorted(component))
    return found


def test_the_graph_sees_imports_inside_functions() -> None:
    graph = import_graph()
    assert "api.services.executor_slots" in graph["api.tasks"]  # imported inside run_lip
    assert "api.services.runs" in graph["api.views.runs"]


def test_the_cycle_finder_finds_a_cycle() -> None:
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_no_import_cycles_in_the_control_plane() -> None:
    assert cycles(import_graph()) == []


def test_services_do_not_import_the_tasks() -> None:
    graph = import_graph()
    assert [m for m, deps in graph.items() if m.startswith("api.services") and "api.tasks" in deps] == []


def test_every_name_services_enqueue_is_a_registered_task() -> None:
    from api import dispatch, tasks

    for name in dispatch.NAMES:
        assert dispatch.task(name).name == name
    assert dispatch.task(dispatch.RUN_LIP) is tasks.run_lip._get_current_object()
