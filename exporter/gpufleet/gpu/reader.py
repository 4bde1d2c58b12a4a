"""Reads every GPU through NVML (the ``pynvml`` module, or a stand-in with its API).

One ``NvmlReader.read()`` is one collection cycle and returns an immutable
``GpuSnapshot``. The reader never raises on a GPU's failure: an unsupported
field is omitted and remembered (NVML is not asked again, except for the calls
whose support depends on the GPU's mode, which are asked again when the MIG mode
changes and every ``reprobe_after_s``), a lost GPU is reported as down, and any
other failure is counted per NVML call.

A GPU in MIG mode is read as a whole (what NVML serves for the parent: clocks,
temperature, power, ECC, remapped rows where allowed, NVLink, PCIe, violations)
and then once per GPU instance on it, through its MIG device handle: memory and
the GPM profiling metrics, which is what NVML serves per instance (the GPU's own
memory series give way to its instances'). XIDs stay on
the parent (the XID watcher registers the parents' handles).
"""

from __future__ import annotations

import ctypes
import dataclasses
import math
import re
import threading
import time
import uuid
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from typing import Any

from gpufleet.gpu.snapshot import GpuFabric, GpuIdentity, GpuReading, GpuSnapshot
from gpufleet.schema import gpu as cat

# The pynvml module, or a fake with the same functions, constants and structs.
NvmlApi = Any

# Errors that mean the GPU itself is gone or unusable until reset.
_GPU_DOWN_ERRORS = frozenset({15, 16, 28})  # GPU_IS_LOST, RESET_REQUIRED, GPU_NOT_FOUND
_INVALID_ARGUMENT = 2
_NOT_SUPPORTED = 3
_MIG_MODE_UNKNOWN = -1
_MIG_ENABLED = 1  # NVML_DEVICE_MIG_ENABLE
_NOT_FOUND = 6  # NVML_ERROR_NOT_FOUND: no MIG device at that index (nvml.h)
_FUNCTION_NOT_FOUND = 13
_ARGUMENT_VERSION_MISMATCH = 25

_INIT_REMEDIES = {
    9: "the NVIDIA kernel driver is not loaded (check `nvidia-smi`, `lsmod | grep nvidia`)",
    12: "libnvidia-ml.so.1 was not found: no NVIDIA driver on this machine, or the container "
    "lacks the NVIDIA runtime (nvidia-container-toolkit)",
    4: "no permission to open /dev/nvidia*: run the agent with access to the GPU devices",
    18: "the NVML library and the kernel driver differ in version: reboot or reload the "
    "nvidia module after a driver upgrade",
}


class NvmlUnavailable(RuntimeError):
    """NVML cannot be used at all on this machine; the message says why and what to do."""


class _Unsupported(Exception):
    pass


class _GpuDown(Exception):
    pass


class _CallFailed(Exception):
    pass


class _NotFound(_CallFailed):
    """nvmlDeviceGetMigDeviceHandleByIndex: no MIG device at that index (not an error)."""


def handle_key(handle: Any) -> Hashable:
    """A hashable identity for an NVML device handle (a ctypes pointer, or a fake's object)."""
    try:
        return ctypes.cast(handle, ctypes.c_void_p).value
    except (TypeError, ctypes.ArgumentError):
        return handle  # type: ignore[no-any-return]


