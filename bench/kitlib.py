"""Pure helpers of the benchmark kit (bench/kit.py, bench/plots.py, bench/soak.py): latency
quantiles for CDFs, figure records with their ratio and target, the markdown summary.

A results file is JSON lines, one record each, told apart by "kind":
- "meta": the run (time, host, cpus, load average, commit, variables);
- "point": one measurement (system, series, replicas, writers, batch, size, rates, latency);
- "cdf": latency quantiles of one measurement, for the CDF plots;
- "figure": one figure of the kit (docs/performance.md): rlog's value, the baseline's (etcd, or
  Spark's JVM path, or rlog with 3 replicas) where one exists, ratio = rlog / baseline, the
  host's ceiling for it where the disk sets one (the same run's "machine" record) and rlog's
  share of it, target, and the exact commands that produced both.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

# The kit's figures (bench/targets.json has one target slot for each; docs/performance.md).
FIGURE_NAMES: tuple[str, ...] = (
    "unary_writers",
    "stream_writers",
    "serial_p50",
    "serial_p99",
    "serial_p50_unary",
    "batched_1k",
    "batched_1k_unary",
    "batched_4k_mb",
    "batched_1k_grown",
    "batched_4k_mb_grown",
    "serial_p50_grpc",
    "stream_writers_grpc",
    "batched_1k_grpc",
    "replicas_5_vs_3_batched",
    "replicas_5_vs_3_stream",
    "catchup_mb",
    "catchup_copy_mb",
    "rejoin_mb",
    "failover_p99",
    "spark_source_noop",
    "spark_source_noop_warm",
    "spark_sink",
    "soak_rss",
)

# Quantiles kept for a CDF: every half percent, and the tail in more detail.
CDF_QUANTILES: tuple[float, ...] = (*(q / 2 for q in range(201)), 99.9, 99.99)


def percentile(ascending: Sequence[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100) of an ascending sequence; q=0 is the minimum."""
    if not ascending:
        raise ValueError("percentile of no values")
    rank = max(1, math.ceil(q / 100 * len(ascending)))
    return float(ascending[min(rank, len(ascending)) - 1])


def quantiles(values: Iterable[float]) -> list[list[float]]:
    """[[q, value], ...] at CDF_QUANTILES, sorted by q (the x/y of a CDF plot)."""
    ordered = sorted(values)
    return [[q, round(percentile(ordered, q), 4)] for q in sorted(CDF_QUANTILES)]


def ratio(value: float | None, baseline: float | None) -> float | None:
    """value / baseline, or None when either is missing or the baseline is zero."""
    if value is None or baseline is None or baseline == 0:
        return None
    return value / baseline


_TARGET_KEYS = (
    "ratio_at_least",
    "ratio_at_most",
    "value_at_least",
    "value_at_most",
    "share_at_least",
)


def share(value: float | None, ceiling: float | None, better: str) -> float | None:
    """How much of the host's ceiling a figure reaches, 1.0 being all of it: value / ceiling
    for a rate, ceiling / value for a latency (a ceiling there is the least time possible)."""
    if value is None or ceiling is None or value == 0 or ceiling == 0:
        return None
    return value / ceiling if better == "higher" else ceiling / value


def target_met(
    target: dict[str, Any] | None,
    figure_ratio: float | None,
    value: float | None = None,
    ceiling_share: float | None = None,
) -> bool | None:
    """Whether a figure meets its target: every bound it names must hold, on the ratio
    (`ratio_at_least`, `ratio_at_most`), on rlog's own value (`value_at_least`,
    `value_at_most`, in the figure's unit) and on its share of the host's ceiling
    (`share_at_least`). None when there is no target, or when a bound's number was not
    measured."""
    if not target:
        return None
    unknown = [k for k in target if k not in _TARGET_KEYS]
    if unknown:
        raise ValueError(f"unknown target {target}")
    checks = {
        "ratio_at_least": (figure_ratio, lambda x, t: x >= t),
        "ratio_at_most": (figure_ratio, lambda x, t: x <= t),
        "value_at_least": (value, lambda x, t: x >= t),
        "value_at_most": (value, lambda x, t: x <= t),
        "share_at_least": (ceiling_share, lambda x, t: x >= t),
    }
    met = True
    for key, bound in target.items():
        measured, holds = checks[key]
        if measured is None:
            return None
        met = met and holds(measured, float(bound))
    return met


