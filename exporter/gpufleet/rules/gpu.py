"""GPU hardware rules: the XID catalogue, per-GPU counters rising over a window, XIDs,
ECC, row remaps, NVLink, PCIe, hardware slowdowns, lost and missing GPUs."""

from __future__ import annotations

from dataclasses import dataclass

from gpufleet.gpu.xid_catalogue import (
    CATALOGUE_DATE,
    CATALOGUE_URL,
    RECOVERY_ACTIONS,
    UNCLASSIFIED_ACTION,
    XidClass,
)
from gpufleet.rules.attribution import alert_condition
from gpufleet.rules.common import (
    GPU,
    GPU_WHO,
    Alert,
    Record,
    RuleGroup,
    SeriesNames,
    agent_node,
    metric,
    new_in,
    not_from,
    per_gpu,
    risen,
    with_node,
)
from gpufleet.rules.config import XID_CATALOGUE, RulesConfig
from gpufleet.rules.inline import duration_seconds
from gpufleet.schema.alerts import AlertName

# The catalogue: one series per catalogued code, labelled with its class, NVIDIA's
# description (meaning) and what to do (action). Codes of no class (NVIDIA's "Unused",
# and any code the catalogue does not hold) have none: GpuFleetUnclassifiedXid.
XID_INFO = "gpufleet:xid_catalogue:info"
# NVML's recovery actions: one series per value, labelled with NVML's name and the
# action in words; `urgency` says which alert pages for it.
RECOVERY_INFO = "gpufleet:gpu_recovery_action:info"
CLASSES_WITH_INFO = tuple(klass for klass in XidClass if klass is not XidClass.UNCLASSIFIED)


def _quoted(text: str) -> str:
    return text.replace("\\", "\\\\").replace('"', '\\"')


def _constant_series(labels: dict[str, str]) -> str:
    """vector(1) carrying ``labels``: one series of an info record."""
    expr = "vector(1)"
    for name, value in labels.items():
        expr = f'label_replace({expr}, "{name}", "{_quoted(value)}", "", "")'
    return expr


def _info_record(name: str, static: dict[str, str], series: list[dict[str, str]]) -> Record:
    """One record holding several constant series: one rule, not one per series."""
    return Record(name, "\nor ".join(_constant_series(labels) for labels in series), static)


def xid_catalogue_group(config: RulesConfig) -> RuleGroup:
    """The catalogue's info series: one record per class, holding a series per code
    (five rules for 108 codes), and one per urgency for NVML's recovery actions. They
    never change: recorded once a minute (what reads them sees the last, 5 min back)."""
    rules: list[Record | Alert] = [
        _info_record(
            XID_INFO,
            {"class": str(klass)},
            [
                {"xid": str(code.code), "meaning": code.meaning, "action": code.action}
                for code in XID_CATALOGUE
                if code.klass is klass
            ],
        )
        for klass in CLASSES_WITH_INFO
    ]
    for urgency in ("critical", "warning", "none"):
        rules.append(
            _info_record(
                RECOVERY_INFO,
                {"urgency": urgency},
                [
                    {"recovery_action": str(item.value), "nvml": item.nvml, "action": item.action}
                    for item in RECOVERY_ACTIONS
                    if item.urgency == urgency
                ],
            )
        )
    return RuleGroup("gpufleet-xid-catalogue", rules, config.slow_recording_interval)


