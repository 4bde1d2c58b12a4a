"""Every per-GPU family the agent exports, with dcgm-exporter's names and units.

Names, types and units follow DCGM (``dcgmlib/dcgm_fields.h``, and how
``dcgmlib/src/DcgmCacheManager.cpp`` computes each field) and dcgm-exporter
(``etc/default-counters.csv``), so existing dashboards and rules keep working;
``tests/test_dcgm_agent_dropin.py`` holds the field-by-field table. What DCGM has
no field for lives under the ``gpufleet_`` prefix.
"""

from __future__ import annotations

from gpufleet.schema.family import MetricDef

# dcgm-exporter's identifying label set, in its order. Every released dcgm-exporter
# names the node `Hostname`; its main branch `hostname`: the agent's --node-label.
GPU_LABELS = ("gpu", "UUID", "pci_bus_id", "device", "modelName", "Hostname")
NODE_LABEL = "Hostname"
# dcgm-exporter's stock counters turn the driver version into a label on every series.
DRIVER_LABEL = "DCGM_FI_DRIVER_VERSION"
# Every per-GPU series carries these (the node label under its configured name).
SERIES_LABELS = (*GPU_LABELS, DRIVER_LABEL)
# A node's GPU counts carry only the node and the driver.
HOST_LABELS = (NODE_LABEL, DRIVER_LABEL)
# dcgm-exporter's labels of a MIG instance's series. Its template
# (internal/pkg/rendermetrics/render_metrics.go) writes them after modelName and
# before the node label: gpu, UUID, pci_bus_id, device, modelName, GPU_I_PROFILE,
# GPU_I_ID, Hostname. GPU_I_ID is NVML's GPU instance id (DCGM's NvmlInstanceId),
# GPU_I_PROFILE the instance's profile name ("1g.10gb").
MIG_PROFILE_LABEL = "GPU_I_PROFILE"
MIG_INSTANCE_LABEL = "GPU_I_ID"
# On every per-GPU series while known (gpu/attribution.py), sorted in after the driver
# label as dcgm-exporter writes them: the pod holding the GPU, the Slurm job mapped to it.
CONTAINER_LABEL = "container"
HPC_JOB_LABEL = "hpc_job"
NAMESPACE_LABEL = "namespace"
POD_LABEL = "pod"
ATTRIBUTION_LABELS = (CONTAINER_LABEL, HPC_JOB_LABEL, NAMESPACE_LABEL, POD_LABEL)
# What a per-GPU series may carry beyond SERIES_LABELS: a MIG instance's, its tenant's.
_GPU_OPTIONAL_LABELS = (MIG_PROFILE_LABEL, MIG_INSTANCE_LABEL, *ATTRIBUTION_LABELS)


def _g(name: str, help_text: str, *extra: str) -> MetricDef:
    return MetricDef(name, "gauge", help_text, (*SERIES_LABELS, *extra), _GPU_OPTIONAL_LABELS)


def _c(name: str, help_text: str, *extra: str) -> MetricDef:
    return MetricDef(name, "counter", help_text, (*SERIES_LABELS, *extra), _GPU_OPTIONAL_LABELS)


