"""The GPU instances of a GPU in MIG mode: found every cycle through their MIG device
handles, named as dcgm-exporter names them, and read for what NVML serves per instance
(memory, and the GPM profiling metrics)."""

from __future__ import annotations

import dataclasses
import math
import re
from typing import Any

from gpufleet.gpu import gpm
from gpufleet.gpu.device import MIG_ENABLED, MIG_MODE_UNKNOWN, GpuState, MigState
from gpufleet.gpu.nvml_call import MIB, CallFailed, GpuDown, NvmlCalls, Unsupported, text
from gpufleet.gpu.snapshot import GpuIdentity, GpuReading
from gpufleet.schema import gpu as cat


def update_mig_mode(calls: NvmlCalls, state: GpuState) -> bool:
    """Reads the GPU's current MIG mode; True when it changed since the last read."""
    if state.mig_mode is None:
        return False
    try:
        current, _pending = calls.device(state, "nvmlDeviceGetMigMode")
    except Unsupported:
        state.mig_mode = None  # no MIG on this GPU: its mode never changes
        return False
    except CallFailed:
        return False
    changed = state.mig_mode not in (MIG_MODE_UNKNOWN, int(current))
    state.mig_mode = int(current)
    return changed


def prime_instances(calls: NvmlCalls, state: GpuState) -> None:
    """Finds the GPU instances at open() and takes a first GPM sample of each, so the
    first snapshot has their profiling metrics as it has the whole GPUs'."""
    try:
        update_mig_mode(calls, state)
        sync_instances(calls, state)
        if state.instances and gpm.gpm_supported(calls, state):
            for mig in state.instances:
                gpm.take_sample(calls, state, mig)
    except (CallFailed, Unsupported, GpuDown):
        pass  # the first cycle tries again


def sync_instances(calls: NvmlCalls, state: GpuState) -> None:
    """The GPU's MIG devices, found every cycle as nvml.h says to: each index below
    nvmlDeviceGetMaxMigDeviceCount through nvmlDeviceGetMigDeviceHandleByIndex
    (NOT_FOUND: none there). Instances come and go without a mode change
    (nvidia-smi mig, mig-parted), and a destroyed one's handle stays invalid."""
    if state.mig_mode != MIG_ENABLED:
        drop_instances(calls, state)
        return
    try:
        count = int(calls.device(state, "nvmlDeviceGetMaxMigDeviceCount"))
    except (Unsupported, CallFailed):
        return  # counted; the instances found last stay until the next cycle
    found: list[tuple[Any, str]] = []
    for mig_index in range(count):
        try:
            handle = calls.device(state, "nvmlDeviceGetMigDeviceHandleByIndex", mig_index)
            uuid = text(calls.on(state, handle, "nvmlDeviceGetUUID"))
        except (CallFailed, Unsupported):
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
        identity = _mig_identity(calls, state, handle, uuid)
        if identity is None or identity.mig_instance_id is None:
            state.mig_uuids = ()
            continue
        current = chosen.get(identity.mig_instance_id)
        if current is None or (identity.mig_compute_instance_id or 0) < (
            current[1].mig_compute_instance_id or 0
        ):
            chosen[identity.mig_instance_id] = (handle, identity)
    kept = {mig.identity: mig for mig in state.instances}
    instances: list[MigState] = []
    for gpu_instance in sorted(chosen):
        handle, identity = chosen[gpu_instance]
        mig = kept.pop(identity) if identity in kept else MigState(handle, identity)
        mig.handle = handle
        instances.append(mig)
    for gone in kept.values():
        gpm.free_sample(calls, gone)
    state.instances = instances


def drop_instances(calls: NvmlCalls, state: GpuState) -> None:
    for mig in state.instances:
        gpm.free_sample(calls, mig)
    state.instances = []
    state.mig_uuids = ()


def read_instance(calls: NvmlCalls, state: GpuState, mig: MigState) -> GpuReading:
    values: dict[str, float] = {}
    try:
        _read_instance_memory(calls, state, mig, values)
        gpm.read_instance_gpm(calls, state, mig, values)
    except GpuDown:
        return GpuReading(identity=mig.identity, up=False)
    return GpuReading(identity=mig.identity, up=True, values=values)


def _read_instance_memory(
    calls: NvmlCalls, state: GpuState, mig: MigState, values: dict[str, float]
) -> None:
    """nvml.h (nvmlDeviceGetMemoryInfo): "Per-instance information can be queried by
    using specific MIG device handles"."""
    try:
        if not mig.memory_v1:
            try:
                info = calls.on(
                    state, mig.handle, "nvmlDeviceGetMemoryInfo", calls.nvml.nvmlMemory_v2
                )
                values[cat.FB_RESERVED.name] = info.reserved / MIB
            except Unsupported:
                mig.memory_v1 = True
        if mig.memory_v1:
            info = calls.on(state, mig.handle, "nvmlDeviceGetMemoryInfo")
    except (CallFailed, Unsupported):
        return
    values[cat.FB_FREE.name] = info.free / MIB
    values[cat.FB_USED.name] = info.used / MIB


def _mig_identity(calls: NvmlCalls, state: GpuState, handle: Any, uuid: str) -> GpuIdentity | None:
    """The parent's labels plus the instance's: its GPU instance id
    (nvmlDeviceGetGpuInstanceId, dcgm-exporter's GPU_I_ID), compute instance id, and
    profile name (GPU_I_PROFILE)."""
    try:
        gpu_instance = int(calls.on(state, handle, "nvmlDeviceGetGpuInstanceId"))
        compute_instance = int(calls.on(state, handle, "nvmlDeviceGetComputeInstanceId"))
    except (CallFailed, Unsupported):
        return None
    return dataclasses.replace(
        state.identity,
        mig_profile=_mig_profile(calls, state, handle),
        mig_instance_id=gpu_instance,
        mig_uuid=uuid,
        mig_compute_instance_id=compute_instance,
    )


def _mig_profile(calls: NvmlCalls, state: GpuState, handle: Any) -> str:
    """The GPU instance's profile name, "1g.10gb". nvml.h: on a MIG device handle
    nvmlDeviceGetName returns the MIG device's name, which ends in "MIG <profile>" as
    nvidia-smi -L lists it ("1c.3g.40gb" for a compute instance of part of a GPU
    instance, whose profile is "3g.40gb"). Failing that, the name NVIDIA's
    k8s-device-plugin gives it (go-nvlib, pkg/nvlib/device/mig_profile.go): the GPU
    instance's slices "g.", its share of the parent's memory rounded up to eighths
    times the parent's GiB "gb"."""
    try:
        name = text(calls.on(state, handle, "nvmlDeviceGetName"))
    except (CallFailed, Unsupported):
        name = ""
    if "MIG " in name:
        profile = name.rsplit("MIG ", 1)[1].strip()
        # a compute instance smaller than its GPU instance is named "2c.3g.40gb":
        # GPU_I_PROFILE is the GPU instance's profile
        return re.sub(r"^\d+c\.", "", profile)
    try:
        attributes = calls.on(state, handle, "nvmlDeviceGetAttributes")
    except (CallFailed, Unsupported):
        return ""
    slices = int(attributes.gpuInstanceSliceCount)
    mib = int(attributes.memorySizeMB)
    try:
        total = int(calls.device(state, "nvmlDeviceGetMemoryInfo").total)
    except (CallFailed, Unsupported, GpuDown):
        total = 0
    return f"{slices}g.{mig_memory_gb(mib, total)}gb"


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
