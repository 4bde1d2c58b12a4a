"""Builds gpufleet's recording and alerting rules from ``RulesConfig``.

Conventions (after the monitoring mixins): alerts are ``GpuFleet...`` CamelCase,
``severity`` is critical (page now), warning (page or ticket within hours) or
info (dashboards only); every alert has a static ``summary``, a templated
``description`` naming node, GPU, job and value, and a ``runbook_url`` into
``alerts/RUNBOOK.md``. Recording rules are ``level:metric:operation``. GPU series
may come from gpufleet's agent or from dcgm-exporter, which labels the node
``Hostname`` (released) or ``hostname`` (main branch); both become ``node``
(``RulesConfig.node_labels``). dcgm-exporter series may also carry ``pod`` /
``namespace`` / ``container`` labels that change with the workload: every GPU rule
compares a GPU with itself by ``UUID``, never by whole label sets.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from gpufleet.rules.config import XID_CATALOGUE, RulesConfig

GPU = "node, gpu, UUID"
STAGE = "training_job, pp_stage"
NODE_STAGE = "training_job, node, pp_stage"


@dataclass(frozen=True, slots=True)
class Record:
    record: str
    expr: str
    labels: dict[str, str] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        rule: dict[str, Any] = {"record": self.record, "expr": self.expr}
        if self.labels:
            rule["labels"] = dict(self.labels)
        return rule


@dataclass(frozen=True, slots=True)
class Alert:
    alert: str
    expr: str
    severity: str
    summary: str
    description: str
    for_: str = "0m"

    def as_dict(self, config: RulesConfig) -> dict[str, Any]:
        rule: dict[str, Any] = {"alert": self.alert, "expr": self.expr}
        if self.for_ != "0m":
            rule["for"] = self.for_
        rule["labels"] = {"severity": config.severity(self.alert, self.severity)}
        rule["annotations"] = {
            "summary": self.summary,
            "description": self.description,
            "runbook_url": config.runbook_url.format(anchor=self.alert.lower()),
        }
        return rule


@dataclass(slots=True)
class Group:
    name: str
    rules: Sequence[Record | Alert]
    interval: str | None = None


@dataclass(frozen=True, slots=True)
class RuleFile:
    name: str  # file stem, e.g. "gpu" -> alerts/gpu.rules.yaml
    groups: list[Group]


def metric(name: str, selector: str, extra: str = "") -> str:
    inner = ", ".join(part for part in (selector, extra) if part)
    return f"{name}{{{inner}}}"


NODE_LABELS = ("Hostname", "hostname")


def with_node(expr: str, labels: Sequence[str] = NODE_LABELS) -> str:
    """Add ``node`` from the label that names it (``Hostname``, ``hostname``; the last
    listed that is set wins, so list the preferred one last: they hold the same name)."""
    for label in labels:
        expr = f'label_replace({expr}, "node", "$1", "{label}", "(.+)")'
    return expr


def per_gpu(expr: str, labels: Sequence[str] = NODE_LABELS) -> str:
    return f"max by ({GPU}) (\n  {with_node(expr, labels)}\n)"


def risen(series: str, window: str) -> str:
    """How much a counter rose within ``window``: robust to young series and resets."""
    return f"({series} - min_over_time({series}[{window}]))"


def new_in(series: str, window: str) -> str:
    """Increments of a counter that may appear (first event) or reset (agent restart)."""
    return (
        f"(({series} - {series} offset {window}) > 0)\n"
        f"  or ({series} unless {series} offset {window})\n"
        f"  or ({series} < {series} offset {window})"
    )


# Reused templates.
GPU_WHO = "{{ $labels.node }} GPU {{ $labels.gpu }} ({{ $labels.UUID }})"
JOB_NODE = (
    "{{ $labels.node }} in job {{ $labels.training_job }} (pipeline stage {{ $labels.pp_stage }})"
)


def _agent_node(config: RulesConfig, expr: str) -> str:
    """Self-metrics carry no Hostname: take the node from gpufleet_agent_info by target."""
    info = metric("gpufleet_agent_info", config.agent_selector)
    return (
        f"({expr})\n  * on (instance, job) group_left (node) max by (instance, job, node) ({info})"
    )


def xid_catalogue_group() -> Group:
    rules: list[Record | Alert] = [
        Record(
            "gpufleet:xid_catalogue:info",
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
    ("DCGM_FI_DEV_ECC_SBE_VOL_TOTAL", "1h"),
    ("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", "ecc_window"),
    # In dcgm-exporter's stock counters (DBE ECC is not): rises with every uncorrectable error
    ("DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS", "ecc_window"),
    ("DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL", "30m"),
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


def window_of(config: RulesConfig, knob: str) -> str:
    return str(getattr(config, knob)) if hasattr(config, knob) else knob


def risen_record(name: str, window: str) -> str:
    return f"gpu:{name}:risen{window}"


def dcgm_gpus_records(config: RulesConfig) -> tuple[str, str]:
    """GPUs answering now on nodes without gpufleet's agent, and the most seen there
    within ``gpus_expected_memory`` (what the node should have: 4 on a 4-GPU node)."""
    return (
        "node:gpufleet_dcgm_gpus:count",
        f"node:gpufleet_dcgm_gpus:max{config.gpus_expected_memory}",
    )


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
    changed = f"gpu:DCGM_FI_DEV_XID_ERRORS:changed{window}"
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
    dcgm_reasons = "gpu:DCGM_FI_DEV_CLOCK_THROTTLE_REASONS:dcgm_only"
    bitmasks = " or ".join(metric(name, sel) for name in THROTTLE_BITMASKS)
    bits = "\n  or ".join(
        f'label_replace(\n    ({throttle.rstrip("}")}, reason="{reason}"}} == 1)\n'
        f"    or (floor({dcgm_reasons} / {value}) % 2 == 1),\n"
        f'    "reason", "{reason}", "", "")'
        for reason, value in THROTTLE_BITS
    )
    presence = metric(config.gpu_presence_metric, sel)
    dcgm_count, dcgm_max = dcgm_gpus_records(config)
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
            f"gpu:gpufleet_gpu_xid_errors:new{window}",
            f"max by ({GPU}, xid) (\n  {with_node(new_in(counter, window), node_labels)}\n)\nor\n"
            f"max by ({GPU}, xid) (\n  {dcgm_paths}\n)\nor\n"
            f"max by ({GPU}, xid) (\n  {with_node(f'({xid_counts} > 0 unless on (UUID) {agent_gpus})', node_labels)}\n)",
        ),
        Record(
            "gpu:gpufleet_gpu_hw_slowdown:active",
            f"max by ({GPU}, reason) (\n  {with_node(f'({bits})', node_labels)}\n)",
        ),
        Record(
            dcgm_count,
            f"count by (node) (\n  max by (node, UUID) ({with_node(f'{presence} unless on (UUID) {agent_gpus}', node_labels)})\n)",
        ),
        Record(dcgm_max, f"max_over_time({dcgm_count}[{config.gpus_expected_memory}])"),
    ]
    for name, knob in RISEN:
        span = window_of(config, knob)
        rules.append(
            Record(
                risen_record(name, span),
                per_gpu(f"{risen(metric(name, sel), span)} > 0", node_labels),
            )
        )
    return Group("gpufleet-gpu-recording", rules, config.gpu_recording_interval)


def gpu_alerts(config: RulesConfig) -> Group:
    sel = config.gpu_selector
    xid = f"gpu:gpufleet_gpu_xid_errors:new{config.xid_window}"
    slowdown = "gpu:gpufleet_gpu_hw_slowdown:active"
    brake = f'{slowdown}{{reason="hw_power_brake_slowdown"}}'
    thermal = f'{slowdown}{{reason="hw_thermal_slowdown"}}'
    generic = f'{slowdown}{{reason="hw_slowdown"}}'
    w = config.nvlink_window
    nvlink = {
        name: risen_record(f"DCGM_FI_DEV_NVLINK_{name}_ERROR_COUNT_TOTAL", w)
        for name in ("RECOVERY", "REPLAY", "CRC_FLIT", "CRC_DATA")
    }
    node_labels = config.node_labels
    lost = f"gpufleet_gpu_up{{{sel}}} == 0"
    collapsed = _agent_node(
        config,
        metric("gpufleet_collector_up", config.agent_selector, 'collector="gpu"') + " == 0",
    )
    seen, expected = metric("gpufleet_gpus_seen", sel), metric("gpufleet_gpus_expected", sel)
    dcgm_count, dcgm_max = dcgm_gpus_records(config)
    missing = (
        f"max by (node) (\n  {with_node(f'{seen} < {expected}', node_labels)}\n)\n"
        # Nodes without gpufleet's agent expect what they showed within the memory: per
        # node, so a healthy 4-GPU node expects 4 (a GB200 tray, a PCIe server).
        f"or ({dcgm_count} < {dcgm_max})"
    )
    dbe = risen_record("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", config.ecc_window)
    uncorrectable_remaps = risen_record(
        "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS", config.ecc_window
    )
    remaps = risen_record("DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS", config.remaps_climbing_window)
    pcie = risen_record("DCGM_FI_DEV_PCIE_REPLAY_COUNTER", config.pcie_window)
    rules: list[Record | Alert] = [
        Alert(
            "GpuFleetCriticalXid",
            f'{xid}\n  * on (xid) group_left (meaning, action)\n  gpufleet:xid_catalogue:info{{class="act_now"}}',
            "critical",
            "A GPU reported an XID that needs action now.",
            f"{GPU_WHO} reported XID {{{{ $labels.xid }}}} ({{{{ $labels.meaning }}}}) "
            f"{{{{ $value }}}} time(s) in {config.xid_window}. Action: {{{{ $labels.action }}}}.",
        ),
        Alert(
            "GpuFleetMaintenanceXid",
            f'{xid}\n  * on (xid) group_left (meaning, action)\n  gpufleet:xid_catalogue:info{{class="maintenance"}}',
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


def targets_record(component: str) -> str:
    return f"fleet:gpufleet_{component}_targets:count"


def presence_records(config: RulesConfig) -> list[Record | Alert]:
    """Targets per component now, what the "seen" presence alerts remember."""
    selectors = {"gpu": config.gpu_selector, "agent": config.agent_selector}
    return [
        Record(targets_record(component), f"count({metric('up', selector)})")
        for component, selector in selectors.items()
        if getattr(config, f"{component}_presence") == "seen"
    ]


def targets_missing(config: RulesConfig, component: str, selector: str) -> str | None:
    """No target left: "required" since ever, "seen" of those scraped within the memory."""
    mode = getattr(config, f"{component}_presence")
    if mode == "off":
        return None
    if mode == "required":
        return f"absent({metric('up', selector)})"
    name = targets_record(component)
    return f"max_over_time({name}[{config.presence_memory}])\nunless on () {name}"


def presence_note(config: RulesConfig, component: str) -> str:
    mode = getattr(config, f"{component}_presence")
    if mode == "required":
        return "The site requires them (presence: required)."
    return f"Prometheus scraped some within {config.presence_memory} (presence: seen)."


def node_alerts(config: RulesConfig) -> Group:
    agent_up = metric("up", config.agent_selector)
    node_up = f'label_replace({agent_up}, "node", "$1", "instance", "([^:]+).*")'
    excluded = metric("gpufleet_fleet_node_excluded", config.fleet_selector)
    quiet = config.excluded_quiet_after
    quietly_excluded = (
        f"unless on (node) (max by (node) ({excluded} == 1) and on (node) max by (node) "
        f"({excluded} offset {quiet} == 1))"
    )
    collapsed = _agent_node(
        config, metric("gpufleet_collector_up", config.agent_selector, 'collector="gpu"') + " == 0"
    )
    dcgm_count, dcgm_max = dcgm_gpus_records(config)
    rules: list[Record | Alert] = [
        Alert(
            "GpuFleetAgentDown",
            f"max by (node, instance) ({node_up} == 0)\n{quietly_excluded}",
            "critical",
            "A node's gpufleet agent does not answer: the node may be down.",
            "The agent on {{ $labels.node }} ({{ $labels.instance }}) has not answered for "
            f"{config.agent_down_for}: the host may have died. Check the node; exclude it from jobs.",
            config.agent_down_for,
        ),
        # Nodes without gpufleet's agent: dcgm-exporter's target on a dead node answers
        # nothing (up 0) or leaves service discovery with its pod. Either way the node's
        # GPUs stop answering; a node that showed GPUs within the memory and shows none
        # now is down. A node gpufleet's agent watches is GpuFleetAgentDown's.
        Alert(
            "GpuFleetGpuExporterDown",
            f"{dcgm_max}\nunless on (node) {dcgm_count}\n"
            f"unless on (node) max by (node) ({node_up})\n{quietly_excluded}",
            "critical",
            "A node's GPU exporter (dcgm-exporter) no longer answers: the node may be down.",
            "{{ $labels.node }} showed {{ $value }} GPUs within "
            f"{config.gpus_expected_memory} and none for {config.exporter_down_for}: its "
            "dcgm-exporter is down or gone with its pod, or the host died. Check the node; "
            "exclude it from jobs.",
            config.exporter_down_for,
        ),
        Alert(
            "GpuFleetTelemetryCollapse",
            collapsed,
            "critical",
            "A node's GPU telemetry collapsed: NVML no longer answers.",
            "NVML on {{ $labels.node }} has not completed a collection for too long, so its GPU "
            "values are no longer served: the driver is wedged. Drain the node and reboot it.",
            config.telemetry_collapse_for,
        ),
        *_targets_missing_alerts(config),
        Alert(
            "GpuFleetNodeHealthDegraded",
            f"node:gpufleet_health:score >= {config.health_threshold}",
            "warning",
            "Several weak warning signs on one node at once.",
            "{{ $labels.node }} shows several weak warning signs together (health score "
            "{{ $value }}): the Node dashboard's 'Health score and its signals' panel shows which. "
            "Drain and test it.",
            config.health_for,
        ),
    ]
    return Group("gpufleet-node-alerts", rules)


def _targets_missing_alerts(config: RulesConfig) -> list[Record | Alert]:
    alerts: list[Record | Alert] = []
    gpu = targets_missing(config, "gpu", config.gpu_selector)
    if gpu is not None:
        alerts.append(
            Alert(
                "GpuFleetGpuTargetsMissing",
                gpu,
                "critical",
                "Prometheus scrapes no GPU exporter at all (gpufleet agent or dcgm-exporter).",
                f"No target of {config.gpu_selector} has been scraped for "
                f"{config.targets_missing_for}. {presence_note(config, 'gpu')} No GPU alert "
                "can fire: the exporters are gone or service discovery broke "
                "({{ $value }} target(s) before).",
                config.targets_missing_for,
            )
        )
    agent = targets_missing(config, "agent", config.agent_selector)
    if agent is not None:
        if gpu is not None:  # every GPU exporter gone: that page says it all
            agent += f"\nunless on () ({gpu})"
        alerts.append(
            Alert(
                "GpuFleetAgentTargetsMissing",
                agent,
                "critical",
                "Prometheus scrapes no gpufleet agent at all.",
                f"No target of {config.agent_selector} has been scraped for "
                f"{config.targets_missing_for}. {presence_note(config, 'agent')} No training "
                "alert can fire, nor GPU alerts from the agent (dcgm-exporter's still can): "
                "the agents are gone or service discovery broke ({{ $value }} target(s) before).",
                config.targets_missing_for,
            )
        )
    return alerts


def health_recording(config: RulesConfig) -> Group:
    sel = config.gpu_selector
    weight = config.health_signal_weight
    throttle = metric(
        "gpufleet_gpu_clock_throttle_active", sel, 'reason=~"sw_thermal_slowdown|sw_power_cap"'
    )
    signals = {
        "remaps": f"{risen_record('DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS', config.remaps_climbing_window)} >= 1",
        "pcie": f"{risen_record('DCGM_FI_DEV_PCIE_REPLAY_COUNTER', config.pcie_window)} >= 2",
        "nvlink": f"{risen_record('DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL', '30m')} >= 1",
        "sbe": f"{risen_record('DCGM_FI_DEV_ECC_SBE_VOL_TOTAL', '1h')} >= 100",
    }
    rules: list[Record | Alert] = [
        Record(f"node:gpufleet_health_signal:{name}", f"max by (node) ({expr}) * 0 + {weight}")
        for name, expr in signals.items()
    ]
    rules.append(
        Record(
            "node:gpufleet_health_signal:sw_throttle",
            f"max by (node) ({with_node(f'avg_over_time({throttle}[15m]) >= 0.5', config.node_labels)}) * 0 + {weight}",
        )
    )
    rules.append(
        Record(
            "node:gpufleet_health_signal:slow",
            f"max by (node) (node:gpufleet_training_compute_ratio:rate{config.rate_window} >= 1.05) * 0 + {weight}",
        )
    )
    rules.append(
        Record(
            "node:gpufleet_health_signal:xid",
            f"max by (node) (gpu:gpufleet_gpu_xid_errors:new{config.xid_window} * on (xid) group_left "
            'gpufleet:xid_catalogue:info{class="maintenance"}) * 0 + ' + str(weight),
        )
    )
    # Each signal tagged with its name so that `or` keeps them all, then summed per node.
    tagged = "\n  or ".join(
        f'label_replace({rule.record}, "signal", "{rule.record.rsplit(":", 1)[1]}", "", "")'
        for rule in rules
        if isinstance(rule, Record)
    )
    rules.append(Record("node:gpufleet_health:score", f"sum by (node) (\n  {tagged}\n)"))
    rules.extend(presence_records(config))
    return Group("gpufleet-node-health", rules)


def job_steady_step(config: RulesConfig) -> tuple[str, str]:
    """Names of the job's steady step time now and over its baseline."""
    percent = round(config.job_slowdown_quantile * 100)
    return (
        f"job:gpufleet_training_step_seconds:p{percent}_{config.job_slowdown_window}",
        f"job:gpufleet_training_step_seconds:p{percent}_baseline{config.baseline_window}",
    )


