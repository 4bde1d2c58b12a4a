"""Records what real NVML answers into a fixture that FakeNvml replays.

``RecordingNvml`` wraps the pynvml module: every call the reader makes passes
through to NVML and its result (or error) is stored under the call's name and
arguments, in the format ``gpufleet.gpu.fake`` documents. Running the reader
through it therefore records exactly the calls the agent makes. Calls on a MIG
device handle are stored under its parent's ``mig_devices``, by the index the
handle was asked for with.
"""

from __future__ import annotations

import ctypes
import json
import socket
import time
import uuid
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import pynvml

from gpufleet.exposition import render
from gpufleet.gpu.fixture import FIXTURE_FORMAT
from gpufleet.gpu.nvml_call import NvmlApi, handle_key
from gpufleet.gpu.reader import NvmlReader
from gpufleet.gpu.render import gpu_families


def _error_name(code: int) -> str:
    for name in dir(pynvml):
        if name.startswith("NVML_ERROR_") and getattr(pynvml, name) == code:
            return name
    return f"NVML_ERROR_{code}"


def _plain(value: Any) -> Any:
    if isinstance(value, bytes):
        return value.decode("utf-8", errors="replace")
    return value


def _struct_fields(value: Any, names: tuple[str, ...]) -> dict[str, Any]:
    return {name: _plain(getattr(value, name)) for name in names}


_STRUCT_FIELDS: dict[str, tuple[str, ...]] = {
    "nvmlDeviceGetPciInfo": ("busId", "domain", "bus", "device", "pciDeviceId", "pciSubSystemId"),
    "nvmlDeviceGetUtilizationRates": ("gpu", "memory"),
    "nvmlDeviceGetMemoryInfo": ("total", "free", "used"),
    "nvmlDeviceGetMemoryInfo_v2": ("total", "reserved", "free", "used"),
    "nvmlDeviceGetViolationStatus": ("referenceTime", "violationTime"),
    "nvmlGpmQueryDeviceSupport": ("isSupportedDevice",),
    "nvmlDeviceGetAttributes": (
        "multiprocessorCount",
        "sharedCopyEngineCount",
        "sharedDecoderCount",
        "sharedEncoderCount",
        "sharedJpegCount",
        "sharedOfaCount",
        "gpuInstanceSliceCount",
        "computeInstanceSliceCount",
        "memorySizeMB",
    ),
}
# Filled through the pointer the caller passes: the struct is the answer.
_FABRIC_CALLS = ("nvmlDeviceGetGpuFabricInfoV", "nvmlDeviceGetGpuFabricInfo")


def _fabric_fields(pointer: Any) -> dict[str, Any]:
    info = getattr(pointer, "_obj", pointer)
    fields = {name: int(getattr(info, name)) for name in ("status", "cliqueId", "state")}
    raw = bytes(info.clusterUuid)
    return {"clusterUuid": str(uuid.UUID(bytes=raw)) if any(raw) else "", **fields}


_VALUE_ATTRS = ("dVal", "uiVal", "ulVal", "ullVal", "sllVal", "siVal", "usVal")


