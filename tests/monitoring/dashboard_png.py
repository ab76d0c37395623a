"""The chart's Grafana dashboard drawn into a PNG from a real Prometheus: not Grafana (which
this machine cannot build: docs/monitoring.md says why), but the same inputs and the same
panel errors.

What Grafana does with the dashboard JSON, done here:
- the template variables at their saved value (All: the variable's allValue, `.*`) are
  substituted into each target's PromQL; an unknown `$variable` is left in place, so
  Prometheus rejects it the way it would reject Grafana's query;
- each target runs as a `query_range` over the time range, and its series are named by the
  target's legendFormat (`{{label}}`);
- each panel is laid out on Grafana's 24-column grid by its gridPos and drawn by its type
  (timeseries, stat, gauge) with its title, unit and legend.

A panel fails, drawn red with the reason, where Grafana would show an error or nothing: a
datasource that is not the dashboard's Prometheus variable, a query Prometheus answers with
an error, a panel type not drawn here, or no sample at all (Grafana's "No data").
"""

from __future__ import annotations

import json
import math
import re
import textwrap
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")  # files only, no display
import matplotlib.dates as mdates
import matplotlib.pyplot as plt
import numpy as np
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.patches import FancyBboxPatch
from matplotlib.ticker import FuncFormatter, Locator, MaxNLocator

# Grafana's dark theme and its classic series palette
BACKGROUND = "#111217"
PANEL = "#181b1f"
BORDER = "#2c3235"
TEXT = "#ccccdc"
MUTED = "#8e8e9e"
ERROR = "#f2495c"
PALETTE = [
    "#73bf69", "#f2cc0c", "#5794f2", "#ff9830", "#f2495c", "#b877d9",
    "#70dbed", "#fade2a", "#1f78c1", "#ba43a9", "#705da0", "#508642",
]  # fmt: skip
DRAWN_TYPES = ("timeseries", "stat", "gauge")
QUERYLESS_TYPES = ("row", "text")  # a row's title bar, a text panel's content
GRID_COLUMNS = 24
QUERY_TIMEOUT = 15.0


@dataclass
class Series:
    name: str
    times: list[float]  # unix seconds
    values: list[float]  # NaN where Prometheus answered NaN


@dataclass
class Panel:
    title: str
    type: str
    grid: dict[str, int]
    unit: str
    series: list[Series] = field(default_factory=list)
    error: str = ""  # why the panel shows an error (red); "" if it shows data
    content: str = ""  # a text panel's text

    @property
    def has_samples(self) -> bool:
        return any(not math.isnan(v) for s in self.series for v in s.values)


class QueryError(Exception):
    """Prometheus answered a query with an error (the text Grafana shows on the panel)."""


def saved_variables(board: dict[str, Any]) -> dict[str, str]:
    """Each query variable at the value the dashboard opens with: All is the allValue."""
    values: dict[str, str] = {}
    for var in board.get("templating", {}).get("list", []):
        if var.get("type") != "query":
            continue
        current = var.get("current", {}).get("value", "")
        picked = current if isinstance(current, list) else [current]
        if picked == ["$__all"]:
            values[var["name"]] = var.get("allValue") or ".*"
        else:
            values[var["name"]] = picked[0] if len(picked) == 1 else f"({'|'.join(picked)})"
    return values


def substitute(expr: str, values: dict[str, str]) -> str:
    """`$name` and `${name}` replaced, longest names first (so `$log` never eats
    `$logs`); anything else is left for Prometheus to reject, as with Grafana."""
    out = expr
    for name in sorted(values, key=len, reverse=True):
        value = values[name]
        out = out.replace(f"${{{name}}}", value)
        out = re.sub(rf"\${re.escape(name)}(?!\w)", value.replace("\\", "\\\\"), out)
    return out


def legend(fmt: str, labels: dict[str, str]) -> str:
    """Grafana's legendFormat: `{{label}}` becomes the label's value ("" if absent); no
    format is the series' label set."""
    if not fmt:
        inner = ", ".join(f'{k}="{v}"' for k, v in sorted(labels.items()) if k != "__name__")
        return f"{labels.get('__name__', '')}{{{inner}}}"
    return re.sub(r"\{\{\s*(\w+)\s*\}\}", lambda m: labels.get(m.group(1), ""), fmt).strip()


