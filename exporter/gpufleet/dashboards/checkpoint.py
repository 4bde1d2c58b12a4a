"""Checkpoint I/O: queue wait against service time, the queue-wait share, per-node save and
restore durations, bytes/s, concurrent writers against queue wait, time since the last save."""

from __future__ import annotations

from grafana_foundation_sdk.models import dashboard as dm

from gpufleet.dashboards import common
from gpufleet.dashboards.names import Recorded
from gpufleet.rules.config import RulesConfig
from gpufleet.schema import training as ts
from gpufleet.schema.alerts import AlertName

UID = "gpufleet-checkpoint"


def build(config: RulesConfig) -> dm.Dashboard:
    r = Recorded.of(config)
    job = common.sel(common.JOB)
    raw = common.sel(config.agent_selector, common.JOB)

    def rate(name: str, by: str) -> str:
        return f"sum by ({by}) (rate({name}{{{raw}}}[$__rate_interval]))"

    queue = ts.CHECKPOINT_QUEUE_WAIT_SECONDS.name
    ops = ts.CHECKPOINT_OPERATIONS.name
    grid = common.Grid()
    grid.timeseries(
        12,
        8,
        "Queue wait vs service time per operation",
        "Mean seconds a checkpoint operation waited in the storage client's queue and "
        "was being served, over the last hour. At scale the wait, not the write, dominates.",
        "s",
        common.targets(
            (f"{r.checkpoint.queue_wait_per_op}{{{job}}}", "{{op}} queued"),
            (
                f"{r.checkpoint.seconds_per_op}{{{job}}} - {r.checkpoint.queue_wait_per_op}{{{job}}}",
                "{{op}} served",
            ),
        ),
        stacked=True,
    )
    grid.timeseries(
        12,
        8,
        "Queue-wait share",
        f"Share of checkpoint time spent queued over {config.checkpoint_window}. "
        f"{AlertName.CHECKPOINT_QUEUE_BOUND} pages above {config.checkpoint_queue_share:g} with at "
        f"least {config.checkpoint_min_writers} writers.",
        "percentunit",
        common.targets((f"{r.checkpoint.queue_share}{{{job}}}", "{{training_job}}")),
        limit_at=config.checkpoint_queue_share,
    )
    # Per node and operation (save / restore): one recorded series each, drawn alike.
    per_node = (
        ("Save / restore duration per node",
         "Seconds per checkpoint operation on each node (queued + served) over "
         f"{config.rate_window}, where it checkpointed. Budgets: save {config.checkpoint_save_budget_s:g} s, "
         f"restore {config.checkpoint_restore_budget_s:g} s.",
         "s", r.support.node_seconds_per_op, {"bars": True}),
        ("Checkpoint bytes/s per node", "Checkpoint bytes each node wrote or read per second.",
         "Bps", r.support.node_checkpoint_bytes, {"stacked": True}),
    )  # fmt: skip
    for title, description, unit, series, style in per_node:
        query = common.targets((f"{series}{{{job}}}", "{{node}} {{op}}"))
        grid.timeseries(12, 8, title, description, unit, query, **style)
    grid.timeseries(
        12,
        8,
        "Concurrent writers vs queue wait",
        "Checkpoint operations in flight across the job against the queue wait they "
        "accumulate per second: queueing appears only once many nodes write at once.",
        "short",
        common.targets(
            (
                f"sum by (training_job) ({ts.CHECKPOINT_IN_FLIGHT.name}{{{raw}}})",
                "writers in flight",
            ),
            (rate(queue, "training_job"), "queue wait (s/s)"),
            (f"{r.checkpoint.writers}{{{job}}}", "nodes that wrote in " + config.checkpoint_window),
        ),
    )
    saved = common.sel(
        config.agent_selector,
        common.JOB,
        "op=" + common.quoted("save"),
        "outcome=" + common.quoted("ok"),
    )
    grid.stat(
        12,
        8,
        "Time since the last successful save",
        "Per job, how long ago any node last completed a checkpoint save (to within 10 minutes).",
        "s",
        [
            # Windows of 10 minutes every 5: Prometheus 3's windows are left-open, so with
            # windows as long as the step a save between two windows' samples is in neither.
            common.target(
                f"time() - max by (training_job) (max_over_time(\n"
                f"  (timestamp(changes({ops}{{{saved}}}[10m]) > 0))[1d:5m]\n))",
                "{{training_job}}",
            )
        ],
        steps=common.thresholds((None, "green"), (2 * 3600, "orange"), (6 * 3600, "red")),
    )
    grid.table(
        12,
        8,
        "Checkpoint writers per job",
        f"Nodes that checkpointed within {config.checkpoint_window}, and the queue-wait "
        "share they saw.",
        "short",
        [
            common.target(
                common.tenant_jobs(
                    f"{r.checkpoint.writers}{{{common.sel()}}}", r.support.job_tenant, jobs=False
                ),
                instant=True,
                ref="A",
            ),
            common.target(
                common.tenant_jobs(
                    f"{r.checkpoint.queue_share}{{{common.sel()}}}",
                    r.support.job_tenant,
                    jobs=False,
                ),
                instant=True,
                ref="B",
            ),
        ],
        link_node=False,
        columns=("nodes writing", "queue-wait share"),
    )
    return common.dashboard(
        UID,
        "gpufleet / Checkpoint I/O",
        "Where checkpoint time goes: queued for storage or being written, and how that "
        "grows with the number of writers.",
        [
            common.namespace_variable((r.support.gpu_tenant, r.support.job_tenant)),
            common.query_variable(
                "training_job",
                "Training job",
                f"label_values({r.support.job_tenant}{{{common.sel(common.TENANT)}}}, training_job)",
            ),
        ],
        grid,
    )
