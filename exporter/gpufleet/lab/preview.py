"""Draw each dashboard's data as a PNG in its grid layout:
``python -m gpufleet.lab.preview --out docs/dashboards``.

No Grafana server runs here, so this is a preview of what the panels show, not a
Grafana replacement: the scenario of the dashboard tests (``gpufleet.lab.stack``)
is queried panel by panel from a real Prometheus and drawn with matplotlib as a
timeseries, stat, table or heatmap.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.dates as mdates
import matplotlib.pyplot as plt
from matplotlib.axes import Axes

from gpufleet.dashboards.build import dashboards
from gpufleet.dashboards.common import WIDTH, render
from gpufleet.lab.stack import QUERY_STEP_S, FedPrometheus, fed_prometheus

ROW_INCHES = 0.27  # one grid row (30 px in Grafana) at 16 inches for 24 columns
FIGURE_WIDTH = 16.0
BACKGROUND, PANEL, TEXT, GRID = "#111217", "#181b1f", "#ccccdc", "#2c3235"
PALETTE = ["#73bf69", "#f2cc0c", "#8ab8ff", "#ff780a", "#f2495c", "#5794f2", "#b877d9",
           "#705da0", "#37872d", "#fade2a", "#ff9830", "#c4162a"]  # fmt: skip
Result = list[dict[str, Any]]


def legend(template: str, labels: dict[str, str]) -> str:
    if not template or template == "__auto":
        shown = {k: v for k, v in labels.items() if k not in ("__name__", "job", "instance")}
        return ", ".join(f"{k}={v}" for k, v in shown.items()) or "value"
    return re.sub(r"\{\{\s*(\w+)\s*\}\}", lambda m: labels.get(m.group(1), ""), template)


def formatted(value: float, unit: str) -> str:
    if not math.isfinite(value):
        return "-"
    if unit == "percentunit":
        return f"{value * 100:.1f}%"
    if unit == "percent":
        return f"{value:.0f}%"
    if unit == "s":
        for size, suffix in ((86400, "d"), (3600, "h"), (60, "min")):
            if abs(value) >= size:
                return f"{value / size:.1f} {suffix}"
        return f"{value:.3g} s"
    if unit == "h":
        return f"{value:.0f} h"
    if unit == "watt":
        return f"{value / 1000:.1f} kW" if abs(value) >= 1000 else f"{value:.0f} W"
    if unit == "Bps":
        return f"{value / 1e6:.0f} MB/s"
    return f"{value:.3g}"


def finite(values: list[list[Any]]) -> list[tuple[float, float]]:
    points = [(float(t), float(v)) for t, v in values]
    return [(t, v) for t, v in points if math.isfinite(v)]


def threshold_line(panel: dict[str, Any]) -> float | None:
    defaults = panel["fieldConfig"]["defaults"]
    if defaults.get("custom", {}).get("thresholdsStyle", {}).get("mode") in (None, "off"):
        return None
    steps = [s["value"] for s in defaults.get("thresholds", {}).get("steps", []) if s["value"]]
    return float(steps[-1]) if steps else None


def with_gaps(points: list[tuple[float, float]]) -> tuple[list[float], list[float]]:
    """Dates and values with a NaN wherever samples are missing, so lines break there as
    Grafana's do, instead of joining across the gap."""
    times: list[float] = []
    values: list[float] = []
    previous: float | None = None
    for t, v in points:
        if previous is not None and t - previous > 1.5 * QUERY_STEP_S:
            times.append(mdates.date2num(datetime.fromtimestamp(previous + QUERY_STEP_S, UTC)))
            values.append(math.nan)
        times.append(mdates.date2num(datetime.fromtimestamp(t, UTC)))
        values.append(v)
        previous = t
    return times, values