def describe_target(target: dict[str, Any] | None) -> str:
    if not target:
        return "-"
    words = {
        "ratio_at_least": "ratio >= {}",
        "ratio_at_most": "ratio <= {}",
        "value_at_least": ">= {}",
        "value_at_most": "<= {}",
        "share_at_least": "share >= {}",
    }
    parts = []
    for key, bound in target.items():
        if key not in words:
            raise ValueError(f"unknown target {target}")
        parts.append(words[key].format(f"{bound:,}" if isinstance(bound, int) else bound))
    return " and ".join(parts)


def figure(
    name: str,
    what: str,
    unit: str,
    rlog: float | None,
    baseline: float | None,
    baseline_name: str | None,
    better: str,
    command: str | None,
    baseline_command: str | None = None,
    targets: dict[str, Any] | None = None,
    ceiling: float | None = None,
    ceiling_name: str | None = None,
) -> dict[str, Any]:
    """One figure record; its ratio is rlog / baseline (for latencies lower is better), its
    share what it reaches of `ceiling` (the host's limit for it, in the figure's unit)."""
    if name not in FIGURE_NAMES:
        raise ValueError(f"unknown figure {name!r}: add it to FIGURE_NAMES and targets.json")
    if better not in ("higher", "lower"):
        raise ValueError(f"better must be higher or lower, not {better!r}")
    figure_ratio = ratio(rlog, baseline)
    figure_share = share(rlog, ceiling, better)
    target = (targets or {}).get(name)
    return {
        "kind": "figure",
        "name": name,
        "what": what,
        "unit": unit,
        "rlog": rlog,
        "baseline": baseline,
        "baseline_name": baseline_name,
        "ratio": None if figure_ratio is None else round(figure_ratio, 3),
        "better": better,
        "ceiling": ceiling,
        "ceiling_name": ceiling_name,
        "share": None if figure_share is None else round(figure_share, 3),
        "target": target,
        "met": target_met(target, figure_ratio, rlog, figure_share),
        "command": command,
        "baseline_command": baseline_command,
    }


def load_targets(path: Path) -> dict[str, Any]:
    """bench/targets.json: {figure name: target or null}; entries starting with "_" are notes."""
    raw = json.loads(path.read_text())
    return {k: v for k, v in raw.items() if not k.startswith("_") and v}


def find_point(points: Iterable[dict[str, Any]], **match: Any) -> dict[str, Any] | None:
    """The last point whose fields equal every `match` item (a rerun replaces a point)."""
    found = None
    for point in points:
        if all(point.get(k) == v for k, v in match.items()):
            found = point
    return found


