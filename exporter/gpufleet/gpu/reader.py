"""Reads every GPU through NVML (the ``pynvml`` module, or a stand-in with its API).

One ``NvmlReader.read()`` is one collection cycle and returns an immutable
``GpuSnapshot``. The reader never raises on a GPU's failure: an unsupported
field is omitted and remembered (NVML is not asked again), a lost GPU is
reported as down, and any other failure is counted per NVML call.
"""

from __future__ import annotations

import ctypes
import threading
import time
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from typing import Any

from gpufleet.gpu import catalogue as cat
from gpufleet.gpu.snapshot import GpuIdentity, GpuReading, GpuSnapshot

# The pynvml module, or a fake with the same functions, constants and structs.
NvmlApi = Any

# Errors that mean the GPU itself is gone or unusable until reset.
_GPU_DOWN_ERRORS = frozenset({15, 16, 28})  # GPU_IS_LOST, RESET_REQUIRED, GPU_NOT_FOUND
_NOT_SUPPORTED = 3
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


@dataclass(slots=True)
class _GpuState:
    handle: Any
    identity: GpuIdentity
    unsupported_probes: set[str] = field(default_factory=set)
    unsupported_fields: set[str] = field(default_factory=set)
    nvlink_links: int = 0
    gpm_supported: bool | None = None
    gpm_previous: Any = None
    gpm_previous_at: float = 0.0


# NVML field IDs read in one nvmlDeviceGetFieldValues call, with the metric each feeds.
_FIELD_METRICS: tuple[tuple[int, cat.GpuMetric], ...] = (
    (82, cat.MEMORY_TEMP),  # NVML_FI_DEV_MEMORY_TEMP
    (38, cat.NVLINK_CRC_FLIT),  # NVML_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL
    (45, cat.NVLINK_CRC_DATA),  # NVML_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL
    (52, cat.NVLINK_REPLAY),  # NVML_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL
    (59, cat.NVLINK_RECOVERY),  # NVML_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL
    (230, cat.RECOVERY_ACTION),  # NVML_FI_DEV_GET_GPU_RECOVERY_ACTION
)
_FI_NVLINK_LINK_COUNT = 91
_FI_NVLINK_THROUGHPUT_RAW = (140, 141)  # TX, RX in KiB, per link (scopeId)

# GPM metric IDs (percent) for the DCGM profiling fields (ratios).
_GPM_METRICS: tuple[tuple[int, cat.GpuMetric], ...] = (
    (1, cat.GR_ENGINE_ACTIVE),  # NVML_GPM_METRIC_GRAPHICS_UTIL
    (2, cat.SM_ACTIVE),  # NVML_GPM_METRIC_SM_UTIL
    (3, cat.SM_OCCUPANCY),  # NVML_GPM_METRIC_SM_OCCUPANCY
    (5, cat.PIPE_TENSOR_ACTIVE),  # NVML_GPM_METRIC_ANY_TENSOR_UTIL
    (10, cat.DRAM_ACTIVE),  # NVML_GPM_METRIC_DRAM_BW_UTIL
)

# GPM metrics are rates between two samples; closer ones are noise.
_GPM_MIN_INTERVAL_S = 0.1

