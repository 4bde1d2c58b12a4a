"""Node rules: agents and GPU exporters that stop answering, scrape targets that vanish,
telemetry that collapses, and the node health page."""

from __future__ import annotations

from gpufleet.rules.common import Alert, Record, RuleGroup, agent_node, metric
from gpufleet.rules.config import RulesConfig
from gpufleet.rules.gpu import GpuSeries
from gpufleet.rules.health import HEALTH_SCORE
from gpufleet.rules.presence import presence_note, targets_missing
from gpufleet.schema.alerts import AlertName


def node_alerts(config: RulesConfig) -> RuleGroup:
    agent_up = metric("up", config.agent_selector)
    node_up = f'label_replace({agent_up}, "node", "$1", "instance", "([^:]+).*")'
    excluded = metric("gpufleet_fleet_node_excluded", config.fleet_selector)
    quiet = config.excluded_quiet_after
    quietly_excluded = (
        f"unless on (node) (max by (node) ({excluded} == 1) and on (node) max by (node) "
        f"({excluded} offset {quiet} == 1))"
    )
    collapsed = agent_node(
        config, metric("gpufleet_collector_up", config.agent_selector, 'collector="gpu"') + " == 0"
    )
    dcgm_count, dcgm_max = GpuSeries.of(config).dcgm_gpus, GpuSeries.of(config).dcgm_gpus_max
    rules: list[Record | Alert] = [
        Alert(
            AlertName.AGENT_DOWN,
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
            AlertName.GPU_EXPORTER_DOWN,
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
            AlertName.TELEMETRY_COLLAPSE,
            collapsed,
            "critical",
            "A node's GPU telemetry collapsed: NVML no longer answers.",
            "NVML on {{ $labels.node }} has not completed a collection for too long, so its GPU "
            "values are no longer served: the driver is wedged. Drain the node and reboot it.",
            config.telemetry_collapse_for,
        ),
        *_targets_missing_alerts(config),
        Alert(
            AlertName.NODE_HEALTH,
            f"{HEALTH_SCORE} >= {config.health_threshold}",
            "warning",
            "Several weak warning signs on one node at once.",
            "{{ $labels.node }} shows several weak warning signs together (health score "
            "{{ $value }}): the Node dashboard's 'Health score and its signals' panel shows which. "
            "Drain and test it.",
            config.health_for,
        ),
    ]
    return RuleGroup("gpufleet-node-alerts", rules)


def _targets_missing_alerts(config: RulesConfig) -> list[Record | Alert]:
    alerts: list[Record | Alert] = []
    gpu = targets_missing(config, "gpu", config.gpu_selector)
    if gpu is not None:
        alerts.append(
            Alert(
                AlertName.GPU_TARGETS_MISSING,
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
                AlertName.AGENT_TARGETS_MISSING,
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
