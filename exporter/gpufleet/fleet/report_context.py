"""What every section of ``gpufleet report`` reads and writes, and the formatting they share."""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpufleet.promapi import PrometheusApi


@dataclass(slots=True)
class LedgerData:
    exclusions: list[dict[str, Any]]
    attempts: list[dict[str, Any]]
    # pages, each with the exclusion it led to (``exclusion_id``, ``exclusion_delay_s``)
    incidents: list[dict[str, Any]] = field(default_factory=list)


@dataclass(slots=True)
class Report:
    title: str
    since: float
    until: float
    sections: list[tuple[str, str]] = field(default_factory=list)  # (heading, markdown body)
    images: list[Path] = field(default_factory=list)
    figures: dict[str, Any] = field(default_factory=dict)


def duration(seconds: float) -> str:
    if not math.isfinite(seconds):
        return "n/a"
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.1f} min"
    if seconds < 3 * 86400:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 86400:.1f} d"


def table(frame: Any, floatfmt: str = ".3g") -> str:
    if frame is None or len(frame) == 0:
        return "_none_\n"
    columns = list(frame.columns)
    lines = ["| " + " | ".join(str(c) for c in columns) + " |", "|" + "---|" * len(columns)]
    for row in frame.itertuples(index=False):
        cells = [format(v, floatfmt) if isinstance(v, float) else str(v) for v in row]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


@dataclass(slots=True)
class SectionContext:
    """What every section needs: the data sources, the period, and a way to draw."""

    prometheus: PrometheusApi
    ledger: LedgerData
    out: Path
    since: float
    until: float
    healthy_after: float
    report: Report
    pd: Any
    plt: Any

    @property
    def window(self) -> str:
        return f"{int(self.until - self.since)}s"

    @property
    def step(self) -> float:
        return max(60.0, (self.until - self.since) / 2000)

    def chart(self, name: str, draw: Callable[[Any], None]) -> str:
        figure, axes = self.plt.subplots(figsize=(8, 3.6))
        draw(axes)
        figure.tight_layout()
        path = self.out / f"{name}.png"
        figure.savefig(path, dpi=110)
        self.plt.close(figure)
        self.report.images.append(path)
        return f"![{name}]({path.name})\n"

    def exclusions(self) -> Any:
        frame = self.pd.DataFrame(self.ledger.exclusions)
        if len(frame):
            frame = frame[(frame.excluded_at >= self.since) & (frame.excluded_at < self.until)]
        return frame

    def attempts(self) -> list[dict[str, Any]]:
        return [a for a in self.ledger.attempts if (a.get("started_at") or 0) < self.until]


def median(values: list[float]) -> float:
    return float(statistics.median(values)) if values else float("nan")


def by_source(frame: Any, what: str) -> str:
    """A table of ``frame``'s rows by their ``source``: the system that recorded each."""
    if "source" not in frame.columns:
        return ""
    counts = frame.groupby("source").size().sort_values(ascending=False).rename(what)
    shares = counts.reset_index()
    shares["share"] = shares[what] / int(counts.sum())
    return f"\n{what.capitalize()} by source (the system that recorded them):\n\n" + table(
        shares, ".0%"
    )
