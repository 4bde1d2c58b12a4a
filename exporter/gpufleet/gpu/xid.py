"""XID errors from NVML's event stream, counted per GPU and per XID code.

dcgm-exporter exports only the last XID value (``DCGM_FI_DEV_XID_ERRORS``), so
two XID 79s in a row look like one. The watcher keeps a true counter per code.
It runs in its own thread because ``nvmlEventSetWait`` blocks.

On a GPU in MIG mode NVML names the GPU instance an XID is attributable to (nvml.h,
``nvmlEventData_t``: ``gpuInstanceId`` / ``computeInstanceId``, 0xFFFFFFFF when the
XID is not attributable to one, and outside MIG mode): an application's XID (13, 31,
43, ...) in one tenant's slice. The ledger keeps that instance, so the counter can name
it (``GPU_I_ID``) and a page can name that instance's pod rather than the GPU's.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Hashable
from dataclasses import dataclass, field
from typing import Any

from gpufleet.gpu.nvml_call import CallErrors, NvmlApi, handle_key
from gpufleet.gpu.snapshot import GpuIdentity

log = logging.getLogger(__name__)

_TIMEOUT = 10
_NOT_SUPPORTED = 3
_XID_CRITICAL_ERROR_EVENT = 0x8  # nvmlEventTypeXidCriticalError
# nvml.h: gpuInstanceId / computeInstanceId when the event is attributable to none
_NO_INSTANCE = 0xFFFFFFFF


@dataclass(slots=True)
class XidHistory:
    """One GPU's XIDs: ``counts`` per code of those NVML attributes to no MIG instance,
    ``instance_counts`` per (GPU instance id, code) of those it does; ``last_xid`` and
    ``last_seen`` are the GPU's, whichever instance (the hardware view)."""

    counts: dict[int, int] = field(default_factory=dict)
    last_xid: int = 0
    last_seen: float = 0.0
    instance_counts: dict[tuple[int, int], int] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class XidView:
    version: int
    watching: bool
    by_uuid: dict[str, XidHistory]


class XidLedger:
    """Thread-safe XID counts; ``version`` changes whenever anything is recorded."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._by_uuid: dict[str, XidHistory] = {}
        self._version = 0
        self.watching = False

    @property
    def version(self) -> int:
        return self._version

    def record(self, uuid: str, xid: int, when: float, instance: int | None = None) -> None:
        """One XID on GPU ``uuid``; ``instance``: the GPU instance NVML attributes it to."""
        with self._lock:
            history = self._by_uuid.setdefault(uuid, XidHistory())
            if instance is None:
                history.counts[xid] = history.counts.get(xid, 0) + 1
            else:
                key = (instance, xid)
                history.instance_counts[key] = history.instance_counts.get(key, 0) + 1
            history.last_xid = xid
            history.last_seen = when
            self._version += 1

    def set_watching(self, watching: bool) -> None:
        with self._lock:
            self.watching = watching
            self._version += 1

    def view(self) -> XidView:
        with self._lock:
            copied = {
                uuid: XidHistory(dict(h.counts), h.last_xid, h.last_seen, dict(h.instance_counts))
                for uuid, h in self._by_uuid.items()
            }
            return XidView(self._version, self.watching, copied)


class XidWatcher:
    """Waits on NVML's XID event set in a daemon thread and records into a ledger."""

    def __init__(
        self,
        nvml: NvmlApi,
        gpus: list[tuple[Any, GpuIdentity]],
        ledger: XidLedger,
        errors: CallErrors,
        poll_ms: int = 500,
    ) -> None:
        self._nvml = nvml
        self._gpus = [(handle, identity) for handle, identity in gpus if handle is not None]
        self._ledger = ledger
        self._errors = errors
        self._poll_ms = poll_ms
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._uuid_by_handle: dict[Hashable, str] = {}

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="gpufleet-xid", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)

    def _run(self) -> None:
        nvml = self._nvml
        try:
            event_set = nvml.nvmlEventSetCreate()
        except Exception:  # noqa: BLE001 - XIDs unavailable; GPU metrics still flow
            self._errors.count("xid", "nvmlEventSetCreate")
            log.warning("NVML event set unavailable: XID counters disabled")
            return
        try:
            for handle, identity in self._gpus:
                try:
                    nvml.nvmlDeviceRegisterEvents(handle, _XID_CRITICAL_ERROR_EVENT, event_set)
                except nvml.NVMLError as error:
                    if getattr(error, "value", None) != _NOT_SUPPORTED:
                        self._errors.count("xid", "nvmlDeviceRegisterEvents")
                    continue
                self._uuid_by_handle[handle_key(handle)] = identity.uuid
            if not self._uuid_by_handle:
                log.warning("no GPU supports XID events: XID counters disabled")
                return
            self._ledger.set_watching(True)
            self._wait_loop(event_set)
        finally:
            self._ledger.set_watching(False)
            try:
                nvml.nvmlEventSetFree(event_set)
            except Exception:  # noqa: BLE001 - best effort at shutdown
                self._errors.count("xid", "nvmlEventSetFree")

    def _wait_loop(self, event_set: Any) -> None:
        nvml = self._nvml
        while not self._stop.is_set():
            try:
                event = nvml.nvmlEventSetWait_v2(event_set, self._poll_ms)
            except nvml.NVMLError as error:
                if getattr(error, "value", None) == _TIMEOUT:
                    continue
                self._errors.count("xid", "nvmlEventSetWait_v2")
                self._stop.wait(1.0)  # do not spin on a broken event set
                continue
            except Exception:  # noqa: BLE001 - never let the thread die
                self._errors.count("xid", "nvmlEventSetWait_v2")
                self._stop.wait(1.0)
                continue
            if not int(event.eventType) & _XID_CRITICAL_ERROR_EVENT:
                continue
            uuid = self._uuid_by_handle.get(handle_key(event.device))
            if uuid is None:
                self._errors.count("xid", "unknown_device")
                continue
            xid = int(event.eventData)
            instance = _instance_id(getattr(event, "gpuInstanceId", None))
            if instance is None:
                log.warning("XID %d on GPU %s", xid, uuid)
            else:
                log.warning(
                    "XID %d on GPU %s, GPU instance %d (compute instance %s)",
                    xid,
                    uuid,
                    instance,
                    _instance_id(getattr(event, "computeInstanceId", None)),
                )
            self._ledger.record(uuid, xid, time.time(), instance)


def _instance_id(value: Any) -> int | None:
    """NVML's instance id of an event, None where it names none (0xFFFFFFFF; absent from
    an older pynvml's event structure)."""
    if value is None:
        return None
    number = int(value)
    return None if number == _NO_INSTANCE else number