def training_recording(config: RulesConfig) -> list[Group]:
    sel = config.agent_selector
    w = config.rate_window

    def rate_sum(name: str, by: str, window: str = w, offset: str = "") -> str:
        suffix = f" offset {offset}" if offset else ""
        function = "increase" if offset else "rate"
        return f"sum by ({by}) ({function}({metric(name, sel)}[{window}]{suffix}))"

    slow = f"node:gpufleet_training_slowest_compute_per_step:rate{w}"
    median = f"stage:gpufleet_training_slowest_compute_per_step:median{w}"
    mad = f"stage:gpufleet_training_slowest_compute_per_step:mad{w}"
    steady, steady_baseline = job_steady_step(config)
    q, steady_w = config.job_slowdown_quantile, config.job_slowdown_window
    rank = f"rank:gpufleet_training_compute_per_step:rate{w}"
    rank_median = f"stage:gpufleet_training_rank_compute_per_step:median{w}"
    rank_mad = f"stage:gpufleet_training_rank_compute_per_step:mad{w}"
    floor = config.mad_floor
    base_w, base_o = config.baseline_window, config.baseline_offset

    def scale(spread: str, center: str) -> str:
        return f"((1.4826 * {spread} > {center} * {floor}) or ({center} * {floor}))"

    peers = [
        Record(
            slow,
            f"{rate_sum('gpufleet_training_slowest_rank_compute_seconds_total', NODE_STAGE)}\n"
            f"/ {rate_sum('gpufleet_training_slowest_rank_steps_total', NODE_STAGE)}",
        ),
        Record(median, f"quantile by ({STAGE}) (0.5, {slow})"),
        Record(mad, f"quantile by ({STAGE}) (0.5, abs({slow} - on ({STAGE}) group_left {median}))"),
        Record(f"stage:gpufleet_training_nodes:count{w}", f"count by ({STAGE}) ({slow})"),
        Record(
            f"node:gpufleet_training_compute_ratio:rate{w}",
            f"{slow} / on ({STAGE}) group_left {median}",
        ),
        Record(
            f"node:gpufleet_training_compute_zscore:rate{w}",
            f"({slow} - on ({STAGE}) group_left {median})\n/ on ({STAGE}) group_left () {scale(mad, median)}",
        ),
        Record(
            rank,
            f"{rate_sum('gpufleet_training_rank_compute_seconds_total', NODE_STAGE + ', rank')}\n"
            f"/ {rate_sum('gpufleet_training_rank_steps_total', NODE_STAGE + ', rank')}",
        ),
        Record(rank_median, f"quantile by ({STAGE}) (0.5, {rank})"),
        Record(
            rank_mad,
            f"quantile by ({STAGE}) (0.5, abs({rank} - on ({STAGE}) group_left {rank_median}))",
        ),
        Record(f"stage:gpufleet_training_ranks:count{w}", f"count by ({STAGE}) ({rank})"),
        Record(
            f"node:gpufleet_training_rank_compute_ratio:max{w}",
            f"max by ({NODE_STAGE}) ({rank} / on ({STAGE}) group_left {rank_median})",
        ),
        Record(
            f"node:gpufleet_training_rank_compute_zscore:max{w}",
            f"max by ({NODE_STAGE}) (\n  ({rank} - on ({STAGE}) group_left {rank_median})\n"
            f"  / on ({STAGE}) group_left () {scale(rank_mad, rank_median)}\n)",
        ),
    ]
    node_baseline = f"node:gpufleet_training_slowest_compute_per_step:baseline{base_w}"
    trends = [
        # Rates over windows keep a stopped job's last minutes "frozen": the alerts below
        # only judge a node that is still stepping.
        Record(
            "node:gpufleet_training_slowest_rank_steps:rate2m",
            rate_sum("gpufleet_training_slowest_rank_steps_total", NODE_STAGE, "2m") + " > 0",
        ),
        Record(
            "node:gpufleet_training_step_seconds:rate2m",
            rate_sum("gpufleet_training_step_seconds_total", NODE_STAGE, "2m") + " > 0",
        ),
        Record(
            node_baseline,
            f"{rate_sum('gpufleet_training_slowest_rank_compute_seconds_total', NODE_STAGE, base_w, base_o)}\n"
            f"/ {rate_sum('gpufleet_training_slowest_rank_steps_total', NODE_STAGE, base_w, base_o)}",
        ),
        Record(f"node:gpufleet_training_own_trend:rate{w}", f"{slow} / {node_baseline}"),
        # Relative to the whole job's median trend (all stages): a cluster-wide slowdown
        # cancels out, and a node alone in its stage still has a reference.
        Record(
            f"node:gpufleet_training_baseline_ratio:rate{w}",
            f"node:gpufleet_training_own_trend:rate{w}\n/ on (training_job) group_left ()\n"
            f"quantile by (training_job) (0.5, node:gpufleet_training_own_trend:rate{w})",
        ),
        # The job's steady step time, a low quantile of its 2-minute step times: in a
        # lock-step job every data-loader stall on any node stops all ranks for a minute
        # or two, several times an hour on a big job. A mean, or even a median when two
        # or three stalls fall in one window, reads that as a slowdown; the fastest
        # quarter of the window's 2-minute stretches only rises when all of them do.
        Record(
            "job:gpufleet_training_step_seconds:rate2m",
            f"{rate_sum('gpufleet_training_step_seconds_total', 'training_job', '2m')}\n"
            f"/ {rate_sum('gpufleet_training_steps_total', 'training_job', '2m')}",
        ),
        Record(
            steady,
            f"quantile_over_time({q}, job:gpufleet_training_step_seconds:rate2m[{steady_w}:1m])",
        ),
        Record(
            steady_baseline,
            f"quantile_over_time({q}, job:gpufleet_training_step_seconds:rate2m[{base_w}:1m] offset {base_o})",
        ),
        Record(
            "job:gpufleet_training_step_seconds:avg1h",
            f"{rate_sum('gpufleet_training_step_seconds_total', 'training_job', '1h')}\n"
            f"/ {rate_sum('gpufleet_training_steps_total', 'training_job', '1h')}",
        ),
        Record(
            f"node:gpufleet_training_data_wait_share:rate{config.data_wait_window}",
            f"{rate_sum('gpufleet_training_data_wait_seconds_total', NODE_STAGE, config.data_wait_window)}\n"
            f"/ {rate_sum('gpufleet_training_step_seconds_total', NODE_STAGE, config.data_wait_window)}",
        ),
        Record(
            f"stage:gpufleet_training_data_wait_share:median{config.data_wait_window}",
            f"quantile by ({STAGE}) (0.5, node:gpufleet_training_data_wait_share:rate{config.data_wait_window})",
        ),
    ]
    memory = config.hang_memory
    last_step = f"node:gpufleet_training_last_step_timestamp:max{memory}"
    finished = f"node:gpufleet_training_finished_timestamp:last{memory}"
    ends = [
        # For hang detection, remembered past the agent's job TTL (series vanish then).
        Record(
            last_step,
            f"max by ({NODE_STAGE}) (max_over_time("
            f"{metric('gpufleet_training_last_step_timestamp_seconds', config.agent_selector)}[{memory}]))",
        ),
        Record(
            finished,
            f"max by ({NODE_STAGE}) (last_over_time("
            f"{metric('gpufleet_training_finished_timestamp_seconds', config.agent_selector)}[{memory}]))",
        ),
        # The node-stages that stepped last in their job and have not finished since:
        # a job with none left ended; one with some left may have hung. Node-stages that
        # stopped long before the rest (a node excluded an attempt ago) do not count.
        Record(
            f"node:gpufleet_training_unfinished_last_step_timestamp:max{memory}",
            f"{last_step}\n  >= on (training_job) group_left ()\n"
            f"  (max by (training_job) ({last_step}) - {config.hang_min_seconds})\n"
            f"unless on ({NODE_STAGE}) ({finished} >= {last_step})",
        ),
    ]
    return [
        Group("gpufleet-training-peers", peers),
        Group("gpufleet-training-trends", [*trends, *ends]),
    ]


