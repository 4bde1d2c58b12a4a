"""What one NVML collection cycle saw: immutable, shared between threads by reference."""

from __future__ import annotations

from dataclasses import dataclass, field

from gpufleet.exposition import format_labels
from gpufleet.gpu.catalogue import GPU_LABELS


@dataclass(frozen=True, slots=True)
class GpuIdentity:
    """What identifies a GPU; it becomes dcgm-exporter's label set."""

    index: int
    uuid: str
    pci_bus_id: str
    minor_number: int
    model: str
    hostname: str

    @property
    def device(self) -> str:
        return f"nvidia{self.minor_number}"

    def label_pairs(self) -> tuple[tuple[str, str], ...]:
        values = (
            str(self.index),
            self.uuid,
            self.pci_bus_id,
            self.device,
            self.model,
            self.hostname,
        )
        return tuple(zip(GPU_LABELS, values, strict=True))

    def labels(self) -> str:
        return format_labels(self.label_pairs())


@dataclass(frozen=True, slots=True)
class GpuReading:
    """One GPU in one cycle. ``values`` holds only the fields the GPU supports."""

    identity: GpuIdentity
    up: bool
    values: dict[str, float] = field(default_factory=dict)
    clock_event_reasons: int | None = None


@dataclass(frozen=True, slots=True)
class GpuSnapshot:
    seq: int
    taken_at: float  # wall clock, seconds since the epoch
    taken_monotonic: float
    duration_seconds: float
    driver_version: str
    cuda_driver_version: str
    gpus: tuple[GpuReading, ...]
    gpus_expected: int
    # field name -> number of GPUs on which NVML reports it unsupported
    unsupported: dict[str, int] = field(default_factory=dict)

    @property
    def gpus_seen(self) -> int:
        return sum(1 for reading in self.gpus if reading.up)