class CallErrors:
    """Errors per (collector, NVML call), shared by the sampler, XID and watchdog threads."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counts: dict[tuple[str, str], int] = {}

    def count(self, collector: str, call: str) -> None:
        with self._lock:
            key = (collector, call)
            self._counts[key] = self._counts.get(key, 0) + 1

    def snapshot(self) -> dict[tuple[str, str], int]:
        with self._lock:
            return dict(self._counts)


@dataclass(slots=True)
class InFlightCall:
    call: str
    gpu: int | None
    started: float
    token: int


# An NVML field value: its id, or (id, scopeId).
_FieldKey = int | tuple[int, int]
# scopeId meaning every link at once, as DCGM passes it (DcgmCacheManager.cpp).
_ALL_LINKS = 0xFFFFFFFF


@dataclass(slots=True)
class _MigState:
    """One GPU instance of a GPU in MIG mode, read through its MIG device handle (the
    first compute instance in it: memory is the GPU instance's, GPM is per GPU instance)."""

    handle: Any
    identity: GpuIdentity
    memory_v1: bool = False  # nvmlMemory_v2 refused on this handle
    gpm_refused: bool = False
    gpm_previous: Any = None
    gpm_previous_at: float = 0.0


@dataclass(slots=True)
class _GpuState:
    handle: Any
    identity: GpuIdentity
    unsupported_probes: set[str] = field(default_factory=set)
    unsupported_fields: set[str] = field(default_factory=set)
    # NVML field values (id, scope) NVML reported unsupported; not asked again
    unsupported_field_ids: set[_FieldKey] = field(default_factory=set)
    # when each mode-dependent probe was found unsupported (monotonic seconds)
    refused_at: dict[str, float] = field(default_factory=dict)
    mig_mode: int | None = _MIG_MODE_UNKNOWN  # None: the GPU has no MIG mode
    nvlink_data: tuple[int, int] | None = None  # (TX + RX KiB, timestamp in us)
    gpm_supported: bool | None = None
    gpm_unsupported_ids: set[int] = field(default_factory=set)
    gpm_previous: Any = None
    gpm_previous_at: float = 0.0
    instances: list[_MigState] = field(default_factory=list)
    mig_uuids: tuple[str, ...] = ()  # the MIG devices found by the last enumeration
    fabric_refused: bool = False  # NVML has no NVLink fabric for this GPU
    fabric_v1: bool = False  # nvmlDeviceGetGpuFabricInfoV failed: the v1 call from then on


# NVML field values read in one nvmlDeviceGetFieldValues call, with the metric each
# feeds; ids from nvml.h, and the DCGM field each becomes (dcgm_fields.cpp maps them).
_FIELD_METRICS: tuple[tuple[_FieldKey, cat.GpuMetric], ...] = (
    (82, cat.MEMORY_TEMP),  # NVML_FI_DEV_MEMORY_TEMP
    (38, cat.NVLINK_CRC_FLIT),  # NVML_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL (pre-Blackwell)
    (45, cat.NVLINK_CRC_DATA),  # NVML_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL (pre-Blackwell)
    (52, cat.NVLINK_REPLAY),  # NVML_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL (pre-Blackwell)
    (59, cat.NVLINK_RECOVERY),  # NVML_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL (pre-Blackwell)
    (160, cat.NVLINK_ECC_ERRORS),  # NVML_FI_DEV_NVLINK_ECC_DATA_ERROR_COUNT_TOTAL (Hopper+)
    # NVLink5 counters: DCGM asks for them with the all-links scope (NvLink aggregate)
    ((213, _ALL_LINKS), cat.NVLINK_RECOVERY_SUCCESSFUL),  # ..._LINK_RECOVERY_SUCCESSFUL_EVENTS
    ((214, _ALL_LINKS), cat.NVLINK_RECOVERY_FAILED),  # ..._COUNT_LINK_RECOVERY_FAILED_EVENTS
    ((215, _ALL_LINKS), cat.NVLINK_RECOVERY_EVENTS),  # ..._COUNT_LINK_RECOVERY_EVENTS
    ((221, _ALL_LINKS), cat.NVLINK_SYMBOL_ERRORS),  # NVML_FI_DEV_NVLINK_COUNT_SYMBOL_ERRORS
    ((219, _ALL_LINKS), cat.NVLINK_EFFECTIVE_ERRORS),  # NVML_FI_DEV_NVLINK_COUNT_EFFECTIVE_ERRORS
    (230, cat.RECOVERY_ACTION),  # NVML_FI_DEV_GET_GPU_RECOVERY_ACTION
)
# NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX / _RX: KiB of data (no protocol) since boot.
_FI_NVLINK_DATA = ((138, _ALL_LINKS), (139, _ALL_LINKS))
# NVML_FI_DEV_PERF_POLICY_POWER / _THERMAL: time held back by the policy, in ns. DCGM
# reads DCGM_FI_DEV_POWER_VIOLATION / _THERMAL_VIOLATION from them unconverted
# (dcgm_fields.cpp); nvmlDeviceGetViolationStatus is the fallback (see _violation).
_FI_POWER_VIOLATION = 74
_FI_THERMAL_VIOLATION = 75
_VIOLATION_FIELDS: tuple[tuple[int, cat.GpuMetric], ...] = (
    (_FI_POWER_VIOLATION, cat.POWER_VIOLATION),
    (_FI_THERMAL_VIOLATION, cat.THERMAL_VIOLATION),
)

# GPM metric IDs (percent) for the DCGM profiling fields (ratios).
_GPM_METRICS: tuple[tuple[int, cat.GpuMetric], ...] = (
    (1, cat.GR_ENGINE_ACTIVE),  # NVML_GPM_METRIC_GRAPHICS_UTIL
    (2, cat.SM_ACTIVE),  # NVML_GPM_METRIC_SM_UTIL
    (3, cat.SM_OCCUPANCY),  # NVML_GPM_METRIC_SM_OCCUPANCY
    (5, cat.PIPE_TENSOR_ACTIVE),  # NVML_GPM_METRIC_ANY_TENSOR_UTIL
    (10, cat.DRAM_ACTIVE),  # NVML_GPM_METRIC_DRAM_BW_UTIL
)
# GPM metric IDs in MiB/s for DCGM_FI_PROF_PCIE_TX/RX_BYTES (bytes/s; DCGM multiplies
# by 1024 * 1024, DcgmCacheManager.cpp). Without GPM, NVML's PCIe throughput stands in.
_GPM_PCIE: tuple[tuple[int, cat.GpuMetric], ...] = (
    (20, cat.PCIE_TX),  # NVML_GPM_METRIC_PCIE_TX_PER_SEC
    (21, cat.PCIE_RX),  # NVML_GPM_METRIC_PCIE_RX_PER_SEC
)
_MIB = 1024.0 * 1024.0
_GRID_LICENSE_FEATURE_CODE_VGPU = 1  # NVML_GRID_LICENSE_FEATURE_CODE_VGPU

# Probes whose support depends on the GPU's mode: with MIG instances NVML refuses the
# whole-GPU remapped rows, utilisation, codec and GPM queries. Asked again when the MIG
# mode changes and every reprobe_after_s, instead of never.
_MODE_DEPENDENT_PROBES = frozenset(
    {"remapped_rows", "utilization", "encoder", "decoder", "gpm", "pcie_tx", "pcie_rx"}
)
DEFAULT_REPROBE_AFTER_S = 300.0

# GPM metrics are rates between two samples; closer ones are noise.
_GPM_MIN_INTERVAL_S = 0.1

# nvmlGpuFabricState_t (nvml.h): 0 NOT_SUPPORTED, 1 NOT_STARTED, 2 IN_PROGRESS, 3 COMPLETED
_FABRIC_STATE_NOT_SUPPORTED = 0
_FABRIC_STATE_COMPLETED = 3
_FABRIC_STATES = {1: "not_started", 2: "in_progress"}

_VALUE_ATTR_BY_TYPE = {
    0: "dVal",
    1: "uiVal",
    2: "ulVal",
    3: "ullVal",
    4: "sllVal",
    5: "siVal",
    6: "usVal",
}


def _fabric(info: Any) -> GpuFabric:
    """A completed registration with a success status names the domain: cluster UUID
    and clique id (an all-zero UUID names none). NCCL reads these fields so before it
    uses multi-node NVLink."""
    state, status, cluster = int(info.state), int(info.status), bytes(info.clusterUuid)
    if state != _FABRIC_STATE_COMPLETED:
        return GpuFabric(_FABRIC_STATES.get(state, f"state_{state}"))
    if status != 0:
        return GpuFabric("failed")
    cluster_uuid = str(uuid.UUID(bytes=cluster)) if any(cluster) else ""
    return GpuFabric("completed", cluster_uuid, str(int(info.cliqueId)))


def _text(value: Any) -> str:
    if isinstance(value, bytes):
        return value.decode("utf-8", errors="replace")
    return str(value)


@dataclass(frozen=True, slots=True)
class _Probe:
    name: str
    metrics: tuple[cat.GpuMetric, ...]
    read: Callable[[_GpuState, dict[str, float]], int | None]


class NvmlReader:
    """Collects one snapshot of every GPU per ``read()`` call; used by one thread."""

    def __init__(
        self,
        nvml: NvmlApi,
        hostname: str,
        expected_gpus: int | None = None,
        errors: CallErrors | None = None,
        collector: str = "gpu",
        *,
        reprobe_after_s: float = DEFAULT_REPROBE_AFTER_S,
    ) -> None:
        self.nvml = nvml
        self.hostname = hostname
        self.errors = errors if errors is not None else CallErrors()
        self._collector = collector
        self._reprobe_after_s = reprobe_after_s
        self._configured_expected = expected_gpus
        self._gpus: list[_GpuState] = []
        self._first_seen = 0
        self._seq = 0
        self._token = 0
        self.in_flight: InFlightCall | None = None
        self.driver_version = ""
        self.cuda_driver_version = ""
        self._opened = False
        self._probes = self._build_probes()
        self._probe_by_name = {probe.name: probe for probe in self._probes}

    # -- lifecycle -----------------------------------------------------------------

    def open(self) -> None:
        """Initialise NVML and enumerate GPUs; raises NvmlUnavailable with a remedy."""
        nvml = self.nvml
        try:
            nvml.nvmlInit()
        except nvml.NVMLError as error:
            code = getattr(error, "value", None)
            remedy = _INIT_REMEDIES.get(code if isinstance(code, int) else -1, str(error))
            raise NvmlUnavailable(f"NVML could not be initialised: {remedy}") from error
        except OSError as error:
            raise NvmlUnavailable(f"NVML could not be loaded: {error}") from error
        self._opened = True
        self.driver_version = self._system_text("nvmlSystemGetDriverVersion")
        cuda = self._system_value("nvmlSystemGetCudaDriverVersion")
        if isinstance(cuda, int) and cuda > 0:
            self.cuda_driver_version = f"{cuda // 1000}.{(cuda % 1000) // 10}"
        try:
            count = int(self._call("nvmlDeviceGetCount", None, nvml.nvmlDeviceGetCount))
        except (_CallFailed, _Unsupported, _GpuDown):
            count = 0
        for index in range(count):
            self._gpus.append(self._enumerate(index))
        self._first_seen = count
        # One NVLink data and one GPM sample now, so that the first snapshot (what /readyz
        # waits for) already has the rates (NVLink bandwidth, DCGM_FI_PROF_*), as
        # dcgm-exporter's first scrape does.
        for state in self._gpus:
            if state.handle is not None:
                self._prime_nvlink(state)
                self._prime_gpm(state)
                self._prime_instances(state)

    def close(self) -> None:
        for state in self._gpus:
            if state.gpm_previous is not None:
                self._free_gpm_sample(state)
            self._drop_instances(state)
        if self._opened:
            self._opened = False
            try:
                self.nvml.nvmlShutdown()
            except Exception:  # noqa: BLE001 - shutting down; nothing useful to do
                self.errors.count(self._collector, "nvmlShutdown")

    @property
    def handles(self) -> list[tuple[Any, GpuIdentity]]:
        return [(state.handle, state.identity) for state in self._gpus]

    @property
    def gpus_expected(self) -> int:
        return max(self._configured_expected or 0, self._first_seen)

    # -- one cycle ---------------------------------------------------------------

    def read(self) -> GpuSnapshot:
        started_wall = time.time()
        started = time.monotonic()
        gathered: list[GpuReading] = []
        for state in self._gpus:
            reading = self._read_gpu(state)
            gathered.append(reading)
            if reading.up:
                try:
                    self._sync_instances(state)
                except _GpuDown:
                    self._drop_instances(state)  # lost since its own reading: next cycle says so
                gathered.extend(self._read_instance(state, mig) for mig in state.instances)
            else:
                self._drop_instances(state)
        readings = tuple(gathered)
        unsupported: dict[str, int] = {}
        for state in self._gpus:
            for name in state.unsupported_fields:
                unsupported[name] = unsupported.get(name, 0) + 1
        finished = time.monotonic()
        self._seq += 1
        return GpuSnapshot(
            seq=self._seq,
            taken_at=started_wall,
            taken_monotonic=finished,
            duration_seconds=finished - started,
            driver_version=self.driver_version,
            cuda_driver_version=self.cuda_driver_version,
            gpus=readings,
            gpus_expected=self.gpus_expected,
            unsupported=unsupported,
        )

    def _read_gpu(self, state: _GpuState) -> GpuReading:
        if state.handle is None:
            state.handle = self._handle_or_none(state.identity.index)
            if state.handle is None:
                return GpuReading(identity=state.identity, up=False)
        values: dict[str, float] = {}
        reasons: int | None = None
        try:
            self._reprobe_mode_dependent(state)
            for probe in self._probes:
                if probe.name in state.unsupported_probes:
                    continue
                try:
                    result = probe.read(state, values)
                except _Unsupported:
                    state.unsupported_probes.add(probe.name)
                    state.unsupported_fields.update(metric.name for metric in probe.metrics)
                    if probe.name in _MODE_DEPENDENT_PROBES:
                        state.refused_at[probe.name] = time.monotonic()
                except _CallFailed:
                    continue
                else:
                    if probe.name == "clock_event_reasons":
                        reasons = result
            fabric = self._read_fabric(state)
        except _GpuDown:
            return GpuReading(identity=state.identity, up=False)
        return GpuReading(
            identity=state.identity,
            up=True,
            values=values,
            clock_event_reasons=reasons,
            fabric=fabric,
        )

    def _read_fabric(self, state: _GpuState) -> GpuFabric | None:
        """The GPU's NVLink fabric (nvmlDeviceGetGpuFabricInfoV; the v1 call on drivers
        without it), asked every cycle: registration completes some time after boot.
        NOT_SUPPORTED, or the state NOT_SUPPORTED, means no fabric: not asked again."""
        if state.fabric_refused:
            return None
        nvml = self.nvml
        try:
            if not state.fabric_v1:
                try:
                    info = nvml.c_nvmlGpuFabricInfoV_t()
                    self._device_call(state, "nvmlDeviceGetGpuFabricInfoV", ctypes.byref(info))
                except (_Unsupported, _CallFailed):  # also a driver older than the struct
                    state.fabric_v1 = True
            if state.fabric_v1:
                info = nvml.c_nvmlGpuFabricInfo_t()
                self._device_call(state, "nvmlDeviceGetGpuFabricInfo", ctypes.byref(info))
        except _Unsupported:
            state.fabric_refused = True
        except _CallFailed:
            return None
        else:
            fabric_state = int(info.state)
            if fabric_state != _FABRIC_STATE_NOT_SUPPORTED:
                return _fabric(info)
            state.fabric_refused = True
        state.unsupported_fields.add(cat.GPU_FABRIC_INFO.name)
        return None

    def _reprobe_mode_dependent(self, state: _GpuState) -> None:
        """Forget that mode-dependent probes were refused when the MIG mode changed or
        they were refused long enough ago; they are asked again this cycle."""
        mig_changed = self._update_mig_mode(state)
        if not state.refused_at:
            return
        now = time.monotonic()
        for name, refused in list(state.refused_at.items()):
            if mig_changed or now - refused >= self._reprobe_after_s:
                del state.refused_at[name]
                state.unsupported_probes.discard(name)
                probe = self._probe_by_name[name]
                state.unsupported_fields.difference_update(m.name for m in probe.metrics)
                if name == "gpm":
                    state.gpm_supported = None
                    state.gpm_unsupported_ids.clear()
                    if state.gpm_previous is not None:
                        # a rate over the refused stretch would mean nothing: start afresh
                        self._free_gpm_sample(state)

    def _update_mig_mode(self, state: _GpuState) -> bool:
        """Reads the GPU's current MIG mode; True when it changed since the last read."""
        if state.mig_mode is None:
            return False
        try:
            current, _pending = self._device_call(state, "nvmlDeviceGetMigMode")
        except _Unsupported:
            state.mig_mode = None  # no MIG on this GPU: its mode never changes
            return False
        except _CallFailed:
            return False
        changed = state.mig_mode not in (_MIG_MODE_UNKNOWN, int(current))
        state.mig_mode = int(current)
        return changed

    # -- MIG instances -------------------------------------------------------------

    def _prime_instances(self, state: _GpuState) -> None:
        """Finds the GPU instances at open() and takes a first GPM sample of each, so the
        first snapshot has their profiling metrics as it has the whole GPUs'."""
        try:
            self._update_mig_mode(state)
            self._sync_instances(state)
            if state.instances and self._gpm_supported(state):
                for mig in state.instances:
                    self._take_mig_gpm_sample(state, mig)
        except (_CallFailed, _Unsupported, _GpuDown):
            pass  # the first cycle tries again

    def _mig_call(self, state: _GpuState, handle: Any, name: str, *args: Any) -> Any:
        return self._call(name, state.identity.index, getattr(self.nvml, name), handle, *args)

    def _sync_instances(self, state: _GpuState) -> None:
        """The GPU's MIG devices, found every cycle as nvml.h says to: each index below
        nvmlDeviceGetMaxMigDeviceCount through nvmlDeviceGetMigDeviceHandleByIndex
        (NOT_FOUND: none there). Instances come and go without a mode change
        (nvidia-smi mig, mig-parted), and a destroyed one's handle stays invalid."""
        if state.mig_mode != _MIG_ENABLED:
            self._drop_instances(state)
            return
        try:
            count = int(self._device_call(state, "nvmlDeviceGetMaxMigDeviceCount"))
        except (_Unsupported, _CallFailed):
            return  # counted; the instances found last stay until the next cycle
        found: list[tuple[Any, str]] = []
        for mig_index in range(count):
            try:
                handle = self._device_call(state, "nvmlDeviceGetMigDeviceHandleByIndex", mig_index)
                uuid = _text(self._mig_call(state, handle, "nvmlDeviceGetUUID"))
            except (_CallFailed, _Unsupported):
                continue
            found.append((handle, uuid))
        uuids = tuple(uuid for _, uuid in found)
        if uuids == state.mig_uuids:
            by_uuid = {uuid: handle for handle, uuid in found}
            for mig in state.instances:
                mig.handle = by_uuid.get(mig.identity.mig_uuid or "", mig.handle)
            return
        # known once every MIG device's identity was read; else read again next cycle
        state.mig_uuids = uuids
        # one reading per GPU instance (its first compute instance), as dcgm-exporter
        # serves GPU instances
        chosen: dict[int, tuple[Any, GpuIdentity]] = {}
        for handle, uuid in found:
            identity = self._mig_identity(state, handle, uuid)
            if identity is None or identity.mig_instance_id is None:
                state.mig_uuids = ()
                continue
            current = chosen.get(identity.mig_instance_id)
            if current is None or (identity.mig_compute_instance_id or 0) < (
                current[1].mig_compute_instance_id or 0
            ):
                chosen[identity.mig_instance_id] = (handle, identity)
        kept = {mig.identity: mig for mig in state.instances}
        instances: list[_MigState] = []
        for gpu_instance in sorted(chosen):
            handle, identity = chosen[gpu_instance]
            mig = kept.pop(identity) if identity in kept else _MigState(handle, identity)
            mig.handle = handle
            instances.append(mig)
        for gone in kept.values():
            self._free_mig_gpm_sample(gone)
        state.instances = instances

    def _mig_identity(self, state: _GpuState, handle: Any, uuid: str) -> GpuIdentity | None:
        """The parent's labels plus the instance's: its GPU instance id
        (nvmlDeviceGetGpuInstanceId, dcgm-exporter's GPU_I_ID), compute instance id, and
        profile name (GPU_I_PROFILE)."""
        try:
            gpu_instance = int(self._mig_call(state, handle, "nvmlDeviceGetGpuInstanceId"))
            compute_instance = int(self._mig_call(state, handle, "nvmlDeviceGetComputeInstanceId"))
        except (_CallFailed, _Unsupported):
            return None
        return dataclasses.replace(
            state.identity,
            mig_profile=self._mig_profile(state, handle),
            mig_instance_id=gpu_instance,
            mig_uuid=uuid,
            mig_compute_instance_id=compute_instance,
        )

    def _mig_profile(self, state: _GpuState, handle: Any) -> str:
        """The GPU instance's profile name, "1g.10gb". nvml.h: on a MIG device handle
        nvmlDeviceGetName returns the MIG device's name, which ends in "MIG <profile>" as
        nvidia-smi -L lists it ("1c.3g.40gb" for a compute instance of part of a GPU
        instance, whose profile is "3g.40gb"). Failing that, the name NVIDIA's
        k8s-device-plugin gives it (go-nvlib, pkg/nvlib/device/mig_profile.go): the GPU
        instance's slices "g.", its share of the parent's memory rounded up to eighths
        times the parent's GiB "gb"."""
        try:
            name = _text(self._mig_call(state, handle, "nvmlDeviceGetName"))
        except (_CallFailed, _Unsupported):
            name = ""
        if "MIG " in name:
            profile = name.rsplit("MIG ", 1)[1].strip()
            # a compute instance smaller than its GPU instance is named "2c.3g.40gb":
            # GPU_I_PROFILE is the GPU instance's profile
            return re.sub(r"^\d+c\.", "", profile)
        try:
            attributes = self._mig_call(state, handle, "nvmlDeviceGetAttributes")
        except (_CallFailed, _Unsupported):
            return ""
        slices = int(attributes.gpuInstanceSliceCount)
        mib = int(attributes.memorySizeMB)
        try:
            total = int(self._device_call(state, "nvmlDeviceGetMemoryInfo").total)
        except (_CallFailed, _Unsupported, _GpuDown):
            total = 0
        return f"{slices}g.{mig_memory_gb(mib, total)}gb"

    def _read_instance(self, state: _GpuState, mig: _MigState) -> GpuReading:
        values: dict[str, float] = {}
        try:
            self._read_instance_memory(state, mig, values)
            self._read_instance_gpm(state, mig, values)
        except _GpuDown:
            return GpuReading(identity=mig.identity, up=False)
        return GpuReading(identity=mig.identity, up=True, values=values)

    def _read_instance_memory(
        self, state: _GpuState, mig: _MigState, values: dict[str, float]
    ) -> None:
        """nvml.h (nvmlDeviceGetMemoryInfo): "Per-instance information can be queried by
        using specific MIG device handles"."""
        mib = 1024.0 * 1024.0
        try:
            if not mig.memory_v1:
                try:
                    info = self._mig_call(
                        state, mig.handle, "nvmlDeviceGetMemoryInfo", self.nvml.nvmlMemory_v2
                    )
                    values[cat.FB_RESERVED.name] = info.reserved / mib
                except _Unsupported:
                    mig.memory_v1 = True
            if mig.memory_v1:
                info = self._mig_call(state, mig.handle, "nvmlDeviceGetMemoryInfo")
        except (_CallFailed, _Unsupported):
            return
        values[cat.FB_FREE.name] = info.free / mib
        values[cat.FB_USED.name] = info.used / mib

    def _take_mig_gpm_sample(self, state: _GpuState, mig: _MigState) -> Any:
        """nvmlGpmMigSampleGet: a GPM sample of one GPU instance, taken on the parent."""
        nvml = self.nvml
        index = state.identity.index
        sample = self._call("nvmlGpmSampleAlloc", index, nvml.nvmlGpmSampleAlloc)
        try:
            self._device_call(state, "nvmlGpmMigSampleGet", mig.identity.mig_instance_id, sample)
        except Exception:
            self._call("nvmlGpmSampleFree", index, nvml.nvmlGpmSampleFree, sample)
            raise
        previous, mig.gpm_previous = mig.gpm_previous, sample
        mig.gpm_previous_at = time.monotonic()
        return previous

    def _read_instance_gpm(
        self, state: _GpuState, mig: _MigState, values: dict[str, float]
    ) -> None:
        """DCGM's profiling fields per GPU instance, from GPM (Hopper and later)."""
        try:
            if mig.gpm_refused or not self._gpm_supported(state):
                return
            if mig.gpm_previous is not None:
                young = _GPM_MIN_INTERVAL_S - (time.monotonic() - mig.gpm_previous_at)
                if young > 0:
                    time.sleep(young)
            previous = self._take_mig_gpm_sample(state, mig)
        except _Unsupported:
            mig.gpm_refused = True
            return
        except _CallFailed:
            return
        if previous is None:
            return
        try:
            request = self._gpm_metrics(state, previous, mig.gpm_previous)
        except (_CallFailed, _Unsupported):
            return
        for slot, (_, metric) in enumerate(_GPM_METRICS):
            result = request.metrics[slot]
            if int(result.nvmlReturn) == 0:
                values[metric.name] = float(result.value) / 100.0
        for slot, (_, metric) in enumerate(_GPM_PCIE, start=len(_GPM_METRICS)):
            result = request.metrics[slot]
            if int(result.nvmlReturn) == 0:
                values[metric.name] = float(int(float(result.value) * _MIB))

    def _free_mig_gpm_sample(self, mig: _MigState) -> None:
        sample, mig.gpm_previous = mig.gpm_previous, None
        if sample is None:
            return
        try:
            self.nvml.nvmlGpmSampleFree(sample)
        except Exception:  # noqa: BLE001 - the instance is gone; nothing useful to do
            self.errors.count(self._collector, "nvmlGpmSampleFree")

    def _drop_instances(self, state: _GpuState) -> None:
        for mig in state.instances:
            self._free_mig_gpm_sample(mig)
        state.instances = []
        state.mig_uuids = ()

    # -- NVML call plumbing ------------------------------------------------------

    def _call(self, name: str, gpu: int | None, fn: Callable[..., Any], *args: Any) -> Any:
        """Call NVML, translating its errors; records the in-flight call for the watchdog."""
        self._token += 1
        self.in_flight = InFlightCall(name, gpu, time.monotonic(), self._token)
        try:
            return fn(*args)
        except self.nvml.NVMLError as error:
            code = getattr(error, "value", None)
            if code in (_NOT_SUPPORTED, _FUNCTION_NOT_FOUND):
                raise _Unsupported from error
            if code == _NOT_FOUND and name == "nvmlDeviceGetMigDeviceHandleByIndex":
                raise _NotFound from error
            if code in _GPU_DOWN_ERRORS:
                raise _GpuDown from error
            self.errors.count(self._collector, name)
            raise _CallFailed from error
        except Exception as error:
            self.errors.count(self._collector, name)
            raise _CallFailed from error
        finally:
            self.in_flight = None

    def _device_call(self, state: _GpuState, name: str, *args: Any) -> Any:
        fn = getattr(self.nvml, name)
        return self._call(name, state.identity.index, fn, state.handle, *args)

    def _system_value(self, name: str) -> Any:
        try:
            return self._call(name, None, getattr(self.nvml, name))
        except (_CallFailed, _Unsupported, _GpuDown):
            return None

    def _system_text(self, name: str) -> str:
        value = self._system_value(name)
        return "" if value is None else _text(value)

    def _handle_or_none(self, index: int) -> Any:
        try:
            return self._call(
                "nvmlDeviceGetHandleByIndex", index, self.nvml.nvmlDeviceGetHandleByIndex, index
            )
        except (_CallFailed, _Unsupported, _GpuDown):
            return None

    def _enumerate(self, index: int) -> _GpuState:
        handle = self._handle_or_none(index)
        placeholder = GpuIdentity(index, "", "", index, "", self.hostname)
        if handle is None:
            return _GpuState(handle=None, identity=placeholder)
        state = _GpuState(handle=handle, identity=placeholder)

        def text(name: str) -> str:
            try:
                return _text(self._device_call(state, name))
            except (_CallFailed, _Unsupported, _GpuDown):
                return ""

        try:
            pci = self._device_call(state, "nvmlDeviceGetPciInfo")
            bus_id = _text(pci.busId)
        except (_CallFailed, _Unsupported, _GpuDown):
            bus_id = ""
        try:
            minor = int(self._device_call(state, "nvmlDeviceGetMinorNumber"))
        except (_CallFailed, _Unsupported, _GpuDown):
            minor = index
        state.identity = GpuIdentity(
            index=index,
            uuid=text("nvmlDeviceGetUUID"),
            pci_bus_id=bus_id,
            minor_number=minor,
            model=text("nvmlDeviceGetName"),
            hostname=self.hostname,
        )
        return state

    def _field_values(
        self,
        state: _GpuState,
        field_ids: list[_FieldKey],
        stamps: dict[_FieldKey, int] | None = None,
    ) -> dict[_FieldKey, float | int | None]:
        """Read NVML field values; None marks a field the GPU does not support. NVML's
        timestamp of each value (us since the epoch, 0 if none) goes into ``stamps``."""
        raw = self._device_call(state, "nvmlDeviceGetFieldValues", field_ids)
        result: dict[_FieldKey, float | int | None] = {}
        for requested, entry in zip(field_ids, raw, strict=False):
            ret = int(entry.nvmlReturn)
            if ret == 0:
                attr = _VALUE_ATTR_BY_TYPE.get(int(entry.valueType), "ullVal")
                result[requested] = getattr(entry.value, attr)
                if stamps is not None:
                    stamps[requested] = int(entry.timestamp)
            elif ret in (_NOT_SUPPORTED, _FUNCTION_NOT_FOUND) or (
                # a GPU or driver without the all-links aggregate may reject the scope itself
                ret == _INVALID_ARGUMENT
                and isinstance(requested, tuple)
                and requested[1] == _ALL_LINKS
            ):
                result[requested] = None
            elif ret in _GPU_DOWN_ERRORS:
                raise _GpuDown
            else:
                self.errors.count(self._collector, "nvmlDeviceGetFieldValues")
        return result

    # -- probes: one per NVML call (or family of calls) ----------------------------

    def _build_probes(self) -> tuple[_Probe, ...]:
        return (
            _Probe("sm_clock", (cat.SM_CLOCK,), self._clock(1, cat.SM_CLOCK)),
            _Probe("mem_clock", (cat.MEM_CLOCK,), self._clock(2, cat.MEM_CLOCK)),
            _Probe("gpu_temp", (cat.GPU_TEMP,), self._read_temperature),
            _Probe("power", (cat.POWER_USAGE,), self._read_power),
            _Probe("energy", (cat.TOTAL_ENERGY,), self._read_energy),
            _Probe("utilization", (cat.GPU_UTIL, cat.MEM_COPY_UTIL), self._read_utilization),
            _Probe("encoder", (cat.ENC_UTIL,), self._codec("nvmlDeviceGetEncoderUtilization")),
            _Probe("decoder", (cat.DEC_UTIL,), self._codec("nvmlDeviceGetDecoderUtilization")),
            _Probe("vgpu_license", (cat.VGPU_LICENSE_STATUS,), self._read_vgpu_license),
            _Probe("memory", (cat.FB_FREE, cat.FB_USED, cat.FB_RESERVED), self._read_memory),
            _Probe("pcie_replay", (cat.PCIE_REPLAY,), self._read_pcie_replay),
            _Probe("ecc_sbe_vol", (cat.ECC_SBE_VOL,), self._ecc(0, 0, cat.ECC_SBE_VOL)),
            _Probe("ecc_dbe_vol", (cat.ECC_DBE_VOL,), self._ecc(1, 0, cat.ECC_DBE_VOL)),
            _Probe("ecc_sbe_agg", (cat.ECC_SBE_AGG,), self._ecc(0, 1, cat.ECC_SBE_AGG)),
            _Probe("ecc_dbe_agg", (cat.ECC_DBE_AGG,), self._ecc(1, 1, cat.ECC_DBE_AGG)),
            _Probe("retired_sbe", (cat.RETIRED_SBE,), self._retired(0, cat.RETIRED_SBE)),
            _Probe("retired_dbe", (cat.RETIRED_DBE,), self._retired(1, cat.RETIRED_DBE)),
            _Probe("retired_pending", (cat.RETIRED_PENDING,), self._read_retired_pending),
            _Probe(
                "remapped_rows",
                (
                    cat.CORRECTABLE_REMAPPED_ROWS,
                    cat.UNCORRECTABLE_REMAPPED_ROWS,
                    cat.ROW_REMAP_PENDING,
                    cat.ROW_REMAP_FAILURE,
                ),
                self._read_remapped_rows,
            ),
            # GPM first: the wait for a meaningful GPM interval after open() also spaces
            # the NVLink data samples
            _Probe("gpm", tuple(metric for _, metric in _GPM_METRICS), self._read_gpm),
            # the violation times come with these field values where NVML has them
            _Probe(
                "field_values",
                (*(metric for _, metric in _FIELD_METRICS), cat.NVLINK_BANDWIDTH),
                self._read_field_values,
            ),
            _Probe(
                "clock_event_reasons",
                (cat.CLOCK_THROTTLE_REASONS, cat.CLOCKS_EVENT_REASONS),
                self._read_clock_reasons,
            ),
            _Probe(
                "power_violation",
                (cat.POWER_VIOLATION,),
                self._violation(_FI_POWER_VIOLATION, 0, cat.POWER_VIOLATION),
            ),
            _Probe(
                "thermal_violation",
                (cat.THERMAL_VIOLATION,),
                self._violation(_FI_THERMAL_VIOLATION, 1, cat.THERMAL_VIOLATION),
            ),
            # after GPM, which gives DCGM's PCIe rates where the GPU has it
            _Probe("pcie_tx", (cat.PCIE_TX,), self._pcie_throughput(0, 20, cat.PCIE_TX)),
            _Probe("pcie_rx", (cat.PCIE_RX,), self._pcie_throughput(1, 21, cat.PCIE_RX)),
        )

    def _clock(
        self, clock_type: int, metric: cat.GpuMetric
    ) -> Callable[[_GpuState, dict[str, float]], None]:
        def read(state: _GpuState, values: dict[str, float]) -> None:
            values[metric.name] = float(
                self._device_call(state, "nvmlDeviceGetClockInfo", clock_type)
            )

        return read

    def _read_temperature(self, state: _GpuState, values: dict[str, float]) -> None:
        values[cat.GPU_TEMP.name] = float(
            self._device_call(state, "nvmlDeviceGetTemperature", self.nvml.NVML_TEMPERATURE_GPU)
        )

    def _read_power(self, state: _GpuState, values: dict[str, float]) -> None:
        milliwatts = self._device_call(state, "nvmlDeviceGetPowerUsage")
        values[cat.POWER_USAGE.name] = milliwatts / 1000.0

    def _read_energy(self, state: _GpuState, values: dict[str, float]) -> None:
        values[cat.TOTAL_ENERGY.name] = float(
            self._device_call(state, "nvmlDeviceGetTotalEnergyConsumption")
        )

    def _read_utilization(self, state: _GpuState, values: dict[str, float]) -> None:
        rates = self._device_call(state, "nvmlDeviceGetUtilizationRates")
        values[cat.GPU_UTIL.name] = float(rates.gpu)
        values[cat.MEM_COPY_UTIL.name] = float(rates.memory)

    def _codec(self, call: str) -> Callable[[_GpuState, dict[str, float]], None]:
        metric = cat.ENC_UTIL if "Encoder" in call else cat.DEC_UTIL

        def read(state: _GpuState, values: dict[str, float]) -> None:
            utilization, _period_us = self._device_call(state, call)
            values[metric.name] = float(utilization)

        return read

    def _read_vgpu_license(self, state: _GpuState, values: dict[str, float]) -> None:
        """As DCGM (DcgmCacheManager.cpp): 0 where NVML says the GPU has no vGPU licensing
        (bare metal), else the state of the vGPU feature; omitted where NVML refuses."""
        features = self._device_call(state, "nvmlDeviceGetGridLicensableFeatures")
        if not features.isGridLicenseSupported:
            values[cat.VGPU_LICENSE_STATUS.name] = 0.0
            return
        count = min(int(features.licensableFeaturesCount), len(features.gridLicensableFeatures))
        for slot in range(count):
            feature = features.gridLicensableFeatures[slot]
            if int(feature.featureCode) == _GRID_LICENSE_FEATURE_CODE_VGPU:
                values[cat.VGPU_LICENSE_STATUS.name] = 1.0 if feature.featureState > 0 else 0.0
                return

    def _read_memory(self, state: _GpuState, values: dict[str, float]) -> None:
        if state.mig_mode == _MIG_ENABLED:
            # The memory is its GPU instances' (each reading has its own), as dcgm-exporter
            # serves it: the GPU's aggregate beside them would count it twice in a sum.
            return
        mib = 1024.0 * 1024.0
        try:
            info = self._device_call(state, "nvmlDeviceGetMemoryInfo", self.nvml.nvmlMemory_v2)
            values[cat.FB_RESERVED.name] = info.reserved / mib
        except _Unsupported:
            # Drivers before R510 have only the v1 structure, without `reserved`.
            info = self._device_call(state, "nvmlDeviceGetMemoryInfo")
            state.unsupported_fields.add(cat.FB_RESERVED.name)
        values[cat.FB_FREE.name] = info.free / mib
        values[cat.FB_USED.name] = info.used / mib

    def _read_pcie_replay(self, state: _GpuState, values: dict[str, float]) -> None:
        values[cat.PCIE_REPLAY.name] = float(
            self._device_call(state, "nvmlDeviceGetPcieReplayCounter")
        )

    def _pcie_throughput(
        self, counter: int, gpm_id: int, metric: cat.GpuMetric
    ) -> Callable[[_GpuState, dict[str, float]], None]:
        """The fallback where GPM has no PCIe rate: NVML's 20 ms sample, in KiB/s."""

        def read(state: _GpuState, values: dict[str, float]) -> None:
            gpm_refused = "gpm" in state.unsupported_probes or gpm_id in state.gpm_unsupported_ids
            if state.gpm_supported and not gpm_refused:
                return  # GPM gives it (or gives it next cycle)
            kib_per_second = self._device_call(state, "nvmlDeviceGetPcieThroughput", counter)
            values[metric.name] = kib_per_second * 1024.0

        return read

    def _ecc(
        self, error_type: int, counter_type: int, metric: cat.GpuMetric
    ) -> Callable[[_GpuState, dict[str, float]], None]:
        def read(state: _GpuState, values: dict[str, float]) -> None:
            values[metric.name] = float(
                self._device_call(state, "nvmlDeviceGetTotalEccErrors", error_type, counter_type)
            )

        return read

    def _retired(
        self, cause: int, metric: cat.GpuMetric
    ) -> Callable[[_GpuState, dict[str, float]], None]:
        def read(state: _GpuState, values: dict[str, float]) -> None:
            pages = self._device_call(state, "nvmlDeviceGetRetiredPages", cause)
            values[metric.name] = float(len(pages))

        return read

    def _read_retired_pending(self, state: _GpuState, values: dict[str, float]) -> None:
        pending = self._device_call(state, "nvmlDeviceGetRetiredPagesPendingStatus")
        values[cat.RETIRED_PENDING.name] = 1.0 if pending else 0.0

    def _read_remapped_rows(self, state: _GpuState, values: dict[str, float]) -> None:
        correctable, uncorrectable, pending, failure = self._device_call(
            state, "nvmlDeviceGetRemappedRows"
        )
        values[cat.CORRECTABLE_REMAPPED_ROWS.name] = float(correctable)
        values[cat.UNCORRECTABLE_REMAPPED_ROWS.name] = float(uncorrectable)
        values[cat.ROW_REMAP_PENDING.name] = 1.0 if pending else 0.0
        values[cat.ROW_REMAP_FAILURE.name] = 1.0 if failure else 0.0

    def _read_field_values(self, state: _GpuState, values: dict[str, float]) -> None:
        unsupported = state.unsupported_field_ids
        wanted: list[_FieldKey] = [
            key
            for key in (
                *(key for key, _ in _FIELD_METRICS),
                *(key for key, _ in _VIOLATION_FIELDS),
                *_FI_NVLINK_DATA,
            )
            if key not in unsupported
        ]
        if not wanted:
            raise _Unsupported
        stamps: dict[_FieldKey, int] = {}
        result = self._field_values(state, wanted, stamps)
        for key, value in result.items():
            if value is None:
                unsupported.add(key)
        for key, metric in _FIELD_METRICS:
            value = result.get(key)
            if value is not None:
                values[metric.name] = float(value)
            elif key in unsupported:
                state.unsupported_fields.add(metric.name)
        for key, metric in _VIOLATION_FIELDS:
            value = result.get(key)
            if value is not None:
                values[metric.name] = float(value)  # ns, as DCGM publishes it
        if any(key in unsupported for key in _FI_NVLINK_DATA):
            state.unsupported_fields.add(cat.NVLINK_BANDWIDTH.name)
            return
        self._nvlink_bandwidth(state, values, result, stamps)

    def _nvlink_bandwidth(
        self,
        state: _GpuState,
        values: dict[str, float],
        result: dict[_FieldKey, float | int | None],
        stamps: dict[_FieldKey, int],
    ) -> None:
        """DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL as DCGM computes it (DcgmCacheManager.cpp,
        ReadAndCacheNvLinkBandwidth): the TX + RX data counters' growth in KiB, per second
        between two samples, / 1000. The first sample has no rate: nothing is exported."""
        parts = [result.get(key) for key in _FI_NVLINK_DATA]
        if any(part is None for part in parts):
            return  # the call failed for a link this cycle (counted)
        total = int(sum(int(part) for part in parts if part is not None))
        stamp = max(stamps.get(key, 0) for key in _FI_NVLINK_DATA) or int(time.time() * 1e6)
        previous, state.nvlink_data = state.nvlink_data, (total, stamp)
        if previous is None:
            return
        seconds = (stamp - previous[1]) / 1e6
        if seconds <= 0 or total < previous[0]:
            return  # no time between the samples, or the counters were reset
        values[cat.NVLINK_BANDWIDTH.name] = float(int((total - previous[0]) / seconds / 1000.0))

    def _read_clock_reasons(self, state: _GpuState, values: dict[str, float]) -> int:
        try:
            reasons = int(self._device_call(state, "nvmlDeviceGetCurrentClocksEventReasons"))
        except _Unsupported:
            # Drivers before R535 only know the older name of the same bitmask.
            reasons = int(self._device_call(state, "nvmlDeviceGetCurrentClocksThrottleReasons"))
        # DCGM field 112 under both of dcgm-exporter's names (3.x and 4.x)
        values[cat.CLOCK_THROTTLE_REASONS.name] = float(reasons)
        values[cat.CLOCKS_EVENT_REASONS.name] = float(reasons)
        return reasons

    def _violation(
        self, field_id: int, policy: int, metric: cat.GpuMetric
    ) -> Callable[[_GpuState, dict[str, float]], None]:
        """The fallback for drivers without the perf-policy field values:
        nvmlDeviceGetViolationStatus (deprecated in NVML 13), also in ns."""

        def read(state: _GpuState, values: dict[str, float]) -> None:
            fields_refused = "field_values" in state.unsupported_probes
            if not fields_refused and field_id not in state.unsupported_field_ids:
                return  # read with the field values (or failed there this cycle, counted)
            violation = self._device_call(state, "nvmlDeviceGetViolationStatus", policy)
            values[metric.name] = float(violation.violationTime)

        return read

    def _prime_nvlink(self, state: _GpuState) -> None:
        try:
            stamps: dict[_FieldKey, int] = {}
            result = self._field_values(state, list(_FI_NVLINK_DATA), stamps)
            self._nvlink_bandwidth(state, {}, result, stamps)
        except (_CallFailed, _Unsupported, _GpuDown):
            pass  # the first cycle tries again (and records what it finds)

    def _prime_gpm(self, state: _GpuState) -> None:
        try:
            if self._gpm_supported(state):
                self._take_gpm_sample(state)
        except (_CallFailed, _Unsupported, _GpuDown):
            pass  # the first cycle tries again (and records what it finds)

    def _gpm_supported(self, state: _GpuState) -> bool:
        if state.gpm_supported is None:
            support = self._device_call(state, "nvmlGpmQueryDeviceSupport")
            state.gpm_supported = bool(support.isSupportedDevice)
        return state.gpm_supported

    def _take_gpm_sample(self, state: _GpuState) -> Any:
        """A new GPM sample becomes the GPU's latest; returns the one it replaces."""
        nvml = self.nvml
        sample = self._call("nvmlGpmSampleAlloc", state.identity.index, nvml.nvmlGpmSampleAlloc)
        try:
            self._device_call(state, "nvmlGpmSampleGet", sample)
        except Exception:
            self._call("nvmlGpmSampleFree", state.identity.index, nvml.nvmlGpmSampleFree, sample)
            raise
        previous, state.gpm_previous = state.gpm_previous, sample
        state.gpm_previous_at = time.monotonic()
        return previous

    def _read_gpm(self, state: _GpuState, values: dict[str, float]) -> None:
        if not self._gpm_supported(state):
            raise _Unsupported
        if state.gpm_previous is not None:
            # only right after open(): give the priming sample a meaningful interval
            young = _GPM_MIN_INTERVAL_S - (time.monotonic() - state.gpm_previous_at)
            if young > 0:
                time.sleep(young)
        previous = self._take_gpm_sample(state)
        sample = state.gpm_previous
        if previous is None:
            return  # GPM metrics are rates between two samples: the next cycle has them
        request = self._gpm_metrics(state, previous, sample)
        for slot, (_, metric) in enumerate(_GPM_METRICS):
            result = request.metrics[slot]
            if int(result.nvmlReturn) == 0:
                values[metric.name] = float(result.value) / 100.0
            elif int(result.nvmlReturn) == _NOT_SUPPORTED:
                state.unsupported_fields.add(metric.name)
        for slot, (metric_id, metric) in enumerate(_GPM_PCIE, start=len(_GPM_METRICS)):
            result = request.metrics[slot]
            if int(result.nvmlReturn) == 0:
                values[metric.name] = float(int(float(result.value) * _MIB))  # MiB/s -> B/s
            elif int(result.nvmlReturn) == _NOT_SUPPORTED:
                state.gpm_unsupported_ids.add(metric_id)  # the PCIe fallback reads it

    def _gpm_metrics(self, state: _GpuState, previous: Any, sample: Any) -> Any:
        """The GPM metrics between two samples (of the GPU, or of one GPU instance);
        frees ``previous``."""
        nvml = self.nvml
        try:
            request = nvml.c_nvmlGpmMetricsGet_t()
            request.version = nvml.NVML_GPM_METRICS_GET_VERSION
            request.numMetrics = len(_GPM_METRICS) + len(_GPM_PCIE)
            request.sample1 = previous
            request.sample2 = sample
            for slot, (metric_id, _) in enumerate((*_GPM_METRICS, *_GPM_PCIE)):
                request.metrics[slot].metricId = metric_id
            self._call("nvmlGpmMetricsGet", state.identity.index, nvml.nvmlGpmMetricsGet, request)
        finally:
            self._call("nvmlGpmSampleFree", state.identity.index, nvml.nvmlGpmSampleFree, previous)
        return request

    def _free_gpm_sample(self, state: _GpuState) -> None:
        sample, state.gpm_previous = state.gpm_previous, None
        try:
            self.nvml.nvmlGpmSampleFree(sample)
        except Exception:  # noqa: BLE001 - best effort at shutdown
            self.errors.count(self._collector, "nvmlGpmSampleFree")


def mig_memory_gb(memory_mib: int, parent_total_bytes: int) -> int:
    """A MIG instance's memory in its profile name's GB, as NVIDIA's k8s-device-plugin
    names it (go-nvlib): its share of the parent's memory rounded up to eighths, times
    the parent's memory in whole GiB rounded up. Without the parent's total, the
    instance's GiB rounded up."""
    gib = 1024**3
    if parent_total_bytes <= 0:
        return math.ceil(memory_mib / 1024)
    share = math.ceil(memory_mib * 1024 * 1024 / parent_total_bytes * 8) / 8
    return round(share * math.ceil(parent_total_bytes / gib))
