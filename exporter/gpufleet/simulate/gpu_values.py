"""What a simulated GPU reads: its error counters and throttle flags (the names and
bits the fault effects set), its SM clock under a slowdown, and the DCGM field values
the agent's reader would produce for it (``GpuValues``, a part of ``Cluster``)."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from gpufleet.schema import gpu as cat

# Per-GPU error counters, by the DCGM field (GPU catalogue entry) they feed.
GPU_COUNTERS = tuple(
    metric.name
    for metric in (
        cat.ECC_SBE_VOL,
        cat.ECC_DBE_VOL,
        cat.ECC_SBE_AGG,
        cat.ECC_DBE_AGG,
        cat.CORRECTABLE_REMAPPED_ROWS,
        cat.UNCORRECTABLE_REMAPPED_ROWS,
        cat.ROW_REMAP_PENDING,
        cat.ROW_REMAP_FAILURE,
        cat.NVLINK_CRC_FLIT,
        cat.NVLINK_CRC_DATA,
        cat.NVLINK_REPLAY,
        cat.NVLINK_RECOVERY,
        cat.PCIE_REPLAY,
    )
)
# Volatile counters reset when the GPU is reset (after a repair).
VOLATILE_COUNTERS = (cat.ECC_SBE_VOL.name, cat.ECC_DBE_VOL.name)
HW_SLOWDOWN = 0x8
HW_THERMAL = 0x40
HW_POWER_BRAKE = 0x80
MAX_SM_CLOCK_MHZ = 1980.0  # an H100 SXM's SM clock under load, unthrottled


def sm_clock_mhz(slowdown: np.ndarray) -> np.ndarray:
    """SM clocks of GPUs slowed by ``slowdown`` (clock-locked, throttled: the clock drops)."""
    return np.round(MAX_SM_CLOCK_MHZ / slowdown)


@dataclass(slots=True)
class XidRecord:
    counts: dict[int, int] = field(default_factory=dict)
    last: int = 0
    last_time: float = 0.0


class GpuValues:
    """The DCGM field values of the cluster's GPUs (a part of ``Cluster``; the state it
    reads is set by ``Cluster.__init__`` and the fault effects)."""

    training_now: bool
    in_training: np.ndarray
    gpu_power_base: np.ndarray
    energy_mj: np.ndarray
    slowdown: np.ndarray
    throttle: np.ndarray
    recovery_action: np.ndarray
    counters: dict[str, np.ndarray]

    def _power_watts(self) -> np.ndarray:
        load = 0.97 if self.training_now else 0.08
        watts = 75.0 + (self.gpu_power_base - 75.0) * load / np.maximum(self.slowdown, 1.0)
        return np.asarray(watts)

    def gpu_values(self, node: int, gpu: int) -> dict[str, float]:
        """DCGM field values of one GPU, as the agent's reader would produce them."""
        load = 0.97 if self.training_now and self.in_training[node] else 0.05
        slow = float(self.slowdown[node, gpu])
        watts = float(self._power_watts()[node, gpu]) if load > 0.5 else 72.0
        values = {
            cat.SM_CLOCK.name: float(sm_clock_mhz(self.slowdown[node, gpu])),
            cat.MEM_CLOCK.name: 2619.0,
            cat.GPU_TEMP.name: round(30 + watts / 20),
            cat.MEMORY_TEMP.name: round(36 + watts / 18),
            cat.POWER_USAGE.name: round(watts, 3),
            cat.TOTAL_ENERGY.name: float(self.energy_mj[node, gpu]),
            cat.GPU_UTIL.name: round(100 * load),
            cat.MEM_COPY_UTIL.name: round(45 * load),
            cat.FB_FREE.name: 6400.0 if load > 0.5 else 80993.0,
            cat.FB_USED.name: 74593.0 if load > 0.5 else 0.0,
            cat.FB_RESERVED.name: 566.0,
            cat.PCIE_TX.name: 3.1e6 * load,
            cat.PCIE_RX.name: 2.9e6 * load,
            cat.CLOCK_THROTTLE_REASONS.name: float(self.throttle[node, gpu]),
            cat.CLOCKS_EVENT_REASONS.name: float(self.throttle[node, gpu]),
            cat.VGPU_LICENSE_STATUS.name: 0.0,  # bare metal, as DCGM reports it
            cat.NVLINK_ECC_ERRORS.name: 0.0,  # an H100 has it (Hopper+); no NVLink5 counters
            cat.POWER_VIOLATION.name: 0.0,
            cat.THERMAL_VIOLATION.name: 0.0,
            cat.SM_ACTIVE.name: round(0.9 * load / slow, 4),
            cat.SM_OCCUPANCY.name: round(0.35 * load, 4),
            cat.PIPE_TENSOR_ACTIVE.name: round(0.55 * load / slow, 4),
            cat.DRAM_ACTIVE.name: round(0.42 * load, 4),
            # DCGM's unit: data KiB/s over all links / 1000 (~460 GB/s while training)
            cat.NVLINK_BANDWIDTH.name: round(449_000.0 * load),
            cat.RECOVERY_ACTION.name: float(self.recovery_action[node, gpu]),
        }
        for name, array in self.counters.items():
            values[name] = float(array[node, gpu])
        return values
