"""Reliability and goodput: the exclusion leaderboard and its concentration, incidents by
cause and XID, fleet MTBF, retries, recovery downtime, Young/Daly against the actual
checkpoint interval, and the share of wall time each job trained. The ledger's events are
shown by their source (the system that recorded them: torchrun, slurm, kubernetes,
alertmanager, manual, auto), which the `source` variable filters."""

from __future__ import annotations

from grafana_foundation_sdk.models import dashboard as dm

from gpufleet.dashboards import common
from gpufleet.dashboards.names import Recorded
from gpufleet.rules.config import RulesConfig
from gpufleet.schema import ledger
from gpufleet.schema.alerts import AlertName

UID = "gpufleet-reliability"


def build(config: RulesConfig) -> dm.Dashboard:
    r = Recorded.of(config)
    c = common.sel()
    fleet = common.sel(config.fleet_selector)
    by_source = common.sel(config.fleet_selector, 'source=~"$source"')
    grid = common.Grid()
    grid.stat(
        6,
        5,
        "Top-3 nodes' share of exclusions (30 d)",
        "Share of the fleet's exclusions over 30 days caused by its three most excluded "
        f"nodes. {AlertName.EXCLUSION_CONCENTRATION} reports above {config.concentration_share:g}.",
        "percentunit",
        [common.target(f"{r.reliability.top_share}{{{c}}}", "top-3 share")],
        steps=common.limit(config.concentration_share),
    )
    grid.stat(
        6,
        5,
        "Fleet MTBF (30 d)",
        "Node-hours per exclusion over 30 days: the mean time between failures of one node.",
        "h",
        [common.target(f"{r.reliability.node_mtbf}{{{c}}}", "MTBF")],
    )
    grid.stat(
        6,
        5,
        "Effective training time",
        "Share of the dashboard's time range in which the job made steps (training time / "
        "wall time): restarts, hangs and restores are the rest.",
        "percentunit",
        [
            common.target(
                f"count_over_time(({r.training.job_step}{{{common.sel(common.JOB)}}} > 0)[$__range:1m]) * 60 / $__range_s",
                "{{training_job}}",
            )
        ],
        steps=common.thresholds((None, "red"), (0.9, "orange"), (0.97, "green")),
    )
    grid.stat(
        6,
        5,
        "Mean recovery downtime",
        "Mean time from a failed attempt to the next attempt's first step, by trigger "
        "(auto: the retry loop; manual: an operator).",
        "s",
        [
            common.target(
                f"sum by (trigger) ({ledger.DOWNTIME.name}_sum{{{fleet}}})\n"
                f"/ sum by (trigger) ({ledger.DOWNTIME.name}_count{{{fleet}}})",
                "{{trigger}}",
            )
        ],
    )
    grid.table(
        8,
        9,
        "Exclusion leaderboard (30 d)",
        "Nodes by exclusions over 30 days, most first: failures concentrate on a few "
        f"nodes. {config.repeat_offender_exclusions} in {config.repeat_offender_window} "
        f"page ({AlertName.REPEAT_OFFENDER_NODE}). Click a node for its dashboard.",
        "short",
        [common.target(f"topk(15, {r.reliability.node_exclusions}{{{c}}} > 0)", instant=True)],
        columns=("exclusions (30 d)",),
    )
    grid.table(
        8,
        9,
        "Incidents by cause (30 d)",
        "Exclusions over 30 days by the reason the ledger recorded.",
        "short",
        [common.target(f"{r.support.exclusions_reason}{{{c}}} > 0", instant=True)],
        link_node=False,
        columns=("exclusions (30 d)",),
    )
    grid.table(
        8,
        9,
        "GPUs with XIDs by code",
        "GPUs that reported each XID code in the time range, with NVIDIA's catalogue class.",
        "short",
        [
            common.target(
                f"count by (xid, class, meaning) (\n  max by (node, gpu, xid) "
                f"(max_over_time({r.gpu.xid_new}{{{c}}}[$__range]))\n"
                "  * on (xid) group_left (class, meaning) gpufleet:xid_catalogue:info\n)",
                instant=True,
            )
        ],
        link_node=False,
        columns=("GPUs",),
    )
    # The ledger's counters, one table each: exclusions by the system that recorded them,
    # attempts by job and outcome, retry chains by job and outcome (chains carry no source:
    # a chain's attempts may come from several).
    ledger_tables = (
        ("Exclusions by source",
         "Exclusions the ledger recorded (all time), by the system that recorded them: "
         "slurm (slurm-watch), kubernetes (the Node watch), alertmanager, torchrun, or a "
         "person (manual).",
         "source", ledger.EXCLUSIONS.name, by_source, "exclusions"),
        ("Job attempts: automatic vs manual",
         "Attempts of each job by what started them (auto retry or an operator), how "
         "they ended, and the system that reported them (source).",
         "training_job, trigger, outcome, source", ledger.ATTEMPTS.name, by_source, "attempts"),
        ("Retry chains",
         "Chains of automatic retries per job by how they ended, and the failed attempts "
         f"of the current chain ({config.retry_chain_failed_attempts} page: {AlertName.RETRY_CHAIN_FAILING}).",
         "training_job, outcome", ledger.CHAINS.name, fleet, "chains"),
    )  # fmt: skip
    for title, description, by, counter, selector, column in ledger_tables:
        query = common.target(f"sum by ({by}) ({counter}{{{selector}}})", instant=True, ref="A")
        grid.table(8, 8, title, description, "short", [query], link_node=False, columns=(column,))
    grid.stat(
        24,
        5,
        "Checkpoint interval: Young/Daly vs actual",
        "The interval that minimises expected lost work, sqrt(2 x save cost x job MTBF) "
        "(Young/Daly, from 30 days of failed attempts and a day of save times), against "
        "how often the job's nodes actually saved over the last hour (saves per rank).",
        "s",
        common.targets(
            (f"{r.reliability.young_daly}{{{common.sel(common.JOB)}}}", "Young/Daly optimum"),
            (f"{r.support.checkpoint_interval}{{{common.sel(common.JOB)}}}", "actual interval"),
        ),
    )
    return common.dashboard(
        UID,
        "gpufleet / Reliability and goodput",
        "Where failures concentrate, how fast jobs recover, and how much wall time trains.",
        [
            common.namespace_variable((r.support.gpu_tenant, r.support.job_tenant)),
            common.query_variable(
                "training_job",
                "Training job",
                f"label_values({r.support.job_tenant}{{{common.sel(common.TENANT)}}}, training_job)",
            ),
            common.query_variable(
                "source",
                "Recorded by",
                f'label_values({{__name__=~"{ledger.EXCLUSIONS.name}|{ledger.ATTEMPTS.name}"}}, source)',
                include_all=True,
            ),
        ],
        grid,
        time_from="now-7d",
    )
