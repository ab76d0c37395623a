"""The import graph of `rlog` and `rlog_operator`, built from the sources with `ast`, for the
checks on it (tests/test_import_cycles.py, tests/test_layers.py).

It sees every import, at module level or inside a function, whether or not a test happens to
run it. An edge A -> B means running A may import B; importing `a.b.c` also runs the
`__init__` of `a` and `a.b`, except for the packages A itself lives in (those are initialized
before A runs, so a submodule importing a sibling is no cycle). Imports under
`if TYPE_CHECKING:` never run and are left out.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SOURCES = {
    "rlog": ROOT / "replica_image" / "rlog",
    "rlog_operator": ROOT / "operator" / "rlog_operator",
}


def modules() -> dict[str, Path]:
    found: dict[str, Path] = {}
    for package, directory in SOURCES.items():
        for path in directory.rglob("*.py"):
            parts = [package, *path.relative_to(directory).with_suffix("").parts]
            if parts[-1] == "__init__":
                parts.pop()
            found[".".join(parts)] = path
    return found


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _imports(tree: ast.AST) -> list[ast.Import | ast.ImportFrom]:
    found: list[ast.Import | ast.ImportFrom] = []

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and _is_type_checking(node):
            for child in node.orelse:
                visit(child)
            return
        if isinstance(node, ast.Import | ast.ImportFrom):
            found.append(node)
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(tree)
    return found


def import_graph() -> dict[str, set[str]]:
    known = modules()

    def resolve(name: str) -> str | None:
        while name and name not in known:
            name = name.rpartition(".")[0]
        return name or None

    graph: dict[str, set[str]] = {name: set() for name in known}
    for name, path in known.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in _imports(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            else:
                if node.level:
                    base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                    prefix = ".".join(base + ([node.module] if node.module else []))
                else:
                    prefix = node.module or ""
                targets = [prefix] + [f"{prefix}.{alias.name}" for alias in node.names]
            for target in targets:
                module = resolve(target)
                if module is None:
                    continue
                if module != name:
                    graph[name].add(module)
                parent = module.rpartition(".")[0]
                while parent in known:
                    if not (name + ".").startswith(parent + "."):
                        graph[name].add(parent)
                    parent = parent.rpartition(".")[0]
    return graph
