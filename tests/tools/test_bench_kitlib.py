"""The benchmark kit's pure helpers (bench/kitlib.py): quantiles, ratios, targets, the
summary table and py-spy's raw stacks. The benchmarks themselves are not tests."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

import kitlib


def test_percentile_is_nearest_rank() -> None:
    values = [float(x) for x in range(1, 101)]
    assert kitlib.percentile(values, 0) == 1
    assert kitlib.percentile(values, 50) == 50
    assert kitlib.percentile(values, 99) == 99
    assert kitlib.percentile(values, 100) == 100
    assert kitlib.percentile([7.0], 99.9) == 7
    with pytest.raises(ValueError):
        kitlib.percentile([], 50)


def test_quantiles_are_sorted_and_end_at_the_maximum() -> None:
    got = kitlib.quantiles([3.0, 1.0, 2.0, 10.0])
    qs = [q for q, _ in got]
    assert qs == sorted(qs) and qs[0] == 0 and qs[-1] == 100
    assert got[0][1] == 1 and got[-1][1] == 10
    assert [v for _, v in got] == sorted(v for _, v in got)


def test_ratio_is_none_without_a_baseline() -> None:
    assert kitlib.ratio(3.0, 2.0) == 1.5
    assert kitlib.ratio(3.0, None) is None
    assert kitlib.ratio(None, 2.0) is None
    assert kitlib.ratio(3.0, 0) is None


def test_figure_ratio_and_targets() -> None:
    targets = {"unary_writers": {"ratio_at_least": 1.0}, "serial_p50": {"ratio_at_most": 1.5}}
    slow = kitlib.figure(
        "unary_writers", "w", "entries/s", 900, 3600, "etcd", "higher", "a", "b", targets
    )
    assert slow["ratio"] == 0.25 and slow["met"] is False
    assert slow["command"] == "a" and slow["baseline_command"] == "b"
    fast = kitlib.figure("serial_p50", "w", "ms", 2.0, 1.5, "etcd", "lower", "a", "b", targets)
    assert fast["ratio"] == 1.333 and fast["met"] is True
    alone = kitlib.figure("catchup_mb", "w", "MB/s", 60, None, None, "higher", "c", None, targets)
    assert alone["ratio"] is None and alone["met"] is None and alone["target"] is None
    with pytest.raises(ValueError):
        kitlib.figure("serial_p50", "w", "u", 1, 1, "etcd", "sideways", None)
    with pytest.raises(ValueError):
        kitlib.figure("not_a_figure", "w", "u", 1, 1, "etcd", "higher", None)
    with pytest.raises(ValueError):
        kitlib.target_met({"ratio_above": 1}, 2.0)


def test_value_targets_and_combined_bounds() -> None:
    targets = {
        "batched_1k": {"value_at_least": 60000},
        "spark_source_noop": {"value_at_least": 1000000, "ratio_at_least": 0.3},
    }
    short = kitlib.figure(
        "batched_1k", "w", "entries/s", 16000, 2600, "etcd", "higher", "a", "b", targets
    )
    assert short["met"] is False  # a ratio of 6 does not make up for the absolute bound
    enough = kitlib.figure(
        "batched_1k", "w", "entries/s", 61000, 2600, "etcd", "higher", "a", "b", targets
    )
    assert enough["met"] is True
    # Both bounds must hold: fast enough in rows/s but below 0.3x the JVM is not met.
    fast_but_far = kitlib.figure(
        "spark_source_noop", "w", "rows/s", 1.2e6, 5e6, "jvm", "higher", "a", "b", targets
    )
    assert fast_but_far["met"] is False
    both = kitlib.figure(
        "spark_source_noop", "w", "rows/s", 1.2e6, 3e6, "jvm", "higher", "a", "b", targets
    )
    assert both["met"] is True
    # A bound on a number that was not measured leaves the verdict open.
    assert kitlib.target_met({"ratio_at_least": 0.3}, None, 5.0) is None
    assert kitlib.describe_target(targets["spark_source_noop"]) == ">= 1,000,000 and ratio >= 0.3"


def test_targets_file_skips_notes_and_nulls(tmp_path: Path) -> None:
    path = tmp_path / "targets.json"
    path.write_text('{"_what": "a note", "a": null, "b": {"ratio_at_least": 2}}')
    assert kitlib.load_targets(path) == {"b": {"ratio_at_least": 2}}


def test_the_shipped_targets_file_has_a_slot_for_every_figure() -> None:
    path = Path(__file__).resolve().parents[2] / "bench" / "targets.json"
    names = {k for k in json.loads(path.read_text()) if not k.startswith("_")}
    assert names == set(kitlib.FIGURE_NAMES)


def test_find_point_takes_the_last_match() -> None:
    points = [{"system": "rlog", "writers": 4, "v": 1}, {"system": "rlog", "writers": 4, "v": 2}]
    assert kitlib.find_point(points, system="rlog", writers=4) == points[1]
    assert kitlib.find_point(points, system="etcd") is None


def test_summary_has_ratio_and_target_columns() -> None:
    records = [
        {"kind": "meta", "run": "r", "host": "h", "cpus": 2, "commit": "c", "mode": "quick",
         "load_start": [1.0, 2.0, 3.0], "load_end": [4.0, 5.0, 6.0], "wall_seconds": 60},
        kitlib.figure("unary_writers", "64 writers", "entries/s", 900, 3600, "etcd 3.4", "higher",
                      "rlog x", "etcd y", {"unary_writers": {"ratio_at_least": 1}}),
        {"kind": "point", "system": "rlog", "series": "unary", "replicas": 3, "writers": 64,
         "batch": 1, "size": 1024, "entries_per_s": 900.0, "mb_per_s": 0.9, "p50_ms": 60.0,
         "p99_ms": 90.0, "load1": 1.5},
    ]  # fmt: skip
    text = kitlib.summary_markdown(records)
    header = (
        "| figure | unit | rlog | baseline | value | ratio | host ceiling | share | target | met |"
    )
    assert header in text
    assert (
        "| 64 writers | entries/s | 900 | etcd 3.4 | 3,600 | 0.25 | - | - | ratio >= 1 | no |"
        in text
    )
    assert "`rlog x`" in text and "`etcd y`" in text
    assert "load average at the start 1.0/2.0/3.0, at the end 4.0/5.0/6.0" in text
    assert "| rlog | unary | 3 | 64 | 1 | 1024 | 900 | 0.90 | 60.00 | 90.00 | 1.5 |" in text
    assert "host:" not in text  # a results file from before the host probe


def test_summary_states_the_host_probe() -> None:
    records = [
        {"kind": "meta", "run": "r", "host": "h", "cpus": 2, "commit": "c", "mode": "quick",
         "load_start": [1.0, 2.0, 3.0]},
        {"kind": "machine", "page_fault_us": 3.456, "synced_mb_per_s_new": 345.2,
         "synced_mb_per_s_rewritten": 1012.7},
    ]  # fmt: skip
    text = kitlib.summary_markdown(records)
    assert (
        "host: a fresh page faults in 3.46 µs; synced 2 MiB writes, 3 writers: 345 MB/s each "
        "on new file space, 1,013 on rewritten"
    ) in text
    records[1]["synced_mb_per_s_new_pieces"] = 1076.0
    assert "345 MB/s each on new file space (1,076 in 1 MiB calls), 1,013 on rewritten" in (
        kitlib.summary_markdown(records)
    )


def test_self_time_from_py_spy_raw_stacks() -> None:
    raw = ["main (a.py:1);loop (b.py:2);work (c.py:3) 5", "main (a.py:1);loop (b.py:2) 3", "", " 1"]
    own, inclusive, total = kitlib.self_time(raw)
    assert total == 9
    assert own == {"work (c.py:3)": 5, "loop (b.py:2)": 3, "": 1}
    assert inclusive["main (a.py:1)"] == 8 and inclusive["work (c.py:3)"] == 5


def test_recursive_frames_count_once_inclusive() -> None:
    own, inclusive, total = kitlib.self_time(["f (a.py:1);f (a.py:1);g (a.py:2) 4"])
    assert inclusive["f (a.py:1)"] == 4 and own == {"g (a.py:2)": 4} and total == 4


def test_a_share_of_the_ceiling_reads_the_same_way_for_rates_and_latencies() -> None:
    assert kitlib.share(70.0, 100.0, "higher") == 0.7  # 70 of 100 MB/s
    assert kitlib.share(2.0, 0.5, "lower") == 0.25  # 2 ms where one sync takes 0.5
    assert kitlib.share(None, 1.0, "higher") is None
    assert kitlib.share(1.0, None, "lower") is None
    targets = {"batched_4k_mb": {"share_at_least": 0.8}}
    under = kitlib.figure(
        "batched_4k_mb", "w", "MB/s", 70, 20, "etcd", "higher", "a", "b", targets, 100, "disk"
    )
    assert under["share"] == 0.7 and under["met"] is False and under["ceiling_name"] == "disk"
    over = kitlib.figure(
        "batched_4k_mb", "w", "MB/s", 85, 20, "etcd", "higher", "a", "b", targets, 100, "disk"
    )
    assert over["met"] is True
    unmeasured = kitlib.figure(
        "batched_4k_mb", "w", "MB/s", 85, 20, "etcd", "higher", "a", "b", targets
    )
    assert unmeasured["share"] is None and unmeasured["met"] is None
    assert kitlib.describe_target(targets["batched_4k_mb"]) == "share >= 0.8"


def test_summary_states_the_ceiling_and_the_share() -> None:
    records = [
        {"kind": "meta", "run": "r", "host": "h", "cpus": 2, "commit": "c", "mode": "quick",
         "load_start": [1.0, 2.0, 3.0], "volume": "slowfs: every file sync +2ms"},
        {"kind": "machine", "page_fault_us": 2.0, "synced_mb_per_s_new": 200.0,
         "synced_mb_per_s_rewritten": 900.0, "sync_ms_p50": 0.5, "sync_ms_p90": 0.7,
         "sync_ms_p99": 3.0, "synced_mb_per_s_one": 400.0, "group_commits_per_s": 1500.0},
        kitlib.figure("serial_p50", "serial p50", "ms", 2.0, 1.0, "etcd 3.4", "lower", "x", "y",
                      {}, 0.5, "one sync"),
    ]  # fmt: skip
    text = kitlib.summary_markdown(records)
    assert "| serial p50 | ms | 2.00 | etcd 3.4 | 1.00 | 2.00 | 0.50 | 25% | - | - |" in text
    assert "- serial p50: one sync" in text
    assert "data of both systems on: slowfs: every file sync +2ms" in text
    assert "fdatasync p50 0.50 ms (p90 0.70, p99 3.00)" in text