SM_CLOCK = _g("DCGM_FI_DEV_SM_CLOCK", "SM clock frequency (in MHz).")
MEM_CLOCK = _g("DCGM_FI_DEV_MEM_CLOCK", "Memory clock frequency (in MHz).")
GPU_TEMP = _g("DCGM_FI_DEV_GPU_TEMP", "GPU temperature (in C).")
MEMORY_TEMP = _g("DCGM_FI_DEV_MEMORY_TEMP", "Memory temperature (in C).")
POWER_USAGE = _g("DCGM_FI_DEV_POWER_USAGE", "Power draw (in W).")
TOTAL_ENERGY = _c(
    "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", "Total energy consumption since boot (in mJ)."
)
GPU_UTIL = _g("DCGM_FI_DEV_GPU_UTIL", "GPU utilization (in %).")
MEM_COPY_UTIL = _g("DCGM_FI_DEV_MEM_COPY_UTIL", "Memory utilization (in %).")
ENC_UTIL = _g("DCGM_FI_DEV_ENC_UTIL", "Encoder utilization (in %).")
DEC_UTIL = _g("DCGM_FI_DEV_DEC_UTIL", "Decoder utilization (in %).")
VGPU_LICENSE_STATUS = _g(
    "DCGM_FI_DEV_VGPU_LICENSE_STATUS",
    "vGPU License status (1 licensed; 0 not licensed, or no vGPU licensing: bare metal).",
)
FB_FREE = _g("DCGM_FI_DEV_FB_FREE", "Framebuffer memory free (in MiB).")
FB_USED = _g("DCGM_FI_DEV_FB_USED", "Framebuffer memory used (in MiB).")
FB_RESERVED = _g("DCGM_FI_DEV_FB_RESERVED", "Framebuffer memory reserved (in MiB).")
PCIE_REPLAY = _c("DCGM_FI_DEV_PCIE_REPLAY_COUNTER", "Total number of PCIe retries.")
PCIE_TX = _g(
    "DCGM_FI_PROF_PCIE_TX_BYTES",
    "The rate of data transmitted over the PCIe bus, including protocol headers and "
    "data payloads (in bytes per second, averaged over the sample interval by NVML GPM; "
    "on GPUs without GPM, NVML's 20 ms PCIe throughput sample).",
)
PCIE_RX = _g(
    "DCGM_FI_PROF_PCIE_RX_BYTES",
    "The rate of data received over the PCIe bus, including protocol headers and "
    "data payloads (in bytes per second, averaged over the sample interval by NVML GPM; "
    "on GPUs without GPM, NVML's 20 ms PCIe throughput sample).",
)
ECC_SBE_VOL = _c("DCGM_FI_DEV_ECC_SBE_VOL_TOTAL", "Total number of single-bit volatile ECC errors.")
ECC_DBE_VOL = _c("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", "Total number of double-bit volatile ECC errors.")
ECC_SBE_AGG = _c(
    "DCGM_FI_DEV_ECC_SBE_AGG_TOTAL", "Total number of single-bit persistent ECC errors."
)
ECC_DBE_AGG = _c(
    "DCGM_FI_DEV_ECC_DBE_AGG_TOTAL", "Total number of double-bit persistent ECC errors."
)
RETIRED_SBE = _c(
    "DCGM_FI_DEV_RETIRED_SBE", "Total number of retired pages due to single-bit errors."
)
RETIRED_DBE = _c(
    "DCGM_FI_DEV_RETIRED_DBE", "Total number of retired pages due to double-bit errors."
)
RETIRED_PENDING = _g(
    "DCGM_FI_DEV_RETIRED_PENDING", "Whether pages are pending retirement (1) or not (0)."
)
CORRECTABLE_REMAPPED_ROWS = _c(
    "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS", "Number of remapped rows for correctable errors."
)
UNCORRECTABLE_REMAPPED_ROWS = _c(
    "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS", "Number of remapped rows for uncorrectable errors."
)
ROW_REMAP_FAILURE = _g("DCGM_FI_DEV_ROW_REMAP_FAILURE", "Whether remapping of rows has failed.")
ROW_REMAP_PENDING = _g(
    "DCGM_FI_DEV_ROW_REMAP_PENDING",
    "Whether a row remap is pending (the GPU must be reset for it to take effect).",
)
NVLINK_CRC_FLIT = _c(
    "DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL",
    "Total number of NVLink flow-control CRC errors.",
)
NVLINK_CRC_DATA = _c(
    "DCGM_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL", "Total number of NVLink data CRC errors."
)
NVLINK_REPLAY = _c("DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL", "Total number of NVLink retries.")
NVLINK_RECOVERY = _c(
    "DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL", "Total number of NVLink recovery errors."
)
# NVLink5 (Blackwell) and Hopper error counters: DCGM fields 1211-1220, each the
# aggregate over all links. NVML refuses them where the NVLink generation lacks them.
NVLINK_ECC_ERRORS = _c(
    "DCGM_FI_DEV_NVLINK_ECC_ERROR_TOTAL", "Total number of NVLink data ECC errors, all links."
)
NVLINK_RECOVERY_SUCCESSFUL = _c(
    "DCGM_FI_DEV_NVLINK_RECOVERY_SUCCESSFUL_TOTAL",
    "Number of times a link went from up to recovery and came back up, all links (NVLink5).",
)
NVLINK_RECOVERY_FAILED = _c(
    "DCGM_FI_DEV_NVLINK_RECOVERY_FAILED_TOTAL",
    "Number of times a link went from up to recovery, failed and was declared down, all "
    "links (NVLink5).",
)
NVLINK_RECOVERY_EVENTS = _c(
    "DCGM_FI_DEV_NVLINK_RECOVERY_EVENT_TOTAL",
    "Number of times a link went from up to recovery, whatever the result, all links (NVLink5).",
)
NVLINK_SYMBOL_ERRORS = _c(
    "DCGM_FI_DEV_NVLINK_RX_SYMBOL_ERROR_TOTAL",
    "Number of errors in received symbols, all links (NVLink5).",
)
NVLINK_EFFECTIVE_ERRORS = _c(
    "DCGM_FI_DEV_NVLINK_EFFECTIVE_ERROR_TOTAL",
    "Sum of the number of errors in each NVLink packet, all links (NVLink5).",
)
NVLINK_BANDWIDTH = _g(
    "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL",
    "NVLink data throughput over all links, TX plus RX, without protocol overhead (in MB/s: "
    "KiB per second / 1000, between two samples, as DCGM computes field 449).",
)
CLOCK_THROTTLE_REASONS = _g(
    "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS",
    "Current clock throttle reasons (bitmask of nvmlClocksEventReason* values).",
)
CLOCKS_EVENT_REASONS = _g(
    "DCGM_FI_DEV_CLOCKS_EVENT_REASONS",
    "Current clock event (throttle) reasons (bitmask of nvmlClocksEventReason* values; "
    "dcgm-exporter 4.x's name for DCGM_FI_DEV_CLOCK_THROTTLE_REASONS, the same DCGM field).",
)
POWER_VIOLATION = _c(
    "DCGM_FI_DEV_POWER_VIOLATION", "Throttling duration due to power constraints (in ns)."
)
THERMAL_VIOLATION = _c(
    "DCGM_FI_DEV_THERMAL_VIOLATION", "Throttling duration due to thermal constraints (in ns)."
)
GR_ENGINE_ACTIVE = _g(
    "DCGM_FI_PROF_GR_ENGINE_ACTIVE", "Ratio of time the graphics engine is active (NVML GPM)."
)
SM_ACTIVE = _g(
    "DCGM_FI_PROF_SM_ACTIVE", "The ratio of cycles an SM has at least 1 warp assigned (NVML GPM)."
)
SM_OCCUPANCY = _g(
    "DCGM_FI_PROF_SM_OCCUPANCY", "The ratio of number of warps resident on an SM (NVML GPM)."
)
PIPE_TENSOR_ACTIVE = _g(
    "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", "Ratio of cycles any tensor pipe is active (NVML GPM)."
)
DRAM_ACTIVE = _g(
    "DCGM_FI_PROF_DRAM_ACTIVE",
    "Ratio of cycles the device memory interface is active sending or receiving data (NVML GPM).",
)
RECOVERY_ACTION = _g(
    "gpufleet_gpu_recovery_action",
    "NVML's recommended recovery action: 0 none, 1 GPU reset, 2 node reboot, 3 drain P2P, "
    "4 drain and reset, 5 recover IMEX domain, 6 bus reset, 7 system reboot.",
)