# Per-GPU counters whose rise over a window the alerts and the health signals read.
# Each is scanned once per cycle here (the costly part: a 6 h window over every GPU)
# and kept only where it rose, so what reads it works on a handful of series.
NVLINK_COUNTERS = ("RECOVERY", "REPLAY", "CRC_FLIT", "CRC_DATA")  # NVLink 4 and earlier
# NVLink5 (Blackwell; ECC from Hopper): DCGM's fields, as dcgm-exporter names them.
NVLINK5_COUNTERS = (
    "DCGM_FI_DEV_NVLINK_RECOVERY_FAILED_TOTAL",
    "DCGM_FI_DEV_NVLINK_RECOVERY_EVENT_TOTAL",
    "DCGM_FI_DEV_NVLINK_RX_SYMBOL_ERROR_TOTAL",
    "DCGM_FI_DEV_NVLINK_EFFECTIVE_ERROR_TOTAL",
    "DCGM_FI_DEV_NVLINK_ECC_ERROR_TOTAL",
)
RISEN: tuple[tuple[str, str], ...] = (
    ("DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS", "remaps_climbing_window"),
    ("DCGM_FI_DEV_PCIE_REPLAY_COUNTER", "pcie_window"),
    ("DCGM_FI_DEV_PCIE_REPLAY_COUNTER", "health_pcie_window"),
    ("DCGM_FI_DEV_ECC_SBE_VOL_TOTAL", "health_sbe_window"),
    ("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", "ecc_window"),
    # In dcgm-exporter's stock counters (DBE ECC is not): rises with every uncorrectable error
    ("DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS", "ecc_window"),
    ("DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL", "health_nvlink_window"),
    *(
        (f"DCGM_FI_DEV_NVLINK_{name}_ERROR_COUNT_TOTAL", "nvlink_window")
        for name in NVLINK_COUNTERS
    ),
    *((name, "nvlink_window") for name in NVLINK5_COUNTERS),
)
THROTTLE_BITS = (
    ("hw_power_brake_slowdown", 128),
    ("hw_thermal_slowdown", 64),
    ("hw_slowdown", 8),
)
# NVML's recovery action: gpufleet's agent, and DCGM's field 1523 as dcgm-exporter
# names it (DCGM_FI_DEV_GPU_RECOVERY_ACTION; DCGM_FI_DEV_GET_GPU_RECOVERY_ACTION before).
RECOVERY_ACTION_METRICS = (
    "gpufleet_gpu_recovery_action",
    "DCGM_FI_DEV_GPU_RECOVERY_ACTION",
    "DCGM_FI_DEV_GET_GPU_RECOVERY_ACTION",
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
    # per GPU that asks for one (not NONE), NVML's recovery action as a label (value 1)
    recovery_action: str = "gpu:gpufleet_gpu_recovery_action:current"


# dcgm-exporter 4.x names the clock-event bitmask ..._CLOCKS_EVENT_REASONS; older ones,
# and gpufleet's agent, ..._CLOCK_THROTTLE_REASONS. Neither is in its stock counters.
THROTTLE_BITMASKS = ("DCGM_FI_DEV_CLOCK_THROTTLE_REASONS", "DCGM_FI_DEV_CLOCKS_EVENT_REASONS")


def gpu_recording(config: RulesConfig) -> list[Record]:
    """dcgm-exporter's fallbacks and what the XID, slowdown and recovery alerts read."""
    sel = config.gpu_selector
    node_labels = config.node_labels
    window = config.xid_window
    counter = metric("gpufleet_gpu_xid_errors_total", sel)
    # gpufleet's agents that started within the window: their XID counters count from then
    started = metric("gpufleet_agent_start_time_seconds", config.agent_selector)
    restarted = f"{started} > time() - {duration_seconds(window):g}"
    # dcgm-exporter's fallbacks: not the agent's series of the same names (not_from), and
    # not a GPU the agent also reports (unless on UUID)
    dcgm = ", ".join(part for part in (sel, not_from(config.agent_selector)) if part)
    last = metric("DCGM_FI_DEV_XID_ERRORS", dcgm)
    agent_gpus = metric("gpufleet_gpu_up", sel)
    series = GpuSeries.of(config)
    changed = series.xid_changed
    # dcgm-exporter's opt-in DCGM_EXP_XID_ERRORS_COUNT{xid}: XIDs per code within its own
    # window (5 min by default); only XIDs that happened recently, even on a first scrape.
    xid_counts = metric("DCGM_EXP_XID_ERRORS_COUNT", dcgm, 'xid!=""')
    throttle = metric("gpufleet_gpu_clock_throttle_active", sel)
    # dcgm-exporter has only the bitmask; GPUs with gpufleet's agent have a flag per reason
    dcgm_reasons = series.dcgm_reasons
    # each filtered before the union: the union of every GPU's two names costs more
    throttled = " or ".join(f"{metric(name, dcgm)} > 0" for name in THROTTLE_BITMASKS)
    bits = "\n  or ".join(
        f'label_replace(\n    ({throttle.rstrip("}")}, reason="{reason}"}} == 1)\n'
        f"    or (floor({dcgm_reasons} / {value}) % 2 == 1),\n"
        f'    "reason", "{reason}", "", "")'
        for reason, value in THROTTLE_BITS
    )
    presence = metric(config.gpu_presence_metric, dcgm)
    dcgm_count, dcgm_max = series.dcgm_gpus, series.dcgm_gpus_max
    recovery = " or ".join(metric(name, sel) for name in RECOVERY_ACTION_METRICS)
    return [
        Record(dcgm_reasons, f"({throttled}) unless on (UUID) {agent_gpus}"),
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
        # Per GPU and code: the agent's counters, rises and resets as increase() sees
        # them, per MIG instance where NVML attributed the XID to one (GPU_I_ID: the
        # page names that instance's tenant); dcgm-exporter's changed last value, made
        # the xid label by count_values (one rule for every code); its opt-in per-code count.
        Record(
            series.xid_new,
            f"max by ({GPU}, GPU_I_ID, xid) (\n  {with_node(new_in(counter, window, restarted, 'UUID, GPU_I_ID, xid'), node_labels)}\n)\nor\n"
            f'count_values by ({GPU}) ("xid", {changed})\nor\n'
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
        Record(
            series.recovery_action,
            f'count_values by ({GPU}) ("recovery_action",\n  '
            f"max by ({GPU}) ({with_node(f'({recovery}) > 0', node_labels)})\n)",
        ),
    ]


def gpu_counters(config: RulesConfig) -> dict[tuple[str, str], Record]:
    """Each counter of RISEN, its rise over its window per GPU, where it rose."""
    sel = config.gpu_selector
    return {
        (name, knob): Record(
            risen_series(config, name, knob),
            per_gpu(f"{risen(metric(name, sel), getattr(config, knob))} > 0", config.node_labels),
        )
        for name, knob in RISEN
    }


def _xid_class(xid: str, klass: XidClass) -> str:
    return f'{xid}\n  * on (xid) group_left (meaning, action)\n  {XID_INFO}{{class="{klass}"}}'


def _recovery(series: GpuSeries, urgency: str) -> str:
    return (
        f"{series.recovery_action}\n  * on (recovery_action) group_left (nvml, action)\n"
        f'  {RECOVERY_INFO}{{urgency="{urgency}"}}'
    )


def gpu_alerts(config: RulesConfig) -> list[Alert]:
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
        for name in NVLINK_COUNTERS
    }
    crc_min = round(config.nvlink_crc_per_second * duration_seconds(w))
    # each tagged with its counter, so that max takes the largest, not the first
    nvlink5 = "\n  or ".join(
        f'label_replace({risen_series(config, name, "nvlink_window")}, "counter", "{name}", "", "")'
        for name in NVLINK5_COUNTERS
    )
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
    # every GPU that reports a recovery action, NONE included: a point lookup, not a record
    recovery = " or ".join(metric(name, sel) for name in RECOVERY_ACTION_METRICS)
    rules: list[Alert] = [
        Alert(
            AlertName.CRITICAL_XID,
            # 154 pages here only on GPUs that report no recovery action: where one is
            # reported, GpuFleetGpuRecoveryAction says what it asks, and NONE pages nothing.
            f"{_xid_class(xid, XidClass.ACT_NOW)}\nor (\n  {_xid_class(xid, XidClass.RECOVERY_ACTION)}\n"
            f"  unless on (UUID) ({recovery})\n)",
            "critical",
            "A GPU reported an XID that needs action now.",
            f"{GPU_WHO} reported XID {{{{ $labels.xid }}}} ({{{{ $labels.meaning }}}}) "
            f"{{{{ $value }}}} time(s) in {config.xid_window}. Action: {{{{ $labels.action }}}}.",
        ),
        Alert(
            AlertName.MAINTENANCE_XID,
            _xid_class(xid, XidClass.MAINTENANCE),
            "warning",
            "A GPU reported an XID that a person should investigate; no immediate action.",
            f"{GPU_WHO} reported XID {{{{ $labels.xid }}}} ({{{{ $labels.meaning }}}}). "
            "Action: {{ $labels.action }}.",
        ),
        Alert(
            AlertName.UNCLASSIFIED_XID,
            f"{xid}\n  unless on (xid) {XID_INFO}",
            "warning",
            "A GPU reported an XID that NVIDIA's catalogue does not classify.",
            f"{GPU_WHO} reported XID {{{{ $labels.xid }}}} {{{{ $value }}}} time(s) in "
            f"{config.xid_window}: {UNCLASSIFIED_ACTION.replace('XID', 'XID {{ $labels.xid }}')} "
            f"({CATALOGUE_URL}; gpufleet's copy is of {CATALOGUE_DATE}).",
        ),
        Alert(
            AlertName.GPU_RECOVERY_ACTION,
            _recovery(series, "critical"),
            "critical",
            "NVML asks for a recovery action on a GPU: reset, reboot or drain.",
            f"{GPU_WHO}: NVML's recovery action is {{{{ $labels.recovery_action }}}} "
            "({{ $labels.nvml }}). Action: {{ $labels.action }}.",
        ),
        Alert(
            AlertName.GPU_RECOVERY_WARNING,
            f"{_recovery(series, 'warning')}\nor label_replace(\n"
            f"  {series.recovery_action} unless on (recovery_action) {RECOVERY_INFO},\n"
            '  "nvml", "unknown to gpufleet", "", ""\n)',
            "warning",
            "NVML asks for a recovery action on a GPU that needs no reset yet.",
            f"{GPU_WHO}: NVML's recovery action is {{{{ $labels.recovery_action }}}} "
            "({{ $labels.nvml }}). Action: {{ if $labels.action }}{{ $labels.action }}"
            "{{ else }}see NVIDIA's documentation of nvmlDeviceGetGpuRecoveryAction{{ end }}.",
        ),
        Alert(
            AlertName.ECC_UNCORRECTABLE,
            # DBE counts are opt-in on dcgm-exporter; remapped rows are in its defaults.
            f"{dbe}\nor ({uncorrectable_remaps} unless on ({GPU}) {dbe})",
            "critical",
            "A GPU had an uncorrectable (double-bit) ECC error.",
            f"{GPU_WHO} counted {{{{ $value }}}} uncorrectable ECC error(s) (or rows remapped for "
            f"them) in {config.ecc_window}. Drain the node and reset the GPU (NVIDIA's XID 48 "
            "workflow); watch the row remap alerts after the reset.",
        ),
        Alert(
            AlertName.ROW_REMAP_FAILURE,
            per_gpu(f"{metric('DCGM_FI_DEV_ROW_REMAP_FAILURE', sel)} == 1", node_labels),
            "critical",
            "A GPU failed to remap a memory row.",
            f"{GPU_WHO} reports a row remapping failure (an uncorrectable error in a bank "
            "that used all its remaps, or on a row already remapped). Drain the node, reset "
            "the GPU or reboot, then run NVIDIA's field diagnostic; RMA only if it confirms a fault.",
        ),
        Alert(
            AlertName.ROW_REMAP_PENDING,
            per_gpu(f"{metric('DCGM_FI_DEV_ROW_REMAP_PENDING', sel)} == 1", node_labels),
            "warning",
            "A GPU has a row remap pending: it needs a reset to take effect.",
            f"{GPU_WHO} has a row remap pending since at least {config.remap_pending_for}. "
            "Reset the GPU at the next drain; until then containment and page offlining keep "
            "the row out of use and new work can run.",
            config.remap_pending_for,
        ),
        Alert(
            AlertName.REMAPS_CLIMBING,
            f"{remaps} >= {config.remaps_climbing_min}",
            "warning",
            "A GPU keeps remapping rows for correctable errors (gpufleet's heuristic).",
            f"{GPU_WHO} remapped {{{{ $value }}}} rows for correctable errors in "
            f"{config.remaps_climbing_window} ({config.remaps_climbing_min} is gpufleet's "
            "threshold; NVIDIA sets none). Plan to drain it and run NVIDIA's field diagnostic.",
        ),
        Alert(
            AlertName.NVLINK_ERRORS,
            f"{nvlink['RECOVERY']} >= {config.nvlink_recovery_min}\n"
            f"or {nvlink['REPLAY']} >= {config.nvlink_replay_min}\n"
            f"or sum by ({GPU}) (\n"
            f'  label_replace({nvlink["CRC_FLIT"]}, "counter", "flit", "", "")\n'
            f'  or label_replace({nvlink["CRC_DATA"]}, "counter", "data", "", "")\n'
            f") >= {crc_min}\n"
            f"or max by ({GPU}) (\n  {nvlink5}\n) >= {config.nvlink5_errors_min}",
            "warning",
            "A GPU's NVLink errors are rising past what DCGM's health check fails.",
            f"{GPU_WHO} counted {{{{ $value }}}} NVLink errors of one kind in {w}: recovery or "
            f"replay errors, CRC errors at {config.nvlink_crc_per_second:g}/s or more, or "
            "NVLink5 recovery, symbol, effective or ECC errors. Check nvidia-smi nvlink -e; "
            "drain and reset the GPU if it continues.",
        ),
        Alert(
            AlertName.PCIE_REPLAYS,
            f"{pcie} >= {config.pcie_replays_min}",
            "warning",
            "A GPU's PCIe link replays packets faster than DCGM's health check allows.",
            f"{GPU_WHO} replayed {{{{ $value }}}} PCIe packets in {config.pcie_window}: a failing "
            "link or riser, often before the GPU falls off the bus. Reseat or replace at the next drain.",
        ),
        Alert(
            AlertName.HW_SLOWDOWN,
            f"{brake}\nor ({thermal} unless on ({GPU}) {brake})\n"
            f"or ({generic} unless on ({GPU}) ({brake} or {thermal}))",
            "warning",
            "A GPU's clocks are held down by a hardware slowdown (thermal or power brake).",
            f"{GPU_WHO} is in {{{{ $labels.reason }}}} since at least {config.hw_slowdown_for}. "
            "Check cooling, fans and power supplies; the GPU is slowing the whole job.",
            config.hw_slowdown_for,
        ),
        Alert(
            AlertName.GPU_LOST,
            f"{per_gpu(lost, node_labels)}\nunless on (node) {collapsed}",
            "critical",
            "NVML reports a GPU lost: it no longer answers.",
            f"{GPU_WHO} is lost (fallen off the bus or unreachable) while the node's other GPUs "
            "answer. Drain the node and reboot it (NVIDIA for XID 79: RESTART_BM); contact "
            "NVIDIA support if it recurs.",
            config.gpu_lost_for,
        ),
        Alert(
            AlertName.GPU_MISSING,
            # not a node whose missing GPU pages as lost: the lost-GPU condition as
            # recorded every 15 s (a scan of every GPU's gpufleet_gpu_up saved here)
            f"(\n{missing}\n)\nunless on (node) {alert_condition(AlertName.GPU_LOST)}\n"
            f"unless on (node) {collapsed}",
            "critical",
            "A node sees fewer GPUs than it should.",
            "{{ $labels.node }} sees {{ $value }} GPUs, fewer than expected (its configured "
            f"count, or the most it showed within {config.gpus_expected_memory}): one fell off "
            "the bus or was not enumerated at boot. Drain and reboot.",
            config.gpu_missing_for,
        ),
    ]
    return rules
