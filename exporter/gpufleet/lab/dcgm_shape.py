"""Exposition shaped exactly like dcgm-exporter's, rendered from a counters file.

For tests of the rules against plain dcgm-exporter fleets (and of the agent's
drop-in claim). It reads dcgm-exporter's counters CSV format (``FIELD, type,
help``; ``#`` starts a comment) and renders what dcgm-exporter serves for a node
with that file:

- only the fields the file lists, so a stock file has no DBE ECC, NVLink errors
  or throttle bitmask, and an extended file has them under the name it uses
  (``DCGM_FI_DEV_CLOCK_THROTTLE_REASONS`` before 4.0,
  ``DCGM_FI_DEV_CLOCKS_EVENT_REASONS`` since);
- its label order: ``gpu, UUID, pci_bus_id, device, modelName``, then the node
  as ``Hostname`` (every release) or ``hostname`` (its main branch), then the
  fields of type ``label`` (``DCGM_FI_DRIVER_VERSION``) and the attributes,
  each sorted by name as Go templates range over maps: ``container``,
  ``err_code`` / ``err_msg`` (on ``DCGM_FI_DEV_XID_ERRORS``), ``namespace``,
  ``pod`` (on Kubernetes, while a pod holds the GPU), ``hpc_job`` (each series once
  per Slurm job mapped to the GPU, transformation/hpc.go);
- a GPU with MIG instances as dcgm-exporter's default ``--devices f`` (flex) serves
  it (devicemonitoring/device_monitoring.go, monitorAllGPUInstances): no series of
  the GPU itself, one per GPU instance with ``GPU_I_PROFILE``, ``GPU_I_ID`` after
  ``modelName`` (rendermetrics/render_metrics.go); memory and the profiling fields
  are the instance's, the rest the GPU's repeated on each instance, and the
  utilisation fields blank (omitted: DCGM does not serve them for MIG);
- ``DCGM_FI_DEV_XID_ERRORS`` as the last XID, never reset;
  ``DCGM_EXP_XID_ERRORS_COUNT`` as XIDs per code within its window (one series
  per code, or one zero series without ``xid`` when there were none).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from gpufleet.exposition import escape_label_value
from gpufleet.gpu.xid_catalogue import DCGM_MESSAGES, UNKNOWN_MESSAGE
from gpufleet.schema import gpu as cat
from gpufleet.schema.external import XID_ERRORS_COUNT

LABEL_KIND = "label"
XID_COUNT = XID_ERRORS_COUNT.name
XID_WINDOW_MS = 300_000  # dcgm-exporter's default --xid-count-window-size

# What a healthy H100 under training load reads; any other field reads 0.
HEALTHY_VALUES = {
    "DCGM_FI_DEV_SM_CLOCK": 1980.0,
    "DCGM_FI_DEV_MEM_CLOCK": 2619.0,
    "DCGM_FI_DEV_MEMORY_TEMP": 52.0,
    "DCGM_FI_DEV_GPU_TEMP": 45.0,
    "DCGM_FI_DEV_POWER_USAGE": 560.5,
    "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION": 2.2e12,
    "DCGM_FI_DEV_GPU_UTIL": 100.0,
    "DCGM_FI_DEV_MEM_COPY_UTIL": 45.0,
    "DCGM_FI_DEV_FB_FREE": 8552.0,
    "DCGM_FI_DEV_FB_USED": 72440.0,
    "DCGM_FI_DEV_FB_RESERVED": 566.0,
    "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL": 451000.0,  # KiB/s / 1000: half of 900 GB/s
    "DCGM_FI_PROF_GR_ENGINE_ACTIVE": 0.98,
    "DCGM_FI_PROF_SM_ACTIVE": 0.89,
    "DCGM_FI_PROF_SM_OCCUPANCY": 0.35,
    "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE": 0.58,
    "DCGM_FI_PROF_DRAM_ACTIVE": 0.38,
    "DCGM_FI_PROF_PCIE_TX_BYTES": 2.8e6,
    "DCGM_FI_PROF_PCIE_RX_BYTES": 2.3e6,
}


# Served per GPU instance (the rest of a MIG GPU's fields are the GPU's, on each instance).
INSTANCE_FIELDS = frozenset(
    {
        "DCGM_FI_DEV_FB_FREE",
        "DCGM_FI_DEV_FB_USED",
        "DCGM_FI_DEV_FB_RESERVED",
        "DCGM_FI_PROF_GR_ENGINE_ACTIVE",
        "DCGM_FI_PROF_SM_ACTIVE",
        "DCGM_FI_PROF_SM_OCCUPANCY",
        "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE",
        "DCGM_FI_PROF_DRAM_ACTIVE",
    }
)
# Blank for a GPU instance: dcgm-exporter's maintainers, issues #50 and #430
# ("not supported for MIG configurations"; use the DCGM_FI_PROF_* fields).
MIG_BLANK_FIELDS = frozenset(
    {
        "DCGM_FI_DEV_GPU_UTIL",
        "DCGM_FI_DEV_MEM_COPY_UTIL",
        "DCGM_FI_DEV_ENC_UTIL",
        "DCGM_FI_DEV_DEC_UTIL",
    }
)


class CountersError(ValueError):
    """A counters file line that dcgm-exporter would refuse; names the line."""


@dataclass(frozen=True, slots=True)
class Counter:
    name: str
    kind: str  # gauge, counter or label
    help: str


def parse_counters(text: str, source: str = "counters") -> list[Counter]:
    """dcgm-exporter's counters CSV: ``FIELD, type, help`` per line, ``#`` comments."""
    counters = []
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        parts = [part.strip() for part in line.split(",", 2)]
        if len(parts) != 3 or not parts[0]:
            raise CountersError(f"{source}:{number}: expected 'FIELD, type, help', got {raw!r}")
        name, kind, help_text = parts
        if kind not in ("gauge", "counter", LABEL_KIND):
            raise CountersError(f"{source}:{number}: type {kind!r} is not gauge/counter/label")
        counters.append(Counter(name, kind, help_text))
    return counters


