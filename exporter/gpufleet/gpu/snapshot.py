"""What one NVML collection cycle saw: immutable, shared between threads by reference."""

from __future__ import annotations

from dataclasses import dataclass, field

from gpufleet.exposition import format_labels
from gpufleet.schema.gpu import GPU_LABELS, MIG_INSTANCE_LABEL, MIG_PROFILE_LABEL, NODE_LABEL


@dataclass(frozen=True, slots=True)
class GpuIdentity:
    """What identifies a GPU or one MIG instance of it; it becomes dcgm-exporter's label set.

    A MIG instance keeps its parent GPU's index, UUID, bus id, device and model, as
    dcgm-exporter labels it, and adds the instance's profile and GPU instance id."""

    index: int
    uuid: str
    pci_bus_id: str
    minor_number: int
    model: str
    hostname: str
    # Set only on a MIG instance's reading (from NVML's MIG device handle).
    mig_profile: str | None = None
    mig_instance_id: int | None = None
    mig_uuid: str | None = None  # the MIG device's own UUID, "MIG-..."
    mig_compute_instance_id: int | None = None

    @property
    def is_mig(self) -> bool:
        return self.mig_instance_id is not None

    @property
    def key(self) -> tuple[int, int]:
        """Unique within a snapshot, where instances share their parent's index."""
        return (self.index, -1 if self.mig_instance_id is None else self.mig_instance_id)

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
        pairs = tuple(zip(GPU_LABELS, values, strict=True))
        if self.mig_instance_id is None:
            return pairs
        mig = (
            (MIG_PROFILE_LABEL, self.mig_profile or ""),
            (MIG_INSTANCE_LABEL, str(self.mig_instance_id)),
        )
        # GPU_LABELS ends with the node label; the MIG labels go just before it.
        assert pairs[-1][0] == NODE_LABEL
        return (*pairs[:-1], *mig, pairs[-1])

    def labels(self) -> str:
        return format_labels(self.label_pairs())


@dataclass(frozen=True, slots=True)
class GpuFabric:
    """The GPU's NVLink fabric registration (nvmlDeviceGetGpuFabricInfoV): the cluster
    UUID and clique id are set only once the state is ``completed``."""

    state: str
    cluster_uuid: str = ""
    clique_id: str = ""


@dataclass(frozen=True, slots=True)
class GpuReading:
    """One GPU in one cycle. ``values`` holds only the fields the GPU supports."""

    identity: GpuIdentity
    up: bool
    values: dict[str, float] = field(default_factory=dict)
    clock_event_reasons: int | None = None
    fabric: GpuFabric | None = None  # None: NVML has no fabric for this GPU, or it is down


@dataclass(frozen=True, slots=True)
class GpuSnapshot:
    seq: int
    taken_at: float  # wall clock, seconds since the epoch
    taken_monotonic: float
    duration_seconds: float
    driver_version: str
    cuda_driver_version: str
    # Whole GPUs; after a GPU in MIG mode, one reading per MIG instance of it
    # (identity.is_mig) holding what NVML serves per instance.
    gpus: tuple[GpuReading, ...]
    gpus_expected: int
    # field name -> number of GPUs on which NVML reports it unsupported
    unsupported: dict[str, int] = field(default_factory=dict)

    @property
    def gpus_seen(self) -> int:
        """GPUs answering; MIG instances are not GPUs and are not counted."""
        return sum(1 for reading in self.gpus if reading.up and not reading.identity.is_mig)
