"""No import cycles among the modules of `rlog` and `rlog_operator`, on the import graph built
from their sources (tests/import_graph.py says what its edges mean)."""

from __future__ import annotations

from import_graph import import_graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
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
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_the_graph_sees_function_level_imports() -> None:
    graph = import_graph()
    # `rlog.storage.open_storage` imports its engines inside the function.
    assert "rlog.storage.lmdb_engine" in graph["rlog.storage"]
    assert "rlog.storage.base" in graph["rlog.storage.lmdb_engine"]


def test_no_import_cycles() -> None:
    graph = import_graph()
    found = cycles(graph)
    described = [
        " <-> ".join(component)
        + ": "
        + "; ".join(f"{a} -> {b}" for a in component for b in sorted(graph[a] & set(component)))
        for component in found
    ]
    assert not found, "import cycles:\n" + "\n".join(described)