def training_alerts(config: RulesConfig) -> Group:
    w = config.rate_window
    steady, steady_baseline = job_steady_step(config)
    ratio = f"node:gpufleet_training_compute_ratio:rate{w}"
    zscore = f"node:gpufleet_training_compute_zscore:rate{w}"
    nodes = f"stage:gpufleet_training_nodes:count{w}"
    rank_ratio = f"node:gpufleet_training_rank_compute_ratio:max{w}"
    rank_z = f"node:gpufleet_training_rank_compute_zscore:max{w}"
    ranks = f"stage:gpufleet_training_ranks:count{w}"
    median = f"stage:gpufleet_training_slowest_compute_per_step:median{w}"
    last_step_memory = f"node:gpufleet_training_last_step_timestamp:max{config.hang_memory}"
    unfinished = f"node:gpufleet_training_unfinished_last_step_timestamp:max{config.hang_memory}"
    in_flight = metric("gpufleet_checkpoint_in_flight", config.agent_selector)
    share = f"node:gpufleet_training_data_wait_share:rate{config.data_wait_window}"
    share_median = f"stage:gpufleet_training_data_wait_share:median{config.data_wait_window}"
    rules: list[Record | Alert] = [
        Alert(
            "GpuFleetStragglerNode",
            f"(\n  (\n  {ratio} > {config.straggler_ratio}\n  and {zscore} > {config.straggler_zscore}\n"
            f"  and on ({STAGE}) ({nodes} >= {config.straggler_min_peers})\n  )\n  or (\n"
            f"  {rank_ratio} > {config.straggler_ratio}\n  and {rank_z} > {config.straggler_zscore}\n"
            f"  and on ({STAGE}) ({nodes} < {config.straggler_min_peers})\n"
            f"  and on ({STAGE}) ({ranks} >= {config.straggler_min_rank_peers})\n  )\n)\n"
            f"and on ({NODE_STAGE}) node:gpufleet_training_slowest_rank_steps:rate2m",
            "warning",
            "A node computes persistently slower than its peers in the same pipeline stage.",
            f'{JOB_NODE} computes {{{{ $value | printf "%.2f" }}}}x the median of its stage '
            f"peers, for {config.straggler_for}: in lock-step training it sets the pace for every rank. "
            "Check its GPUs' clocks and throttling; drain it and let the job continue without it.",
            config.straggler_for,
        ),
        Alert(
            "GpuFleetNodeSlowerThanBaseline",
            f"node:gpufleet_training_baseline_ratio:rate{w} > {config.baseline_ratio}\n"
            f"and on ({NODE_STAGE}) node:gpufleet_training_slowest_rank_steps:rate2m\n"
            f"unless on ({NODE_STAGE}) {ratio} > {config.straggler_ratio}",
            "warning",
            "A node computes slower than it did itself, relative to the rest of the job.",
            f'{JOB_NODE} computes {{{{ $value | printf "%.2f" }}}}x its own recent baseline '
            f"({config.baseline_window} ending {config.baseline_offset} ago), relative to the whole job. "
            "Check its GPUs' clocks and throttling.",
            config.baseline_for,
        ),
        Alert(
            "GpuFleetJobSlowdown",
            f"{steady}\n/ {steady_baseline} > {config.job_slowdown_ratio}\n"
            f"and on (training_job) count by (training_job) (node:gpufleet_training_step_seconds:rate2m)\n"
            # A straggler slows a lock-step job too; it has its own page, naming the node.
            f"unless on (training_job) max by (training_job) ({ratio}) > {config.straggler_ratio}",
            "warning",
            "A training job runs slower than its recent baseline (job-wide, not one node).",
            'Job {{ $labels.training_job }} takes {{ $value | printf "%.2f" }}x its recent '
            "step time across all nodes: a cluster-wide cause (network, storage, cooling, a "
            "communication fail-slow). No single node is slower than its peers.",
            config.job_slowdown_for,
        ),
        Alert(
            "GpuFleetStageImbalance",
            f"max by (training_job) ({median}) / min by (training_job) ({median}) > {config.stage_imbalance_ratio}",
            "info",
            "Pipeline stages of a job take noticeably different compute time.",
            "The slowest pipeline stage of job {{ $labels.training_job }} computes "
            '{{ $value | printf "%.2f" }}x the fastest: rebalance the layers across stages.',
            config.stage_imbalance_for,
        ),
        Alert(
            "GpuFleetJobHung",
            f"(time() - max by (training_job) ({last_step_memory}))\n"
            f"> on (training_job) clamp_min({config.hang_step_multiple} * job:gpufleet_training_step_seconds:avg1h, "
            f"{config.hang_min_seconds})\n"
            f"unless on (training_job) (sum by (training_job) ({in_flight}) > 0)\n"
            # A job whose last ranks all said they finished ended; it did not hang.
            f"and on (training_job) count by (training_job) ({unfinished})",
            "critical",
            "A training job has made no progress for many step times.",
            "Job {{ $labels.training_job }} has reported no step for {{ $value | humanizeDuration }}. "
            "Look for a failed or hung rank (NCCL timeout, network, a crashed process).",
            config.hang_for,
        ),
        Alert(
            "GpuFleetDataLoaderStall",
            f"{share} > {config.data_wait_share}\n"
            f"and {share} > on ({STAGE}) group_left {config.data_wait_peer_multiple} * {share_median}\n"
            f"and on ({NODE_STAGE}) node:gpufleet_training_step_seconds:rate2m",
            "warning",
            "One node's ranks keep waiting on the data loader.",
            f"{JOB_NODE} spends {{{{ $value | humanizePercentage }}}} of its steps waiting for data, "
            "far more than its peers: check its local disk, page cache, CPU and network to storage.",
            config.data_wait_for,
        ),
        # Job-level, so it lives with the training alerts: on a sharded setup it must
        # see every node of the job (docs/SCALING.md).
        Alert(
            "GpuFleetApplicationXid",
            f"count by (training_job, xid) (\n"
            f'  max by (node, xid) (gpu:gpufleet_gpu_xid_errors:new{config.xid_window} * on (xid) group_left gpufleet:xid_catalogue:info{{class="application"}})\n'
            f"  * on (node) group_left (training_job) max by (node, training_job) (gpufleet_training_ranks)\n)",
            "info",
            "GPUs of a training job reported XIDs that usually come from the application.",
            "{{ $value }} node(s) of job {{ $labels.training_job }} reported XID {{ $labels.xid }} "
            f"in {config.xid_window}: usually the application, not the hardware. Check the job's logs.",
        ),
    ]
    return Group("gpufleet-training-alerts", rules)


