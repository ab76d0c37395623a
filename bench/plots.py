"""Plots of a benchmark kit results file (bench/kit.py) as PNGs, default into bench/plots/:

- throughput_vs_concurrency.png: acknowledged 1 KiB entries/s against writers, etcd puts and
  rlog (the default client, one append each on the append lane; the stream client), 3 replicas;
- latency_cdf.png: CDFs of the serial latency and of the largest writer count, both systems;
- mb_per_s_vs_value_size.png: acknowledged MB/s against value size, rlog batched (8 writers x
  64 entries per call) and etcd single puts (largest writer count);
- replicas_3_vs_5.png: rlog with 3 and 5 replicas, batched and stream client (entries/s);
- soak_rss.png (with --soak FILE from bench/soak.py): RSS of each replica over time.

    python bench/plots.py bench/results/bench-<date>.jsonl [--soak FILE] [--out bench/plots]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")  # files only, no display
import matplotlib.pyplot as plt
from kitlib import find_point, read_results
from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

BENCH = Path(__file__).resolve().parent


def subtitle(meta: dict[str, Any]) -> str:
    """Run, cores and the load average seen by the measurements (kit.py adds load_range)."""
    head = f"{meta.get('run', '')}, {meta.get('cpus', '?')} cpus"
    if "load_range" in meta:
        low, high = meta["load_range"]
        return f"{head}, load average {low:.1f}-{high:.1f}"
    return f"{head}, load average {meta.get('load_start', [0.0])[0]:.1f} at the start"


def series(points: list[dict[str, Any]], x: str, **match: Any) -> tuple[list[Any], list[Any]]:
    chosen = [p for p in points if all(p.get(k) == v for k, v in match.items())]
    chosen.sort(key=lambda p: p[x])
    return [p[x] for p in chosen], chosen


def throughput(points: list[dict[str, Any]], meta: dict[str, Any], out: Path) -> Path:
    fig, ax = plt.subplots(figsize=(7, 4.5))
    lines = (
        ("etcd 3.4, puts", {"system": "etcd", "series": "put"}),
        (
            "rlog, default client (append lane)",
            {"system": "rlog", "series": "unary", "replicas": 3},
        ),
        ("rlog, stream client", {"system": "rlog", "series": "stream", "replicas": 3}),
    )
    for label, match in lines:
        xs, chosen = series(points, "writers", size=1024, **match)
        if xs:
            ax.plot(xs, [p["entries_per_s"] for p in chosen], marker="o", label=label)
    ax.set_xscale("log", base=2)
    ticks = sorted({p["writers"] for p in points if p["series"] in ("put", "unary", "stream")})
    ax.set_xticks(ticks, [str(t) for t in ticks])
    ax.set_xlabel("writers (one single-entry append in flight each)")
    ax.set_ylabel("acknowledged 1 KiB entries/s")
    ax.set_title("Throughput vs concurrency, 3 members/replicas\n" + subtitle(meta), fontsize=10)
    ax.grid(True, alpha=0.3)
    ax.legend()
    return save(fig, out / "throughput_vs_concurrency.png")


def latency_cdf(records: list[dict[str, Any]], meta: dict[str, Any], out: Path) -> Path:
    cdfs = [r for r in records if r["kind"] == "cdf"]
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.5), sharey=True)
    serial = [c for c in cdfs if c["series"] == "serial"]
    loaded = [c for c in cdfs if c["series"] != "serial"]
    panels = ((axes[0], serial, "serial (one append in flight)"), (axes[1], loaded, ""))
    for ax, chosen, title in panels:
        for c in chosen:
            qs = [q for q, _ in c["quantiles_ms"]]
            ms = [v for _, v in c["quantiles_ms"]]
            ax.plot(ms, [q / 100 for q in qs], label=f"{c['system']} {c['series']}")
        if chosen and not title:
            title = f"{chosen[0]['writers']} writers, single-entry appends/puts"
        ax.set_xscale("log")
        # Ticks at 1, 2 and 5 of each decade, written plainly (0.5, 1, 2, 5, 10, 20): the
        # log axis' own minor labels ("2x10^0", "3x10^0", ...) ran into each other.
        ax.xaxis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
        ax.xaxis.set_major_formatter(FuncFormatter(lambda value, _: f"{value:g}"))
        ax.xaxis.set_minor_formatter(NullFormatter())
        ax.set_xlabel("latency (ms, log scale)")
        ax.set_title(title, fontsize=10)
        ax.grid(True, alpha=0.3, which="both")
        ax.legend()
    axes[0].set_ylabel("fraction of calls")
    fig.suptitle("Latency CDFs, 1 KiB, 3 members/replicas: " + subtitle(meta), fontsize=10)
    return save(fig, out / "latency_cdf.png")


def mb_per_s(points: list[dict[str, Any]], meta: dict[str, Any], out: Path) -> Path:
    fig, ax = plt.subplots(figsize=(7, 4.5))
    etcd_writers = max((p["writers"] for p in points if p["series"] == "put"), default=0)
    lines = (
        ("rlog, batched 8 writers x 64 per call", {"system": "rlog", "series": "batched"}),
        (
            f"etcd 3.4, {etcd_writers} writers, single puts",
            {"system": "etcd", "series": "put", "writers": etcd_writers},
        ),
    )
    for label, match in lines:
        xs, chosen = series(points, "size", replicas=3, **match)
        if xs:
            ax.plot(xs, [p["mb_per_s"] for p in chosen], marker="o", label=label)
    ax.set_xscale("log", base=2)
    ticks = sorted({p["size"] for p in points if p["series"] in ("put", "batched")})
    ax.set_xticks(ticks, [str(t) for t in ticks])
    ax.set_xlabel("value size (bytes)")
    ax.set_ylabel("acknowledged MB/s (payload, 10^6 B)")
    ax.set_title("MB/s vs value size, 3 members/replicas\n" + subtitle(meta), fontsize=10)
    ax.grid(True, alpha=0.3)
    ax.legend()
    return save(fig, out / "mb_per_s_vs_value_size.png")


def replicas(points: list[dict[str, Any]], meta: dict[str, Any], out: Path) -> Path:
    fig, ax = plt.subplots(figsize=(7, 4.5))
    five = [p for p in points if p["system"] == "rlog" and p["replicas"] == 5]
    groups = []
    for p5 in five:
        if p5["series"] == "serial":
            continue
        match = {k: p5[k] for k in ("series", "writers", "batch", "size")}
        p3 = find_point(points, system="rlog", replicas=3, **match)
        if p3 is not None:
            groups.append((f"{p5['series']}\n{p5['writers']} writers x {p5['batch']}", p3, p5))
    width = 0.38
    for i, (_, p3, p5) in enumerate(groups):
        for j, (p, name) in enumerate(((p3, "3 replicas"), (p5, "5 replicas"))):
            bar = ax.bar(i + (j - 0.5) * width, p["entries_per_s"], width, color=f"C{j}")
            if i == 0:
                bar.set_label(name)
        ax.text(i, max(p3["entries_per_s"], p5["entries_per_s"]) * 1.02,
                f"5/3 = {p5['entries_per_s'] / p3['entries_per_s']:.2f}", ha="center")  # fmt: skip
    ax.set_xticks(range(len(groups)), [g[0] for g in groups])
    ax.set_ylabel("acknowledged 1 KiB entries/s")
    ax.set_ylim(top=ax.get_ylim()[1] * 1.08)
    ax.set_title("rlog: 3 vs 5 replicas\n" + subtitle(meta), fontsize=10)
    ax.legend()
    return save(fig, out / "replicas_3_vs_5.png")


def soak_rss(records: list[dict[str, Any]], out: Path) -> Path:
    samples = [r for r in records if r["kind"] == "rss"]
    meta = next(r for r in records if r["kind"] == "meta")
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for replica in sorted({s["replica"] for s in samples}):
        mine = [s for s in samples if s["replica"] == replica]
        role = mine[0]["role"]
        minutes = [s["t"] / 60 for s in mine]
        line = ax.plot(minutes, [s["rss_mb"] for s in mine], label=f"{replica} {role}: RSS")
        ax.plot(minutes, [s["anon_mb"] for s in mine], linestyle="--",
                color=line[0].get_color(), label=f"{replica} {role}: anon")  # fmt: skip
    ax.set_xlabel("minutes of the batched benchmark")
    ax.set_ylabel("RSS (MB)")
    ax.set_ylim(bottom=0)
    ax.set_title(f"Replica RSS under sustained batched writes\n{subtitle(meta)}", fontsize=10)
    ax.grid(True, alpha=0.3)
    ax.legend()
    return save(fig, out / "soak_rss.png")


def save(fig: Any, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("results", help="a bench/kit.py results file (.jsonl)")
    parser.add_argument("--soak", help="a bench/soak.py results file (.jsonl)")
    parser.add_argument("--out", default=str(BENCH / "plots"))
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    records = read_results(Path(args.results))
    meta = next(r for r in records if r["kind"] == "meta")
    points = [r for r in records if r["kind"] == "point"]
    loads = [p["load1"] for p in points if "load1" in p]
    if loads:
        meta = {**meta, "load_range": [min(loads), max(loads)]}
    written = [
        throughput(points, meta, out),
        latency_cdf(records, meta, out),
        mb_per_s(points, meta, out),
        replicas(points, meta, out),
    ]
    if args.soak:
        written.append(soak_rss(read_results(Path(args.soak)), out))
    for path in written:
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
