"""The layers of `rlog` and `rlog_operator`, lowest first: which modules each holds, and the
rule that keeps them apart (a module imports only its own layer and the layers below it).

tests/test_layers.py checks the rule on the import graph (tests/import_graph.py)
and that docs/design.md's layer map is the one `render()` draws from the modules' own
docstrings. After adding, moving or redescribing a module, redraw it:

    .venv/bin/python tests/layering.py --write      (or: make design-map)

The alternative rejected: a hand-kept table. The last one named 10 of 25 runtime modules
and still gave elections to the runtime a week after they had moved into the protocol.
"""

from __future__ import annotations

import ast
import re
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SOURCES = {
    "rlog": ROOT / "replica_image" / "rlog",
    "rlog_operator": ROOT / "operator" / "rlog_operator",
}
DESIGN = ROOT / "docs" / "design.md"
BEGIN = "<!-- layers: drawn by tests/layering.py --write; do not edit by hand -->"
END = "<!-- layers: end -->"


@dataclass(frozen=True)
class Layer:
    name: str
    job: str
    modules: tuple[str, ...]  # module names or package prefixes; the longest match wins


LAYERS: tuple[Layer, ...] = (
    Layer(
        "wire",
        "what travels: the messages, the rest of the contract, packed values",
        ("rlog", "rlog.proto", "rlog.wire", "rlog.packed"),
    ),
    Layer(
        "process",
        "what every process shares: its configuration, event loop, allocator, certificates",
        (
            "rlog.config",
            "rlog.event_loop",
            "rlog.allocator",
            "rlog.certs",
            "rlog.durable",
            "rlog.log_format",
            "rlog.build_info",
        ),
    ),
    Layer(
        "storage",
        "one narrow interface between the protocol and a disk engine",
        ("rlog.storage", "rlog.arg_types"),
    ),
    Layer(
        "protocol",
        "the pure rules: functions of state and message, no I/O, no clocks",
        ("rlog.protocol",),
    ),
    Layer(
        "transport",
        "the lane's framing and a client's side of it (the replica's side is in the runtime)",
        ("rlog.lane",),
    ),
    Layer(
        "client",
        "the client library and what is built directly on its errors",
        ("rlog.client", "rlog.initialize"),
    ),
    Layer(
        "runtime",
        "the protocol wrapped with disks, gRPC, lanes and timers: one driver per rule",
        (
            "rlog.runtime",
            "rlog.lane.server",
            "rlog.lane.append",
            "rlog.lane.fetch",
            "rlog.lane.write",
            "rlog.lane.tls",
        ),
    ),
    Layer(
        "applications",
        "what is built on the public client: archive, replicated state, Spark",
        ("rlog.archive", "rlog.state", "rlog.spark"),
    ),
    Layer("tools", "the `rlog` command line and the local harness", ("rlog.tools",)),
    Layer(
        "operator",
        "the kopf operator: facts, pure decisions, small I/O modules, thin registrations",
        ("rlog_operator",),
    ),
    Layer(
        "plugin",
        "`kubectl rlog`, for people: commands, patches, views and completion",
        ("rlog_operator.plugin",),
    ),
)


def modules() -> dict[str, Path]:
    """Every hand-written module (generated stubs left out), by dotted name."""
    found: dict[str, Path] = {}
    for package, directory in SOURCES.items():
        for path in sorted(directory.rglob("*.py")):
            if "_pb2" in path.name:
                continue
            parts = [package, *path.relative_to(directory).with_suffix("").parts]
            if parts[-1] == "__init__":
                parts.pop()
            found[".".join(parts)] = path
    return found


def layer_of(module: str) -> int | None:
    """The rank of the layer holding `module` (0 is the lowest), by its longest prefix."""
    best: tuple[int, int] | None = None  # (prefix length, rank)
    for rank, layer in enumerate(LAYERS):
        for prefix in layer.modules:
            if module == prefix or module.startswith(prefix + "."):
                if best is None or len(prefix) > best[0]:
                    best = (len(prefix), rank)
    return None if best is None else best[1]


def upward_imports(graph: dict[str, set[str]]) -> list[str]:
    """Every edge of `graph` from a module to one in a higher layer, described."""
    found = []
    for source in sorted(graph):
        low = layer_of(source)
        for target in sorted(graph[source]):
            high = layer_of(target)
            if low is not None and high is not None and high > low:
                found.append(
                    f"{source} ({LAYERS[low].name}) imports {target} ({LAYERS[high].name})"
                )
    return found


def first_sentence(path: Path) -> str:
    """The first sentence of a module's docstring, on one line."""
    doc = ast.get_docstring(ast.parse(path.read_text(), str(path))) or ""
    text = " ".join(doc.split("\n\n")[0].split())
    match = re.match(r"(.+?[.!?])(\s|$)", text)
    return (match.group(1) if match else text).replace("|", "\\|")


def _where(module: str, path: Path) -> str:
    relative = path.relative_to(SOURCES[module.split(".")[0]].parent).as_posix()
    return relative.removesuffix("/__init__.py") + ("/" if path.name == "__init__.py" else "")


def render() -> str:
    """docs/design.md's layer map: a row per module, layers lowest first."""
    found = modules()
    by_layer: dict[int, list[str]] = {}
    for name in found:
        rank = layer_of(name)
        assert rank is not None, f"{name} is in no layer of tests/layering.py"
        by_layer.setdefault(rank, []).append(name)
    lines = [BEGIN, "", "| layer | module | what it is |", "| --- | --- | --- |"]
    for rank, layer in enumerate(LAYERS):
        for i, name in enumerate(sorted(by_layer.get(rank, []))):
            label = f"**{layer.name}**: {layer.job}" if i == 0 else ""
            lines.append(
                f"| {label} | `{_where(name, found[name])}` | {first_sentence(found[name])} |"
            )
    lines += ["", END]
    return "\n".join(lines)


def drawn(text: str) -> str | None:
    """The layer map as it stands in a design.md text (None if it has none)."""
    start, stop = text.find(BEGIN), text.find(END)
    if start < 0 or stop < 0:
        return None
    return text[start : stop + len(END)]


def write() -> None:
    text = DESIGN.read_text()
    old = drawn(text)
    if old is None:
        sys.exit(f"{DESIGN}: no layer map between {BEGIN!r} and {END!r}")
    DESIGN.write_text(text.replace(old, render()))


if __name__ == "__main__":
    if sys.argv[1:] != ["--write"]:
        sys.exit("usage: tests/layering.py --write   (redraws docs/design.md's layer map)")
    write()
