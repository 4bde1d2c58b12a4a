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

# node_exporter's network bytes (its infiniband and netdev collectors), which the job
# layout panels set beside each node's NVLink bytes: tensor parallelism across nodes
# shows as sustained network traffic. Its node is in `instance` (host:port).
_NODE_EXPORTER = ("instance", "job", "device")
NODE_INFINIBAND_TRANSMITTED = MetricDef(
    "node_infiniband_port_data_transmitted_bytes_total",
    "counter",
    "Number of data octets transmitted on all links",
    (*_NODE_EXPORTER, "port"),
)
NODE_INFINIBAND_RECEIVED = MetricDef(
    "node_infiniband_port_data_received_bytes_total",
    "counter",
    "Number of data octets received on all links",
    (*_NODE_EXPORTER, "port"),
)
NODE_NETWORK_TRANSMIT = MetricDef(
    "node_network_transmit_bytes_total",
    "counter",
    "Network device statistic transmit_bytes.",
    _NODE_EXPORTER,
)
NODE_NETWORK_RECEIVE = MetricDef(
    "node_network_receive_bytes_total",
    "counter",
    "Network device statistic receive_bytes.",
    _NODE_EXPORTER,
)
NODE_EXPORTER_FAMILIES = (
    NODE_INFINIBAND_TRANSMITTED,
    NODE_INFINIBAND_RECEIVED,
    NODE_NETWORK_TRANSMIT,
    NODE_NETWORK_RECEIVE,
)

# dcgm-exporter names the rules read where the agent exposes its own equivalent. Its XID
# count per code (the agent's is gpufleet_gpu_xid_errors_total). A gauge: it is
# the number of XIDs within a sliding window (internal/pkg/collector/expcollector.go
# counts the values since now - window), so it falls as XIDs age out. dcgm-exporter
# serves it under the type its counters file gives; gpufleet's file says gauge.
XID_ERRORS_COUNT = MetricDef(
    "DCGM_EXP_XID_ERRORS_COUNT",
    "gauge",
    "Count of XID errors within the user-specified time window, per XID code.",
    ("xid",),
)
# NVML's recommended recovery action (NVML_FI_DEV_GET_GPU_RECOVERY_ACTION) as DCGM field
# 1523 (dcgm_fields.h: DCGM_FI_DEV_GPU_RECOVERY_ACTION, DCGM_FI_DEV_GET_GPU_RECOVERY_ACTION
# its older name); the agent exports it as gpufleet_gpu_recovery_action.
GPU_RECOVERY_ACTION = MetricDef(
    "DCGM_FI_DEV_GPU_RECOVERY_ACTION",
    "gauge",
    "GPU recovery action (nvmlDeviceGpuRecoveryAction_t: 0 none, 1 GPU reset, 2 node reboot, "
    "3 drain P2P, 4 drain and reset).",
)
GET_GPU_RECOVERY_ACTION = MetricDef(
    "DCGM_FI_DEV_GET_GPU_RECOVERY_ACTION",
    "gauge",
    "GPU recovery action (the older name of DCGM_FI_DEV_GPU_RECOVERY_ACTION).",
)
DCGM_EXPORTER_ONLY = (XID_ERRORS_COUNT, GPU_RECOVERY_ACTION, GET_GPU_RECOVERY_ACTION)
