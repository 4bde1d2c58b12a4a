"""``gpufleet report``: a postmortem / capacity-review report from the ledger and Prometheus.

Sections: the exclusion leaderboard and its concentration; incidents by cause
(XID code and exclusion reason); pages and the exclusions they led to (from
Alertmanager's webhook); fail-slow episodes per node (from the straggler alerts
Prometheus recorded); the checkpoint queue-wait share over time; automatic vs
manual recovery (success, retry chains, retry interval and downtime); fleet MTBF
and the Young/Daly checkpoint interval it implies. Every event's ``source`` (the
system that recorded it) is shown beside it. Markdown (or HTML) with PNG charts.
"""

from __future__ import annotations

import html
import json
import sys
import time
from pathlib import Path
from typing import Any

from gpufleet.fleet.chains import DEFAULT_HEALTHY_AFTER_S
from gpufleet.fleet.report_context import LedgerData, Report, SectionContext, duration
from gpufleet.fleet.report_sections import SECTIONS
from gpufleet.promapi import PrometheusApi


class ReportError(RuntimeError):
    pass


class Progress:
    """A one-line progress bar on stderr."""

    def __init__(self, total: int, stream: Any = None) -> None:
        self.total = total
        self.done = 0
        self.stream = stream or sys.stderr

    def step(self, label: str) -> None:
        self.done += 1
        width = 24
        filled = round(width * self.done / self.total)
        bar = "#" * filled + "-" * (width - filled)
        self.stream.write(f"\r[{bar}] {self.done}/{self.total} {label:<40}")
        if self.done == self.total:
            self.stream.write("\n")
        self.stream.flush()


def parse_since(text: str) -> float:
    units = {"m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
    if text and text[-1] in units and text[:-1].replace(".", "", 1).isdigit():
        return float(text[:-1]) * units[text[-1]]
    raise ReportError(f"--since {text!r} is not a duration like 12h, 30d or 8w")


def build_report(
    prometheus: PrometheusApi,
    ledger: LedgerData,
    out: Path,
    since_s: float,
    *,
    until: float | None = None,
    progress: Progress | None = None,
    healthy_after: float = DEFAULT_HEALTHY_AFTER_S,
) -> Report:
    """Query, compute and draw every section; writes the PNGs into ``out``."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        import pandas as pd
    except ImportError as error:
        raise ReportError(
            f"the report needs pandas and matplotlib ({error}); pip install 'gpufleet[report]'"
        ) from None
    until = until if until is not None else time.time()
    out.mkdir(parents=True, exist_ok=True)
    ending = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(until))
    report = Report(f"gpufleet report: {duration(since_s)} to {ending}", until - since_s, until)
    ctx = SectionContext(
        prometheus, ledger, out, until - since_s, until, healthy_after, report, pd, plt
    )
    progress = progress or Progress(len(SECTIONS))
    for heading, section in SECTIONS:
        progress.step(heading)
        report.sections.append((heading, section(ctx)))
    return report


def write_report(report: Report, out: Path, fmt: str = "md") -> Path:
    if fmt == "md":
        text = f"# {report.title}\n\n"
        for heading, body in report.sections:
            text += f"## {heading}\n\n{body}\n"
        path = out / "report.md"
        path.write_text(text)
    else:
        parts = [f"<h1>{html.escape(report.title)}</h1>"]
        for heading, body in report.sections:
            parts.append(f"<h2>{html.escape(heading)}</h2>")
            for line in body.splitlines():
                if line.startswith("!["):
                    name = line[line.index("(") + 1 : line.index(")")]
                    parts.append(f'<img src="{html.escape(name)}" alt="{html.escape(name)}">')
                elif line.startswith("|"):
                    if set(line) <= {"|", "-"}:
                        continue
                    cells = "".join(
                        f"<td>{html.escape(c.strip())}</td>" for c in line.strip("|").split("|")
                    )
                    parts.append(f"<table><tr>{cells}</tr></table>")
                elif line.strip():
                    parts.append(f"<p>{html.escape(line)}</p>")
        path = out / "report.html"
        path.write_text("<!doctype html><meta charset=utf-8><body>" + "\n".join(parts) + "</body>")
    (out / "figures.json").write_text(json.dumps(report.figures, indent=1, default=str))
    return path


def read_ledger(db: str | None, client: Any) -> LedgerData:
    """The ledger's history: from its SQLite file when ``db`` names one (the ledger need not
    run), else every page of its API through ``client`` (a ``LedgerClient``)."""
    if not db:
        return LedgerData(
            client.get_all("/v1/exclusions"),
            client.get_all("/v1/attempts"),
            client.get_all("/v1/incidents"),
        )
    from gpufleet.fleet.incidents import IncidentStore
    from gpufleet.fleet.store import LedgerStore

    if not Path(db).exists():
        raise ReportError(f"--db {db}: no such file")
    store = LedgerStore(db)
    try:
        return LedgerData(store.exclusions(), store.attempts(), IncidentStore(store).incidents())
    finally:
        store.close()
