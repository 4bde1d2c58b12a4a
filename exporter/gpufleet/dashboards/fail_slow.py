"""Fail-slow: each node's compute against its stage's median, as lines and as a node x time
heatmap in which one slow node stands out; the ranking; where step time goes; baselines."""

from __future__ import annotations

from grafana_foundation_sdk.builders import dashboard as db
from grafana_foundation_sdk.models import dashboard as dm

from gpufleet.dashboards import common
from gpufleet.dashboards.layout import layout_panels
from gpufleet.dashboards.names import Recorded
from gpufleet.rules.config import RulesConfig
from gpufleet.schema.alerts import AlertName

UID = "gpufleet-fail-slow"
STAGE = 'pp_stage=~"$pp_stage"'
STRAGGLER_ALERTS = "|".join(
    (AlertName.STRAGGLER, AlertName.SLOWER_THAN_BASELINE, AlertName.JOB_SLOWDOWN)
)


def build(config: RulesConfig) -> dm.Dashboard:
    r = Recorded.of(config)
    job_stage = common.sel(common.JOB, STAGE)
    ratio = f"{r.training.compute_ratio}{{{job_stage}}}"
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
                common.target(f"{r.training.compute_zscore}{{{job_stage}}}", instant=True, ref="B"),
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
                f"sum without (phase) ({r.support.phase_per_step}{{{common.sel(common.JOB, STAGE, 'phase=' + common.quoted(p))}}})",
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
        f"slowdown cancels out). {AlertName.SLOWER_THAN_BASELINE} pages above {config.baseline_ratio:g}.",
        "short",
        common.targets(
            (f"{r.training.baseline_ratio}{{{job_stage}}}", "{{node}} (stage {{pp_stage}})")
        ),
        limit_at=config.baseline_ratio,
    )
    grid.timeseries(
        24,
        8,
        "Job step time vs its baseline",
        "The job's mean step time over 2 minutes, its steady step time (less its data-loader "
        f"stalls, the {config.job_slowdown_quantile:g} quantile over {config.job_slowdown_window}) "
        f"and the same over its baseline. {AlertName.JOB_SLOWDOWN} pages when steady / baseline > {config.job_slowdown_ratio:g}.",
        "s",
        common.targets(
            (f"{r.training.job_step}{{{common.sel(common.JOB)}}}", "step time (2m)"),
            (f"{r.training.job_steady}{{{common.sel(common.JOB)}}}", "steady step time"),
            (f"{r.training.job_steady_baseline}{{{common.sel(common.JOB)}}}", "baseline"),
        ),
    )
    coverage_panels(grid, config, r)
    layout_panels(grid, config)
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
            common.namespace_variable((r.support.gpu_tenant, r.support.job_tenant)),
            common.query_variable(
                "training_job",
                "Training job",
                f"label_values({r.support.job_tenant}{{{common.sel(common.TENANT)}}}, training_job)",
            ),
            common.query_variable(
                "pp_stage",
                "Pipeline stage",
                f"label_values({r.training.compute_ratio}{{{common.sel(common.JOB)}}}, pp_stage)",
                include_all=True,
            ),
        ],
        grid,
        annotations=[straggler_alerts],
    )


def reason_texts(config: RulesConfig) -> dict[str, str]:
    """The coverage series' ``reason`` label in plain words, with what to do about a gap."""
    return {
        "node_peers": f"covered: {config.straggler_min_peers}+ nodes in the stage are compared",
        "rank_peers": (
            f"covered: fewer than {config.straggler_min_peers} nodes, so "
            f"{config.straggler_min_rank_peers}+ reporting ranks are compared"
        ),
        "too_few_peers": (
            f"NOT covered, too few peers (under {config.straggler_min_peers} nodes and under "
            f"{config.straggler_min_rank_peers} reporting ranks): have every local rank report, "
            "not only tensor-parallel rank 0"
        ),
        "no_compute_split": (
            "NOT covered, step time only (compute cannot be told from waiting): have the job "
            "report its compute time (reporter.step() phases)"
        ),
    }


def coverage_panels(grid: common.Grid, config: RulesConfig, r: Recorded) -> None:
    """Which stages of which jobs no peer comparison covers, and why: fleet-wide, since a
    job whose agents export no compute series is not in the job picker (it has no compute
    ratio); one that reports step time only is there, its compute being its step time."""
    # all the chosen tenant's jobs (every job under "All")
    active = common.tenant_jobs(
        f"{r.training.detection_active}{{{common.sel()}}}", r.support.job_tenant, jobs=False
    )
    grid.add(
        common.stat_panel(
            "Straggler detection coverage (all jobs)",
            "Pipeline stages of running jobs (all jobs, not only the one picked) that a peer "
            "comparison covers, and those it does not: in an uncovered stage a slow node "
            f"pages nothing ({AlertName.STRAGGLER_DETECTION_INACTIVE}, info). The table beside it "
            "names them and says what to do.",
            "none",
            common.targets(
                (f"count({active} == 1) or vector(0)", "stages covered"),
                (f"count({active} == 0) or vector(0)", "stages not covered"),
            ),
            steps=common.thresholds((None, "green")),
        ).override_by_name(
            "stages not covered",
            [
                dm.DynamicConfigValue(
                    id_val="thresholds",
                    value={
                        "mode": "absolute",
                        "steps": [
                            {"color": "green", "value": None},
                            {"color": "orange", "value": 1},
                        ],
                    },
                )
            ],
        ),
        6,
        8,
    )
    mapping = {
        reason: {
            "index": index,
            "text": text,
            "color": "green" if text.startswith("covered") else "orange",
        }
        for index, (reason, text) in enumerate(reason_texts(config).items())
    }
    grid.add(
        common.table_panel(
            "Straggler detection coverage by job and stage",
            "Every pipeline stage of every running job, uncovered first. A stage is covered "
            f"when {config.straggler_min_peers}+ of its nodes, or else "
            f"{config.straggler_min_rank_peers}+ of its reporting ranks, report a compute "
            f"time to compare ({AlertName.STRAGGLER}). An uncovered stage gets no straggler "
            "page; job slowdown and the node's own baseline still apply, but a node slow from "
            "the job's start is caught by neither. The last column says why, and what the "
            "job's owner can change.",
            "none",
            [common.target(f"sort({active})", instant=True)],
            link_node=False,
            sort_by="covered",
            descending=False,
        )
        .override_by_name(
            "Value",
            [
                dm.DynamicConfigValue(id_val="displayName", value="covered"),
                dm.DynamicConfigValue(
                    id_val="mappings",
                    value=[
                        {
                            "type": "value",
                            "options": {
                                "0": {"index": 0, "text": "no", "color": "orange"},
                                "1": {"index": 1, "text": "yes", "color": "green"},
                            },
                        }
                    ],
                ),
                dm.DynamicConfigValue(id_val="custom.cellOptions", value={"type": "color-text"}),
            ],
        )
        .override_by_name(
            "reason",
            [
                dm.DynamicConfigValue(
                    id_val="mappings", value=[{"type": "value", "options": mapping}]
                ),
                dm.DynamicConfigValue(id_val="custom.cellOptions", value={"type": "color-text"}),
                dm.DynamicConfigValue(id_val="displayName", value="why (and what to do)"),
            ],
        )
        .override_by_name(
            "training_job", [dm.DynamicConfigValue(id_val="displayName", value="job")]
        )
        .override_by_name("pp_stage", [dm.DynamicConfigValue(id_val="displayName", value="stage")])
        .override_by_name("__name__", [dm.DynamicConfigValue(id_val="custom.hidden", value=True)]),
        18,
        8,
    )