def checkpoint_groups(config: RulesConfig) -> list[Group]:
    sel = config.agent_selector
    w = config.checkpoint_window

    def rate_by(name: str, by: str, window: str = w, extra: str = "") -> str:
        return f"sum by ({by}) (rate({metric(name, sel, extra)}[{window}]))"

    queue, service = (
        "gpufleet_checkpoint_queue_wait_seconds_total",
        "gpufleet_checkpoint_service_seconds_total",
    )
    records: list[Record | Alert] = [
        Record(
            f"job:gpufleet_checkpoint_queue_share:rate{w}",
            f"{rate_by(queue, 'training_job')}\n/ ({rate_by(queue, 'training_job')} + {rate_by(service, 'training_job')})",
        ),
        Record(
            f"job:gpufleet_checkpoint_writers:count{w}",
            f"count by (training_job) (\n  sum by (training_job, node) (increase({metric('gpufleet_checkpoint_operations_total', sel)}[{w}])) > 0\n)",
        ),
        Record(
            "job:gpufleet_checkpoint_seconds_per_op:rate1h",
            f"({rate_by(queue, 'training_job, op', '1h')} + {rate_by(service, 'training_job, op', '1h')})\n"
            f"/ {rate_by('gpufleet_checkpoint_operations_total', 'training_job, op', '1h')}",
        ),
        Record(
            "job:gpufleet_checkpoint_queue_wait_per_op:rate1h",
            f"{rate_by(queue, 'training_job, op', '1h')}\n"
            f"/ {rate_by('gpufleet_checkpoint_operations_total', 'training_job, op', '1h')}",
        ),
        Record(
            "job:gpufleet_checkpoint_seconds_per_op:rate1d",
            f"({rate_by(queue, 'training_job, op', '1d')} + {rate_by(service, 'training_job, op', '1d')})\n"
            f"/ {rate_by('gpufleet_checkpoint_operations_total', 'training_job, op', '1d')}",
        ),
    ]
    alerts: list[Record | Alert] = [
        Alert(
            "GpuFleetCheckpointQueueBound",
            f"job:gpufleet_checkpoint_queue_share:rate{w} > {config.checkpoint_queue_share}\n"
            f"and on (training_job) job:gpufleet_checkpoint_writers:count{w} >= {config.checkpoint_min_writers}",
            "warning",
            "Checkpoints spend most of their time queued for storage, not writing.",
            "Checkpoints of job {{ $labels.training_job }} spent {{ $value | humanizePercentage }} of "
            "their time queued for storage: the storage, not the writers, is the bottleneck. "
            "Stagger the writers or add storage bandwidth.",
            config.checkpoint_queue_for,
        ),
        Alert(
            "GpuFleetCheckpointSlow",
            f'job:gpufleet_checkpoint_seconds_per_op:rate1h{{op="save"}} > {config.checkpoint_save_budget_s:g}',
            "warning",
            "Checkpoint saves take longer than their budget.",
            "Checkpoint saves of job {{ $labels.training_job }} take {{ $value | humanizeDuration }} "
            f"each (budget {config.checkpoint_save_budget_s:g} s): every save stalls the whole job.",
        ),
        Alert(
            "GpuFleetRestoreSlow",
            f'job:gpufleet_checkpoint_seconds_per_op:rate1h{{op="restore"}} > {config.checkpoint_restore_budget_s:g}',
            "warning",
            "Checkpoint restores take longer than their budget.",
            "Restores of job {{ $labels.training_job }} take {{ $value | humanizeDuration }} each "
            f"(budget {config.checkpoint_restore_budget_s:g} s): every recovery is that much longer.",
        ),
    ]
    return [
        Group("gpufleet-checkpoint-recording", records),
        Group("gpufleet-checkpoint-alerts", alerts),
    ]


