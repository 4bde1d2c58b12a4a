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
import itertools
import json
import math
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpufleet.fleet.chains import DEFAULT_HEALTHY_AFTER_S, attempt_recovered, histories
from gpufleet.promapi import PrometheusApi

STRAGGLER_ALERT = "GpuFleetStragglerNode"


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


def parse_since(text: str) -> float:
    units = {"m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
    if text and text[-1] in units and text[:-1].replace(".", "", 1).isdigit():
        return float(text[:-1]) * units[text[-1]]
    raise ReportError(f"--since {text!r} is not a duration like 12h, 30d or 8w")


def _duration(seconds: float) -> str:
    if not math.isfinite(seconds):
        return "n/a"
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.1f} min"
    if seconds < 3 * 86400:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 86400:.1f} d"


def _table(frame: Any, floatfmt: str = ".3g") -> str:
    if frame is None or len(frame) == 0:
        return "_none_\n"
    columns = list(frame.columns)
    lines = ["| " + " | ".join(str(c) for c in columns) + " |", "|" + "---|" * len(columns)]
    for row in frame.itertuples(index=False):
        cells = [format(v, floatfmt) if isinstance(v, float) else str(v) for v in row]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


@dataclass(slots=True)
class _Context:
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


def _median(values: list[float]) -> float:
    return float(statistics.median(values)) if values else float("nan")


def _by_source(frame: Any, what: str) -> str:
    """A table of ``frame``'s rows by their ``source``: the system that recorded each."""
    if "source" not in frame.columns:
        return ""
    counts = frame.groupby("source").size().sort_values(ascending=False).rename(what)
    table = counts.reset_index()
    table["share"] = table[what] / int(counts.sum())
    return f"\n{what.capitalize()} by source (the system that recorded them):\n\n" + _table(
        table, ".0%"
    )


def _exclusions_section(ctx: _Context) -> str:
    exclusions = ctx.exclusions()
    figures = ctx.report.figures
    if not len(exclusions):
        figures.update(exclusions=0, nodes_excluded=0, top3_share=0.0)
        return "No exclusions were recorded in the ledger in this period.\n"
    board = exclusions.groupby("node").size().sort_values(ascending=False).rename("exclusions")
    total = int(board.sum())
    top3 = float(board.head(3).sum() / total)
    figures.update(exclusions=total, nodes_excluded=len(board), top3_share=top3)
    leaderboard = board.reset_index()
    leaderboard["share"] = leaderboard.exclusions / total
    leaderboard["cumulative"] = leaderboard.share.cumsum()
    advice = " — fix or retire them first.\n\n" if top3 > 0.5 else ".\n\n"
    body = (
        f"{total} exclusions on {len(board)} nodes. **The top 3 nodes account for "
        f"{top3:.0%} of all exclusions**{advice}"
    )
    if "source" in exclusions.columns:
        sources = exclusions.groupby("node").source.agg(
            lambda s: ", ".join(f"{name} {n}" for name, n in s.value_counts().items())
        )
        leaderboard["sources"] = leaderboard.node.map(sources)
    body += _table(leaderboard.head(15), ".1%")
    body += _by_source(exclusions, "exclusions")

    def draw(axes: Any) -> None:
        head = leaderboard.head(15)
        axes.bar(head.node, head.exclusions, color="#c0504d")
        axes.set_ylabel("exclusions")
        axes.yaxis.get_major_locator().set_params(integer=True)
        axes.tick_params(axis="x", rotation=60)
        twin = axes.twinx()
        twin.plot(head.node, head.cumulative * 100, color="#1f4e79", marker="o")
        twin.set_ylabel("cumulative share %")
        twin.set_ylim(0, 100)
        axes.set_title("Exclusions by node")

    return body + "\n" + ctx.chart("exclusions_by_node", draw)


