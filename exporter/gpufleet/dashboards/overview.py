"""Fleet overview, the landing page: node states, firing alerts, GPUs, GPUs by tenant,
worst nodes, XIDs, straggler candidates, fleet utilisation and power. The namespace and
training-job variables narrow every panel whose series say which tenant or job they are
of (GPUs, XIDs, alerts, stragglers); node states, health and the fleet's totals are the
fleet's."""

from __future__ import annotations

from grafana_foundation_sdk.models import dashboard as dm

from gpufleet.dashboards import common
from gpufleet.dashboards.names import Recorded
from gpufleet.rules.config import RulesConfig
from gpufleet.schema import gpu as cat
from gpufleet.schema import ledger
from gpufleet.schema.alerts import AlertName

UID = "gpufleet-overview"


def build(config: RulesConfig) -> dm.Dashboard:
    r = Recorded.of(config)
    c = common.sel()
    agent = common.sel(config.agent_selector)
    up_nodes = f'label_replace(up{{{agent}}}, "node", "$1", "instance", "([^:]+).*")'
    degraded = f"{r.health}{{{c}}} >= {config.health_threshold:g}"
    excluded = f"{ledger.EXCLUDED.name}{{{common.sel(config.fleet_selector)}}} == 1"
    firing = common.sel('alertstate="firing"', 'alertname=~"GpuFleet.*"', common.TENANT)
    gpus = common.sel(config.gpu_selector)
    grid = common.Grid()
    ratios = common.tenant_jobs(f"{r.training.compute_ratio}{{{c}}}", r.support.job_tenant)
    counts = [
        ("Healthy nodes", "Nodes whose agent answers, with a health score below the alert's "
         "threshold and no exclusion.",
         f"count(({up_nodes} == 1) unless on (node) ({degraded}) unless on (node) ({excluded})) or vector(0)",
         common.thresholds((None, "green"))),
        ("Degraded nodes", f"Nodes whose health score is at or above {config.health_threshold:g} "
         f"({AlertName.NODE_HEALTH}'s threshold): several weak signs at once.",
         f"count({degraded}) or vector(0)", common.thresholds((None, "green"), (1, "orange"))),
        ("Down nodes", "Nodes whose gpufleet agent does not answer its scrape.",
         f"count({up_nodes} == 0) or vector(0)", common.thresholds((None, "green"), (1, "red"))),
        ("Excluded nodes", "Nodes the fleet ledger holds excluded from jobs now.",
         f"count({excluded}) or vector(0)", common.thresholds((None, "green"), (1, "orange"))),
    ]  # fmt: skip
    for title, description, expr, steps in counts:
        grid.stat(4, 4, title, description, "short", [common.target(expr, title)], steps=steps)
    grid.stat(
        8,
        4,
        "Firing alerts by severity",
        "gpufleet alerts firing now, counted per severity.",
        "short",
        [
            common.target(
                f"count by (severity) (ALERTS{{{firing}}})",
                "{{severity}}",
            )
        ],
        steps=common.thresholds((None, "orange"), (3, "red")),
    )
    grid.timeseries(
        8,
        8,
        "GPUs expected vs seen",
        "GPUs the nodes should have, those NVML enumerates, and those that answer now. "
        "A gap is a missing or lost GPU.",
        "short",
        common.targets(
            (f"sum({cat.GPUS_EXPECTED.name}{{{common.sel(config.gpu_selector)}}})", "expected"),
            (f"sum({cat.GPUS_SEEN.name}{{{common.sel(config.gpu_selector)}}})", "seen"),
            (
                f"sum({common.tenant_gpus(f'{cat.GPU_UP.name}{{{gpus}}}', r.support.gpu_tenant)})",
                "answering (of the tenant)",
            ),
        ),
    )
    # GPUs by tenant: those its pods hold now, those of them a GPU alert fires for, and
    # those on nodes the ledger holds excluded (0 where none); GPUs by UUID: a time-sliced
    # or MIG GPU counts once for each namespace holding it, however many of its
    # instances; the MIG instances its pods hold are a column of their own.
    held = f"{r.support.gpu_tenant}{{{common.sel(common.TENANT)}}}"
    instances = f"{r.attribution.instance_allocation}{{{common.sel(common.TENANT)}}}"
    xids = f"{r.gpu.xid_new}{{{c}}}"
    none = f"count by (namespace) ({held}) * 0"
    failing = f"ALERTS{{{common.sel('alertstate=' + common.quoted('firing'), 'alertname=~' + common.quoted('GpuFleet.*'), 'UUID!=' + common.quoted(''))}}}"
    grid.add(
        common.table_panel(
            "GPUs by tenant",
            "Per namespace (tenant): the GPUs its pods hold now, those of them a gpufleet "
            "GPU alert fires for, and those on a node the fleet ledger holds excluded; a GPU "
            "split into MIG instances counts once for each tenant holding one of them, and "
            "the instances its pods hold are counted apart. The row without a namespace "
            "counts the unallocated GPUs (under All).",
            "short",
            [
                common.target(f"count by (namespace) ({held})", instant=True, ref="A"),
                common.target(
                    f"count by (namespace) ({held} and on (UUID) {failing})\nor {none}",
                    instant=True,
                    ref="B",
                ),
                common.target(
                    f"count by (namespace) ({held} and on (node) ({excluded}))\nor {none}",
                    instant=True,
                    ref="C",
                ),
                common.target(
                    f"count by (namespace) ({instances})\nor {none}", instant=True, ref="D"
                ),
            ],
            link_node=False,
            columns=("allocated GPUs", "failing", "excluded", "MIG instances"),
        ),
        8,
        8,
    )
    grid.add(
        common.table_panel(
            "Nodes by health score",
            "Every node's health score, worst first (0: no warning sign). The score sums weak "
            "signals (correctable remaps, PCIe replays, NVLink replays, single-bit ECC, "
            "software throttling, slow compute, maintenance XIDs); at "
            f"{config.health_threshold:g} it pages. Click a node for its dashboard.",
            "short",
            [
                common.target(
                    f"sort_desc({r.health}{{{c}}} or on (node) 0 * max by (node) ({up_nodes}))",
                    instant=True,
                )
            ],
            columns=("health score",),
        ).thresholds(common.limit(config.health_threshold)),
        8,
        8,
    )
    grid.add(
        common.table_panel(
            "Straggler candidates",
            "Nodes computing slowest against the median of their pipeline stage now, with "
            f"their robust z-score. {AlertName.STRAGGLER} pages above {config.straggler_ratio:g}x "
            f"and z {config.straggler_zscore:g} for {config.straggler_for}.",
            "short",
            [
                common.target(f"topk(5, {ratios})", instant=True, ref="A"),
                common.target(
                    f"{r.training.compute_zscore}{{{c}}} and on (training_job, node, pp_stage) topk(5, {ratios})",
                    instant=True,
                    ref="B",
                ),
            ],
            columns=("ratio to stage median", "robust z-score"),
        ).thresholds(common.limit(config.straggler_ratio)),
        8,
        8,
    )
    grid.timeseries(
        8,
        8,
        "XID events by code",
        f"GPUs that reported each XID code within {config.xid_window} "
        "(gpufleet's counter or dcgm-exporter's last XID); an XID NVML attributes to a MIG "
        "instance counts for that instance's tenant only.",
        "short",
        common.targets(
            (
                f"sum by (xid) (\n  ({xids} and on (UUID, GPU_I_ID) {instances})\n  or "
                f"{common.tenant_gpus(f'{xids} unless on (UUID, GPU_I_ID) {r.attribution.instance_allocation}', r.support.gpu_tenant)}\n)",
                "XID {{xid}}",
            )
        ),
        bars=True,
    )
    grid.timeseries(
        8,
        8,
        "Fleet GPU utilisation",
        "Mean GPU utilisation over every GPU of the fleet (a GPU split into MIG instances: "
        "their graphics engine activity weighted by their compute slices).",
        "percent",
        common.targets((f"{r.support.fleet_util}{{{c}}}", "mean utilisation")),
    )
    grid.timeseries(
        8,
        8,
        "Fleet GPU power",
        "Power drawn by all GPUs of the fleet together.",
        "watt",
        common.targets((f"{r.support.fleet_power}{{{c}}}", "GPU power")),
    )
    return common.dashboard(
        UID,
        "gpufleet / Fleet overview",
        "Where to start: node states, firing alerts, the worst nodes and the fleet's load.",
        [
            common.namespace_variable((r.support.gpu_tenant, r.support.job_tenant)),
            common.training_jobs_variable(r.support.job_tenant),
        ],
        grid,
    )
