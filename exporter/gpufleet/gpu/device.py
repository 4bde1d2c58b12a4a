"""What the reader remembers of each GPU (and each MIG instance) between cycles."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from gpufleet.gpu.snapshot import GpuIdentity

MIG_MODE_UNKNOWN = -1
MIG_ENABLED = 1  # NVML_DEVICE_MIG_ENABLE
# An NVML field value: its id, or (id, scopeId).
FieldKey = int | tuple[int, int]


@dataclass(slots=True)
class MigState:
    """One GPU instance of a GPU in MIG mode, read through its MIG device handle (the
    first compute instance in it: memory is the GPU instance's, GPM is per GPU instance)."""

    handle: Any
    identity: GpuIdentity
    memory_v1: bool = False  # nvmlMemory_v2 refused on this handle
    gpm_refused: bool = False
    gpm_previous: Any = None
    gpm_previous_at: float = 0.0


@dataclass(slots=True)
class GpuState:
    handle: Any
    identity: GpuIdentity
    unsupported_probes: set[str] = field(default_factory=set)
    unsupported_fields: set[str] = field(default_factory=set)
    # NVML field values NVML reported unsupported; not asked again
    unsupported_field_ids: set[FieldKey] = field(default_factory=set)
    # when each mode-dependent probe was found unsupported (monotonic seconds)
    refused_at: dict[str, float] = field(default_factory=dict)
    mig_mode: int | None = MIG_MODE_UNKNOWN  # None: the GPU has no MIG mode
    nvlink_data: tuple[int, int] | None = None  # (TX + RX KiB, timestamp in us)
    gpm_supported: bool | None = None
    gpm_unsupported_ids: set[int] = field(default_factory=set)
    gpm_previous: Any = None
    gpm_previous_at: float = 0.0
    instances: list[MigState] = field(default_factory=list)
    mig_uuids: tuple[str, ...] = ()  # the MIG devices found by the last enumeration
    fabric_refused: bool = False  # NVML has no NVLink fabric for this GPU
    fabric_v1: bool = False  # nvmlDeviceGetGpuFabricInfoV failed: the v1 call from then on
