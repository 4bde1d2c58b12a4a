"""GPU hardware rules: the XID catalogue, per-GPU counters rising over a window, XIDs,
ECC, row remaps, NVLink, PCIe, hardware slowdowns, lost and missing GPUs."""

from __future__ import annotations

from dataclasses import dataclass

from gpufleet.rules.common import (
    GPU,
    GPU_WHO,
    Alert,
    Group,
    Record,
    SeriesNames,
    agent_node,
    metric,
    new_in,
    per_gpu,
    risen,
    with_node,
)
from gpufleet.rules.config import XID_CATALOGUE, RulesConfig

# One series per XID code, labelled with its class, meaning and action.
XID_INFO = "gpufleet:xid_catalogue:info"


def xid_catalogue_group() -> Group:
    rules: list[Record | Alert] = [
        Record(
            XID_INFO,
            "vector(1)",
            {
                "xid": str(code.code),
                "class": code.klass,
                "meaning": code.meaning,
                "action": code.action,
            },
        )
        for code in XID_CATALOGUE
    ]
    return Group("gpufleet-xid-catalogue", rules)


# Per-GPU counters whose rise over a window the alerts and the health signals read.
# Each is scanned once per cycle here (the costly part: a 6 h window over every GPU)
# and kept only where it rose, so what reads it works on a handful of series.
RISEN: tuple[tuple[str, str], ...] = (
    ("DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS", "remaps_climbing_window"),
    ("DCGM_FI_DEV_PCIE_REPLAY_COUNTER", "pcie_window"),
    ("DCGM_FI_DEV_ECC_SBE_VOL_TOTAL", "health_sbe_window"),
    ("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", "ecc_window"),
    # In dcgm-exporter's stock counters (DBE ECC is not): rises with every uncorrectable error
    ("DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS", "ecc_window"),
    ("DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL", "health_nvlink_window"),
    ("DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL", "nvlink_window"),
    ("DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL", "nvlink_window"),
    ("DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL", "nvlink_window"),
    ("DCGM_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL", "nvlink_window"),
)
THROTTLE_BITS = (
    ("hw_power_brake_slowdown", 128),
    ("hw_thermal_slowdown", 64),
    ("hw_slowdown", 8),
)


def risen_series(config: RulesConfig, counter: str, knob: str) -> str:
    """The recorded rise of ``counter`` over the window that ``knob`` holds; only a pair
    that RISEN records can be named, so a rule cannot read a series nothing records."""
    if (counter, knob) not in RISEN:
        raise ValueError(f"{counter} over {knob} is not recorded: add it to RISEN")
    return f"gpu:{counter}:risen{getattr(config, knob)}"


@dataclass(frozen=True, slots=True)
class GpuSeries(SeriesNames):
    """What gpu.rules.yaml records, each named once here: the GPU alerts, the node and
    health rules, the training rules and the dashboards refer to these."""

    # dcgm-exporter's last XID changed within xid_window
    xid_changed: str = "gpu:DCGM_FI_DEV_XID_ERRORS:changed{xid_window}"
    # new XIDs per GPU and code within xid_window
    xid_new: str = "gpu:gpufleet_gpu_xid_errors:new{xid_window}"
    # per GPU and reason, 1 while in a hardware slowdown
    hw_slowdown: str = "gpu:gpufleet_gpu_hw_slowdown:active"
    # dcgm-exporter's clock-event bitmask, where it is the only source
    dcgm_reasons: str = "gpu:DCGM_FI_DEV_CLOCK_THROTTLE_REASONS:dcgm_only"
    # GPUs answering now on nodes without gpufleet's agent, and the most seen there
    # within gpus_expected_memory (what the node should have: 4 on a 4-GPU node)
    dcgm_gpus: str = "node:gpufleet_dcgm_gpus:count"
    dcgm_gpus_max: str = "node:gpufleet_dcgm_gpus:max{gpus_expected_memory}"


