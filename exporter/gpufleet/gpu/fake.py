"""A stand-in for the ``pynvml`` module, driven by a recorded NVML fixture.

It implements the pynvml functions the agent calls, with pynvml's own return
types (its ctypes structures) and its own exceptions (``pynvml.NVMLError``
subclasses), so the reader cannot tell it from the real library. Constants and
structure classes come from the real module. Tests steer it (``FakeDevices``):
lose a GPU, inject an XID event, make a call hang, change a counter. The fixture
format is described in ``gpu/fixture.py``.
"""

from __future__ import annotations

import ctypes
import queue
import uuid
from typing import Any

import pynvml

from gpufleet.gpu.fake_devices import FakeDevices, FakeEventData, FakeHandle, nvml_error


class FakeNvml(FakeDevices):
    """pynvml-compatible fake: the call table over the fixture's devices."""

    def __getattr__(self, name: str) -> Any:
        value = getattr(pynvml, name)
        if callable(value) and name.startswith("nvml"):
            raise AttributeError(f"FakeNvml does not implement {name}")
        return value

    # -- system ----------------------------------------------------------------

    def nvmlInit(self) -> None:
        self._enter("nvmlInit")
        if self.init_error:
            raise nvml_error(self.init_error)
        self.initialized = True

    def nvmlShutdown(self) -> None:
        self._enter("nvmlShutdown")
        self.initialized = False

    def nvmlSystemGetDriverVersion(self) -> str:
        self._enter("nvmlSystemGetDriverVersion")
        return str(self._lookup(None, "nvmlSystemGetDriverVersion"))

    def nvmlSystemGetCudaDriverVersion(self) -> int:
        self._enter("nvmlSystemGetCudaDriverVersion")
        return int(self._lookup(None, "nvmlSystemGetCudaDriverVersion"))

    def nvmlDeviceGetCount(self) -> int:
        self._enter("nvmlDeviceGetCount")
        return len(self._devices)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> FakeHandle:
        self._enter("nvmlDeviceGetHandleByIndex")
        if not 0 <= index < len(self._devices):
            raise nvml_error("NVML_ERROR_INVALID_ARGUMENT")
        if index in self._lost:
            raise nvml_error("NVML_ERROR_GPU_IS_LOST")
        return self._handles[index]

    # -- identity ---------------------------------------------------------------

    def nvmlDeviceGetName(self, handle: FakeHandle) -> str:
        return str(self._device(handle, "nvmlDeviceGetName"))

    def nvmlDeviceGetUUID(self, handle: FakeHandle) -> str:
        return str(self._device(handle, "nvmlDeviceGetUUID"))

    def nvmlDeviceGetSerial(self, handle: FakeHandle) -> str:
        return str(self._device(handle, "nvmlDeviceGetSerial"))

    def nvmlDeviceGetMinorNumber(self, handle: FakeHandle) -> int:
        return int(self._device(handle, "nvmlDeviceGetMinorNumber"))

    def nvmlDeviceGetPciInfo(self, handle: FakeHandle) -> Any:
        recorded = self._device(handle, "nvmlDeviceGetPciInfo")
        info = pynvml.nvmlPciInfo_t()
        for name, value in recorded.items():
            setattr(info, name, value.encode() if isinstance(value, str) else value)
        return info

    # -- readings -----------------------------------------------------------------

    def nvmlDeviceGetClockInfo(self, handle: FakeHandle, clock_type: int) -> int:
        return int(self._device(handle, "nvmlDeviceGetClockInfo", str(clock_type)))

    def nvmlDeviceGetTemperature(self, handle: FakeHandle, sensor: int) -> int:
        return int(self._device(handle, "nvmlDeviceGetTemperature", str(sensor)))

    def nvmlDeviceGetPowerUsage(self, handle: FakeHandle) -> int:
        return int(self._device(handle, "nvmlDeviceGetPowerUsage"))

    def nvmlDeviceGetTotalEnergyConsumption(self, handle: FakeHandle) -> int:
        return int(self._device(handle, "nvmlDeviceGetTotalEnergyConsumption"))

    def nvmlDeviceGetUtilizationRates(self, handle: FakeHandle) -> Any:
        recorded = self._device(handle, "nvmlDeviceGetUtilizationRates")
        return pynvml.c_nvmlUtilization_t(gpu=recorded["gpu"], memory=recorded["memory"])

    def nvmlDeviceGetEncoderUtilization(self, handle: FakeHandle) -> list[int]:
        return [int(v) for v in self._device(handle, "nvmlDeviceGetEncoderUtilization")]

    def nvmlDeviceGetDecoderUtilization(self, handle: FakeHandle) -> list[int]:
        return [int(v) for v in self._device(handle, "nvmlDeviceGetDecoderUtilization")]

    def nvmlDeviceGetGridLicensableFeatures(self, handle: FakeHandle) -> Any:
        recorded = self._device(handle, "nvmlDeviceGetGridLicensableFeatures")
        features = pynvml.c_nvmlGridLicensableFeatures_v4_t()
        features.isGridLicenseSupported = int(recorded["isGridLicenseSupported"])
        states = list(recorded.get("featureStates", []))
        codes = list(recorded.get("featureCodes", [pynvml.NVML_GRID_LICENSE_FEATURE_CODE_VGPU]))
        features.licensableFeaturesCount = len(states)
        for slot, state in enumerate(states):
            features.gridLicensableFeatures[slot].featureState = int(state)
            features.gridLicensableFeatures[slot].featureCode = int(codes[slot % len(codes)])
        return features

    def nvmlDeviceGetMigMode(self, handle: FakeHandle) -> list[int]:
        return [int(mode) for mode in self._device(handle, "nvmlDeviceGetMigMode")]

    # -- MIG (nvml.h, "Multi Instance GPU Management") ------------------------------

    def nvmlDeviceGetMaxMigDeviceCount(self, handle: FakeHandle) -> int:
        return int(self._device(handle, "nvmlDeviceGetMaxMigDeviceCount"))

    def nvmlDeviceGetMigDeviceHandleByIndex(self, handle: FakeHandle, index: int) -> FakeHandle:
        self._enter("nvmlDeviceGetMigDeviceHandleByIndex", handle)
        with self._lock:
            if handle.mig is not None:
                raise nvml_error("NVML_ERROR_INVALID_ARGUMENT")
            if handle.index not in self._mig:
                raise nvml_error("NVML_ERROR_NOT_SUPPORTED")  # MIG mode is off
            devices = self._devices[handle.index].get("mig_devices") or []
            if not 0 <= index < len(devices) or devices[index] is None:
                raise nvml_error("NVML_ERROR_NOT_FOUND")
            key = (handle.index, index)
            if key not in self._mig_handles:
                self._mig_handles[key] = FakeHandle(handle.index, index)
            return self._mig_handles[key]

    def nvmlDeviceIsMigDeviceHandle(self, handle: FakeHandle) -> int:
        self._enter("nvmlDeviceIsMigDeviceHandle", handle)
        return 0 if handle.mig is None else 1

    def nvmlDeviceGetDeviceHandleFromMigDeviceHandle(self, handle: FakeHandle) -> FakeHandle:
        self._enter("nvmlDeviceGetDeviceHandleFromMigDeviceHandle", handle)
        if handle.mig is None:
            raise nvml_error("NVML_ERROR_INVALID_ARGUMENT")
        return self._handles[handle.index]

    def _mig_only(self, handle: FakeHandle, call: str) -> Any:
        if handle.mig is None:
            self._enter(call, handle)
            raise nvml_error("NVML_ERROR_NOT_SUPPORTED")  # only MIG device handles have it
        return self._device(handle, call)

    def nvmlDeviceGetGpuInstanceId(self, handle: FakeHandle) -> int:
        return int(self._mig_only(handle, "nvmlDeviceGetGpuInstanceId"))

    def nvmlDeviceGetComputeInstanceId(self, handle: FakeHandle) -> int:
        return int(self._mig_only(handle, "nvmlDeviceGetComputeInstanceId"))

    def nvmlDeviceGetAttributes(self, handle: FakeHandle) -> Any:
        recorded = self._mig_only(handle, "nvmlDeviceGetAttributes")
        attributes = pynvml.c_nvmlDeviceAttributes()
        for name, value in recorded.items():
            setattr(attributes, name, int(value))
        return attributes

    def nvmlDeviceGetMemoryInfo(self, handle: FakeHandle, version: int | None = None) -> Any:
        if version:
            recorded = self._device(handle, "nvmlDeviceGetMemoryInfo_v2")
            info = pynvml.c_nvmlMemory_v2_t()
            info.version = version
            info.reserved = recorded["reserved"]
        else:
            recorded = self._device(handle, "nvmlDeviceGetMemoryInfo")
            info = pynvml.c_nvmlMemory_t()
        info.total = recorded["total"]
        info.free = recorded["free"]
        info.used = recorded["used"]
        return info

    def nvmlDeviceGetPcieReplayCounter(self, handle: FakeHandle) -> int:
        return int(self._device(handle, "nvmlDeviceGetPcieReplayCounter"))

    def nvmlDeviceGetPcieThroughput(self, handle: FakeHandle, counter: int) -> int:
        return int(self._device(handle, "nvmlDeviceGetPcieThroughput", str(counter)))

    def nvmlDeviceGetTotalEccErrors(
        self, handle: FakeHandle, error_type: int, counter_type: int
    ) -> int:
        key = f"{error_type},{counter_type}"
        return int(self._device(handle, "nvmlDeviceGetTotalEccErrors", key))

    def nvmlDeviceGetRetiredPages(self, handle: FakeHandle, cause: int) -> list[int]:
        count = int(self._device(handle, "nvmlDeviceGetRetiredPages", str(cause)))
        return [0x1000 * (page + 1) for page in range(count)]

    def nvmlDeviceGetRetiredPagesPendingStatus(self, handle: FakeHandle) -> int:
        return int(self._device(handle, "nvmlDeviceGetRetiredPagesPendingStatus"))

    def nvmlDeviceGetRemappedRows(self, handle: FakeHandle) -> tuple[int, int, int, int]:
        recorded = self._device(handle, "nvmlDeviceGetRemappedRows")
        return (
            int(recorded["correctable"]),
            int(recorded["uncorrectable"]),
            int(recorded["pending"]),
            int(recorded["failure"]),
        )

    def nvmlDeviceGetCurrentClocksEventReasons(self, handle: FakeHandle) -> int:
        return int(self._device(handle, "nvmlDeviceGetCurrentClocksEventReasons"))

    def nvmlDeviceGetCurrentClocksThrottleReasons(self, handle: FakeHandle) -> int:
        return int(self._device(handle, "nvmlDeviceGetCurrentClocksThrottleReasons"))

    def nvmlDeviceGetViolationStatus(self, handle: FakeHandle, policy: int) -> Any:
        recorded = self._device(handle, "nvmlDeviceGetViolationStatus", str(policy))
        return pynvml.c_nvmlViolationTime_t(
            referenceTime=recorded["referenceTime"], violationTime=recorded["violationTime"]
        )

    def nvmlDeviceGetFieldValues(
        self, handle: FakeHandle, field_ids: list[int | tuple[int, int]]
    ) -> Any:
        recorded = self._device(handle, "nvmlDeviceGetFieldValues")
        values = (pynvml.c_nvmlFieldValue_t * len(field_ids))()
        for slot, requested in enumerate(field_ids):
            field_id, scope = requested if isinstance(requested, tuple) else (requested, 0)
            key = f"{field_id}@{scope}" if isinstance(requested, tuple) else str(field_id)
            values[slot].fieldId = field_id
            values[slot].scopeId = scope
            entry = recorded.get(key)
            if entry is None:
                values[slot].nvmlReturn = pynvml.NVML_ERROR_NOT_SUPPORTED
            elif "nvml_error" in entry:
                values[slot].nvmlReturn = getattr(pynvml, entry["nvml_error"])
            else:
                value_type = int(entry.get("type", pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG))
                values[slot].nvmlReturn = pynvml.NVML_SUCCESS
                values[slot].valueType = value_type
                values[slot].timestamp = int(entry.get("timestamp", 0))
                attr = ("dVal", "uiVal", "ulVal", "ullVal", "sllVal", "siVal", "usVal")[value_type]
                setattr(values[slot].value, attr, entry["value"])
        return values

    # -- GPM ----------------------------------------------------------------------

    def nvmlGpmQueryDeviceSupport(self, handle: FakeHandle) -> Any:
        recorded = self._device(handle, "nvmlGpmQueryDeviceSupport")
        support = pynvml.c_nvmlGpmSupport_t()
        support.version = pynvml.NVML_GPM_SUPPORT_VERSION
        support.isSupportedDevice = int(recorded["isSupportedDevice"])
        return support

    def nvmlGpmSampleAlloc(self) -> Any:
        self._enter("nvmlGpmSampleAlloc")
        sample_id = next(self._gpm_ids)
        return ctypes.cast(ctypes.c_void_p(sample_id), pynvml.c_nvmlGpmSample_t)

    def nvmlGpmSampleGet(self, handle: FakeHandle, sample: Any) -> Any:
        self._enter("nvmlGpmSampleGet", handle)
        if handle.mig is not None:
            raise nvml_error("NVML_ERROR_NOT_SUPPORTED")  # nvmlGpmMigSampleGet instead
        self._lookup(handle.index, "nvmlGpmMetricsGet")  # unsupported devices fail here
        self._gpm_samples[_pointer_value(sample)] = (handle.index, None)
        return sample

    def nvmlGpmMigSampleGet(self, handle: FakeHandle, gpu_instance_id: int, sample: Any) -> Any:
        self._enter("nvmlGpmMigSampleGet", handle)
        if handle.mig is not None or handle.index not in self._mig:
            raise nvml_error("NVML_ERROR_INVALID_ARGUMENT")
        self._lookup(handle.index, "nvmlGpmMigMetricsGet", str(gpu_instance_id))
        self._gpm_samples[_pointer_value(sample)] = (handle.index, gpu_instance_id)
        return sample

    def nvmlGpmSampleFree(self, sample: Any) -> None:
        self._enter("nvmlGpmSampleFree")
        self._gpm_samples.pop(_pointer_value(sample), None)

    def nvmlGpmMetricsGet(self, request: Any) -> Any:
        self._enter("nvmlGpmMetricsGet")
        source = self._gpm_samples.get(_pointer_value(request.sample2))
        if source is None or _pointer_value(request.sample1) not in self._gpm_samples:
            raise nvml_error("NVML_ERROR_INVALID_ARGUMENT")
        index, gpu_instance = source
        if index in self._lost:
            raise nvml_error("NVML_ERROR_GPU_IS_LOST")
        if gpu_instance is None:
            recorded = self._lookup(index, "nvmlGpmMetricsGet")
        else:
            recorded = self._lookup(index, "nvmlGpmMigMetricsGet", str(gpu_instance))
        for slot in range(request.numMetrics):
            metric = request.metrics[slot]
            value = recorded.get(str(metric.metricId))
            if value is None:
                metric.nvmlReturn = pynvml.NVML_ERROR_NOT_SUPPORTED
            else:
                metric.nvmlReturn = pynvml.NVML_SUCCESS
                metric.value = float(value)
        return request

    # -- NVLink fabric -------------------------------------------------------------

    def nvmlDeviceGetGpuFabricInfoV(self, handle: FakeHandle, info: Any) -> int:
        return self._fabric(handle, "nvmlDeviceGetGpuFabricInfoV", info)

    def nvmlDeviceGetGpuFabricInfo(self, handle: FakeHandle, info: Any) -> int:
        return self._fabric(handle, "nvmlDeviceGetGpuFabricInfo", info)

    def _fabric(self, handle: FakeHandle, call: str, info: Any) -> int:
        """Fills the caller's struct (passed by reference, as to pynvml) from the entry:
        clusterUuid as UUID text, status, cliqueId, state (healthMask for the V call)."""
        recorded = self._device(handle, call)
        target = getattr(info, "_obj", info)
        for name, value in recorded.items():
            if name == "clusterUuid":
                raw = uuid.UUID(value).bytes if value else bytes(16)
                target.clusterUuid = (ctypes.c_uint8 * len(raw))(*raw)
            elif name != "version":
                setattr(target, name, int(value))
        return int(pynvml.NVML_SUCCESS)

    # -- events ---------------------------------------------------------------------

    def nvmlEventSetCreate(self) -> object:
        self._enter("nvmlEventSetCreate")
        return object()

    def nvmlDeviceRegisterEvents(self, handle: FakeHandle, types: int, event_set: object) -> None:
        self._enter("nvmlDeviceRegisterEvents", handle)
        recorded = self._devices[handle.index].get("nvmlDeviceRegisterEvents")
        if isinstance(recorded, dict) and "nvml_error" in recorded:
            raise nvml_error(recorded["nvml_error"])

    def nvmlEventSetWait_v2(self, event_set: object, timeout_ms: int) -> FakeEventData:
        self._enter("nvmlEventSetWait_v2")
        try:
            return self._events.get(timeout=timeout_ms / 1000.0)
        except queue.Empty:
            raise nvml_error("NVML_ERROR_TIMEOUT") from None

    def nvmlEventSetFree(self, event_set: object) -> None:
        self._enter("nvmlEventSetFree")


def _pointer_value(pointer: Any) -> int:
    value = ctypes.cast(pointer, ctypes.c_void_p).value
    return int(value or 0)
