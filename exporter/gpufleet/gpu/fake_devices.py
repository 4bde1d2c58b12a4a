"""The fake NVML's devices: the fixture's answers, its handles, and what tests steer
(lose a GPU, switch MIG mode, inject an XID, hang a call, change a value)."""

from __future__ import annotations

import itertools
import queue
import threading
from collections import Counter
from dataclasses import dataclass
from typing import Any

import pynvml

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


class FakeDevices:
    """The state behind ``FakeNvml``; thread-safe enough for the sampler and XID threads."""

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


def _mig_enabled(device: dict[str, Any]) -> bool:
    mode = device.get("nvmlDeviceGetMigMode")
    return isinstance(mode, list) and bool(mode) and int(mode[0]) == 1