class RecordingNvml:
    def __init__(self, nvml: NvmlApi) -> None:
        self._nvml = nvml
        self.system: dict[str, Any] = {}
        self.devices: dict[int, dict[str, Any]] = {}
        self._index_by_handle: dict[Any, int] = {}
        # MIG device handle -> (parent index, MIG device index)
        self._mig_by_handle: dict[Any, tuple[int, int]] = {}
        # GPM sample -> (GPU index, GPU instance id or None for the whole GPU)
        self._gpm_sample_device: dict[int, tuple[int, int | None]] = {}

    def __getattr__(self, name: str) -> Any:
        target = getattr(self._nvml, name)
        if not (callable(target) and name.startswith("nvml")):
            return target
        return self._wrap(name, target)

    def _wrap(self, name: str, target: Callable[..., Any]) -> Callable[..., Any]:
        def call(*args: Any, **kwargs: Any) -> Any:
            try:
                result = target(*args, **kwargs)
            except self._nvml.NVMLError as error:
                self._store(name, args, kwargs, None, _error_name(error.value))
                raise
            self._store(name, args, kwargs, result, None)
            return result

        return call

    def fixture(self, note: str = "") -> dict[str, Any]:
        when = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        source = f"recorded by gpufleet nvml-record on {socket.gethostname()} at {when}"
        return {
            "format": FIXTURE_FORMAT,
            "source": f"{source}. {note}".strip(),
            "system": self.system,
            "devices": [self.devices[index] for index in sorted(self.devices)],
        }

    def _device_index(self, handle: Any) -> int | None:
        try:
            return self._index_by_handle.get(handle_key(handle))
        except TypeError:
            return None

    def _device_entry(self, handle: Any) -> tuple[int, dict[str, Any]] | None:
        """The fixture entry a handle's answers go to: its GPU's, or its MIG device's."""
        index = self._device_index(handle)
        if index is not None:
            return index, self.devices[index]
        try:
            mig = self._mig_by_handle.get(handle_key(handle))
        except TypeError:
            return None
        if mig is None:
            return None
        entry = self.devices[mig[0]]["mig_devices"][mig[1]]
        return mig[0], entry

    def _store_mig_handle(self, args: tuple[Any, ...], result: Any, error: str | None) -> None:
        index = self._device_index(args[0])
        if index is None:
            return
        migs: list[dict[str, Any] | None] = self.devices[index].setdefault("mig_devices", [])
        if error is not None:
            # no MIG device there: no entry (null where a later index has one), which the
            # fake answers with NOT_FOUND
            return
        mig_index = int(args[1])
        migs.extend([None] * (mig_index + 1 - len(migs)))
        if migs[mig_index] is None:
            migs[mig_index] = {}
        self._mig_by_handle[handle_key(result)] = (index, mig_index)

    def _store(
        self,
        name: str,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        result: Any,
        error: str | None,
    ) -> None:
        if name == "nvmlDeviceGetHandleByIndex" and error is None:
            self._index_by_handle[handle_key(result)] = int(args[0])
            self.devices.setdefault(int(args[0]), {})
            return
        if name.startswith("nvmlSystem"):
            self.system[name] = {"nvml_error": error} if error else _plain(result)
            return
        if name == "nvmlGpmMetricsGet":
            self._store_gpm(args[0], error)
            return
        if name == "nvmlDeviceGetMigDeviceHandleByIndex":
            self._store_mig_handle(args, result, error)
            return
        found = self._device_entry(args[0]) if args else None
        if found is None:
            return
        index, device = found
        if name == "nvmlGpmSampleGet" and error is None:
            pointer = ctypes.cast(args[1], ctypes.c_void_p).value or 0
            self._gpm_sample_device[int(pointer)] = (index, None)
            return
        if name == "nvmlGpmMigSampleGet":
            self._store_mig_gpm_sample(index, device, args, error)
            return
        if name == "nvmlDeviceGetFieldValues":
            self._store_fields(device, args[1], result, error)
            return
        if name in _FABRIC_CALLS:
            device[name] = {"nvml_error": error} if error else _fabric_fields(args[1])
            return
        version = kwargs.get("version") or (
            args[1] if name == "nvmlDeviceGetMemoryInfo" and len(args) > 1 else None
        )
        if name == "nvmlDeviceGetMemoryInfo" and version:
            name, args = "nvmlDeviceGetMemoryInfo_v2", args[:1]
        value: Any
        if error:
            value = {"nvml_error": error}
        elif name in _STRUCT_FIELDS:
            value = _struct_fields(result, _STRUCT_FIELDS[name])
        elif name == "nvmlDeviceGetRemappedRows":
            value = dict(
                zip(("correctable", "uncorrectable", "pending", "failure"), result, strict=True)
            )
        elif name == "nvmlDeviceGetGridLicensableFeatures":
            count = int(result.licensableFeaturesCount)
            value = {
                "isGridLicenseSupported": int(result.isGridLicenseSupported),
                "featureStates": [
                    int(result.gridLicensableFeatures[i].featureState) for i in range(count)
                ],
                "featureCodes": [
                    int(result.gridLicensableFeatures[i].featureCode) for i in range(count)
                ],
            }
        elif name in ("nvmlDeviceGetEncoderUtilization", "nvmlDeviceGetDecoderUtilization"):
            value = [int(part) for part in result]
        elif name == "nvmlDeviceGetRetiredPages":
            value = len(result)
        elif name == "nvmlDeviceRegisterEvents":
            return
        else:
            value = _plain(result)
        extra = args[1:]
        if extra:
            entry = device.setdefault(name, {})
            entry[",".join(str(arg) for arg in extra)] = value
        else:
            device[name] = value

    def _store_mig_gpm_sample(
        self, index: int, device: dict[str, Any], args: tuple[Any, ...], error: str | None
    ) -> None:
        """nvmlGpmMigSampleGet(parent, GPU instance id, sample): the metrics computed from
        the sample go under the parent's nvmlGpmMigMetricsGet, by GPU instance id."""
        by_instance = device.setdefault("nvmlGpmMigMetricsGet", {})
        gpu_instance = int(args[1])
        if error is not None:
            by_instance[str(gpu_instance)] = {"nvml_error": error}
            return
        by_instance.setdefault(str(gpu_instance), {})
        pointer = ctypes.cast(args[2], ctypes.c_void_p).value or 0
        self._gpm_sample_device[int(pointer)] = (index, gpu_instance)

    def _store_fields(
        self, device: dict[str, Any], requested: list[Any], result: Any, error: str | None
    ) -> None:
        entry = device.setdefault("nvmlDeviceGetFieldValues", {})
        for slot, field in enumerate(requested):
            key = f"{field[0]}@{field[1]}" if isinstance(field, tuple) else str(field)
            if error:
                entry[key] = {"nvml_error": error}
                continue
            value = result[slot]
            if int(value.nvmlReturn) != 0:
                entry[key] = {"nvml_error": _error_name(int(value.nvmlReturn))}
                continue
            value_type = int(value.valueType)
            raw = getattr(value.value, _VALUE_ATTRS[value_type] if value_type < 7 else "ullVal")
            entry[key] = {"type": value_type, "value": raw}

    def _store_gpm(self, request: Any, error: str | None) -> None:
        pointer = ctypes.cast(request.sample2, ctypes.c_void_p).value or 0
        source = self._gpm_sample_device.get(int(pointer))
        if source is None or error:
            return
        index, gpu_instance = source
        if gpu_instance is None:
            recorded = self.devices[index].setdefault("nvmlGpmMetricsGet", {})
        else:
            by_instance = self.devices[index].setdefault("nvmlGpmMigMetricsGet", {})
            recorded = by_instance.setdefault(str(gpu_instance), {})
        for slot in range(request.numMetrics):
            metric = request.metrics[slot]
            if int(metric.nvmlReturn) == 0:
                recorded[str(metric.metricId)] = float(metric.value)


def record_fixture(node: str, out: str, metrics_out: str | None = None) -> str:
    """Read this machine's GPUs twice through real NVML and write every answer to ``out``
    (and the GPU part of /metrics to ``metrics_out``); returns a one-line summary.
    Raises NvmlUnavailable when there is no driver."""
    recorder = RecordingNvml(pynvml)
    reader = NvmlReader(recorder, node)
    reader.open()
    reader.read()
    time.sleep(1.0)  # GPM metrics are rates between two samples
    snapshot = reader.read()
    reader.close()
    with open(out, "w", encoding="utf-8") as handle:
        json.dump(recorder.fixture(), handle, indent=1)
        handle.write("\n")
    if metrics_out:
        with open(metrics_out, "wb") as handle:
            handle.write(render(gpu_families(snapshot)))
    instances = sum(1 for reading in snapshot.gpus if reading.identity.is_mig)
    return (
        f"recorded {snapshot.gpus_seen} GPUs and {instances} MIG instances into {out}; "
        f"errors: {reader.errors.snapshot() or 'none'}; unsupported: {snapshot.unsupported}"
    )