def reliability_groups(config: RulesConfig) -> list[Group]:
    sel = config.fleet_selector
    exclusions = metric("gpufleet_fleet_node_exclusions_total", sel)
    failed = metric("gpufleet_fleet_job_attempts_total", sel, 'outcome="failed"')

    def since(series: str, window: str) -> str:
        # Series the ledger creates at the first event count in full.
        return f"({series} - ({series} offset {window} or {series} * 0))"

    week, month = config.repeat_offender_window, "30d"
    records: list[Record | Alert] = [
        Record(
            f"node:gpufleet_fleet_exclusions:increase{week}",
            f"sum by (node) {since(exclusions, week)}",
        ),
        Record(
            f"node:gpufleet_fleet_exclusions:increase{month}",
            f"sum by (node) {since(exclusions, month)}",
        ),
        Record(
            f"fleet:gpufleet_fleet_exclusions:increase{month}",
            f"sum(node:gpufleet_fleet_exclusions:increase{month})",
        ),
        Record(
            f"fleet:gpufleet_fleet_exclusions:top3_share{month}",
            f"sum(topk(3, node:gpufleet_fleet_exclusions:increase{month}))\n/ fleet:gpufleet_fleet_exclusions:increase{month}",
        ),
        Record(
            f"fleet:gpufleet_node_mtbf_hours:{month}",
            f"count(max by (instance) ({metric('up', config.agent_selector)})) * 720\n/ fleet:gpufleet_fleet_exclusions:increase{month}",
        ),
        Record(
            f"job:gpufleet_job_mtbf_hours:{month}",
            f"720 / sum by (training_job) {since(failed, month)}",
        ),
        Record(
            f"job:gpufleet_checkpoint_interval_young_daly_seconds:{month}",
            f'sqrt(2 * job:gpufleet_checkpoint_seconds_per_op:rate1d{{op="save"}}\n'
            f"  * on (training_job) group_left job:gpufleet_job_mtbf_hours:{month} * 3600)",
        ),
    ]
    fleet_up = metric("up", sel)
    if config.ledger_presence == "seen":
        records.append(Record(targets_record("ledger"), f"count({fleet_up})"))
    ledger_missing = targets_missing(config, "ledger", sel)
    alerts: list[Record | Alert] = [
        Alert(
            "GpuFleetRepeatOffenderNode",
            f"node:gpufleet_fleet_exclusions:increase{week} >= {config.repeat_offender_exclusions}",
            "warning",
            "A node was excluded repeatedly within a week.",
            f"{{{{ $labels.node }}}} was excluded {{{{ $value }}}} times in {week}: failures concentrate "
            "on a few nodes. Take it out for a full diagnostic (dcgmi diag -r 3) or RMA before it "
            "returns to jobs.",
        ),
        Alert(
            "GpuFleetExclusionConcentration",
            f"fleet:gpufleet_fleet_exclusions:top3_share{month} > {config.concentration_share}\n"
            f"and on () fleet:gpufleet_fleet_exclusions:increase{month} >= {config.concentration_min_exclusions}",
            "info",
            "A few nodes cause most of the fleet's exclusions.",
            f"The top 3 nodes caused {{{{ $value | humanizePercentage }}}} of all exclusions in {month}: "
            "fixing or retiring them is the cheapest reliability win. See gpufleet exclusions top.",
        ),
        Alert(
            "GpuFleetRetryChainFailing",
            f"max by (training_job) ({metric('gpufleet_fleet_retry_chain_failed_attempts', sel)})"
            f" >= {config.retry_chain_failed_attempts}",
            "critical",
            "Automatic retries of a job keep failing.",
            "Job {{ $labels.training_job }} failed {{ $value }} automatic retries in a row: the "
            "retry loop is not recovering it. Find the node or change that breaks it, then restart by hand.",
        ),
        Alert(
            "GpuFleetLedgerDown",
            f"{fleet_up} == 0",
            "warning",
            "The fleet ledger does not answer.",
            "The fleet ledger ({{ $labels.instance }}) has not answered for "
            f"{config.ledger_down_for}: exclusions and job attempts are not being recorded.",
            config.ledger_down_for,
        ),
    ]
    if ledger_missing is not None:
        alerts.append(
            Alert(
                "GpuFleetLedgerTargetMissing",
                ledger_missing,
                "warning",
                "Prometheus scrapes no fleet ledger.",
                f"No target of {sel} has been scraped for {config.targets_missing_for}. "
                f"{presence_note(config, 'ledger')} Reliability alerts (repeat offenders, "
                "failing retries) cannot fire ({{ $value }} target(s) before).",
                config.targets_missing_for,
            )
        )
    return [
        Group("gpufleet-reliability-recording", records),
        Group("gpufleet-reliability-alerts", alerts),
    ]


