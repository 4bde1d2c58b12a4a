"""One node (the ``node`` variable): every GPU signal per GPU, its health score and the
signals behind it, its training time by stage, its checkpoint I/O, its exclusions.

GPU series come from gpufleet's agent or dcgm-exporter, labelled ``Hostname`` (or
``hostname``); panels derive ``node`` from them with the rules' own ``with_node``, so no
panel selects on either spelling. The namespace variable narrows the GPU panels to the
GPUs a tenant's pods hold on the node (the hidden uuid variable lists them) and the
training panel to its jobs; health, checkpoint I/O and exclusions are the node's.
"""

from __future__ import annotations

from grafana_foundation_sdk.models import dashboard as dm

from gpufleet.dashboards import common
from gpufleet.dashboards.names import Recorded
from gpufleet.rules.common import Record
from gpufleet.rules.config import RulesConfig
from gpufleet.rules.health import HEALTH_SIGNAL, health_recording
from gpufleet.schema import gpu as cat
from gpufleet.schema import ledger
from gpufleet.schema import training as ts
from gpufleet.schema.alerts import AlertName

UID = "gpufleet-node"
NODE = 'node="$node"'
# the node's GPUs of the chosen tenant (the hidden uuid variable lists them)
THESE_GPUS = 'UUID=~"$uuid"'
GPU_LEGEND = "{{node}} GPU {{gpu}}"


def this_node(config: RulesConfig, name: str, by: str = "node, gpu", wrap: str = "") -> str:
    """``name`` for the chosen node's chosen GPUs, labelled by ``node``.

    The hidden ``uuid`` variable (the node's GPUs, from the rules' node-GPU map) selects
    the series through the index: mapping every GPU of the fleet to its node at query time
    would read all of them on each refresh.
    """
    series = f"{name}{{{common.sel(config.gpu_selector, 'UUID=~' + common.quoted('$uuid'), 'gpu=~' + common.quoted('$gpu'))}}}"
    if wrap:
        series = wrap.format(series)
    return (
        f"max by ({by}) (\n  {series}\n"
        f"  * on (UUID) group_left (node) {Recorded.of(config).support.gpu_node}{{{common.sel(NODE)}}}\n)"
    )