@dataclass(frozen=True, slots=True)
class Pod:
    name: str
    namespace: str
    container: str


@dataclass(slots=True)
class DcgmInstance:
    """A MIG GPU instance: its profile ("1g.10gb"), NVML GPU instance id, own values."""

    profile: str
    gpu_instance_id: int
    values: dict[str, float] = field(default_factory=dict)
    pod: Pod | None = None  # on Kubernetes, the pod that holds this instance
    hpc_jobs: tuple[str, ...] = ()  # from the file <gpu>.<GPU instance id>


@dataclass(slots=True)
class DcgmGpu:
    index: int
    uuid: str
    pci_bus_id: str
    model: str = "NVIDIA H100 80GB HBM3"
    values: dict[str, float] = field(default_factory=dict)  # overrides HEALTHY_VALUES
    pod: Pod | None = None
    last_xid: int = 0
    recent_xids: dict[int, int] = field(default_factory=dict)  # code -> count in window
    instances: list[DcgmInstance] = field(default_factory=list)  # MIG mode
    hpc_jobs: tuple[str, ...] = ()  # from the hpc-job-mapping file named after the index

    def value(self, name: str) -> float:
        return self.values.get(name, HEALTHY_VALUES.get(name, 0.0))

    def xid(self, code: int) -> None:
        """An XID happens: the last value changes and the window count rises."""
        self.last_xid = code
        self.recent_xids[code] = self.recent_xids.get(code, 0) + 1


@dataclass(slots=True)
class DcgmNode:
    name: str
    gpus: list[DcgmGpu]
    driver_version: str = "570.86.15"

    @classmethod
    def with_gpus(cls, name: str, count: int = 8) -> DcgmNode:
        gpus = [
            DcgmGpu(index, f"GPU-{name}-{index:04d}", f"00000000:{0x18 + 0x10 * index:02X}:00.0")
            for index in range(count)
        ]
        return cls(name, gpus)

    def gpu(self, index: int) -> DcgmGpu:
        return next(gpu for gpu in self.gpus if gpu.index == index)


