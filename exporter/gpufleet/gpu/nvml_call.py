"""How the reader calls NVML: its errors translated into what they mean for a GPU,
errors counted per call, and the call in flight recorded for the sampler's watchdog."""

from __future__ import annotations

import ctypes
import threading
import time
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import Any

from gpufleet.gpu.device import FieldKey, GpuState

# The pynvml module, or a fake with the same functions, constants and structs.
NvmlApi = Any

# nvmlReturn_t values (nvml.h) the reader tells apart.
INVALID_ARGUMENT = 2
NOT_SUPPORTED = 3
NOT_FOUND = 6  # no MIG device at that index
FUNCTION_NOT_FOUND = 13
# NVML reports memory in bytes; DCGM's memory fields are in MiB.
MIB = 1024.0 * 1024.0
# The GPU itself is gone or unusable until reset: GPU_IS_LOST, RESET_REQUIRED, GPU_NOT_FOUND.
GPU_DOWN_ERRORS = frozenset({15, 16, 28})

# scopeId meaning every link at once, as DCGM passes it (DcgmCacheManager.cpp).
ALL_LINKS = 0xFFFFFFFF
# nvmlValueType_t -> the member of nvmlValue_t that holds the value
_VALUE_ATTR_BY_TYPE = {
    0: "dVal",
    1: "uiVal",
    2: "ulVal",
    3: "ullVal",
    4: "sllVal",
    5: "siVal",
    6: "usVal",
}

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


class Unsupported(Exception):
    """NVML does not have this call or field for this GPU (or driver)."""


class GpuDown(Exception):
    """The GPU is lost, or unusable until it is reset."""


class CallFailed(Exception):
    """Any other failure; counted per call."""


class NotFound(CallFailed):
    """nvmlDeviceGetMigDeviceHandleByIndex: no MIG device at that index (not an error)."""


def init_nvml(nvml: NvmlApi) -> None:
    """nvmlInit; raises NvmlUnavailable with the remedy for the usual causes."""
    try:
        nvml.nvmlInit()
    except nvml.NVMLError as error:
        code = getattr(error, "value", None)
        remedy = _INIT_REMEDIES.get(code if isinstance(code, int) else -1, str(error))
        raise NvmlUnavailable(f"NVML could not be initialised: {remedy}") from error
    except OSError as error:
        raise NvmlUnavailable(f"NVML could not be loaded: {error}") from error


def handle_key(handle: Any) -> Hashable:
    """A hashable identity for an NVML device handle (a ctypes pointer, or a fake's object)."""
    try:
        return ctypes.cast(handle, ctypes.c_void_p).value
    except (TypeError, ctypes.ArgumentError):
        return handle  # type: ignore[no-any-return]


def text(value: Any) -> str:
    """An NVML string (bytes from older pynvml) as text."""
    if isinstance(value, bytes):
        return value.decode("utf-8", errors="replace")
    return str(value)


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


class NvmlCalls:
    """Every NVML call of one reader goes through here; used by one thread."""

    def __init__(self, nvml: NvmlApi, errors: CallErrors, collector: str) -> None:
        self.nvml = nvml
        self.errors = errors
        self.collector = collector
        self.in_flight: InFlightCall | None = None
        self._token = 0

    def count_error(self, call: str) -> None:
        self.errors.count(self.collector, call)

    def call(self, name: str, gpu: int | None, fn: Callable[..., Any], *args: Any) -> Any:
        """Call NVML, translating its errors; records the in-flight call for the watchdog."""
        self._token += 1
        self.in_flight = InFlightCall(name, gpu, time.monotonic(), self._token)
        try:
            return fn(*args)
        except self.nvml.NVMLError as error:
            code = getattr(error, "value", None)
            if code in (NOT_SUPPORTED, FUNCTION_NOT_FOUND):
                raise Unsupported from error
            if code == NOT_FOUND and name == "nvmlDeviceGetMigDeviceHandleByIndex":
                raise NotFound from error
            if code in GPU_DOWN_ERRORS:
                raise GpuDown from error
            self.count_error(name)
            raise CallFailed from error
        except Exception as error:
            self.count_error(name)
            raise CallFailed from error
        finally:
            self.in_flight = None

    def device(self, state: GpuState, name: str, *args: Any) -> Any:
        """``name`` on the GPU's handle."""
        return self.call(name, state.identity.index, getattr(self.nvml, name), state.handle, *args)

    def on(self, state: GpuState, handle: Any, name: str, *args: Any) -> Any:
        """``name`` on another handle of the GPU (one of its MIG devices)."""
        return self.call(name, state.identity.index, getattr(self.nvml, name), handle, *args)

    def system_text(self, name: str) -> str:
        value = self.system_value(name)
        return "" if value is None else text(value)

    def system_value(self, name: str) -> Any:
        try:
            return self.call(name, None, getattr(self.nvml, name))
        except (CallFailed, Unsupported, GpuDown):
            return None

    def handle_or_none(self, index: int) -> Any:
        try:
            return self.call(
                "nvmlDeviceGetHandleByIndex", index, self.nvml.nvmlDeviceGetHandleByIndex, index
            )
        except (CallFailed, Unsupported, GpuDown):
            return None

    def field_values(
        self,
        state: GpuState,
        field_ids: list[FieldKey],
        stamps: dict[FieldKey, int] | None = None,
    ) -> dict[FieldKey, float | int | None]:
        """Read NVML field values; None marks a field the GPU does not support. NVML's
        timestamp of each value (us since the epoch, 0 if none) goes into ``stamps``."""
        raw = self.device(state, "nvmlDeviceGetFieldValues", field_ids)
        result: dict[FieldKey, float | int | None] = {}
        for requested, entry in zip(field_ids, raw, strict=False):
            ret = int(entry.nvmlReturn)
            if ret == 0:
                attr = _VALUE_ATTR_BY_TYPE.get(int(entry.valueType), "ullVal")
                result[requested] = getattr(entry.value, attr)
                if stamps is not None:
                    stamps[requested] = int(entry.timestamp)
            elif ret in (NOT_SUPPORTED, FUNCTION_NOT_FOUND) or (
                # a GPU or driver without the all-links aggregate may reject the scope itself
                ret == INVALID_ARGUMENT
                and isinstance(requested, tuple)
                and requested[1] == ALL_LINKS
            ):
                result[requested] = None
            elif ret in GPU_DOWN_ERRORS:
                raise GpuDown
            else:
                self.count_error("nvmlDeviceGetFieldValues")
        return result
