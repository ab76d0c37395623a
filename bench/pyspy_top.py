"""The top self-time and inclusive functions of a py-spy raw profile (`py-spy record -f raw`,
lines `frame;frame;...;leaf COUNT`), with the CPU cost per entry when the entries acknowledged
while it sampled are given, so a flame graph's conclusions can be written down as text.

    python bench/pyspy_top.py PROFILE.txt [--top 15] [--rate 100] [--entries N]

Frames are grouped by function and file (line numbers dropped); the inclusive list shows
rlog's own functions only. py-spy samples only threads
that are not idle, so samples / rate is the CPU-ish time of the process's Python threads.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

from kitlib import self_time

LINE_NUMBER = re.compile(r":\d+\)$")


def function_of(frame: str) -> str:
    """`name (path/to/file.py:123)` -> `name (path/to/file.py)`."""
    return LINE_NUMBER.sub(")", frame)


def rlog_work(frame: str) -> bool:
    """A function of rlog's own below the entry points (the inclusive list shows only these:
    the entry points and asyncio's loop include everything)."""
    return (
        " (rlog/" in frame
        and " (rlog/tools/cli.py)" not in frame
        and not frame.startswith("serve (")
    )


def grouped(lines: list[str]) -> list[str]:
    out = []
    for line in lines:
        stack, _, count = line.rstrip("\n").rpartition(" ")
        if stack:
            out.append(";".join(function_of(f) for f in stack.split(";")) + " " + count)
    return out


def report(path: Path, top: int, rate: float, entries: int | None) -> str:
    raw = path.read_text().splitlines()
    own, inclusive, total = self_time(grouped(raw))
    own_lines, _, _ = self_time(raw)
    seconds = total / rate
    lines = [f"{path.name}: {total} samples at {rate:g}/s = {seconds:.2f} s of busy threads"]
    if entries:
        lines[0] += f", {entries} entries acknowledged: {seconds / entries * 1e6:.1f} us/entry"
    ours = {name: n for name, n in inclusive.items() if rlog_work(name)}
    for title, table in (("self time", own), ("inclusive, rlog's functions", ours)):
        lines.append(f"  top {top} by {title}:")
        for name, samples in sorted(table.items(), key=lambda kv: -kv[1])[:top]:
            per = f"  {samples / rate / entries * 1e6:7.2f} us/entry" if entries else ""
            lines.append(f"    {100 * samples / max(total, 1):5.1f}%{per}  {name}")
    lines.append("  lines of the top 3 self-time functions (C calls show on their Python line):")
    for name, _ in sorted(own.items(), key=lambda kv: -kv[1])[:3]:
        split = sorted(
            ((n, frame) for frame, n in own_lines.items() if function_of(frame) == name),
            reverse=True,
        )
        lines.append(
            f"    {name}: "
            + ", ".join(f"line {frame.rsplit(':', 1)[-1].rstrip(')')} {n}" for n, frame in split)
        )
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("profiles", nargs="+", type=Path)
    parser.add_argument("--top", type=int, default=15)
    parser.add_argument("--rate", type=float, default=100, help="py-spy's --rate")
    parser.add_argument("--entries", type=int, help="entries acknowledged while sampling")
    args = parser.parse_args()
    for path in args.profiles:
        print(report(path, args.top, args.rate, args.entries))
    return 0


if __name__ == "__main__":
    sys.exit(main())
