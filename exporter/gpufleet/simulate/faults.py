"""The fault model: causes of fail-stop interruptions, their signatures, and episodes.

Cause shares follow the Llama 3 report (419 unexpected interruptions in 54
days on 16,384 GPUs): faulty GPU incl. NVLink 30%, HBM 17%, software 13%,
network 8%, host 8%, SRAM 5%, GSP 4%, then small shares for NIC, NCCL
timeouts, silent data corruption, thermal, SSD and PSU. Each cause leaves the
signature NVIDIA documents for it on the metrics (XID codes, ECC and remap
counters, a GPU or node vanishing, the job stalling), and names the alerts that
should fire for it: the contract between the simulator's ground truth and the
rules in ``alerts/``.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from enum import StrEnum
from typing import Any

import numpy as np

from gpufleet.schema.alerts import AlertName

# An uncorrectable HBM error as the driver reports it, in order (NVIDIA, "GPU Memory
# Error Management", and the XID catalogue): XID 48, the double-bit error; 94 if it was
# contained to the processes using the memory, 95 if not (the catalogue's investigatory
# step for both: "IGNORE (sympathetic)", they follow the 48); 63 when the row was marked
# for remapping, 64 when remapping it failed; 154 as NVML's recovery action becomes "GPU
# reset", which is when a pending remap takes effect.
DBE = 48
CONTAINED = 94
UNCONTAINED = 95
REMAP_RECORDED = 63
REMAP_FAILED = 64
RECOVERY_ACTION_CHANGED = 154
DBE_BURST_XIDS = frozenset(
    {DBE, CONTAINED, UNCONTAINED, REMAP_RECORDED, REMAP_FAILED, RECOVERY_ACTION_CHANGED}
)
# NVML's recovery action (gpufleet_gpu_recovery_action): the driver changes it with an
# XID 154, which the simulator emits only in a DBE burst (a GPU reset on that GPU); every
# other cause leaves it at NONE, as NVML reports it on a GPU that asked for nothing.
RECOVERY_GPU_RESET = 1


def dbe_burst(
    rng: np.random.Generator,
    contained_share: float,
    remap_failure_share: float,
    gap_max_s: float,
    *,
    contained: bool | None = None,
    remap_failed: bool | None = None,
) -> tuple[tuple[float, int], ...]:
    """The XIDs of one uncorrectable HBM error: (seconds after the first, code), in order.

    ``contained`` and ``remap_failed`` force a variant (a scenario naming XID 95 or 64);
    the draws are made either way, so a forced variant changes nothing else of the seed.
    """
    drawn_contained = bool(rng.random() < contained_share)
    drawn_failed = bool(rng.random() < remap_failure_share)
    gaps = rng.uniform(0.0, gap_max_s, 3)
    contained = drawn_contained if contained is None else contained
    remap_failed = drawn_failed if remap_failed is None else remap_failed
    codes = (
        DBE,
        CONTAINED if contained else UNCONTAINED,
        REMAP_FAILED if remap_failed else REMAP_RECORDED,
        RECOVERY_ACTION_CHANGED,
    )
    offsets = (0.0, *(float(t) for t in np.cumsum(gaps)))
    return tuple(zip(offsets, codes, strict=True))


def forced_dbe_variant(xid: int | None) -> dict[str, bool]:
    """The burst variant a scenario asks for by naming one of its XIDs (none: drawn)."""
    if xid is not None and xid not in DBE_BURST_XIDS:
        raise ValueError(f"XID {xid} is not one of an HBM error's {sorted(DBE_BURST_XIDS)}")
    return {
        CONTAINED: {"contained": True},
        UNCONTAINED: {"contained": False},
        REMAP_RECORDED: {"remap_failed": False},
        REMAP_FAILED: {"remap_failed": True},
    }.get(xid or DBE, {})


class Scope(StrEnum):
    NODE = "node"  # a page for the node is expected
    JOB = "job"  # the job is affected; no single node can be blamed from telemetry
    NONE = "none"  # invisible to telemetry (e.g. silent data corruption)


class Effect(StrEnum):
    GPU_LOST = "gpu_lost"  # the GPU falls off the bus / stops answering NVML
    GPU_ERROR = "gpu_error"  # an XID; the GPU keeps answering
    NVLINK = "nvlink"  # XID 74 with NVLink error counters jumping
    HBM_ECC = "hbm_ecc"  # uncorrectable ECC, a row remapped (pending until reset)
    SRAM_ECC = "sram_ecc"  # uncorrectable ECC in SRAM (no row remap)
    NVML_HANG = "nvml_hang"  # NVML stops answering on the node: telemetry collapses
    NODE_DOWN = "node_down"  # the host dies: the agent stops answering
    JOB_STALL = "job_stall"  # the job hangs or crashes; the node looks fine
    THERMAL = "thermal"  # HW thermal slowdown for a while, then the job fails
    POWER_BRAKE = "power_brake"  # HW power-brake slowdown, then the host dies
    SILENT = "silent"  # nothing on the metrics


@dataclass(frozen=True, slots=True)
class Cause:
    name: str
    category: str
    weight: float  # percent of fail-stop interruptions
    effect: Effect
    xids: tuple[tuple[int, float], ...]  # (XID code, probability it is the one emitted)
    scope: Scope
    expected_alerts: tuple[AlertName, ...]
    excludes_node: bool
    precursor: str | None = None  # "remaps" or "pcie_replays", seen before some failures
    precursor_probability: float = 0.0


# Percentages after Llama 3 (Table 5); "faulty GPU incl. NVLink" split three ways.
CAUSES: tuple[Cause, ...] = (
    Cause(
        "gpu_fell_off_bus", "faulty_gpu", 12.0, Effect.GPU_LOST, ((79, 1.0),), Scope.NODE,
        (AlertName.CRITICAL_XID, AlertName.GPU_LOST, AlertName.GPU_MISSING), True,
        "pcie_replays", 0.3,
    ),
    Cause(
        "gpu_internal_error", "faulty_gpu", 10.0, Effect.GPU_ERROR, ((62, 0.5), (140, 0.5)),
        Scope.NODE, (AlertName.CRITICAL_XID,), True,
    ),
    Cause(
        "nvlink", "faulty_gpu", 8.0, Effect.NVLINK, ((74, 1.0),), Scope.NODE,
        (AlertName.CRITICAL_XID, AlertName.NVLINK_ERRORS), True,
    ),
    Cause(
        # XID 48 leads; the rest of the burst follows it (``dbe_burst``)
        "hbm", "hbm", 17.0, Effect.HBM_ECC, ((DBE, 1.0),), Scope.NODE,
        (AlertName.CRITICAL_XID, AlertName.ECC_UNCORRECTABLE, AlertName.GPU_RECOVERY_ACTION,
         AlertName.ROW_REMAP_PENDING, AlertName.ROW_REMAP_FAILURE),
        True, "remaps", 0.3,
    ),
    Cause(
        "software", "software", 13.0, Effect.JOB_STALL, ((13, 0.5), (31, 0.3), (43, 0.2)),
        Scope.JOB, (AlertName.APPLICATION_XID, AlertName.JOB_HUNG), False,
    ),
    Cause(
        "network", "network", 8.0, Effect.JOB_STALL, (), Scope.JOB, (AlertName.JOB_HUNG,), False
    ),
    Cause("host", "host", 8.0, Effect.NODE_DOWN, (), Scope.NODE, (AlertName.AGENT_DOWN,), True),
    Cause(
        "sram", "sram", 5.0, Effect.SRAM_ECC, ((95, 0.7), (48, 0.3)), Scope.NODE,
        (AlertName.CRITICAL_XID, AlertName.ECC_UNCORRECTABLE), True,
    ),
    Cause(
        "gsp", "gsp", 4.0, Effect.NVML_HANG, ((119, 0.6), (120, 0.4)), Scope.NODE,
        (AlertName.CRITICAL_XID, AlertName.TELEMETRY_COLLAPSE, AlertName.GPU_LOST), True,
    ),
    Cause("nic", "nic", 1.7, Effect.JOB_STALL, (), Scope.JOB, (AlertName.JOB_HUNG,), False),
    Cause(
        "nccl_timeout", "nccl_timeout", 1.7, Effect.JOB_STALL, (), Scope.JOB,
        (AlertName.JOB_HUNG,), False,
    ),
    Cause("sdc", "sdc", 1.4, Effect.SILENT, (), Scope.NONE, (), False),
    Cause(
        "thermal", "thermal", 1.4, Effect.THERMAL, (), Scope.NODE,
        (AlertName.HW_SLOWDOWN, AlertName.STRAGGLER), True,
    ),
    Cause("ssd", "ssd", 0.7, Effect.NODE_DOWN, (), Scope.NODE, (AlertName.AGENT_DOWN,), True),
    Cause(
        "psu", "psu", 0.7, Effect.POWER_BRAKE, (), Scope.NODE,
        (AlertName.HW_SLOWDOWN, AlertName.AGENT_DOWN), True,
    ),
)  # fmt: skip
CAUSES_BY_NAME = {cause.name: cause for cause in CAUSES}


class Kind(StrEnum):
    FAIL_STOP = "fail_stop"
    FAIL_SLOW_COMPUTE = "fail_slow_compute"
    FAIL_SLOW_COMM = "fail_slow_comm"
    PRECURSOR = "precursor"
    XID_STORM = "xid_storm"
    ECC_DEGRADATION = "ecc_degradation"
    NVLINK_FLAPPING = "nvlink_flapping"
    # confounders: no fault label, no node page expected
    DATA_LOADER_STALL = "data_loader_stall"
    CLUSTER_SLOWDOWN = "cluster_slowdown"
    CHECKPOINT = "checkpoint"
    EVAL = "eval"
    # one data-parallel replica given more work for a while (longer sequences): its
    # ranks compute longer on GPUs that are not slower
    WORKLOAD_IMBALANCE = "workload_imbalance"


CONFOUNDERS = frozenset(
    {
        Kind.DATA_LOADER_STALL,
        Kind.CLUSTER_SLOWDOWN,
        Kind.CHECKPOINT,
        Kind.EVAL,
        Kind.WORKLOAD_IMBALANCE,
    }
)


@dataclass(slots=True)
class Episode:
    """Something that happens to the cluster over [start, end) (Unix seconds)."""

    kind: Kind
    start: float
    end: float
    node: int | None = None
    gpu: int | None = None
    cause: str | None = None
    xid: int | None = None
    magnitude: float = 0.0
    expected_alerts: tuple[str, ...] = ()
    scope: Scope = Scope.NONE
    details: dict[str, Any] = field(default_factory=dict)
    id: int = -1

    @property
    def is_fault(self) -> bool:
        return self.kind not in CONFOUNDERS

    @property
    def shows_from(self) -> float:
        """When the episode first shows on the metrics: its start, or earlier for a
        fail-stop with a lead (the thermal or power-brake slowdown before the failure)."""
        lead = self.details.get("slowdown_from")
        return min(self.start, float(lead)) if isinstance(lead, float | int) else self.start

    def record(self, node_names: list[str]) -> dict[str, Any]:
        data = asdict(self)
        data["kind"] = str(self.kind)
        data["scope"] = str(self.scope)
        data["node"] = node_names[self.node] if self.node is not None else None
        data["fault"] = self.is_fault
        data["expected_alerts"] = list(self.expected_alerts)
        return data


def slow_episode_expectations(kind: Kind) -> tuple[tuple[str, ...], Scope]:
    if kind == Kind.FAIL_SLOW_COMPUTE:
        return (AlertName.STRAGGLER, AlertName.SLOWER_THAN_BASELINE), Scope.NODE
    if kind == Kind.FAIL_SLOW_COMM:
        # A slow link slows every rank of a lock-step job alike: the job is paged,
        # attributing it to a node needs network telemetry gpufleet does not have.
        return (AlertName.JOB_SLOWDOWN,), Scope.JOB
    if kind == Kind.XID_STORM:
        return (AlertName.CRITICAL_XID,), Scope.NODE
    if kind == Kind.ECC_DEGRADATION:
        return (
            AlertName.REMAPS_CLIMBING,
            AlertName.ROW_REMAP_PENDING,
            AlertName.ECC_UNCORRECTABLE,
        ), Scope.NODE
    if kind == Kind.NVLINK_FLAPPING:
        return (AlertName.NVLINK_ERRORS, AlertName.CRITICAL_XID), Scope.NODE
    if kind == Kind.PRECURSOR:
        return (AlertName.REMAPS_CLIMBING, AlertName.PCIE_REPLAYS), Scope.NODE
    return (), Scope.NONE
