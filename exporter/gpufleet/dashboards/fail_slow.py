"""Fail-slow: each node's compute against its stage's median, as lines and as a node x time
heatmap in which one slow node stands out; the ranking; where step time goes; baselines."""

from __future__ import annotations

from grafana_foundation_sdk.builders import dashboard as db
from grafana_foundation_sdk.models import dashboard as dm

from gpufleet.dashboards.common import (
    DATASOURCE,
    Grid,
    dashboard,
    heatmap_panel,
    limit,
    query_variable,
    quoted,
    sel,
    table_panel,
    target,
    targets,
    timeseries_panel,
)
from gpufleet.dashboards.names import Recorded
from gpufleet.rules.config import RulesConfig

UID = "gpufleet-fail-slow"
JOB = 'training_job="$training_job"'
STAGE = 'pp_stage=~"$pp_stage"'
STRAGGLER_ALERTS = "GpuFleetStragglerNode|GpuFleetNodeSlowerThanBaseline|GpuFleetJobSlowdown"


def build(config: RulesConfig) -> dm.Dashboard:
    r = Recorded.of(config)
    job_stage = sel(JOB, STAGE)
    ratio = f"{r.compute_ratio}{{{job_stage}}}"
    grid = Grid()
    grid.add(
        timeseries_panel(
            "Compute time / stage median",
            "Each node's slowest-local-rank compute time per step divided by the median of the "
            f"nodes in the same job and pipeline stage. Above {config.straggler_ratio:g} (the "
            "straggler alert's threshold) a node sets the pace of the whole lock-step job.",
            "short",
            targets((ratio, "{{node}} (stage {{pp_stage}})")),
            limit_at=config.straggler_ratio,
        ),
        12,
        9,
    )
    grid.add(
        heatmap_panel(
            "Compute ratio heatmap (node x time)",
            "The same ratio, one row per node, colour by value: a slow node is a dark row. "
            "Rows are ordered by their ratio, highest first.",
            "short",
            [target(f"sort_desc({ratio})", "{{node}}")],
        ),
        12,
        9,
    )
    grid.add(
        table_panel(
            "Straggler ranking",
            "Nodes by compute ratio to their stage median now, with the robust z-score "
            f"((value - median) / 1.4826 MAD). The alert needs ratio > {config.straggler_ratio:g} "
            f"and z > {config.straggler_zscore:g} for {config.straggler_for}.",
            "short",
            [
                target(f"sort_desc({ratio})", instant=True, ref="A"),
                target(f"{r.compute_zscore}{{{job_stage}}}", instant=True, ref="B"),
            ],
            columns=("ratio to stage median", "robust z-score"),
        ).thresholds(limit(config.straggler_ratio)),
        8,
        9,
    )
    grid.add(
        table_panel(
            "Where step time goes, per node",
            "Seconds per step each node spends computing, waiting on collectives and waiting "
            "on the data loader. Healthy ranks wait on a slow one: the straggler computes "
            "longest and waits least.",
            "s",
            [
                target(
                    f"sum without (phase) ({r.phase_per_step}{{{sel(JOB, STAGE, 'phase=' + quoted(p))}}})",
                    instant=True,
                    ref=chr(ord("A") + i),
                )
                for i, p in enumerate(("compute", "collective_wait", "data_wait"))
            ],
            columns=("compute s/step", "collective wait s/step", "data wait s/step"),
        ),
        8,
        9,
    )
    grid.add(
        timeseries_panel(
            "Node vs its own baseline",
            f"Each node's compute per step against its own {config.baseline_window} ending "
            f"{config.baseline_offset} ago, relative to the job's median trend (a cluster-wide "
            f"slowdown cancels out). GpuFleetNodeSlowerThanBaseline pages above {config.baseline_ratio:g}.",
            "short",
            targets((f"{r.baseline_ratio}{{{job_stage}}}", "{{node}} (stage {{pp_stage}})")),
            limit_at=config.baseline_ratio,
        ),
        8,
        9,
    )
    grid.add(
        timeseries_panel(
            "Job step time vs its baseline",
            "The job's mean step time over 2 minutes, its steady step time (the "
            f"{config.job_slowdown_quantile:g} quantile over {config.job_slowdown_window}) and the "
            f"same over its baseline. GpuFleetJobSlowdown pages when steady / baseline > {config.job_slowdown_ratio:g}.",
            "s",
            targets(
                (f"{r.job_step}{{{sel(JOB)}}}", "step time (2m)"),
                (f"{r.job_steady}{{{sel(JOB)}}}", "steady step time"),
                (f"{r.job_steady_baseline}{{{sel(JOB)}}}", "baseline"),
            ),
        ),
        24,
        8,
    )
    straggler_alerts = (
        db.AnnotationQuery()
        .name("Straggler alerts")
        .datasource(DATASOURCE)
        .enable(True)
        .icon_color("red")
        .expr(f"ALERTS{{{sel(JOB, 'alertname=~' + quoted(STRAGGLER_ALERTS))}}}")
    )
    return dashboard(
        UID,
        "gpufleet / Fail-slow",
        "Stragglers: which node computes slower than its pipeline-stage peers, since when, "
        "and what it costs the job.",
        [
            query_variable(
                "training_job",
                "Training job",
                f"label_values({r.compute_ratio}{{{sel()}}}, training_job)",
            ),
            query_variable(
                "pp_stage",
                "Pipeline stage",
                f"label_values({r.compute_ratio}{{{sel(JOB)}}}, pp_stage)",
                include_all=True,
            ),
        ],
        grid,
        annotations=[straggler_alerts],
    )
