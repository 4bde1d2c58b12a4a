"""A stand-in for the ``pynvml`` module, driven by a recorded NVML fixture.

It implements the pynvml functions the agent calls, with pynvml's own return
types (its ctypes structures) and its own exceptions (``pynvml.NVMLError``
subclasses), so the reader cannot tell it from the real library. Constants and
structure classes come from the real module. Tests steer it: lose a GPU, inject
an XID event, make a call hang, change a counter.

Fixture format (JSON), as written by ``gpufleet nvml-record``::

    {"format": "gpufleet-nvml-fixture/1",
     "system": {"nvmlSystemGetDriverVersion": "570.86.15", ...},
     "devices": [{"nvmlDeviceGetName": "...",
                  "nvmlDeviceGetClockInfo": {"1": 1980, "2": 2619},
                  "nvmlDeviceGetRetiredPages": {"nvml_error": "NVML_ERROR_NOT_SUPPORTED"},
                  "nvmlDeviceGetFieldValues": {"82": {"type": 1, "value": 52}, "140@0": ...},
                  ...}]}

A call's entry is its result, or a mapping from its non-handle arguments
(comma-joined) to results. ``{"nvml_error": NAME}`` is an NVML error. A call
the fixture does not mention answers NVML_ERROR_NOT_SUPPORTED. A field value
read for one scope is keyed ``ID@SCOPE`` (4294967295: every link at once); it
may carry NVML's ``timestamp`` (us since the epoch).

A GPU in MIG mode (``nvmlDeviceGetMigMode`` [1, 1]) lists its MIG devices under
``mig_devices``, by the index ``nvmlDeviceGetMigDeviceHandleByIndex`` takes
(``null``: no MIG device there, NVML_ERROR_NOT_FOUND), each with the answers to
the calls made on its MIG device handle (``nvmlDeviceGetUUID`` "MIG-...",
``nvmlDeviceGetGpuInstanceId``, ``nvmlDeviceGetComputeInstanceId``,
``nvmlDeviceGetName``, ``nvmlDeviceGetAttributes``, ``nvmlDeviceGetMemoryInfo``...);
whatever an entry does not mention, NVML refuses on that handle. GPM metrics of a
GPU instance (``nvmlGpmMigSampleGet`` on the parent with the instance's id) are
under the parent's ``nvmlGpmMigMetricsGet``, keyed by GPU instance id.

``nvmlDeviceGetGpuFabricInfoV`` (and the v1 ``nvmlDeviceGetGpuFabricInfo``) is the
struct's fields: ``{"clusterUuid": "<uuid>", "status": 0, "cliqueId": 1, "state": 3}``.
"""

from __future__ import annotations

import ctypes
import itertools
import json
import queue
import threading
import uuid
from collections import Counter
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

import pynvml

FIXTURE_FORMAT = "gpufleet-nvml-fixture/1"
_MISSING = object()
# What NVML refuses (NOT_SUPPORTED) for a whole GPU while it is in MIG mode.
REFUSED_UNDER_MIG = frozenset(
    {
        "nvmlDeviceGetRemappedRows",
        "nvmlDeviceGetUtilizationRates",
        "nvmlDeviceGetEncoderUtilization",
        "nvmlDeviceGetDecoderUtilization",
        "nvmlGpmSampleGet",
    }
)


def load_fixture(path: str | Path) -> dict[str, Any]:
    with open(path, encoding="utf-8") as handle:
        fixture: dict[str, Any] = json.load(handle)
    if fixture.get("format") != FIXTURE_FORMAT:
        raise ValueError(f"{path}: not a {FIXTURE_FORMAT} fixture")
    return fixture


def bundled_fixture(name: str = "h100-sxm-8gpu") -> dict[str, Any]:
    """A fixture shipped with the package (used by the synthetic source and tests)."""
    text = resources.files("gpufleet.gpu").joinpath(f"fixtures/{name}.json").read_text("utf-8")
    fixture: dict[str, Any] = json.loads(text)
    return fixture