# dcgm-exporter 4.x names the clock-event bitmask ..._CLOCKS_EVENT_REASONS; older ones,
# and gpufleet's agent, ..._CLOCK_THROTTLE_REASONS. Neither is in its stock counters.
THROTTLE_BITMASKS = ("DCGM_FI_DEV_CLOCK_THROTTLE_REASONS", "DCGM_FI_DEV_CLOCKS_EVENT_REASONS")


def gpu_recording(config: RulesConfig) -> Group:
    sel = config.gpu_selector
    node_labels = config.node_labels
    window = config.xid_window
    counter = metric("gpufleet_gpu_xid_errors_total", sel)
    last = metric("DCGM_FI_DEV_XID_ERRORS", sel)
    agent_gpus = metric("gpufleet_gpu_up", sel)
    series = GpuSeries.of(config)
    changed = series.xid_changed
    # dcgm-exporter keeps only the last XID: a value that changed within the window is
    # a new XID. Point lookups, not a range scan; GPUs with gpufleet's agent skip this.
    dcgm_paths = "\n  or ".join(
        f'label_replace(({changed} == {code.code}) / {code.code}, "xid", "{code.code}", "", "")'
        for code in XID_CATALOGUE
    )
    # dcgm-exporter's opt-in DCGM_EXP_XID_ERRORS_COUNT{xid}: XIDs per code within its own
    # window (5 min by default); only XIDs that happened recently, even on a first scrape.
    xid_counts = metric("DCGM_EXP_XID_ERRORS_COUNT", sel, 'xid!=""')
    throttle = metric("gpufleet_gpu_clock_throttle_active", sel)
    # dcgm-exporter has only the bitmask; GPUs with gpufleet's agent have a flag per reason
    dcgm_reasons = series.dcgm_reasons
    bitmasks = " or ".join(metric(name, sel) for name in THROTTLE_BITMASKS)
    bits = "\n  or ".join(
        f'label_replace(\n    ({throttle.rstrip("}")}, reason="{reason}"}} == 1)\n'
        f"    or (floor({dcgm_reasons} / {value}) % 2 == 1),\n"
        f'    "reason", "{reason}", "", "")'
        for reason, value in THROTTLE_BITS
    )
    presence = metric(config.gpu_presence_metric, sel)
    dcgm_count, dcgm_max = series.dcgm_gpus, series.dcgm_gpus_max
    rules: list[Record | Alert] = [
        Record(dcgm_reasons, f"({bitmasks}) > 0 unless on (UUID) {agent_gpus}"),
        # A new XID is a last value that changed within the window, per GPU (UUID), never
        # per label set: pod / namespace / container labels change with every workload.
        # A GPU first scraped (a new node, a rollout, a gap longer than the window) shows
        # one value only: its last XID is old news.
        Record(
            changed,
            f"max by ({GPU}) (\n  {with_node(f'({last} > 0 unless on (UUID) {agent_gpus})', node_labels)}\n)\n"
            f"  and on (UUID) (\n    max by (UUID) (max_over_time({last}[{window}]))\n"
            f"    != on (UUID) min by (UUID) (min_over_time({last}[{window}]))\n  )",
        ),
        Record(
            series.xid_new,
            f"max by ({GPU}, xid) (\n  {with_node(new_in(counter, window), node_labels)}\n)\nor\n"
            f"max by ({GPU}, xid) (\n  {dcgm_paths}\n)\nor\n"
            f"max by ({GPU}, xid) (\n  {with_node(f'({xid_counts} > 0 unless on (UUID) {agent_gpus})', node_labels)}\n)",
        ),
        Record(
            series.hw_slowdown,
            f"max by ({GPU}, reason) (\n  {with_node(f'({bits})', node_labels)}\n)",
        ),
        Record(
            dcgm_count,
            f"count by (node) (\n  max by (node, UUID) ({with_node(f'{presence} unless on (UUID) {agent_gpus}', node_labels)})\n)",
        ),
        Record(dcgm_max, f"max_over_time({dcgm_count}[{config.gpus_expected_memory}])"),
    ]
    for name, knob in RISEN:
        span = getattr(config, knob)
        rules.append(
            Record(
                risen_series(config, name, knob),
                per_gpu(f"{risen(metric(name, sel), span)} > 0", node_labels),
            )
        )
    return Group("gpufleet-gpu-recording", rules, config.gpu_recording_interval)


