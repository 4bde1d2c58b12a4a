"""The sections of ``gpufleet report``, in order: each queries the ledger's history and
Prometheus over the report's period, adds its figures and draws its chart."""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable
from typing import Any

from gpufleet.fleet.chains import attempt_recovered, histories
from gpufleet.fleet.report_context import SectionContext, by_source, duration, median, table
from gpufleet.schema.alerts import AlertName


def _exclusions_section(ctx: SectionContext) -> str:
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
    body += table(leaderboard.head(15), ".1%")
    body += by_source(exclusions, "exclusions")

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


def _incidents_section(ctx: SectionContext) -> str:
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
        body += table(by_xid)
        ctx.report.figures["xid_events"] = int(by_xid.events.sum())
    else:
        body += "_no XID was reported_\n"
        ctx.report.figures["xid_events"] = 0
    exclusions = ctx.exclusions()
    if len(exclusions):
        reasons = exclusions.groupby("reason").size().sort_values(ascending=False)
        body += "\nExclusions by recorded reason:\n\n"
        body += table(reasons.rename("exclusions").reset_index())
    return body


def _pages_section(ctx: SectionContext) -> str:
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
    figures.update(pages_led_to_exclusion=len(led), median_page_to_exclusion_s=median(delays))
    body = (
        f"{len(pages)} pages (critical alerts of a node) on "
        f"{len({i['node'] for i in pages})} nodes; **{len(led)} led to an exclusion of their "
        f"node**, a median {duration(median(delays))} after the page.\n\n"
    )
    if pages:
        frame = ctx.pd.DataFrame(pages)
        frame["led"] = frame.exclusion_id.notna()
        by_alert = frame.groupby("alertname").agg(
            pages=("led", "size"),
            exclusions=("led", "sum"),
            median_delay_s=("exclusion_delay_s", "median"),
        )
        by_alert["median delay"] = by_alert.pop("median_delay_s").map(duration)
        body += table(by_alert.sort_values("pages", ascending=False).reset_index())
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
        body += table(silent.sort_values("exclusions", ascending=False).head(15))
    return body


def _fail_slow_section(ctx: SectionContext) -> str:
    step = ctx.step
    firing = ctx.prometheus.query_range(
        f'max by (node) (ALERTS{{alertname="{AlertName.STRAGGLER}",alertstate="firing"}})',
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
            f"No {AlertName.STRAGGLER} alert fired in this period (or the gpufleet rules are not "
            "loaded in this Prometheus).\n"
        )
    slow = ctx.pd.DataFrame(rows).sort_values(["episodes", "minutes firing"], ascending=False)
    return f"Nodes paged as stragglers ({AlertName.STRAGGLER}):\n\n" + table(slow)


def _checkpoint_section(ctx: SectionContext) -> str:
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


def _recovery_section(ctx: SectionContext) -> str:
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
        summary["median downtime"] = downtime.median().map(duration)
        summary["p90 downtime"] = downtime.quantile(0.9).map(duration)
    body = table(summary.reset_index(), ".0%")
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
        counts = restarts.groupby(["source", "trigger"]).size().unstack(fill_value=0)
        body += "\nRestarts by source (the system that recorded them):\n\n"
        body += table(counts.reset_index())
    return body


def _seed_figures(
    ctx: SectionContext, attempts: list[dict[str, Any]], chains: list[Any], recoveries: Any
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
        trigger: median(
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
        median_retry_interval_s=median(intervals),
        median_downtime_auto_s=downtime["auto"],
        median_downtime_manual_s=downtime["manual"],
    )
    success = f"{rate:.0%}" if closed else "n/a"
    return (
        f"\n- **retry chain success rate: {success}** ({recovered} of {len(closed)} closed "
        f"chains recovered; {len(chains) - len(closed)} still open)\n"
        f"- median retry interval: {duration(median(intervals))} (a failed attempt's end "
        f"to the next automatic attempt's start, {len(intervals)} retries)\n"
        f"- median downtime: automatic {duration(downtime['auto'])}, manual "
        f"{duration(downtime['manual'])} (a failed attempt's end to the next attempt's "
        "first step: the retry interval plus the restart's start-up)\n"
    )


def _mtbf_section(ctx: SectionContext) -> str:
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
        f"- node MTBF (node-time per exclusion): {duration(node_mtbf)}\n"
        f"- job MTBF (training time per failed attempt): {duration(job_mtbf)} "
        f"({failures} failures)\n"
        f"- checkpoint cost (mean per operation, queue wait included): {duration(cost)}\n"
        f"- **Young/Daly checkpoint interval** sqrt(2 x cost x MTBF): {duration(young_daly)}\n"
    )
    if math.isfinite(young_daly) and young_daly > 0:
        loss = cost / young_daly + young_daly / (2 * job_mtbf)
        body += f"- expected share of time lost at that interval: {loss:.1%}\n"
    return body


SECTIONS: tuple[tuple[str, Callable[[SectionContext], str]], ...] = (
    ("Exclusion leaderboard and concentration", _exclusions_section),
    ("Incidents by cause", _incidents_section),
    ("Pages and the exclusions they led to", _pages_section),
    ("Fail-slow episodes per node", _fail_slow_section),
    ("Checkpoint queue wait", _checkpoint_section),
    ("Automatic vs manual recovery", _recovery_section),
    ("Fleet MTBF and the checkpoint interval", _mtbf_section),
)