_VALUE_ATTR_BY_TYPE = {
    0: "dVal",
    1: "uiVal",
    2: "ulVal",
    3: "ullVal",
    4: "sllVal",
    5: "siVal",
    6: "usVal",
}


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
    ) -> None:
        self.nvml = nvml
        self.hostname = hostname
        self.errors = errors if errors is not None else CallErrors()
        self._collector = collector
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
        # One GPM sample now, so that the first snapshot (what /readyz waits for) already
        # has the DCGM_FI_PROF_* families, as dcgm-exporter's first scrape does.
        for state in self._gpus:
            if state.handle is not None:
                self._prime_gpm(state)

    def close(self) -> None:
        for state in self._gpus:
            if state.gpm_previous is not None:
                self._free_gpm_sample(state)
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
        readings = tuple(self._read_gpu(state) for state in self._gpus)
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
            for probe in self._probes:
                if probe.name in state.unsupported_probes:
                    continue
                try:
                    result = probe.read(state, values)
                except _Unsupported:
                    state.unsupported_probes.add(probe.name)
                    state.unsupported_fields.update(metric.name for metric in probe.metrics)
                except _CallFailed:
                    continue
                else:
                    if probe.name == "clock_event_reasons":
                        reasons = result
        except _GpuDown:
            return GpuReading(identity=state.identity, up=False)
        return GpuReading(
            identity=state.identity, up=True, values=values, clock_event_reasons=reasons
        )

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
        try:
            links = self._field_values(state, [_FI_NVLINK_LINK_COUNT])
            value = links.get(_FI_NVLINK_LINK_COUNT)
            state.nvlink_links = int(value) if isinstance(value, int | float) else 0
        except (_CallFailed, _Unsupported, _GpuDown):
            state.nvlink_links = 0
        return state

    def _field_values(
        self, state: _GpuState, field_ids: list[int | tuple[int, int]]
    ) -> dict[int | tuple[int, int], float | int | None]:
        """Read NVML field values; None marks a field the GPU does not support."""
        raw = self._device_call(state, "nvmlDeviceGetFieldValues", field_ids)
        result: dict[int | tuple[int, int], float | int | None] = {}
        for requested, entry in zip(field_ids, raw, strict=False):
            ret = int(entry.nvmlReturn)
            if ret == 0:
                attr = _VALUE_ATTR_BY_TYPE.get(int(entry.valueType), "ullVal")
                result[requested] = getattr(entry.value, attr)
            elif ret in (_NOT_SUPPORTED, _FUNCTION_NOT_FOUND):
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
            _Probe("pcie_tx", (cat.PCIE_TX,), self._pcie_throughput(0, cat.PCIE_TX)),
            _Probe("pcie_rx", (cat.PCIE_RX,), self._pcie_throughput(1, cat.PCIE_RX)),
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
            _Probe(
                "field_values",
                (*(metric for _, metric in _FIELD_METRICS), cat.NVLINK_BANDWIDTH),
                self._read_field_values,
            ),
            _Probe("clock_event_reasons", (cat.CLOCK_THROTTLE_REASONS,), self._read_clock_reasons),
            _Probe(
                "power_violation", (cat.POWER_VIOLATION,), self._violation(0, cat.POWER_VIOLATION)
            ),
            _Probe(
                "thermal_violation",
                (cat.THERMAL_VIOLATION,),
                self._violation(1, cat.THERMAL_VIOLATION),
            ),
            _Probe("gpm", tuple(metric for _, metric in _GPM_METRICS), self._read_gpm),
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
        """1 when a vGPU guest holds a license, 0 when not; omitted on bare metal."""
        features = self._device_call(state, "nvmlDeviceGetGridLicensableFeatures")
        if not features.isGridLicenseSupported:
            raise _Unsupported
        count = min(int(features.licensableFeaturesCount), len(features.gridLicensableFeatures))
        licensed = any(features.gridLicensableFeatures[i].featureState for i in range(count))
        values[cat.VGPU_LICENSE_STATUS.name] = 1.0 if licensed else 0.0

    def _read_memory(self, state: _GpuState, values: dict[str, float]) -> None:
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
        self, counter: int, metric: cat.GpuMetric
    ) -> Callable[[_GpuState, dict[str, float]], None]:
        def read(state: _GpuState, values: dict[str, float]) -> None:
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
        wanted: list[int | tuple[int, int]] = [
            field_id
            for field_id, metric in _FIELD_METRICS
            if metric.name not in state.unsupported_fields
        ]
        links = range(state.nvlink_links)
        bandwidth = cat.NVLINK_BANDWIDTH.name not in state.unsupported_fields and state.nvlink_links
        if bandwidth:
            wanted += [(fid, link) for fid in _FI_NVLINK_THROUGHPUT_RAW for link in links]
        elif cat.NVLINK_BANDWIDTH.name not in state.unsupported_fields:
            state.unsupported_fields.add(cat.NVLINK_BANDWIDTH.name)
        if not wanted:
            raise _Unsupported
        result = self._field_values(state, wanted)
        for field_id, metric in _FIELD_METRICS:
            if field_id not in result:
                continue
            value = result[field_id]
            if value is None:
                state.unsupported_fields.add(metric.name)
            else:
                values[metric.name] = float(value)
        if bandwidth:
            keys = [(fid, link) for fid in _FI_NVLINK_THROUGHPUT_RAW for link in links]
            if any(key not in result for key in keys):
                return  # a link failed this cycle (counted): a partial sum is not a counter
            parts = [result[key] for key in keys]
            if all(part is None for part in parts):
                state.unsupported_fields.add(cat.NVLINK_BANDWIDTH.name)
            else:
                # Inactive links report NOT_SUPPORTED; the total is over active links.
                values[cat.NVLINK_BANDWIDTH.name] = float(
                    sum(part for part in parts if part is not None)
                )

    def _read_clock_reasons(self, state: _GpuState, values: dict[str, float]) -> int:
        try:
            reasons = int(self._device_call(state, "nvmlDeviceGetCurrentClocksEventReasons"))
        except _Unsupported:
            # Drivers before R535 only know the older name of the same bitmask.
            reasons = int(self._device_call(state, "nvmlDeviceGetCurrentClocksThrottleReasons"))
        values[cat.CLOCK_THROTTLE_REASONS.name] = float(reasons)
        return reasons

    def _violation(
        self, policy: int, metric: cat.GpuMetric
    ) -> Callable[[_GpuState, dict[str, float]], None]:
        def read(state: _GpuState, values: dict[str, float]) -> None:
            violation = self._device_call(state, "nvmlDeviceGetViolationStatus", policy)
            values[metric.name] = violation.violationTime / 1000.0  # ns -> us, as DCGM

        return read

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
        nvml = self.nvml
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
        try:
            request = nvml.c_nvmlGpmMetricsGet_t()
            request.version = nvml.NVML_GPM_METRICS_GET_VERSION
            request.numMetrics = len(_GPM_METRICS)
            request.sample1 = previous
            request.sample2 = sample
            for slot, (metric_id, _) in enumerate(_GPM_METRICS):
                request.metrics[slot].metricId = metric_id
            self._call("nvmlGpmMetricsGet", state.identity.index, nvml.nvmlGpmMetricsGet, request)
        finally:
            self._call("nvmlGpmSampleFree", state.identity.index, nvml.nvmlGpmSampleFree, previous)
        for slot, (_, metric) in enumerate(_GPM_METRICS):
            result = request.metrics[slot]
            if int(result.nvmlReturn) == 0:
                values[metric.name] = float(result.value) / 100.0
            elif int(result.nvmlReturn) == _NOT_SUPPORTED:
                state.unsupported_fields.add(metric.name)

    def _free_gpm_sample(self, state: _GpuState) -> None:
        sample, state.gpm_previous = state.gpm_previous, None
        try:
            self.nvml.nvmlGpmSampleFree(sample)
        except Exception:  # noqa: BLE001 - best effort at shutdown
            self.errors.count(self._collector, "nvmlGpmSampleFree")