def gpu_alerts(config: RulesConfig) -> Group:
    sel = config.gpu_selector
    series = GpuSeries.of(config)
    xid = series.xid_new
    slowdown = series.hw_slowdown
    brake = f'{slowdown}{{reason="hw_power_brake_slowdown"}}'
    thermal = f'{slowdown}{{reason="hw_thermal_slowdown"}}'
    generic = f'{slowdown}{{reason="hw_slowdown"}}'
    w = config.nvlink_window
    nvlink = {
        name: risen_series(config, f"DCGM_FI_DEV_NVLINK_{name}_ERROR_COUNT_TOTAL", "nvlink_window")
        for name in ("RECOVERY", "REPLAY", "CRC_FLIT", "CRC_DATA")
    }
    node_labels = config.node_labels
    lost = f"gpufleet_gpu_up{{{sel}}} == 0"
    collapsed = agent_node(
        config,
        metric("gpufleet_collector_up", config.agent_selector, 'collector="gpu"') + " == 0",
    )
    seen, expected = metric("gpufleet_gpus_seen", sel), metric("gpufleet_gpus_expected", sel)
    dcgm_count, dcgm_max = series.dcgm_gpus, series.dcgm_gpus_max
    missing = (
        f"max by (node) (\n  {with_node(f'{seen} < {expected}', node_labels)}\n)\n"
        # Nodes without gpufleet's agent expect what they showed within the memory: per
        # node, so a healthy 4-GPU node expects 4 (a GB200 tray, a PCIe server).
        f"or ({dcgm_count} < {dcgm_max})"
    )
    dbe = risen_series(config, "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", "ecc_window")
    uncorrectable_remaps = risen_series(
        config, "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS", "ecc_window"
    )
    remaps = risen_series(config, "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS", "remaps_climbing_window")
    pcie = risen_series(config, "DCGM_FI_DEV_PCIE_REPLAY_COUNTER", "pcie_window")
    rules: list[Record | Alert] = [
        Alert(
            "GpuFleetCriticalXid",
            f'{xid}\n  * on (xid) group_left (meaning, action)\n  {XID_INFO}{{class="act_now"}}',
            "critical",
            "A GPU reported an XID that needs action now.",
            f"{GPU_WHO} reported XID {{{{ $labels.xid }}}} ({{{{ $labels.meaning }}}}) "
            f"{{{{ $value }}}} time(s) in {config.xid_window}. Action: {{{{ $labels.action }}}}.",
        ),
        Alert(
            "GpuFleetMaintenanceXid",
            f'{xid}\n  * on (xid) group_left (meaning, action)\n  {XID_INFO}{{class="maintenance"}}',
            "warning",
            "A GPU reported an XID that needs maintenance at the next drain.",
            f"{GPU_WHO} reported XID {{{{ $labels.xid }}}} ({{{{ $labels.meaning }}}}). "
            "Action: {{ $labels.action }}.",
        ),
        Alert(
            "GpuFleetEccUncorrectable",
            # DBE counts are opt-in on dcgm-exporter; remapped rows are in its defaults.
            f"{dbe}\nor ({uncorrectable_remaps} unless on ({GPU}) {dbe})",
            "critical",
            "A GPU had an uncorrectable (double-bit) ECC error.",
            f"{GPU_WHO} counted {{{{ $value }}}} uncorrectable ECC error(s) (or rows remapped for "
            f"them) in {config.ecc_window}. Drain the node and reset the GPU; RMA if it repeats.",
        ),
        Alert(
            "GpuFleetRowRemapFailure",
            per_gpu(f"{metric('DCGM_FI_DEV_ROW_REMAP_FAILURE', sel)} == 1", node_labels),
            "critical",
            "A GPU failed to remap a memory row: it has no spare rows left.",
            f"{GPU_WHO} reports a row remapping failure. Drain the node and RMA the GPU.",
        ),
        Alert(
            "GpuFleetRowRemapPending",
            per_gpu(f"{metric('DCGM_FI_DEV_ROW_REMAP_PENDING', sel)} == 1", node_labels),
            "warning",
            "A GPU has a row remap pending: it needs a reset to take effect.",
            f"{GPU_WHO} has a row remap pending since at least {config.remap_pending_for}. "
            "Reset the GPU at the next drain.",
            config.remap_pending_for,
        ),
        Alert(
            "GpuFleetCorrectableRemapsClimbing",
            f"{remaps} >= {config.remaps_climbing_min}",
            "warning",
            "A GPU keeps remapping rows for correctable errors: a known precursor of failure.",
            f"{GPU_WHO} remapped {{{{ $value }}}} rows for correctable errors in "
            f"{config.remaps_climbing_window}. Plan to drain and test it before it fails.",
        ),
        Alert(
            "GpuFleetNvlinkErrors",
            f"{nvlink['RECOVERY']} >= {config.nvlink_recovery_min}\n"
            f"or {nvlink['REPLAY']} >= {config.nvlink_replay_min}\n"
            f"or sum by ({GPU}) (\n"
            f'  label_replace({nvlink["CRC_FLIT"]}, "counter", "flit", "", "")\n'
            f'  or label_replace({nvlink["CRC_DATA"]}, "counter", "data", "", "")\n'
            f") >= {config.nvlink_crc_min}",
            "warning",
            "A GPU's NVLink errors are rising.",
            f"{GPU_WHO} counted {{{{ $value }}}} NVLink recovery, replay or CRC errors in {w}. "
            "Check nvidia-smi nvlink -e; drain and reset the GPU if it continues.",
        ),
        Alert(
            "GpuFleetPcieReplays",
            f"{pcie} >= {config.pcie_replays_min}",
            "warning",
            "A GPU's PCIe link is replaying packets at a high rate.",
            f"{GPU_WHO} replayed {{{{ $value }}}} PCIe packets in {config.pcie_window}: a failing "
            "link or riser, often before the GPU falls off the bus. Reseat or replace at the next drain.",
        ),
        Alert(
            "GpuFleetHwSlowdown",
            f"{brake}\nor ({thermal} unless on ({GPU}) {brake})\n"
            f"or ({generic} unless on ({GPU}) ({brake} or {thermal}))",
            "warning",
            "A GPU's clocks are held down by a hardware slowdown (thermal or power brake).",
            f"{GPU_WHO} is in {{{{ $labels.reason }}}} since at least {config.hw_slowdown_for}. "
            "Check cooling, fans and power supplies; the GPU is slowing the whole job.",
            config.hw_slowdown_for,
        ),
        Alert(
            "GpuFleetGpuLost",
            f"{per_gpu(lost, node_labels)}\nunless on (node) {collapsed}",
            "critical",
            "NVML reports a GPU lost: it no longer answers.",
            f"{GPU_WHO} is lost (fallen off the bus or unreachable) while the node's other GPUs "
            "answer. Drain the node and reboot it; RMA the GPU if it recurs.",
            config.gpu_lost_for,
        ),
        Alert(
            "GpuFleetGpuMissing",
            f"(\n{missing}\n)\nunless on (node) max by (node) ({with_node(lost, node_labels)})\n"
            f"unless on (node) {collapsed}",
            "critical",
            "A node sees fewer GPUs than it should.",
            "{{ $labels.node }} sees {{ $value }} GPUs, fewer than expected (its configured "
            f"count, or the most it showed within {config.gpus_expected_memory}): one fell off "
            "the bus or was not enumerated at boot. Drain and reboot.",
            config.gpu_missing_for,
        ),
    ]
    return Group("gpufleet-gpu-alerts", rules)