def render(node: DcgmNode, counters: list[Counter], node_label: str = "Hostname") -> str:
    """The node's /metrics as dcgm-exporter would serve it with ``counters``."""
    label_fields = {
        counter.name: node.driver_version if counter.name == "DCGM_FI_DRIVER_VERSION" else ""
        for counter in counters
        if counter.kind == LABEL_KIND
    }
    extra = "".join(
        f',{name}="{escape_label_value(value)}"' for name, value in sorted(label_fields.items())
    )
    lines: list[str] = []
    for counter in counters:
        if counter.kind == LABEL_KIND:
            continue
        lines.append(f"# HELP {counter.name} {counter.help}")
        lines.append(f"# TYPE {counter.name} {counter.kind}")
        for gpu, base, instance in _entities(node, node_label, extra):
            if instance is not None and counter.name in MIG_BLANK_FIELDS:
                continue
            for own, value in _samples(counter.name, gpu, instance):
                attributes = own
                pod = gpu.pod if instance is None else instance.pod
                if pod is not None:
                    attributes = {
                        **own,
                        "pod": pod.name,
                        "namespace": pod.namespace,
                        "container": pod.container,
                    }
                jobs = gpu.hpc_jobs if instance is None else instance.hpc_jobs
                for copy in [{**attributes, "hpc_job": job} for job in jobs] or [attributes]:
                    tail = "".join(
                        f',{key}="{escape_label_value(text)}"' for key, text in sorted(copy.items())
                    )
                    lines.append(f"{counter.name}{{{base}{tail}}} {_number(value)}")
    return "\n".join(lines) + "\n"


def _entities(
    node: DcgmNode, node_label: str, extra: str
) -> list[tuple[DcgmGpu, str, DcgmInstance | None]]:
    """What dcgm-exporter monitors by default: each GPU, or each GPU instance of a GPU in
    MIG mode, with its labels up to the label fields."""
    entities: list[tuple[DcgmGpu, str, DcgmInstance | None]] = []
    for gpu in node.gpus:
        head = (
            f'gpu="{gpu.index}",UUID="{gpu.uuid}",pci_bus_id="{gpu.pci_bus_id}",'
            f'device="nvidia{gpu.index}",modelName="{escape_label_value(gpu.model)}"'
        )
        tail = f',{node_label}="{escape_label_value(node.name)}"{extra}'
        if not gpu.instances:
            entities.append((gpu, head + tail, None))
        for instance in gpu.instances:
            mig = f',GPU_I_PROFILE="{instance.profile}",GPU_I_ID="{instance.gpu_instance_id}"'
            entities.append((gpu, head + mig + tail, instance))
    return entities


def _samples(
    name: str, gpu: DcgmGpu, instance: DcgmInstance | None = None
) -> list[tuple[dict[str, str], float]]:
    if instance is not None and name in INSTANCE_FIELDS:
        return [({}, instance.values.get(name, gpu.value(name)))]
    if name == cat.XID_LAST.name:
        code = gpu.last_xid
        text = DCGM_MESSAGES.get(code, UNKNOWN_MESSAGE)  # dcgm-exporter's xid_errors.go
        return [({"err_code": str(code), "err_msg": text}, float(code))]
    if name == XID_COUNT:
        window = {"window_size_in_ms": str(XID_WINDOW_MS)}
        if not gpu.recent_xids:
            return [(window, 0.0)]
        return [
            ({**window, "xid": str(code)}, float(count))
            for code, count in sorted(gpu.recent_xids.items())
        ]
    return [({}, gpu.value(name))]


def _number(value: float) -> str:
    return str(int(value)) if value == int(value) and abs(value) < 1e15 else repr(value)
