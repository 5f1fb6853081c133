"""The import graph of the core (kvfs/) has no circle, imports under TYPE_CHECKING included.

import-linter enforces the floors and the absence of circles in .ci/static (pyproject.toml's
contracts); this test reads the same graph with nothing but ``ast``, so the suite says it too,
and prints the floors (docs/store.md, "Floors") when it fails.
"""

from __future__ import annotations

import ast
from pathlib import Path

CORE = Path(__file__).resolve().parents[2] / "kvfs"


def _unit(module: str) -> str:
    """The unit of the graph: a module of kvfs/, or a subpackage (kvfs.client) as one."""
    return ".".join(module.split(".")[:2])


def core_graph() -> dict[str, set[str]]:
    """``{unit: units it imports}`` over kvfs/ (an import of a name from a module counts)."""
    modules: dict[str, Path] = {}
    for f in CORE.rglob("*.py"):
        parts = list(f.relative_to(CORE.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        modules[".".join(parts)] = f
    graph: dict[str, set[str]] = {_unit(m): set() for m in modules if m != "kvfs"}
    for module, f in modules.items():
        package = module if f.name == "__init__.py" else module.rpartition(".")[0]
        for node in ast.walk(ast.parse(f.read_text())):
            targets: list[str] = []
            if isinstance(node, ast.ImportFrom):
                if node.level:
                    base = package.split(".")[: len(package.split(".")) - node.level + 1]
                    source = ".".join(base + ([node.module] if node.module else []))
                else:
                    source = node.module or ""
                targets = [source, *(f"{source}.{a.name}" for a in node.names)]
            elif isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            for t in targets:
                if t in modules and t != "kvfs" and _unit(t) != _unit(module) and module != "kvfs":
                    graph[_unit(module)].add(_unit(t))
    return graph


def floors(graph: dict[str, set[str]]) -> dict[str, int]:
    """Each unit's floor: 0 for one that imports no other, else one above its highest import."""
    out: dict[str, int] = {}
    visiting: set[str] = set()

    def floor(u: str) -> int:
        if u in out:
            return out[u]
        if u in visiting:
            raise AssertionError(f"an import circle through {u}")
        visiting.add(u)
        out[u] = 1 + max((floor(v) for v in graph[u]), default=-1)
        visiting.discard(u)
        return out[u]

    for u in graph:
        floor(u)
    return out


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one unit (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_the_core_has_no_import_circle():
    graph = core_graph()
    assert "kvfs.store" in graph and "kvfs.protocol" in graph  # the walk found the core
    assert circles(graph) == []


def test_the_store_is_the_top_floor_and_the_protocol_below_it():
    """Nothing imports the store; the protocol and the client sit below it."""
    graph = core_graph()
    f = floors(graph)
    assert not [u for u, deps in graph.items() if "kvfs.store" in deps]
    assert f["kvfs.store"] == max(f.values())
    for part in ("kvfs.protocol", "kvfs.client", "kvfs.placement", "kvfs.sealing", "kvfs.reading"):
        assert f[part] < f["kvfs.store"], (part, f)
    for collaborator in ("kvfs.batch", "kvfs.ingest", "kvfs.lifetimes", "kvfs.renames", "kvfs.steering"):
        assert "kvfs.store" not in graph[collaborator]


def test_circles_are_found():
    """The check itself: a graph with a circle (the one the core had) is caught."""
    graph = {"kvfs.store": {"kvfs.renames"}, "kvfs.renames": {"kvfs.store"}, "kvfs.errors": set()}
    assert circles(graph) == [["kvfs.renames", "kvfs.store"]]