def draw_timeseries(ax: Axes, panel: dict[str, Any], results: list[Result]) -> None:
    unit = panel["fieldConfig"]["defaults"].get("unit", "")
    scale = 100.0 if unit == "percentunit" else 1.0
    stacked = panel["fieldConfig"]["defaults"].get("custom", {}).get("stacking", {}).get("mode")
    bars = panel["fieldConfig"]["defaults"].get("custom", {}).get("drawStyle") == "bars"
    base: dict[float, float] = {}
    lines = 0
    for target, result in zip(panel["targets"], results, strict=True):
        for series in result:
            points = finite(series["values"])
            if not points:
                continue
            if stacked == "normal":
                points = [(t, v + base.get(t, 0.0)) for t, v in points]
                base.update(points)
            times, values = with_gaps(points)
            color = PALETTE[lines % len(PALETTE)]
            label = legend(target.get("legendFormat", ""), series["metric"])
            # Bars and lone points would vanish as lines: mark every point.
            sparse = bars or len(points) < 3
            ax.plot(times, [v * scale for v in values], color=color, lw=1, label=label,
                    marker="o" if sparse else None, ms=2)  # fmt: skip
            lines += 1
    limit = threshold_line(panel)
    if limit is not None:
        ax.axhline(limit * scale, color="#f2495c", lw=1, ls="--")
    ax.xaxis_date(tz=UTC)
    ax.xaxis.set_major_formatter(mdates.DateFormatter("%H:%M", tz=UTC))
    ax.tick_params(labelsize=6, colors=TEXT)
    ax.grid(color=GRID, lw=0.5)
    if unit in ("percentunit", "percent"):
        ax.yaxis.set_major_formatter(lambda v, _: f"{v:.0f}%")
    elif unit in ("s", "watt", "Bps"):
        ax.yaxis.set_major_formatter(lambda v, _: formatted(v, unit))
    if lines and lines <= 12:
        ax.legend(fontsize=5, loc="upper left", ncol=3, frameon=False, labelcolor=TEXT)
    elif lines:
        ax.text(0.01, 0.97, f"{lines} series", transform=ax.transAxes, fontsize=6,
                color=TEXT, va="top")  # fmt: skip


GRAFANA_COLORS = {"green": "#73bf69", "orange": "#ff9830", "red": "#f2495c", "blue": "#8ab8ff"}


def step_color(panel: dict[str, Any], value: float) -> str:
    """The colour of the threshold step ``value`` falls in, as Grafana colours a stat."""
    color = "blue"
    for step in panel["fieldConfig"]["defaults"].get("thresholds", {}).get("steps", []):
        if step["value"] is None or value >= step["value"]:
            color = step["color"]
    return GRAFANA_COLORS.get(color, color)


def draw_stat(ax: Axes, panel: dict[str, Any], results: list[Result]) -> None:
    unit = panel["fieldConfig"]["defaults"].get("unit", "")
    items = []
    for target, result in zip(panel["targets"], results, strict=True):
        for series in result:
            points = finite(series.get("values") or [series["value"]])
            if points:
                label = legend(target.get("legendFormat", ""), series["metric"])
                items.append((label, points[-1][1]))
    ax.set_axis_off()
    for index, (label, value) in enumerate(items[:4]):
        x = (index + 0.5) / min(len(items), 4)
        ax.text(
            x,
            0.45,
            formatted(value, unit),
            ha="center",
            va="center",
            fontsize=16,
            color=step_color(panel, value),
            weight="bold",
            transform=ax.transAxes,
        )
        if len(panel["targets"]) > 1 or "{{" in panel["targets"][0].get("legendFormat", ""):
            ax.text(x, 0.1, label, ha="center", fontsize=6, color=TEXT, transform=ax.transAxes)


def draw_table(ax: Axes, panel: dict[str, Any], results: list[Result]) -> None:
    unit = panel["fieldConfig"]["defaults"].get("unit", "")
    rows: dict[tuple[tuple[str, str], ...], dict[str, float]] = {}
    columns: list[str] = []
    for target, result in zip(panel["targets"], results, strict=True):
        column = "Value" if len(results) == 1 else f"Value #{target['refId']}"
        column = display_names(panel).get(column, column)
        columns.append(column)
        for series in result:
            labels = tuple(
                (k, v) for k, v in sorted(series["metric"].items())
                if k not in ("__name__", "job", "instance")
            )  # fmt: skip
            rows.setdefault(labels, {})[column] = float(series["value"][1])
    label_names = sorted({k for labels in rows for k, _ in labels})
    ordered = sorted(rows.items(), key=lambda item: -item[1].get(columns[0], -math.inf))[:9]
    cells = [
        [dict(labels).get(name, "") for name in label_names]
        + [formatted(values.get(column, math.nan), unit) for column in columns]
        for labels, values in ordered
    ]
    ax.set_axis_off()
    if not cells:
        return
    table = ax.table(cellText=cells, colLabels=label_names + columns, loc="upper center",
                     cellLoc="left", colLoc="left")  # fmt: skip
    table.auto_set_font_size(False)
    table.set_fontsize(6)
    table.scale(1, 0.9)
    for (row, _), cell in table.get_celld().items():
        cell.set_facecolor(PANEL if row else "#22252b")
        cell.set_edgecolor(GRID)
        cell.get_text().set_color(TEXT)


def display_names(panel: dict[str, Any]) -> dict[str, str]:
    names = {}
    for override in panel["fieldConfig"].get("overrides", []):
        for prop in override["properties"]:
            if prop["id"] == "displayName":
                names[override["matcher"]["options"]] = prop["value"]
    return names


