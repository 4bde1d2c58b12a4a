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

# dcgm-exporter names the rules read where the agent exposes its own equivalent:
# its XID count per code (the agent's is gpufleet_gpu_xid_errors_total) and the 4.x
# name of the throttle bitmask (the agent keeps the older DCGM_FI_DEV_CLOCK_THROTTLE_REASONS).
XID_ERRORS_COUNT = MetricDef(
    "DCGM_EXP_XID_ERRORS_COUNT",
    "gauge",
    "Count of XID errors within the user-specified time window, per XID code.",
    ("xid",),
)
CLOCKS_EVENT_REASONS = MetricDef(
    "DCGM_FI_DEV_CLOCKS_EVENT_REASONS",
    "gauge",
    "Current clock event (throttle) reasons, a bitmask (dcgm-exporter 4.x's name).",
)
DCGM_EXPORTER_ONLY = (XID_ERRORS_COUNT, CLOCKS_EVENT_REASONS)