def read_results(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _number(value: float | None, unit: str) -> str:
    if value is None:
        return "-"
    if unit in ("ms", "s"):
        return f"{value:.2f}"
    if abs(value) >= 100:
        return f"{value:,.0f}"
    return f"{value:.1f}"


def summary_markdown(records: Sequence[dict[str, Any]]) -> str:
    """The figures as a markdown table (ratio and target columns), then every point."""
    meta = next((r for r in records if r["kind"] == "meta"), {})
    figures = [r for r in records if r["kind"] == "figure"]
    points = [r for r in records if r["kind"] == "point"]
    lines = []
    if meta:
        load = meta.get("load_start", [])
        end = meta.get("load_end", [])
        lines.append(
            f"# {meta.get('run', 'bench')}: {meta.get('host', '?')}, {meta.get('cpus', '?')} cpus, "
            f"commit {meta.get('commit', '?')}, {meta.get('mode', '?')} mode"
        )
        lines.append("")
        lines.append(
            "load average at the start "
            + "/".join(f"{x:.1f}" for x in load)
            + (", at the end " + "/".join(f"{x:.1f}" for x in end) if end else "")
            + (f"; wall time {meta['wall_seconds']:.0f} s" if "wall_seconds" in meta else "")
        )
        lines.append("")
        if "volume" in meta:
            lines.append(f"data of both systems on: {meta['volume']}")
            lines.append("")
    machine = next((r for r in records if r["kind"] == "machine"), None)
    if machine:
        lines.append(
            f"host: a fresh page faults in {machine['page_fault_us']:.2f} µs; synced 2 MiB "
            f"writes, 3 writers: {machine['synced_mb_per_s_new']:,.0f} MB/s each on new file "
            f"space"
            + (
                f" ({machine['synced_mb_per_s_new_pieces']:,.0f} in 1 MiB calls)"
                if "synced_mb_per_s_new_pieces" in machine
                else ""
            )
            + f", {machine['synced_mb_per_s_rewritten']:,.0f} on rewritten"
        )
        if "sync_ms_p50" in machine:
            lines.append("")
            lines.append(
                f"host ceilings: a 4 KiB append's fdatasync p50 {machine['sync_ms_p50']:.2f} ms "
                f"(p90 {machine['sync_ms_p90']:.2f}, p99 {machine['sync_ms_p99']:.2f}); one "
                f"writer's synced 2 MiB writes {machine['synced_mb_per_s_one']:,.0f} MB/s; three "
                f"writers' synced 64 KiB group commits {machine['group_commits_per_s']:,.0f}/s each"
            )
        lines.append("")
    lines.append(
        "| figure | unit | rlog | baseline | value | ratio | host ceiling | share | target | met |"
    )
    lines.append("| --- | --- | ---: | --- | ---: | ---: | ---: | ---: | --- | --- |")
    for f in figures:
        met = {True: "yes", False: "no", None: "-"}[f["met"]]
        ratio_text = "-" if f["ratio"] is None else f"{f['ratio']:.2f}"
        share_text = "-" if f.get("share") is None else f"{f['share']:.0%}"
        lines.append(
            f"| {f['what']} | {f['unit']} | {_number(f['rlog'], f['unit'])} | "
            f"{f['baseline_name'] or '-'} | {_number(f['baseline'], f['unit'])} | {ratio_text} | "
            f"{_number(f.get('ceiling'), f['unit'])} | {share_text} | "
            f"{describe_target(f['target'])} | {met} |"
        )
    lines.append("")
    lines.append(
        "Ratio = rlog / baseline (lower is better for latencies). Share = rlog's value over the "
        "host ceiling for it (a rate), or the ceiling over rlog's value (a latency). Ceilings:"
    )
    lines.append("")
    for f in figures:
        if f.get("ceiling_name"):
            lines.append(f"- {f['what']}: {f['ceiling_name']}")
    lines.append("")
    lines.append("Commands:")
    lines.append("")
    for f in figures:
        lines.append(f"- {f['what']}: `{f['command']}`")
        if f["baseline_command"]:
            lines.append(f"  - baseline: `{f['baseline_command']}`")
    lines.append("")
    lines.append("## every point")
    lines.append("")
    lines.append(
        "| system | series | replicas | writers | batch | value B | entries/s | MB/s "
        "| p50 ms | p99 ms | load |"
    )
    lines.append("| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for p in points:
        lines.append(
            f"| {p['system']} | {p['series']} | {p.get('replicas', '-')} | {p['writers']} | "
            f"{p['batch']} | {p['size']} | {p['entries_per_s']:,.0f} | {p['mb_per_s']:.2f} | "
            f"{p['p50_ms']:.2f} | {p['p99_ms']:.2f} | {p.get('load1', 0):.1f} |"
        )
    return "\n".join(lines) + "\n"


def self_time(raw_lines: Iterable[str]) -> tuple[dict[str, int], dict[str, int], int]:
    """From py-spy's raw (collapsed) output, lines `frame;frame;...;leaf COUNT`: samples per
    leaf frame (self time), per frame anywhere on the stack (inclusive, counted once per
    stack) and the total."""
    own: dict[str, int] = {}
    inclusive: dict[str, int] = {}
    total = 0
    for line in raw_lines:
        line = line.rstrip("\n")
        if not line.strip():
            continue
        stack, _, count_text = line.rpartition(" ")
        count = int(count_text)
        frames = stack.split(";")
        total += count
        own[frames[-1]] = own.get(frames[-1], 0) + count
        for frame in set(frames):
            inclusive[frame] = inclusive.get(frame, 0) + count
    return own, inclusive, total