# Order of appearance in /metrics.
VALUE_METRICS: tuple[MetricDef, ...] = (
    SM_CLOCK,
    MEM_CLOCK,
    GPU_TEMP,
    MEMORY_TEMP,
    POWER_USAGE,
    TOTAL_ENERGY,
    GPU_UTIL,
    MEM_COPY_UTIL,
    ENC_UTIL,
    DEC_UTIL,
    VGPU_LICENSE_STATUS,
    FB_FREE,
    FB_USED,
    FB_RESERVED,
    PCIE_REPLAY,
    PCIE_TX,
    PCIE_RX,
    ECC_SBE_VOL,
    ECC_DBE_VOL,
    ECC_SBE_AGG,
    ECC_DBE_AGG,
    RETIRED_SBE,
    RETIRED_DBE,
    RETIRED_PENDING,
    CORRECTABLE_REMAPPED_ROWS,
    UNCORRECTABLE_REMAPPED_ROWS,
    ROW_REMAP_FAILURE,
    ROW_REMAP_PENDING,
    NVLINK_CRC_FLIT,
    NVLINK_CRC_DATA,
    NVLINK_REPLAY,
    NVLINK_RECOVERY,
    NVLINK_ECC_ERRORS,
    NVLINK_RECOVERY_SUCCESSFUL,
    NVLINK_RECOVERY_FAILED,
    NVLINK_RECOVERY_EVENTS,
    NVLINK_SYMBOL_ERRORS,
    NVLINK_EFFECTIVE_ERRORS,
    NVLINK_BANDWIDTH,
    CLOCK_THROTTLE_REASONS,
    CLOCKS_EVENT_REASONS,
    POWER_VIOLATION,
    THERMAL_VIOLATION,
    GR_ENGINE_ACTIVE,
    SM_ACTIVE,
    SM_OCCUPANCY,
    PIPE_TENSOR_ACTIVE,
    DRAM_ACTIVE,
    RECOVERY_ACTION,
)