def _incidents_section(ctx: _Context) -> str:
    pd, window, until = ctx.pd, ctx.window, ctx.until
    xids = ctx.prometheus.query(
        f"sum by (xid) (max_over_time(gpufleet_gpu_xid_errors_total[{window}]))", until
    )
    gpus = ctx.prometheus.query(
        f"count by (xid) (max_over_time(gpufleet_gpu_xid_errors_total[{window}]))", until
    )
    gpu_counts = {s["metric"].get("xid"): int(float(s["value"][1])) for s in gpus}
    rows = [
        {
            "XID": s["metric"].get("xid", "?"),
            "events": int(float(s["value"][1])),
            "GPUs": gpu_counts.get(s["metric"].get("xid"), 0),
        }
        for s in xids
    ]
    body = "XID errors counted by the agents (`gpufleet_gpu_xid_errors_total`):\n\n"
    if rows:
        by_xid = pd.DataFrame(rows).sort_values("events", ascending=False)
        body += _table(by_xid)
        ctx.report.figures["xid_events"] = int(by_xid.events.sum())
    else:
        body += "_no XID was reported_\n"
        ctx.report.figures["xid_events"] = 0
    exclusions = ctx.exclusions()
    if len(exclusions):
        reasons = exclusions.groupby("reason").size().sort_values(ascending=False)
        body += "\nExclusions by recorded reason:\n\n"
        body += _table(reasons.rename("exclusions").reset_index())
    return body


def _pages_section(ctx: _Context) -> str:
    figures = ctx.report.figures
    pages = [i for i in ctx.ledger.incidents if ctx.since <= float(i["started_at"]) < ctx.until]
    figures["pages"] = len(pages)
    if not ctx.ledger.incidents:
        return (
            "No pages were recorded: route Alertmanager's critical pages to the ledger's "
            "webhook (`/v1/alertmanager`) to see which exclusions followed a page.\n"
        )
    led = [i for i in pages if i.get("exclusion_id") is not None]
    delays = [float(i["exclusion_delay_s"]) for i in led]
    figures.update(pages_led_to_exclusion=len(led), median_page_to_exclusion_s=_median(delays))
    body = (
        f"{len(pages)} pages (critical alerts of a node) on "
        f"{len({i['node'] for i in pages})} nodes; **{len(led)} led to an exclusion of their "
        f"node**, a median {_duration(_median(delays))} after the page.\n\n"
    )
    if pages:
        frame = ctx.pd.DataFrame(pages)
        frame["led"] = frame.exclusion_id.notna()
        by_alert = frame.groupby("alertname").agg(
            pages=("led", "size"),
            exclusions=("led", "sum"),
            median_delay_s=("exclusion_delay_s", "median"),
        )
        by_alert["median delay"] = by_alert.pop("median_delay_s").map(_duration)
        body += _table(by_alert.sort_values("pages", ascending=False).reset_index())
    paged = {i["exclusion_id"] for i in ctx.ledger.incidents if i.get("exclusion_id")}
    exclusions = ctx.exclusions()
    unpaged = exclusions[~exclusions.id.isin(paged)] if len(exclusions) else exclusions
    figures.update(exclusions_unpaged=len(unpaged))
    if not len(exclusions):
        return body
    share = len(unpaged) / len(exclusions)
    figures["unpaged_share"] = share
    body += (
        f"\n**{len(unpaged)} of {len(exclusions)} exclusions ({share:.0%}) had no page "
        "before them**: the node was taken out without a critical alert of it (a silent "
        "failure, or a page that did not reach the ledger).\n\n"
    )
    if len(unpaged):
        columns = [c for c in ("node", "reason", "source") if c in unpaged.columns]
        silent = unpaged.groupby(columns).size().rename("exclusions").reset_index()
        body += _table(silent.sort_values("exclusions", ascending=False).head(15))
    return body


def _fail_slow_section(ctx: _Context) -> str:
    step = ctx.step
    firing = ctx.prometheus.query_range(
        f'max by (node) (ALERTS{{alertname="{STRAGGLER_ALERT}",alertstate="firing"}})',
        ctx.since,
        ctx.until,
        step,
    )
    rows = []
    for series in firing:
        stamps = [float(t) for t, _ in series["values"]]
        gaps = sum(1 for a, b in itertools.pairwise(stamps) if b - a > step * 1.5)
        rows.append(
            {
                "node": series["metric"].get("node", "?"),
                "episodes": 1 + gaps,
                "minutes firing": round(len(stamps) * step / 60, 1),
            }
        )
    ctx.report.figures["straggler_episodes"] = sum(row["episodes"] for row in rows)
    if not rows:
        return (
            f"No {STRAGGLER_ALERT} alert fired in this period (or the gpufleet rules are not "
            "loaded in this Prometheus).\n"
        )
    slow = ctx.pd.DataFrame(rows).sort_values(["episodes", "minutes firing"], ascending=False)
    return f"Nodes paged as stragglers ({STRAGGLER_ALERT}):\n\n" + _table(slow)