def build(config: RulesConfig) -> dm.Dashboard:
    r = Recorded.of(config)
    grid = common.Grid()
    # the chosen GPUs, from the GPU series themselves (a recorded series takes no regex here)
    chosen = common.sel(config.gpu_selector, THESE_GPUS)
    these = f"group by (UUID) ({cat.GPU_UP.name}{{{chosen}}} or {cat.GPU_TEMP.name}{{{chosen}}})"
    # The signals the score sums, named by the rules that record them.
    signals = "\nor ".join(
        f'label_replace({rule.record}{{{common.sel(NODE)}}}, "signal", "{rule.record.rsplit(":", 1)[1]}", "", "")'
        for rule in health_recording(config).rules
        if isinstance(rule, Record) and rule.record.startswith(HEALTH_SIGNAL)
    )

    def gpu_panel(
        title: str, description: str, unit: str, *signals: tuple[str, str], wrap: str = ""
    ) -> None:
        queries = common.targets(
            *((this_node(config, name, wrap=wrap), legend) for name, legend in signals)
        )
        grid.timeseries(8, 7, title, description, unit, queries)

    increase = "increase({}[$__rate_interval])"
    gpu_panel(
        "GPU utilisation",
        "Percent of time a kernel ran, per GPU.",
        "percent",
        (cat.GPU_UTIL.name, GPU_LEGEND),
    )
    gpu_panel(
        "SM and tensor activity",
        "Share of cycles with an SM busy and with a tensor pipe busy (profiling fields; "
        "absent where the GPU or driver lacks them).",
        "percentunit",
        (cat.SM_ACTIVE.name, GPU_LEGEND + " SM"),
        (cat.PIPE_TENSOR_ACTIVE.name, GPU_LEGEND + " tensor"),
    )
    gpu_panel(
        "Temperatures",
        "GPU die and HBM temperature.",
        "celsius",
        (cat.GPU_TEMP.name, GPU_LEGEND),
        (cat.MEMORY_TEMP.name, GPU_LEGEND + " memory"),
    )
    gpu_panel("Power", "Power draw per GPU.", "watt", (cat.POWER_USAGE.name, GPU_LEGEND))
    gpu_panel(
        "Clocks",
        "SM and memory clocks: a clock held low is a slow GPU.",
        "rotmhz",
        (cat.SM_CLOCK.name, GPU_LEGEND + " SM"),
        (cat.MEM_CLOCK.name, GPU_LEGEND + " memory"),
    )
    grid.timeseries(
        8,
        7,
        "Throttling by reason",
        "1 while a reason holds the GPU's clocks down (gpufleet's per-reason flags; on "
        "dcgm-exporter only the hardware reasons, decoded from its bitmask). A hardware "
        f"slowdown held {config.hw_slowdown_for} pages ({AlertName.HW_SLOWDOWN}).",
        "short",
        common.targets(
            (
                this_node(config, cat.THROTTLE_ACTIVE.name, "node, gpu, reason")
                + f"\nor ({r.gpu.hw_slowdown}{{{common.sel(NODE)}}} and on (UUID) {these})",
                GPU_LEGEND + " {{reason}}",
            ),
        ),
    )
    gpu_panel(
        "ECC errors",
        "Single- and double-bit volatile ECC errors per interval. Any "
        f"double-bit error pages ({AlertName.ECC_UNCORRECTABLE}).",
        "short",
        (cat.ECC_SBE_VOL.name, GPU_LEGEND + " single-bit"),
        (cat.ECC_DBE_VOL.name, GPU_LEGEND + " double-bit"),
        wrap=increase,
    )
    gpu_panel(
        "Row remapping",
        "Rows remapped for correctable and uncorrectable errors, and the pending / "
        f"failed flags. {config.remaps_climbing_min} correctable remaps in "
        f"{config.remaps_climbing_window} page ({AlertName.REMAPS_CLIMBING}).",
        "short",
        (cat.CORRECTABLE_REMAPPED_ROWS.name, GPU_LEGEND + " correctable"),
        (cat.UNCORRECTABLE_REMAPPED_ROWS.name, GPU_LEGEND + " uncorrectable"),
        (cat.ROW_REMAP_PENDING.name, GPU_LEGEND + " pending"),
        (cat.ROW_REMAP_FAILURE.name, GPU_LEGEND + " failed"),
    )
    # One query: each GPU has only its NVLink generation's counters, so the panel has
    # data on every node; the counter label names the one a line comes from.
    nvlink_errors = (
        (cat.NVLINK_CRC_FLIT.name, "CRC flit"),
        (cat.NVLINK_CRC_DATA.name, "CRC data"),
        (cat.NVLINK_REPLAY.name, "replay"),
        (cat.NVLINK_RECOVERY.name, "recovery"),
        (cat.NVLINK_ECC_ERRORS.name, "data ECC"),
        (cat.NVLINK_RECOVERY_FAILED.name, "recovery failed"),
        (cat.NVLINK_RECOVERY_EVENTS.name, "recovery events"),
        (cat.NVLINK_SYMBOL_ERRORS.name, "symbol"),
        (cat.NVLINK_EFFECTIVE_ERRORS.name, "effective"),
    )
    grid.timeseries(
        8,
        7,
        "NVLink errors",
        "NVLink errors per interval: CRC, replay and recovery errors before Blackwell; "
        "data ECC errors from Hopper on; link recoveries (failed and all) and symbol / "
        "effective errors on Blackwell (NVLink5), where the older counters are gone.",
        "short",
        common.targets(
            (
                "\nor ".join(
                    f"label_replace(\n{this_node(config, name, wrap=increase)},\n"
                    f'  "counter", "{label}", "", "")'
                    for name, label in nvlink_errors
                ),
                GPU_LEGEND + " {{counter}}",
            ),
        ),
    )
    gpu_panel(
        "PCIe replays",
        f"PCIe packet replays per interval; {config.pcie_replays_min} in "
        f"{config.pcie_window} page ({AlertName.PCIE_REPLAYS}).",
        "short",
        (cat.PCIE_REPLAY.name, GPU_LEGEND),
        wrap=increase,
    )
    grid.timeseries(
        8,
        7,
        "XIDs",
        f"GPUs of this node that reported each XID within {config.xid_window}.",
        "short",
        common.targets(
            (
                f"{r.gpu.xid_new}{{{common.sel(NODE)}}} and on (UUID) {these}",
                GPU_LEGEND + " XID {{xid}}",
            )
        ),
        bars=True,
    )
    gpu_panel(
        f"GPU answering ({cat.GPU_UP.name})",
        f"1 while NVML answers for the GPU; 0 is a lost GPU ({AlertName.GPU_LOST}).",
        "short",
        (cat.GPU_UP.name, GPU_LEGEND),
    )
    grid.timeseries(
        12,
        8,
        "Health score and its signals",
        "The node's health score: each weak warning sign adds "
        f"{config.health_signal_weight:g}; at {config.health_threshold:g} for "
        f"{config.health_for} it pages ({AlertName.NODE_HEALTH}). The legend names the signals.",
        "short",
        common.targets(
            (f"{r.health}{{{common.sel(NODE)}}}", "{{node}} score"),
            (signals, "{{node}} {{signal}}"),
        ),
        limit_at=config.health_threshold,
    )
    grid.timeseries(
        12,
        8,
        "Training time by stage",
        "Seconds per step this node spends computing, waiting on collectives and waiting "
        "on the data loader, per pipeline stage and job.",
        "s",
        common.targets(
            (
                common.tenant_jobs(
                    f"{r.support.phase_per_step}{{{common.sel(NODE)}}}",
                    r.support.job_tenant,
                    jobs=False,
                ),
                "{{node}} {{phase}} ({{training_job}} stage {{pp_stage}})",
            )
        ),
        stacked=True,
    )
    ckpt = common.sel(config.agent_selector, NODE)
    grid.timeseries(
        12,
        8,
        "Checkpoint I/O",
        "Seconds per second this node's checkpoints spend queued for storage and being "
        "served, per operation.",
        "s",
        common.targets(
            (
                f"sum by (node, op) (rate({ts.CHECKPOINT_QUEUE_WAIT_SECONDS.name}{{{ckpt}}}[$__rate_interval]))",
                "{{node}} {{op}} queued",
            ),
            (
                f"sum by (node, op) (rate({ts.CHECKPOINT_SERVICE_SECONDS.name}{{{ckpt}}}[$__rate_interval]))",
                "{{node}} {{op}} served",
            ),
        ),
        stacked=True,
    )
    grid.table(
        12,
        8,
        "Exclusion history",
        "How often the fleet ledger excluded this node, by reason and by who "
        "(auto: the job launcher; manual: an operator), and whether it is excluded now.",
        "short",
        [
            common.target(
                f"sum by (node, reason, source) ({ledger.EXCLUSIONS.name}{{{common.sel(config.fleet_selector, NODE)}}})",
                instant=True,
            )
        ],
        columns=("exclusions",),
    )
    return common.dashboard(
        UID,
        "gpufleet / Node",
        "One node: every GPU signal, its health score, training time, checkpoint I/O and exclusions.",
        [
            common.namespace_variable((r.support.gpu_tenant, r.support.job_tenant)),
            common.query_variable(
                "node",
                "Node",
                f"label_values({r.support.gpu_tenant}{{{common.sel(common.TENANT)}}}, node)",
            ),
            common.query_variable(
                "gpu",
                "GPU",
                f"label_values({r.support.gpu_tenant}{{{common.sel(NODE, common.TENANT)}}}, gpu)",
                include_all=True,
            ),
            common.query_variable(
                "uuid",
                "GPU UUIDs",
                f"label_values({r.support.gpu_tenant}{{{common.sel(NODE, common.TENANT)}}}, UUID)",
                include_all=True,
                all_value=None,
                hide=True,
            ),
        ],
        grid,
    )