# One flag per clock-event (throttle) reason: reason label -> NVML bit.
THROTTLE_REASON_BITS: tuple[tuple[str, int], ...] = (
    ("gpu_idle", 0x1),
    ("applications_clocks_setting", 0x2),
    ("sw_power_cap", 0x4),
    ("hw_slowdown", 0x8),
    ("sync_boost", 0x10),
    ("sw_thermal_slowdown", 0x20),
    ("hw_thermal_slowdown", 0x40),
    ("hw_power_brake_slowdown", 0x80),
    ("display_clock_setting", 0x100),
)

# The families DCGM has no field for, under the gpufleet_ prefix.
THROTTLE_ACTIVE = _g(
    "gpufleet_gpu_clock_throttle_active",
    "1 while the GPU's clocks are held down for this reason: a series only for the "
    "reasons in effect (the clock-event bitmask holds every bit).",
    "reason",
)
GPU_UP = _g(
    "gpufleet_gpu_up",
    "1 if NVML answers for this GPU; 0 if it is lost, unreachable or NVML is hung.",
)
GPU_INFO = _g(
    "gpufleet_gpu_info",
    "Descriptive facts about each GPU, as labels; the value is always 1.",
    "driver_version",
    "cuda_driver_version",
)
GPUS_EXPECTED = MetricDef(
    "gpufleet_gpus_expected",
    "gauge",
    "GPUs this node should have: the configured count, or as many as were first seen.",
    HOST_LABELS,
)
GPUS_SEEN = MetricDef(
    "gpufleet_gpus_seen", "gauge", "GPUs NVML currently answers for.", HOST_LABELS
)
FIELDS_UNSUPPORTED = MetricDef(
    "gpufleet_gpu_fields_unsupported",
    "gauge",
    "Number of GPUs on which NVML reports this field unsupported; it is omitted for them.",
    (*HOST_LABELS, "field"),
)
# nvmlDeviceGetGpuFabricInfoV (nvml.h, nvmlGpuFabricInfo_v2_t): GPUs whose fabric
# registration completed with the same cluster UUID and clique id share one NVLink domain
# (what NCCL checks before it uses multi-node NVLink). Where NVML answers NOT_SUPPORTED
# (no NVLink fabric: PCIe GPUs, HGX without a multi-node fabric) there is no series and
# gpufleet_gpu_fields_unsupported counts the GPU under this name.
GPU_FABRIC_INFO = _g(
    "gpufleet_gpu_fabric_info",
    "The GPU's NVLink fabric as NVML reports it: cluster UUID and clique id (set while the "
    "registration state is completed; GPUs sharing both share an NVLink domain); the value "
    "is always 1.",
    "cluster_uuid",
    "clique_id",
    "state",
)
# The fabric registration states as the state label writes them (nvmlGpuFabricState_t;
# "failed": completed with an error status).
FABRIC_STATES = ("not_started", "in_progress", "completed", "failed")
# err_msg: dcgm-exporter's text for the code (gpu/xid_catalogue.py, DCGM_MESSAGES).
XID_LAST = _g(
    "DCGM_FI_DEV_XID_ERRORS", "Value of the last XID error encountered.", "err_code", "err_msg"
)
# An XID NVML attributes to a MIG GPU instance is counted on the GPU's series with that
# instance's GPU_I_ID (and its pod, where one holds it): gpu/xid.py, gpu/render.py.
XID_TOTAL = _c(
    "gpufleet_gpu_xid_errors_total",
    "XID errors reported by the driver, per XID code (from NVML's event stream).",
    "xid",
)
XID_LAST_TIMESTAMP = _g(
    "gpufleet_gpu_last_xid_timestamp_seconds", "Unix time of the last XID error on this GPU."
)