def _checkpoint_section(ctx: _Context) -> str:
    window = f"{int(max(1800, ctx.step * 4))}s"
    queue = f"sum(rate(gpufleet_checkpoint_queue_wait_seconds_total[{window}]))"
    service = f"sum(rate(gpufleet_checkpoint_service_seconds_total[{window}]))"
    share = ctx.prometheus.query_range(
        f"{queue} / ({queue} + {service})", ctx.since, ctx.until, ctx.step
    )
    if not share or not share[0]["values"]:
        return "No checkpoint was reported in this period.\n"
    pd = ctx.pd
    points = pd.DataFrame(share[0]["values"], columns=["time", "share"]).astype(float)
    points["time"] = pd.to_datetime(points.time, unit="s")
    mean = float(points.share.mean())
    ctx.report.figures["checkpoint_queue_share"] = mean
    advice = (
        " Storage, not the writers, bounds checkpoints: stagger them or add storage bandwidth."
        if mean > 0.5
        else ""
    )
    body = (
        f"Share of checkpoint time spent queued for storage, not writing: mean **{mean:.0%}**, "
        f"max {points.share.max():.0%}.{advice}\n\n"
    )

    def draw(axes: Any) -> None:
        axes.plot(points.time, points.share * 100, color="#1f4e79")
        axes.set_ylabel("queue wait %")
        axes.set_ylim(0, 100)
        axes.set_title("Checkpoint queue-wait share")

    return body + ctx.chart("checkpoint_queue_share", draw)


def _recovery_section(ctx: _Context) -> str:
    pd = ctx.pd
    attempts = ctx.attempts()
    jobs = histories(attempts, ctx.until, ctx.healthy_after)
    tried = pd.DataFrame(
        [
            {
                "trigger": a["trigger"],
                "recovered": attempt_recovered(a, ctx.until, ctx.healthy_after),
            }
            for a in attempts
            if a["trigger"] in ("auto", "manual")
        ]
    )
    if not len(tried):
        return "No restarts were recorded in the ledger in this period.\n"
    recoveries = pd.DataFrame(
        [
            {"trigger": r.trigger, "downtime_s": r.downtime_s}
            for history in jobs.values()
            for r in history.recoveries
        ]
    )
    summary = tried.groupby("trigger").agg(
        attempts=("recovered", "size"), recovered=("recovered", "sum")
    )
    summary["success rate"] = summary.recovered / summary.attempts
    if len(recoveries):
        downtime = recoveries.groupby("trigger").downtime_s
        summary["median downtime"] = downtime.median().map(_duration)
        summary["p90 downtime"] = downtime.quantile(0.9).map(_duration)
    body = _table(summary.reset_index(), ".0%")
    figures = ctx.report.figures
    rates = summary["success rate"].to_dict()
    if rates.get("auto") and rates.get("manual"):
        ratio = rates["auto"] / rates["manual"]
        figures["auto_vs_manual_success"] = ratio
        body += f"\nAutomatic retries recovered the job {ratio:.1f}x as often as manual restarts.\n"
    chains = [chain for history in jobs.values() for chain in history.chains]
    outcomes = pd.Series([chain.outcome or "open" for chain in chains]).value_counts()
    if len(outcomes):
        body += "\nRetry chains by outcome: "
        body += ", ".join(f"{name} {count}" for name, count in outcomes.items()) + "\n"
    body += _seed_figures(ctx, attempts, chains, recoveries)
    restarts = pd.DataFrame([a for a in attempts if a["trigger"] in ("auto", "manual")])
    if "source" in restarts.columns:
        by_source = restarts.groupby(["source", "trigger"]).size().unstack(fill_value=0)
        body += "\nRestarts by source (the system that recorded them):\n\n"
        body += _table(by_source.reset_index())
    return body