class FakeHandle:
    """An NVML device handle, or a MIG device handle (``mig``: its index under the
    parent GPU ``index``); compared by identity like the real pointer."""

    __slots__ = ("index", "mig")

    def __init__(self, index: int, mig: int | None = None) -> None:
        self.index = index
        self.mig = mig

    def __repr__(self) -> str:
        if self.mig is None:
            return f"FakeHandle({self.index})"
        return f"FakeHandle({self.index}, mig={self.mig})"


@dataclass
class FakeEventData:
    device: FakeHandle
    eventType: int
    eventData: int
    gpuInstanceId: int = 0xFFFFFFFF
    computeInstanceId: int = 0xFFFFFFFF


class HangControl:
    """Makes every call to one NVML function block until released."""

    def __init__(self, call: str) -> None:
        self.call = call
        self.entered = threading.Event()
        self._release = threading.Event()

    def wait(self) -> None:
        self.entered.set()
        self._release.wait()

    def release(self) -> None:
        self._release.set()


def nvml_error(name_or_code: str | int) -> pynvml.NVMLError:
    code = getattr(pynvml, name_or_code) if isinstance(name_or_code, str) else name_or_code
    return pynvml.NVMLError(code)


class FakeNvml:
    """pynvml-compatible fake. Thread-safe enough for the sampler and XID threads."""

    def __init__(self, fixture: dict[str, Any]) -> None:
        self._system: dict[str, Any] = dict(fixture.get("system", {}))
        self._devices: list[dict[str, Any]] = [dict(d) for d in fixture.get("devices", [])]
        self._handles = [FakeHandle(i) for i in range(len(self._devices))]
        self._lock = threading.Lock()
        self._lost: set[int] = set()
        self._mig: set[int] = {
            index for index, device in enumerate(self._devices) if _mig_enabled(device)
        }
        self._mig_handles: dict[tuple[int, int], FakeHandle] = {}
        self._hangs: dict[str, HangControl] = {}
        self._events: queue.Queue[FakeEventData] = queue.Queue()
        self._gpm_ids = itertools.count(0x1000)
        # sample -> (GPU index, GPU instance id, or None for the whole GPU)
        self._gpm_samples: dict[int, tuple[int, int | None]] = {}
        self.initialized = False
        self.calls: Counter[str] = Counter()
        self.init_error: str | None = fixture.get("init_error")

    def __getattr__(self, name: str) -> Any:
        value = getattr(pynvml, name)
        if callable(value) and name.startswith("nvml"):
            raise AttributeError(f"FakeNvml does not implement {name}")
        return value

    # -- steering ------------------------------------------------------------

    def lose_gpu(self, index: int) -> None:
        with self._lock:
            self._lost.add(index)

    def restore_gpu(self, index: int) -> None:
        with self._lock:
            self._lost.discard(index)

    def set_mig_mode(
        self,
        index: int,
        enabled: bool,
        mig_devices: list[dict[str, Any] | None] | None = None,
        max_mig_devices: int = 7,
    ) -> None:
        """Turn MIG mode on or off for one GPU: NVML reports the new mode and, while it
        is on, refuses the whole-GPU queries of ``REFUSED_UNDER_MIG``. ``mig_devices``
        (fixture entries) are the MIG devices then configured; none by default, as
        right after enabling MIG mode. Turning it off destroys them."""
        mode = 1 if enabled else 0
        with self._lock:
            device = self._devices[index]
            device["nvmlDeviceGetMigMode"] = [mode, mode]
            device["nvmlDeviceGetMaxMigDeviceCount"] = max_mig_devices if enabled else 0
            device["mig_devices"] = list(mig_devices or []) if enabled else []
            if enabled:
                self._mig.add(index)
            else:
                self._mig.discard(index)

    def set_mig_devices(self, index: int, mig_devices: list[dict[str, Any] | None]) -> None:
        """Reconfigure a GPU's MIG devices (as nvidia-smi mig / mig-parted do) without
        changing its mode: handles to the old ones become invalid."""
        with self._lock:
            self._devices[index]["mig_devices"] = list(mig_devices)

    def inject_xid(
        self,
        index: int,
        xid: int,
        gpu_instance: int | None = None,
        compute_instance: int | None = None,
    ) -> None:
        """An XID event on GPU ``index``, attributed to a MIG GPU / compute instance as
        NVML does in MIG mode (nvmlEventData_t; 0xFFFFFFFF where it names none)."""
        none = 0xFFFFFFFF
        self._events.put(
            FakeEventData(
                self._handles[index],
                pynvml.nvmlEventTypeXidCriticalError,
                xid,
                none if gpu_instance is None else gpu_instance,
                none if compute_instance is None else compute_instance,
            )
        )

    def hang(self, call: str) -> HangControl:
        control = HangControl(call)
        with self._lock:
            self._hangs[call] = control
        return control

    def unhang(self, call: str) -> None:
        with self._lock:
            control = self._hangs.pop(call, None)
        if control is not None:
            control.release()

    def set_value(
        self, index: int, call: str, value: Any, key: str | None = None, mig: int | None = None
    ) -> None:
        """Change what NVML answers to ``call`` on GPU ``index`` (or on its MIG device
        ``mig``), for the argument ``key`` if given."""
        with self._lock:
            device = self._devices[index]
            if mig is not None:
                device = device["mig_devices"][mig]
            if key is None:
                device[call] = value
            else:
                entry = dict(device.get(call) or {})
                entry[key] = value
                device[call] = entry

    # -- plumbing ------------------------------------------------------------

    def _enter(self, call: str, handle: FakeHandle | None = None) -> None:
        with self._lock:
            self.calls[call] += 1
            hang = self._hangs.get(call)
            lost = handle is not None and handle.index in self._lost
            # MIG mode refuses whole-GPU queries, not those on a MIG device handle
            mig = handle is not None and handle.mig is None and handle.index in self._mig
        if hang is not None:
            hang.wait()
        if not self.initialized and call != "nvmlInit":
            raise nvml_error("NVML_ERROR_UNINITIALIZED")
        if lost:
            raise nvml_error("NVML_ERROR_GPU_IS_LOST")
        if mig and call in REFUSED_UNDER_MIG:
            raise nvml_error("NVML_ERROR_NOT_SUPPORTED")

    def _mig_device(self, handle: FakeHandle) -> dict[str, Any]:
        """The fixture entry of a MIG device handle; NVML answers INVALID_ARGUMENT for
        a handle whose MIG device was destroyed (nvml.h: such handles stay invalid)."""
        devices = self._devices[handle.index].get("mig_devices") or []
        mig = handle.mig if handle.mig is not None else -1
        if handle.index not in self._mig or not 0 <= mig < len(devices) or devices[mig] is None:
            raise nvml_error("NVML_ERROR_INVALID_ARGUMENT")
        entry: dict[str, Any] = devices[mig]
        return entry

    def _lookup(
        self, index: int | None, call: str, key: str | None = None, mig: FakeHandle | None = None
    ) -> Any:
        with self._lock:
            if mig is not None:
                source = self._mig_device(mig)
            else:
                source = self._system if index is None else self._devices[index]
            value = source.get(call, _MISSING)
        if value is not _MISSING and key is not None:
            value = value.get(key, _MISSING) if isinstance(value, dict) else _MISSING
        if value is _MISSING:
            raise nvml_error("NVML_ERROR_NOT_SUPPORTED")
        if isinstance(value, dict) and "nvml_error" in value:
            raise nvml_error(value["nvml_error"])
        return value

    def _device(self, handle: FakeHandle, call: str, key: str | None = None) -> Any:
        self._enter(call, handle)
        return self._lookup(handle.index, call, key, handle if handle.mig is not None else None)

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


def _mig_enabled(device: dict[str, Any]) -> bool:
    mode = device.get("nvmlDeviceGetMigMode")
    return isinstance(mode, list) and bool(mode) and int(mode[0]) == 1


def _pointer_value(pointer: Any) -> int:
    value = ctypes.cast(pointer, ctypes.c_void_p).value
    return int(value or 0)