# What a join series may add to the labels declared below.
_ALLOCATION_OPTIONAL_LABELS = (MIG_PROFILE_LABEL, MIG_INSTANCE_LABEL, "training_job")

# Join series (gpu/render.py's allocation_families): who holds a GPU, as few labels as
# identify it, so a rule adds pod or job labels with `* on (Hostname, gpu, UUID)
# group_left (namespace, pod) gpufleet_gpu_allocation_info`. A MIG instance's series add
# GPU_I_PROFILE and GPU_I_ID (job_info: GPU_I_ID), allocation_info adds training_job
# when a training client in that pod reports to the agent; the labels below are those
# every series has.
ALLOCATION_INFO = MetricDef(
    "gpufleet_gpu_allocation_info",
    "gauge",
    "The pod and container the kubelet allocated this GPU (or MIG instance) to; the value "
    "is always 1.",
    (NODE_LABEL, "gpu", "UUID", NAMESPACE_LABEL, POD_LABEL, CONTAINER_LABEL),
    _ALLOCATION_OPTIONAL_LABELS,
)
JOB_INFO = MetricDef(
    "gpufleet_gpu_job_info",
    "gauge",
    "A Slurm job this GPU (or MIG instance) is mapped to (--hpc-job-mapping-dir), one series "
    "per job; the value is always 1.",
    (NODE_LABEL, "gpu", "UUID", HPC_JOB_LABEL),
    _ALLOCATION_OPTIONAL_LABELS,
)

# Every family the agent's GPU part exposes, for the schema's index.
GPU_FAMILIES: tuple[MetricDef, ...] = (
    *VALUE_METRICS,
    THROTTLE_ACTIVE,
    GPU_UP,
    GPU_INFO,
    GPU_FABRIC_INFO,
    GPUS_EXPECTED,
    GPUS_SEEN,
    FIELDS_UNSUPPORTED,
    XID_LAST,
    XID_TOTAL,
    XID_LAST_TIMESTAMP,
    ALLOCATION_INFO,
    JOB_INFO,
)