def _seed_figures(
    ctx: _Context, attempts: list[dict[str, Any]], chains: list[Any], recoveries: Any
) -> str:
    """The reliability figures a review compares across clusters, from what was recorded."""
    closed = [chain for chain in chains if chain.outcome is not None]
    recovered = sum(chain.outcome == "recovered" for chain in closed)
    rate = recovered / len(closed) if closed else float("nan")
    by_job: dict[str, dict[int, dict[str, Any]]] = {}
    for a in attempts:
        by_job.setdefault(str(a["training_job"]), {})[int(a["attempt"])] = a
    intervals = [
        float(a["started_at"]) - float(previous["ended_at"])
        for numbered in by_job.values()
        for number, a in numbered.items()
        if a["trigger"] == "auto"
        and (previous := numbered.get(number - 1)) is not None
        and previous.get("outcome") == "failed"
        and previous.get("ended_at") is not None
    ]
    downtime = {
        trigger: _median(
            [float(d) for d in recoveries[recoveries.trigger == trigger].downtime_s]
            if len(recoveries)
            else []
        )
        for trigger in ("auto", "manual")
    }
    ctx.report.figures.update(
        chains_closed=len(closed),
        chains_recovered=recovered,
        chain_success_rate=rate,
        median_retry_interval_s=_median(intervals),
        median_downtime_auto_s=downtime["auto"],
        median_downtime_manual_s=downtime["manual"],
    )
    success = f"{rate:.0%}" if closed else "n/a"
    return (
        f"\n- **retry chain success rate: {success}** ({recovered} of {len(closed)} closed "
        f"chains recovered; {len(chains) - len(closed)} still open)\n"
        f"- median retry interval: {_duration(_median(intervals))} (a failed attempt's end "
        f"to the next automatic attempt's start, {len(intervals)} retries)\n"
        f"- median downtime: automatic {_duration(downtime['auto'])}, manual "
        f"{_duration(downtime['manual'])} (a failed attempt's end to the next attempt's "
        "first step: the retry interval plus the restart's start-up)\n"
    )


def _mtbf_section(ctx: _Context) -> str:
    window, until = ctx.window, ctx.until
    nodes_result = ctx.prometheus.query(
        f'count(max_over_time(up{{job="gpufleet-agent"}}[{window}]))', until
    )
    nodes = int(float(nodes_result[0]["value"][1])) if nodes_result else 0
    spent = (
        f"sum(increase(gpufleet_checkpoint_queue_wait_seconds_total[{window}])) + "
        f"sum(increase(gpufleet_checkpoint_service_seconds_total[{window}]))"
    )
    operations = f"sum(increase(gpufleet_checkpoint_operations_total[{window}]))"
    cost_result = ctx.prometheus.query(f"({spent}) / {operations}", until)
    cost = float(cost_result[0]["value"][1]) if cost_result else float("nan")
    attempts = ctx.attempts()
    failures = sum(1 for a in attempts if a.get("outcome") == "failed")
    uptime = sum(
        (a.get("ended_at") or until) - a["first_step_at"]
        for a in attempts
        if a.get("first_step_at")
    )
    job_mtbf = uptime / failures if failures else float("inf")
    excluded = len(ctx.exclusions())
    node_mtbf = nodes * (until - ctx.since) / excluded if excluded and nodes else float("inf")
    young_daly = (
        math.sqrt(2 * cost * job_mtbf)
        if math.isfinite(cost) and math.isfinite(job_mtbf)
        else float("nan")
    )
    ctx.report.figures.update(
        nodes=nodes,
        node_mtbf_s=node_mtbf,
        job_mtbf_s=job_mtbf,
        checkpoint_cost_s=cost,
        young_daly_s=young_daly,
    )
    body = (
        f"- nodes reporting: {nodes}\n"
        f"- node MTBF (node-time per exclusion): {_duration(node_mtbf)}\n"
        f"- job MTBF (training time per failed attempt): {_duration(job_mtbf)} "
        f"({failures} failures)\n"
        f"- checkpoint cost (mean per operation, queue wait included): {_duration(cost)}\n"
        f"- **Young/Daly checkpoint interval** sqrt(2 x cost x MTBF): {_duration(young_daly)}\n"
    )
    if math.isfinite(young_daly) and young_daly > 0:
        loss = cost / young_daly + young_daly / (2 * job_mtbf)
        body += f"- expected share of time lost at that interval: {loss:.1%}\n"
    return body


SECTIONS: tuple[tuple[str, Callable[[_Context], str]], ...] = (
    ("Exclusion leaderboard and concentration", _exclusions_section),
    ("Incidents by cause", _incidents_section),
    ("Pages and the exclusions they led to", _pages_section),
    ("Fail-slow episodes per node", _fail_slow_section),
    ("Checkpoint queue wait", _checkpoint_section),
    ("Automatic vs manual recovery", _recovery_section),
    ("Fleet MTBF and the checkpoint interval", _mtbf_section),
)


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
    report = Report(f"gpufleet report: {_duration(since_s)} to {ending}", until - since_s, until)
    ctx = _Context(prometheus, ledger, out, until - since_s, until, healthy_after, report, pd, plt)
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