def query_range(url: str, expr: str, start: float, end: float, step: float) -> list[Any]:
    params = urllib.parse.urlencode({"query": expr, "start": start, "end": end, "step": step})
    try:
        with urllib.request.urlopen(
            f"{url}/api/v1/query_range?{params}", timeout=QUERY_TIMEOUT
        ) as r:
            body = json.load(r)
    except urllib.error.HTTPError as e:  # 400/422: bad_data, execution errors
        try:
            body = json.load(e)
        except ValueError:
            raise QueryError(f"HTTP {e.code}: {e.reason}") from e
    if body.get("status") != "success":
        raise QueryError(f"{body.get('errorType', 'error')}: {body.get('error', body)}")
    result: list[Any] = body["data"]["result"]
    return result


def on_grid(values: list[Any], start: float, step: float, grid: list[float]) -> list[float]:
    """A series' samples on the query's step grid, NaN where it has none, so that a line
    breaks where a series is missing (a killed replica) as Grafana's does, instead of
    joining the points on either side."""
    out = [math.nan] * len(grid)
    for t, v in values:
        i = round((float(t) - start) / step)
        if 0 <= i < len(out):
            out[i] = float(v)
    return out


def datasource_error(board: dict[str, Any], panel: dict[str, Any]) -> str:
    """The panel's datasource must be the dashboard's Prometheus datasource variable."""
    ds = panel.get("datasource") or {}
    uid = str(ds.get("uid", ""))
    m = re.fullmatch(r"\$\{?(\w+)\}?", uid)
    variables = {v["name"]: v for v in board.get("templating", {}).get("list", [])}
    var = variables.get(m.group(1)) if m else None
    if var is None or var.get("type") != "datasource" or var.get("query") != "prometheus":
        return f"Datasource {uid or ds!r} was not found"
    if ds.get("type") not in (None, "prometheus"):
        return f"datasource type {ds.get('type')!r} is not prometheus"
    return ""


