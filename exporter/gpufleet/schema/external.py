"""Series gpufleet's rules and dashboards read that something else produces.

Prometheus itself writes ``up`` per target and ``ALERTS`` / ``ALERTS_FOR_STATE``
per alert; dcgm-exporter (when the agent runs beside it, or instead of it) has a
few names the agent does not expose.
"""

from __future__ import annotations

from gpufleet.schema.family import MetricDef

UP = MetricDef("up", "gauge", "Whether the node's agent answered its scrape.", ("instance", "job"))
ALERTS = MetricDef(
    "ALERTS",
    "gauge",
    "Alerts pending or firing (written by Prometheus).",
    ("alertname", "alertstate"),
)
ALERTS_FOR_STATE = MetricDef(
    "ALERTS_FOR_STATE",
    "gauge",
    "When each pending or firing alert became active (written by Prometheus).",
    ("alertname",),
)
PROMETHEUS_FAMILIES = (UP, ALERTS, ALERTS_FOR_STATE)
