"""A GPU's NVLink fabric registration (nvmlDeviceGetGpuFabricInfoV): which NVLink
domain it is in, what gpufleet_gpu_fabric_info exports."""

from __future__ import annotations

import ctypes
import uuid
from typing import Any

from gpufleet.gpu.device import GpuState
from gpufleet.gpu.nvml_call import CallFailed, NvmlCalls, Unsupported
from gpufleet.gpu.snapshot import GpuFabric
from gpufleet.schema import gpu as cat

# nvmlGpuFabricState_t (nvml.h): 0 NOT_SUPPORTED, 1 NOT_STARTED, 2 IN_PROGRESS, 3 COMPLETED
_STATE_NOT_SUPPORTED = 0
_STATE_COMPLETED = 3
# the state label's values (a completed registration with an error status is "failed")
_NOT_STARTED, _IN_PROGRESS, _COMPLETED, _FAILED = cat.FABRIC_STATES
_STATE_LABELS = {1: _NOT_STARTED, 2: _IN_PROGRESS}


def read_fabric(calls: NvmlCalls, state: GpuState) -> GpuFabric | None:
    """The GPU's NVLink fabric (nvmlDeviceGetGpuFabricInfoV; the v1 call on drivers
    without it), asked every cycle: registration completes some time after boot.
    NOT_SUPPORTED, or the state NOT_SUPPORTED, means no fabric: not asked again."""
    if state.fabric_refused:
        return None
    nvml = calls.nvml
    try:
        if not state.fabric_v1:
            try:
                info = nvml.c_nvmlGpuFabricInfoV_t()
                calls.device(state, "nvmlDeviceGetGpuFabricInfoV", ctypes.byref(info))
            except (Unsupported, CallFailed):  # also a driver older than the struct
                state.fabric_v1 = True
        if state.fabric_v1:
            info = nvml.c_nvmlGpuFabricInfo_t()
            calls.device(state, "nvmlDeviceGetGpuFabricInfo", ctypes.byref(info))
    except Unsupported:
        state.fabric_refused = True
    except CallFailed:
        return None
    else:
        if int(info.state) != _STATE_NOT_SUPPORTED:
            return _fabric(info)
        state.fabric_refused = True
    state.unsupported_fields.add(cat.GPU_FABRIC_INFO.name)
    return None


def _fabric(info: Any) -> GpuFabric:
    """A completed registration with a success status names the domain: cluster UUID
    and clique id (an all-zero UUID names none). NCCL reads these fields so before it
    uses multi-node NVLink."""
    state, status, cluster = int(info.state), int(info.status), bytes(info.clusterUuid)
    if state != _STATE_COMPLETED:
        return GpuFabric(_STATE_LABELS.get(state, f"state_{state}"))
    if status != 0:
        return GpuFabric(_FAILED)
    cluster_uuid = str(uuid.UUID(bytes=cluster)) if any(cluster) else ""
    return GpuFabric(_COMPLETED, cluster_uuid, str(int(info.cliqueId)))