def query_panels(
    board: dict[str, Any], url: str, start: float, end: float, variables: dict[str, str]
) -> list[Panel]:
    step = float(max(1, round((end - start) / 400)))
    grid = [start + i * step for i in range(int((end - start) // step) + 1)]
    panels: list[Panel] = []
    for raw in board["panels"]:
        unit = raw.get("fieldConfig", {}).get("defaults", {}).get("unit", "short")
        panel = Panel(raw.get("title", ""), raw.get("type", ""), raw["gridPos"], unit)
        panels.append(panel)
        if panel.type in QUERYLESS_TYPES:
            panel.content = str(raw.get("options", {}).get("content", ""))
            continue
        panel.error = datasource_error(board, raw)
        if not panel.error and panel.type not in DRAWN_TYPES:
            panel.error = f"panel type {panel.type!r} is not drawn here"
        if panel.error:
            continue
        errors = []
        for target in raw.get("targets", []):
            if target.get("hide"):  # Grafana does not run a hidden query
                continue
            expr = substitute(target.get("expr", ""), variables)
            try:
                found = query_range(url, expr, start, end, step)
            except (QueryError, OSError) as e:
                errors.append(f"{target.get('refId', '?')}: {e}")
                continue
            named = [(legend(target.get("legendFormat", ""), r["metric"]), r) for r in found]
            for name, r in sorted(named, key=lambda nr: nr[0]):
                panel.series.append(Series(name, grid, on_grid(r["values"], start, step, grid)))
        if errors:
            panel.error = "\n".join(errors)
        elif not panel.has_samples:
            panel.error = "No data"
    return panels


def _si(value: float, steps: list[tuple[float, str]], digits: int = 3) -> str:
    for size, suffix in steps:
        if abs(value) >= size:
            return f"{value / size:.{digits}g}{suffix}"
    return f"{value:.{digits}g}"


def format_value(value: float, unit: str) -> str:
    """Grafana's units, as the y axis and stat panels show them."""
    if math.isnan(value):
        return "NaN"
    if unit == "s":
        if value == 0:
            return "0 s"
        return _si(value, [(1.0, " s"), (1e-3, " ms"), (1e-6, " µs"), (1e-9, " ns")])
    if unit == "bytes":
        return _si(value, [(2**40, " TiB"), (2**30, " GiB"), (2**20, " MiB"), (2**10, " KiB")])
    text = _si(value, [(1e12, " T"), (1e9, " B"), (1e6, " Mil"), (1e3, " K")])
    return f"{text} ops/s" if unit == "ops" else text


class UnitLocator(Locator):
    """Round ticks in the unit the axis shows (1, 2, 5 GiB rather than 2.33 GiB)."""

    def __init__(self, unit: str) -> None:
        self.unit = unit
        self.inner = MaxNLocator(nbins=5, steps=[1, 2, 2.5, 5, 10])

    def __call__(self) -> Any:
        low, high = self.axis.get_view_interval() if self.axis else (0.0, 1.0)
        return self.tick_values(low, high)

    def tick_values(self, vmin: float, vmax: float) -> Any:
        scale = 1.0
        if self.unit == "bytes":
            top = max(abs(vmin), abs(vmax))
            scale = next((2.0**p for p in (40, 30, 20, 10) if top >= 2.0**p), 1.0)
        return np.asarray(self.inner.tick_values(vmin / scale, vmax / scale)) * scale


def _place(fig: Figure, grid: dict[str, int], rows: int, top: float, bottom: float) -> tuple:
    """The figure rectangle (left, bottom, width, height) of a gridPos, with a margin."""
    cell_w, cell_h = 1.0 / GRID_COLUMNS, (top - bottom) / rows
    gap_x, gap_y = 0.004, 0.004
    left = grid["x"] * cell_w + gap_x
    width = grid["w"] * cell_w - 2 * gap_x
    height = grid["h"] * cell_h - 2 * gap_y
    low = top - (grid["y"] + grid["h"]) * cell_h + gap_y
    return left, low, width, height


def _frame(fig: Figure, rect: tuple, failed: bool) -> None:
    left, low, width, height = rect
    fig.patches.append(
        FancyBboxPatch(
            (left, low),
            width,
            height,
            boxstyle="round,pad=0,rounding_size=0.002",
            transform=fig.transFigure,
            facecolor=PANEL,
            edgecolor=ERROR if failed else BORDER,
            linewidth=2.5 if failed else 1.0,
            zorder=-10,
        )
    )


def _draw_error(fig: Figure, rect: tuple, panel: Panel) -> None:
    left, low, width, height = rect
    text = "\n".join(textwrap.fill(line, 70) for line in panel.error.splitlines())
    fig.text(
        left + width / 2,
        low + height / 2,
        f"⚠ {text}",
        ha="center",
        va="center",
        color=ERROR,
        fontsize=10,
        wrap=True,
    )


def _style(ax: Axes) -> None:
    ax.set_facecolor(PANEL)
    for side in ("top", "right"):
        ax.spines[side].set_visible(False)
    for side in ("left", "bottom"):
        ax.spines[side].set_color(BORDER)
    ax.tick_params(colors=MUTED, labelsize=8)
    ax.grid(color=BORDER, linewidth=0.6)


def _draw_timeseries(fig: Figure, rect: tuple, panel: Panel) -> None:
    left, low, width, height = rect
    ncol = 3 if len(panel.series) > 4 else 2
    legend_rows = math.ceil(len(panel.series) / ncol)
    legend_h = min(0.45, 0.075 * legend_rows + 0.02) * height
    ax = fig.add_axes(
        (left + 0.075 * width, low + legend_h + 0.1 * height, 0.9 * width, 0.72 * height - legend_h)
    )
    _style(ax)
    for i, s in enumerate(panel.series):
        ax.plot(
            [mdates.date2num(datetime.fromtimestamp(t, UTC)) for t in s.times],
            s.values,
            color=PALETTE[i % len(PALETTE)],
            linewidth=1.4,
            label=s.name,
        )
    finite = {v for s in panel.series for v in s.values if not math.isnan(v)}
    if len(finite) == 1:  # a flat line: Grafana's axis then spans 0 to the value (or 1)
        (only,) = finite
        top = max(1.0, only) * 1.1
        ax.set_ylim(min(0.0, only) - 0.03 * top, top)  # a line at 0 stays off the axis
    ax.yaxis.set_major_locator(UnitLocator(panel.unit))
    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _pos: format_value(v, panel.unit)))
    ax.xaxis.set_major_formatter(mdates.DateFormatter("%H:%M:%S", tz=UTC))
    ax.xaxis.set_major_locator(mdates.AutoDateLocator(minticks=3, maxticks=7))
    ax.legend(
        loc="upper left",
        bbox_to_anchor=(0.0, -0.14),
        ncol=ncol,
        frameon=False,
        fontsize=8,
        labelcolor=TEXT,
        handlelength=1.2,
        columnspacing=1.2,
    )


def _draw_stat(fig: Figure, rect: tuple, panel: Panel) -> None:
    """stat and gauge: the last value of each series, big, with its name."""
    left, low, width, height = rect
    shown = [
        (s.name, next((v for v in reversed(s.values) if not math.isnan(v)), math.nan))
        for s in panel.series
    ]
    for i, (name, value) in enumerate(shown):
        x = left + width * (i + 0.5) / len(shown)
        color = PALETTE[i % len(PALETTE)]
        fig.text(x, low + 0.45 * height, format_value(value, panel.unit), ha="center",
                 va="center", color=color, fontsize=22, weight="bold")  # fmt: skip
        fig.text(x, low + 0.2 * height, name, ha="center", va="center", color=TEXT, fontsize=9)


def draw(
    board: dict[str, Any],
    panels: list[Panel],
    variables: dict[str, str],
    start: float,
    end: float,
    path: Path,
    note: str = "",
) -> Path:
    rows = max(p.grid["y"] + p.grid["h"] for p in panels)
    width_in = 18.0
    height_in = rows * 0.42 + 1.4  # panel rows plus the header and footer
    header = 0.9 / height_in
    footer = 0.5 / height_in
    fig = plt.figure(figsize=(width_in, height_in), facecolor=BACKGROUND)
    queried = [p for p in panels if p.type not in QUERYLESS_TYPES]
    failed = [p for p in queried if p.error]
    shown_vars = "   ".join(
        f"{v.get('label') or v['name']} = {v.get('current', {}).get('text', '')} "
        f"({variables.get(v['name'], '')})"
        for v in board.get("templating", {}).get("list", [])
        if v.get("type") == "query"
    )
    span = (
        f"{datetime.fromtimestamp(start, UTC):%Y-%m-%d %H:%M:%S} to "
        f"{datetime.fromtimestamp(end, UTC):%H:%M:%S} UTC"
    )
    fig.text(0.006, 1 - 0.35 * header, board.get("title", ""), color=TEXT, fontsize=18,
             weight="bold", va="center")  # fmt: skip
    subtitle = f"{shown_vars}   |   {span}" if shown_vars else span
    fig.text(0.006, 1 - 0.75 * header, subtitle, color=MUTED, fontsize=10, va="center")
    verdict = (
        f"{len(failed)} of {len(queried)} panels failed"
        if failed
        else f"all {len(queried)} panels show data"
    )
    fig.text(0.994, 1 - 0.35 * header, verdict, color=ERROR if failed else PALETTE[0],
             fontsize=12, ha="right", va="center")  # fmt: skip
    lines = [
        "Not Grafana: drawn by tests/monitoring/dashboard_png.py from the chart's dashboard "
        "JSON and Prometheus query_range answers (docs/monitoring.md says why).",
        note,
    ]
    for i, line in enumerate(x for x in lines if x):
        fig.text(0.006, (0.7 - 0.45 * i) * footer, line, color=MUTED, fontsize=9, va="center")
    for panel in panels:
        rect = _place(fig, panel.grid, rows, 1 - header, footer)
        if panel.type == "row":
            fig.text(rect[0], rect[1] + rect[3] / 2, panel.title, color=TEXT, fontsize=13,
                     weight="bold", va="center")  # fmt: skip
            continue
        _frame(fig, rect, bool(panel.error))
        left, low, _, height = rect
        fig.text(left + 0.006, low + 0.96 * height, panel.title,
                 color=ERROR if panel.error else TEXT, fontsize=11, weight="bold",
                 va="top")  # fmt: skip
        if panel.error:
            _draw_error(fig, rect, panel)
        elif panel.type == "text":
            fig.text(left + 0.006, low + 0.8 * height, textwrap.fill(panel.content, 90),
                     color=TEXT, fontsize=9, va="top")  # fmt: skip
        elif panel.type == "timeseries":
            _draw_timeseries(fig, rect, panel)
        else:
            _draw_stat(fig, rect, panel)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100, facecolor=BACKGROUND)
    plt.close(fig)
    return path


def render(
    board: dict[str, Any], url: str, start: float, end: float, path: Path, note: str = ""
) -> list[Panel]:
    """Query every panel of `board` on the Prometheus at `url` over [start, end] with the
    dashboard's saved variable values, draw them into `path`, return the panels (with
    their errors)."""
    variables = saved_variables(board)
    panels = query_panels(board, url, start, end, variables)
    draw(board, panels, variables, start, end, path, note)
    return panels