# Where the rule files run when scraping is sharded (docs/SCALING.md). gpu.rules.yaml
# works per GPU and per node: each shard Prometheus evaluates it on its own nodes,
# next to the bulk of the data. Every other file compares nodes of a job with each
# other (stage medians, job step time) or reads the ledger, and runs once, on a
# ruler that sees every node (vmalert, Thanos Ruler, Mimir's ruler).
SHARD_LOCAL_FILES = frozenset({"gpu"})


def rule_files(config: RulesConfig | None = None) -> list[RuleFile]:
    config = config or RulesConfig()
    return [
        RuleFile("gpu", [xid_catalogue_group(), gpu_recording(config), gpu_alerts(config)]),
        RuleFile("node", [health_recording(config), node_alerts(config)]),
        RuleFile("training", [*training_recording(config), training_alerts(config)]),
        RuleFile("checkpoint", checkpoint_groups(config)),
        RuleFile("reliability", reliability_groups(config)),
        RuleFile("dashboards", [dashboard_support_group(config)]),
    ]


def as_document(rule_file: RuleFile, config: RulesConfig) -> dict[str, Any]:
    return {
        "groups": [
            {
                "name": group.name,
                **({"interval": group.interval} if group.interval else {}),
                "rules": [
                    rule.as_dict(config) if isinstance(rule, Alert) else rule.as_dict()
                    for rule in group.rules
                ],
            }
            for group in rule_file.groups
        ]
    }


