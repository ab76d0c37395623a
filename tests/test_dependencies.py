"""The package's dependencies: ranges for users, one lock for images and CI. Every library
dependency (the package's and its user-facing extras') is a range whose lower bound is the
version constraints.txt pins, so CI, which installs the lock, tests exactly the lowest
version a user may get; and it has an upper bound (the next major)."""

from __future__ import annotations

import tomllib
from pathlib import Path

from packaging.requirements import Requirement
from packaging.specifiers import Specifier

ROOT = Path(__file__).resolve().parent.parent
USER_EXTRAS = ("operator", "kubectl", "archive", "spark")


def locked() -> dict[str, str]:
    pins: dict[str, str] = {}
    for line in (ROOT / "constraints.txt").read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            name, _, version = line.partition("==")
            assert version, f"constraints.txt: {line!r} is not an exact pin"
            pins[name.lower().replace("_", "-")] = version
    return pins


def library_requirements() -> list[Requirement]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    found = [Requirement(r) for r in project["dependencies"]]
    for extra in USER_EXTRAS:
        found += [Requirement(r) for r in project["optional-dependencies"][extra]]
    return found


def test_every_library_dependency_is_a_range_from_the_locked_version():
    pins = locked()
    for requirement in library_requirements():
        specifiers = {s.operator: s.version for s in requirement.specifier}
        assert set(specifiers) == {">=", "<"}, f"{requirement}: a range >=low,<high"
        name = requirement.name.lower()
        assert name in pins, f"{name} is not in constraints.txt: make lock"
        assert specifiers[">="] == pins[name], (
            f"{requirement}: the lower bound is not the version CI tests ({pins[name]})"
        )
        assert Specifier(f"<{specifiers['<']}").contains(pins[name])


def test_the_lock_pins_everything_the_venv_resolved_and_nothing_twice():
    lines = [
        line.split("==", 1)[0].lower()
        for line in (ROOT / "constraints.txt").read_text().splitlines()
        if line and not line.startswith("#")
    ]
    assert len(lines) == len(set(lines))
    assert {"grpcio", "protobuf", "kopf", "pyspark", "pytest"} <= set(lines)