def draw_heatmap(ax: Axes, panel: dict[str, Any], results: list[Result]) -> None:
    series = [s for result in results for s in result if finite(s["values"])]
    times = sorted({float(t) for s in series for t, _ in s["values"]})
    index = {t: i for i, t in enumerate(times)}
    matrix = []
    for item in series:
        row = [math.nan] * len(times)
        for t, v in item["values"]:
            row[index[float(t)]] = float(v)
        matrix.append(row)

    def mean(row: list[float]) -> float:
        values = [v for v in row if math.isfinite(v)]
        return sum(values) / len(values)

    order = sorted(range(len(matrix)), key=lambda i: -mean(matrix[i]))
    template = panel["targets"][0].get("legendFormat", "")
    start, end = (mdates.date2num(datetime.fromtimestamp(t, UTC)) for t in (times[0], times[-1]))
    image = ax.imshow([matrix[i] for i in order], aspect="auto", cmap="Oranges",
                      interpolation="nearest", extent=(start, end, len(order), 0))  # fmt: skip
    ax.set_yticks([i + 0.5 for i in range(len(order))])
    ax.set_yticklabels([legend(template, series[i]["metric"]) for i in order], fontsize=5)
    ax.xaxis_date(tz=UTC)
    ax.xaxis.set_major_formatter(mdates.DateFormatter("%H:%M", tz=UTC))
    ax.tick_params(labelsize=6, colors=TEXT)
    bar = plt.colorbar(image, ax=ax, pad=0.01, fraction=0.03)
    bar.ax.tick_params(labelsize=5, colors=TEXT)


DRAW = {
    "timeseries": draw_timeseries,
    "stat": draw_stat,
    "table": draw_table,
    "heatmap": draw_heatmap,
}


def draw(board: dict[str, Any], fed: FedPrometheus, out: Path) -> Path:
    height = max(p["gridPos"]["y"] + p["gridPos"]["h"] for p in board["panels"])
    figure = plt.figure(figsize=(FIGURE_WIDTH, height * ROW_INCHES + 0.5), facecolor=BACKGROUND)
    total = height * ROW_INCHES + 0.5
    figure.suptitle(board["title"], x=0.01, y=1 - 0.12 / total, ha="left", fontsize=11,
                    color=TEXT)  # fmt: skip
    span = (fed.start + 3600, time.time())  # the range FedPrometheus.run queries
    for panel in board["panels"]:
        grid = panel["gridPos"]
        bottom = (height - grid["y"] - grid["h"]) * ROW_INCHES / total
        left, width = grid["x"] / WIDTH, grid["w"] / WIDTH
        box = figure.add_axes((left + 0.004, bottom + 0.006, width - 0.008,
                               grid["h"] * ROW_INCHES / total - 0.012))  # fmt: skip
        box.set_facecolor(PANEL)
        box.set_xticks([])
        box.set_yticks([])
        for spine in box.spines.values():
            spine.set_color(GRID)
        box.text(0.01, 0.985, panel["title"], transform=box.transAxes, fontsize=7,
                 color=TEXT, va="top", weight="bold")  # fmt: skip
        # Inside the box: a band for the title on top, room for tick labels below and left.
        box_inches = grid["h"] * ROW_INCHES
        inner = figure.add_axes((
            left + 0.045 * width + 0.008,
            bottom + 0.3 / total,
            width * 0.94 - 0.016,
            (box_inches - 0.58) / total,
        ))  # fmt: skip
        inner.set_facecolor(PANEL)
        for spine in inner.spines.values():
            spine.set_color(GRID)
        results = [fed.run(t["expr"], bool(t.get("instant"))) for t in panel["targets"]]
        DRAW[panel["type"]](inner, panel, results)
        if panel["type"] in ("timeseries", "heatmap"):
            # Grafana draws the dashboard's whole time range, however sparse the data.
            inner.set_xlim(*(mdates.date2num(datetime.fromtimestamp(t, UTC)) for t in span))
    path = out / f"{board['uid'].removeprefix('gpufleet-')}.png"
    figure.savefig(path, dpi=72, facecolor=BACKGROUND)
    plt.close(figure)
    return path


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", default="docs/dashboards", help="directory for the PNGs")
    out = Path(parser.parse_args().out)
    out.mkdir(parents=True, exist_ok=True)
    with (
        tempfile.TemporaryDirectory(prefix="gpufleet-previews-") as workdir,
        fed_prometheus(Path(workdir)) as fed,
    ):
        for board in dashboards().values():
            print(f"wrote {draw(json.loads(render(board)), fed, out)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