# -- dashboard support ---------------------------------------------------------------------
# Recorded only for dashboards/ (exporter/gpufleet/dashboards/): what a panel would
# otherwise compute over every GPU or every node on each refresh. No alert reads them.
def dashboard_support_group(config: RulesConfig) -> Group:
    gpus, agent, fleet = config.gpu_selector, config.agent_selector, config.fleet_selector
    w = config.rate_window
    month = "30d"
    ckpt_by = "training_job, node, op"
    exclusions = metric("gpufleet_fleet_node_exclusions_total", fleet)
    saves = metric("gpufleet_checkpoint_operations_total", agent, 'op="save"')
    phases = "\n  or ".join(
        f"label_replace(rate({metric(f'gpufleet_training_{name}_seconds_total', agent)}[{w}]), "
        f'"phase", "{phase}", "", "")'
        for phase, name in (
            ("compute", "compute"),
            ("collective_wait", "collective_wait"),
            ("data_wait", "data_wait"),
        )
    )
    rules: list[Record | Alert] = [
        # Which node each GPU is on, whichever exporter and label spelling: the node
        # dashboard selects a node's GPUs by UUID through it. gpufleet_gpu_up keeps a
        # lost GPU (no more readings) on its node.
        Record(
            "gpu:gpufleet_gpu_node:info",
            f"group by (node, gpu, UUID) (\n  {with_node(metric('gpufleet_gpu_up', gpus) + ' or ' + metric('DCGM_FI_DEV_GPU_TEMP', gpus), config.node_labels)}\n)",
        ),
        Record(
            "node:gpufleet_gpus_reporting:count",
            f"count by (node) (\n  {with_node(metric('DCGM_FI_DEV_GPU_TEMP', gpus), config.node_labels)}\n)",
        ),
        Record("fleet:DCGM_FI_DEV_GPU_UTIL:avg", f"avg({metric('DCGM_FI_DEV_GPU_UTIL', gpus)})"),
        Record(
            "fleet:DCGM_FI_DEV_POWER_USAGE:sum", f"sum({metric('DCGM_FI_DEV_POWER_USAGE', gpus)})"
        ),
        Record(
            f"node:gpufleet_training_phase_seconds_per_step:rate{w}",
            f"sum by ({NODE_STAGE}, phase) (\n  {phases}\n)\n"
            f"/ on ({NODE_STAGE}) group_left ()\n"
            f"sum by ({NODE_STAGE}) (rate({metric('gpufleet_training_steps_total', agent)}[{w}]))",
        ),
        Record(
            f"reason:gpufleet_fleet_exclusions:increase{month}",
            f"sum by (reason) ({exclusions} - ({exclusions} offset {month} or {exclusions} * 0))",
        ),
        # Per node: seconds per checkpoint operation (queued + served) and bytes/s; what
        # the checkpoint dashboard draws for every node of a job.
        Record(
            f"node:gpufleet_checkpoint_seconds_per_op:rate{w}",
            f"(\n  sum by ({ckpt_by}) (rate({metric('gpufleet_checkpoint_queue_wait_seconds_total', agent)}[{w}]))\n"
            f"  + sum by ({ckpt_by}) (rate({metric('gpufleet_checkpoint_service_seconds_total', agent)}[{w}]))\n)\n"
            f"/ sum by ({ckpt_by}) (rate({metric('gpufleet_checkpoint_operations_total', agent)}[{w}]))",
        ),
        Record(
            f"node:gpufleet_checkpoint_bytes:rate{w}",
            f"sum by ({ckpt_by}) (rate({metric('gpufleet_checkpoint_bytes_total', agent)}[{w}]))",
        ),
        # Seconds between a node's saves, averaged over the job's saving nodes. Each rank
        # that writes its shard counts one operation, so saves are per rank of the node.
        Record(
            "job:gpufleet_checkpoint_interval_seconds:rate1h",
            f"1 / avg by (training_job) (\n  sum by (training_job, node) (rate({saves}[1h]))\n"
            f"  / max by (training_job, node) ({metric('gpufleet_training_ranks', agent)}) > 0\n)",
        ),
    ]
    return Group("gpufleet-dashboard-support", rules)
