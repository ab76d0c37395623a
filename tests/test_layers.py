"""Dependencies go one way: no module imports one of a higher layer (tests/layering.py
names the layers), and docs/design.md's layer map is the one the code draws."""

from __future__ import annotations

import re
from pathlib import Path

from import_graph import import_graph
from layering import DESIGN, LAYERS, drawn, layer_of, modules, render, upward_imports


def test_every_module_is_in_a_layer() -> None:
    outside = [name for name in modules() if layer_of(name) is None]
    assert not outside, f"modules in no layer of tests/layering.py: {outside}"


def test_no_module_imports_a_higher_layer() -> None:
    found = upward_imports(import_graph())
    assert not found, "upward imports:\n" + "\n".join(found)


def test_an_upward_import_is_caught() -> None:
    # The check itself, on a planted edge: the protocol importing the runtime.
    planted = {"rlog.protocol.replica": {"rlog.runtime.node", "rlog.storage.base"}}
    assert upward_imports(planted) == [
        "rlog.protocol.replica (protocol) imports rlog.runtime.node (runtime)"
    ]


def test_the_longest_prefix_places_a_module() -> None:
    names = [layer.name for layer in LAYERS]
    assert names[layer_of("rlog.lane.framed") or 0] == "transport"
    assert names[layer_of("rlog.lane.server") or 0] == "runtime"
    assert names[layer_of("rlog.runtime.node") or 0] == "runtime"


def test_the_design_map_is_drawn_from_the_code() -> None:
    assert drawn(DESIGN.read_text()) == render(), (
        "docs/design.md's layer map is stale: run `.venv/bin/python tests/layering.py --write`"
    )


def test_every_module_the_design_names_exists() -> None:
    # "Where to find" and "Where new things go" name files by hand: a move must update them.
    text = DESIGN.read_text()
    named = set(re.findall(r"`((?:rlog|operator/rlog_operator)/[\w/]+\.py)", text))
    short = set(re.findall(r"`((?:runtime|protocol|client|storage|lane|tools)/\w+\.py)", text))
    root = DESIGN.parents[1]
    missing = [p for p in sorted(named) if not _exists(root, p)]
    missing += [p for p in sorted(short) if not (root / "replica_image" / "rlog" / p).exists()]
    assert named and not missing, f"docs/design.md names files that do not exist: {missing}"


def _exists(root: Path, path: str) -> bool:
    base = root / "replica_image" if path.startswith("rlog/") else root / "operator"
    return (base / path.removeprefix("operator/")).exists()


MAX_MODULE_LINES = 700  # a module past this has grown a second job: split it along its jobs


def test_no_module_grows_past_its_size() -> None:
    sizes = {name: len(path.read_text().splitlines()) for name, path in modules().items()}
    large = {name: lines for name, lines in sizes.items() if lines > MAX_MODULE_LINES}
    assert not large, f"modules over {MAX_MODULE_LINES} lines: {large}"
