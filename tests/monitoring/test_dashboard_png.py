"""The dashboard picture's pure parts (tests/monitoring/dashboard_png.py): Grafana's variable
substitution, legend formats and units. The drawing over a real Prometheus is tested in
test_live.py."""

from __future__ import annotations

import math
from pathlib import Path

import dashboard_png as dp
from monlib import Chart, Tools


def test_substitute_both_forms_and_leaves_unknown_variables_for_prometheus() -> None:
    values = {"log": ".*", "namespace": "a|b"}
    expr = 'x{n=~"$namespace", l=~"${log}", m=~"$log", o="$logs", p="$nope"}'
    assert dp.substitute(expr, values) == 'x{n=~"a|b", l=~".*", m=~".*", o="$logs", p="$nope"}'
    # a backslash in a value stays one backslash (no regex replacement escapes)
    assert dp.substitute('x{l=~"$log"}', {"log": r"a\.b"}) == r'x{l=~"a\.b"}'


def test_saved_variables_are_the_all_value(tools: Tools, chart: Chart) -> None:
    assert dp.saved_variables(chart.dashboard) == {"namespace": ".*", "log": ".*"}
    board = {
        "templating": {
            "list": [
                {"name": "one", "type": "query", "current": {"value": "x"}},
                {"name": "many", "type": "query", "current": {"value": ["x", "y"]}},
                {"name": "ds", "type": "datasource", "query": "prometheus"},
            ]
        }
    }
    assert dp.saved_variables(board) == {"one": "x", "many": "(x|y)"}


def test_legend_format() -> None:
    labels = {"__name__": "up", "pod": "demo-0", "job": "j"}
    assert dp.legend("{{pod}} {{ job }}", labels) == "demo-0 j"
    assert dp.legend("{{pod}} {{missing}}", labels) == "demo-0"
    assert dp.legend("", labels) == 'up{job="j", pod="demo-0"}'


def test_units() -> None:
    assert dp.format_value(0.0123, "s") == "12.3 ms"
    assert dp.format_value(2.5, "s") == "2.5 s"
    assert dp.format_value(3 * 2**30, "bytes") == "3 GiB"
    assert dp.format_value(1500, "short") == "1.5 K"
    assert dp.format_value(42, "ops") == "42 ops/s"
    assert dp.format_value(math.nan, "short") == "NaN"


def test_on_grid_leaves_gaps() -> None:
    grid = [100.0, 101.0, 102.0, 103.0]
    out = dp.on_grid([[100, "1"], [103, "4"]], 100.0, 1.0, grid)
    assert out[0] == 1.0 and out[3] == 4.0
    assert math.isnan(out[1]) and math.isnan(out[2])


def test_rows_text_and_hidden_queries(tmp_path: Path) -> None:
    """A row and a text panel run no query and never fail; a panel whose only query is
    hidden runs nothing and shows "No data", as in Grafana. No query is sent: the URL is
    a closed port."""
    ds = {"type": "prometheus", "uid": "${datasource}"}
    board = {
        "title": "t",
        "templating": {
            "list": [{"name": "datasource", "type": "datasource", "query": "prometheus"}]
        },
        "panels": [
            {"type": "row", "title": "Replicas", "gridPos": {"x": 0, "y": 0, "w": 24, "h": 1}},
            {
                "type": "text",
                "title": "Read me",
                "gridPos": {"x": 0, "y": 1, "w": 12, "h": 4},
                "options": {"content": "what this dashboard shows"},
            },
            {
                "type": "timeseries",
                "title": "Hidden",
                "datasource": ds,
                "gridPos": {"x": 12, "y": 1, "w": 12, "h": 4},
                "targets": [{"refId": "A", "expr": "up", "hide": True}],
            },
        ],
    }
    panels = dp.render(board, "http://127.0.0.1:1", 0.0, 60.0, tmp_path / "p.png")
    assert [(p.title, p.error) for p in panels] == [
        ("Replicas", ""),
        ("Read me", ""),
        ("Hidden", "No data"),
    ]
    assert panels[1].content == "what this dashboard shows"
    assert (tmp_path / "p.png").read_bytes()[:4] == b"\x89PNG"
