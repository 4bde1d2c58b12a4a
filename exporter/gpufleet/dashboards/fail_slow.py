"""Fail-slow: each node's compute against its stage's median, as lines and as a node x time
heatmap in which one slow node stands out; the ranking; where step time goes; baselines."""

from __future__ import annotations

from grafana_foundation_sdk.builders import dashboard as db
from grafana_foundation_sdk.models import dashboard as dm

from gpufleet.dashboards import common
from gpufleet.dashboards.names import Recorded
from gpufleet.rules.config import RulesConfig

UID = "gpufleet-fail-slow"
STAGE = 'pp_stage=~"$pp_stage"'
STRAGGLER_ALERTS = "GpuFleetStragglerNode|GpuFleetNodeSlowerThanBaseline|GpuFleetJobSlowdown"


def build(config: RulesConfig) -> dm.Dashboard:
    r = Recorded.of(config)
    job_stage = common.sel(common.JOB, STAGE)
    ratio = f"{r.compute_ratio}{{{job_stage}}}"
    grid = common.Grid()
    grid.timeseries(
        12,
        9,
        "Compute time / stage median",
        "Each node's slowest-local-rank compute time per step divided by the median of the "
        f"nodes in the same job and pipeline stage. Above {config.straggler_ratio:g} (the "
        "straggler alert's threshold) a node sets the pace of the whole lock-step job.",
        "short",
        common.targets((ratio, "{{node}} (stage {{pp_stage}})")),
        limit_at=config.straggler_ratio,
    )
    grid.heatmap(
        12,
        9,
        "Compute ratio heatmap (node x time)",
        "The same ratio, one row per node, colour by value: a slow node is a dark row. "
        "Rows are ordered by their ratio, highest first.",
        "short",
        [common.target(f"sort_desc({ratio})", "{{node}}")],
    )
    grid.add(
        common.table_panel(
            "Straggler ranking",
            "Nodes by compute ratio to their stage median now, with the robust z-score "
            f"((value - median) / 1.4826 MAD). The alert needs ratio > {config.straggler_ratio:g} "
            f"and z > {config.straggler_zscore:g} for {config.straggler_for}.",
            "short",
            [
                common.target(f"sort_desc({ratio})", instant=True, ref="A"),
                common.target(f"{r.compute_zscore}{{{job_stage}}}", instant=True, ref="B"),
            ],
            columns=("ratio to stage median", "robust z-score"),
        ).thresholds(common.limit(config.straggler_ratio)),
        8,
        9,
    )
    grid.table(
        8,
        9,
        "Where step time goes, per node",
        "Seconds per step each node spends computing, waiting on collectives and waiting "
        "on the data loader. Healthy ranks wait on a slow one: the straggler computes "
        "longest and waits least.",
        "s",
        [
            common.target(
                f"sum without (phase) ({r.phase_per_step}{{{common.sel(common.JOB, STAGE, 'phase=' + common.quoted(p))}}})",
                instant=True,
                ref=chr(ord("A") + i),
            )
            for i, p in enumerate(("compute", "collective_wait", "data_wait"))
        ],
        columns=("compute s/step", "collective wait s/step", "data wait s/step"),
    )
    grid.timeseries(
        8,
        9,
        "Node vs its own baseline",
        f"Each node's compute per step against its own {config.baseline_window} ending "
        f"{config.baseline_offset} ago, relative to the job's median trend (a cluster-wide "
        f"slowdown cancels out). GpuFleetNodeSlowerThanBaseline pages above {config.baseline_ratio:g}.",
        "short",
        common.targets((f"{r.baseline_ratio}{{{job_stage}}}", "{{node}} (stage {{pp_stage}})")),
        limit_at=config.baseline_ratio,
    )
    grid.timeseries(
        24,
        8,
        "Job step time vs its baseline",
        "The job's mean step time over 2 minutes, its steady step time (the "
        f"{config.job_slowdown_quantile:g} quantile over {config.job_slowdown_window}) and the "
        f"same over its baseline. GpuFleetJobSlowdown pages when steady / baseline > {config.job_slowdown_ratio:g}.",
        "s",
        common.targets(
            (f"{r.job_step}{{{common.sel(common.JOB)}}}", "step time (2m)"),
            (f"{r.job_steady}{{{common.sel(common.JOB)}}}", "steady step time"),
            (f"{r.job_steady_baseline}{{{common.sel(common.JOB)}}}", "baseline"),
        ),
    )
    straggler_alerts = (
        db.AnnotationQuery()
        .name("Straggler alerts")
        .datasource(common.DATASOURCE)
        .enable(True)
        .icon_color("red")
        .expr(
            f"ALERTS{{{common.sel(common.JOB, 'alertname=~' + common.quoted(STRAGGLER_ALERTS))}}}"
        )
    )
    return common.dashboard(
        UID,
        "gpufleet / Fail-slow",
        "Stragglers: which node computes slower than its pipeline-stage peers, since when, "
        "and what it costs the job.",
        [
            common.query_variable(
                "training_job",
                "Training job",
                f"label_values({r.compute_ratio}{{{common.sel()}}}, training_job)",
            ),
            common.query_variable(
                "pp_stage",
                "Pipeline stage",
                f"label_values({r.compute_ratio}{{{common.sel(common.JOB)}}}, pp_stage)",
                include_all=True,
            ),
        ],
        grid,
        annotations=[straggler_alerts],
    )
