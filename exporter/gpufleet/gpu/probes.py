"""The probes: one per NVML call (or family of calls), each with the metrics it feeds,
in the order the reader asks them every cycle."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from gpufleet.gpu import fields, gpm
from gpufleet.gpu.device import MIG_ENABLED, GpuState
from gpufleet.gpu.nvml_call import MIB, NvmlCalls, Unsupported
from gpufleet.schema import gpu as cat
from gpufleet.schema.family import MetricDef

_GRID_LICENSE_FEATURE_CODE_VGPU = 1  # NVML_GRID_LICENSE_FEATURE_CODE_VGPU

# A probe's reading: it puts its values into the dict; the clock event reasons probe
# also returns the bitmask.
ProbeRead = Callable[[NvmlCalls, GpuState, dict[str, float]], int | None]


@dataclass(frozen=True, slots=True)
class Probe:
    name: str
    metrics: tuple[MetricDef, ...]
    read: ProbeRead


def _clock(clock_type: int, metric: MetricDef) -> ProbeRead:
    def read(calls: NvmlCalls, state: GpuState, values: dict[str, float]) -> None:
        values[metric.name] = float(calls.device(state, "nvmlDeviceGetClockInfo", clock_type))

    return read


def _read_temperature(calls: NvmlCalls, state: GpuState, values: dict[str, float]) -> None:
    sensor = calls.nvml.NVML_TEMPERATURE_GPU
    values[cat.GPU_TEMP.name] = float(calls.device(state, "nvmlDeviceGetTemperature", sensor))


def _read_power(calls: NvmlCalls, state: GpuState, values: dict[str, float]) -> None:
    milliwatts = calls.device(state, "nvmlDeviceGetPowerUsage")
    values[cat.POWER_USAGE.name] = milliwatts / 1000.0


def _read_energy(calls: NvmlCalls, state: GpuState, values: dict[str, float]) -> None:
    values[cat.TOTAL_ENERGY.name] = float(
        calls.device(state, "nvmlDeviceGetTotalEnergyConsumption")
    )


def _read_utilization(calls: NvmlCalls, state: GpuState, values: dict[str, float]) -> None:
    rates = calls.device(state, "nvmlDeviceGetUtilizationRates")
    values[cat.GPU_UTIL.name] = float(rates.gpu)
    values[cat.MEM_COPY_UTIL.name] = float(rates.memory)


def _codec(call: str, metric: MetricDef) -> ProbeRead:
    def read(calls: NvmlCalls, state: GpuState, values: dict[str, float]) -> None:
        utilization, _period_us = calls.device(state, call)
        values[metric.name] = float(utilization)

    return read


def _read_vgpu_license(calls: NvmlCalls, state: GpuState, values: dict[str, float]) -> None:
    """As DCGM (DcgmCacheManager.cpp): 0 where NVML says the GPU has no vGPU licensing
    (bare metal), else the state of the vGPU feature; omitted where NVML refuses."""
    features = calls.device(state, "nvmlDeviceGetGridLicensableFeatures")
    if not features.isGridLicenseSupported:
        values[cat.VGPU_LICENSE_STATUS.name] = 0.0
        return
    count = min(int(features.licensableFeaturesCount), len(features.gridLicensableFeatures))
    for slot in range(count):
        feature = features.gridLicensableFeatures[slot]
        if int(feature.featureCode) == _GRID_LICENSE_FEATURE_CODE_VGPU:
            values[cat.VGPU_LICENSE_STATUS.name] = 1.0 if feature.featureState > 0 else 0.0
            return


def _read_memory(calls: NvmlCalls, state: GpuState, values: dict[str, float]) -> None:
    if state.mig_mode == MIG_ENABLED:
        # The memory is its GPU instances' (each reading has its own), as dcgm-exporter
        # serves it: the GPU's aggregate beside them would count it twice in a sum.
        return
    try:
        info = calls.device(state, "nvmlDeviceGetMemoryInfo", calls.nvml.nvmlMemory_v2)
        values[cat.FB_RESERVED.name] = info.reserved / MIB
    except Unsupported:
        # Drivers before R510 have only the v1 structure, without `reserved`.
        info = calls.device(state, "nvmlDeviceGetMemoryInfo")
        state.unsupported_fields.add(cat.FB_RESERVED.name)
    values[cat.FB_FREE.name] = info.free / MIB
    values[cat.FB_USED.name] = info.used / MIB


def _read_pcie_replay(calls: NvmlCalls, state: GpuState, values: dict[str, float]) -> None:
    values[cat.PCIE_REPLAY.name] = float(calls.device(state, "nvmlDeviceGetPcieReplayCounter"))


def _pcie_throughput(counter: int, gpm_id: int, metric: MetricDef) -> ProbeRead:
    """The fallback where GPM has no PCIe rate: NVML's 20 ms sample, in KiB/s."""

    def read(calls: NvmlCalls, state: GpuState, values: dict[str, float]) -> None:
        gpm_refused = gpm.PROBE in state.unsupported_probes or gpm_id in state.gpm_unsupported_ids
        if state.gpm_supported and not gpm_refused:
            return  # GPM gives it (or gives it next cycle)
        kib_per_second = calls.device(state, "nvmlDeviceGetPcieThroughput", counter)
        values[metric.name] = kib_per_second * 1024.0

    return read


def _ecc(error_type: int, counter_type: int, metric: MetricDef) -> ProbeRead:
    def read(calls: NvmlCalls, state: GpuState, values: dict[str, float]) -> None:
        values[metric.name] = float(
            calls.device(state, "nvmlDeviceGetTotalEccErrors", error_type, counter_type)
        )

    return read


def _retired(cause: int, metric: MetricDef) -> ProbeRead:
    def read(calls: NvmlCalls, state: GpuState, values: dict[str, float]) -> None:
        pages = calls.device(state, "nvmlDeviceGetRetiredPages", cause)
        values[metric.name] = float(len(pages))

    return read


def _read_retired_pending(calls: NvmlCalls, state: GpuState, values: dict[str, float]) -> None:
    pending = calls.device(state, "nvmlDeviceGetRetiredPagesPendingStatus")
    values[cat.RETIRED_PENDING.name] = 1.0 if pending else 0.0


def _read_remapped_rows(calls: NvmlCalls, state: GpuState, values: dict[str, float]) -> None:
    correctable, uncorrectable, pending, failure = calls.device(state, "nvmlDeviceGetRemappedRows")
    values[cat.CORRECTABLE_REMAPPED_ROWS.name] = float(correctable)
    values[cat.UNCORRECTABLE_REMAPPED_ROWS.name] = float(uncorrectable)
    values[cat.ROW_REMAP_PENDING.name] = 1.0 if pending else 0.0
    values[cat.ROW_REMAP_FAILURE.name] = 1.0 if failure else 0.0


def _read_clock_reasons(calls: NvmlCalls, state: GpuState, values: dict[str, float]) -> int:
    try:
        reasons = int(calls.device(state, "nvmlDeviceGetCurrentClocksEventReasons"))
    except Unsupported:
        # Drivers before R535 only know the older name of the same bitmask.
        reasons = int(calls.device(state, "nvmlDeviceGetCurrentClocksThrottleReasons"))
    # DCGM field 112 under both of dcgm-exporter's names (3.x and 4.x)
    values[cat.CLOCK_THROTTLE_REASONS.name] = float(reasons)
    values[cat.CLOCKS_EVENT_REASONS.name] = float(reasons)
    return reasons


CLOCK_EVENT_REASONS = "clock_event_reasons"

PROBES: tuple[Probe, ...] = (
    Probe("sm_clock", (cat.SM_CLOCK,), _clock(1, cat.SM_CLOCK)),
    Probe("mem_clock", (cat.MEM_CLOCK,), _clock(2, cat.MEM_CLOCK)),
    Probe("gpu_temp", (cat.GPU_TEMP,), _read_temperature),
    Probe("power", (cat.POWER_USAGE,), _read_power),
    Probe("energy", (cat.TOTAL_ENERGY,), _read_energy),
    Probe("utilization", (cat.GPU_UTIL, cat.MEM_COPY_UTIL), _read_utilization),
    Probe("encoder", (cat.ENC_UTIL,), _codec("nvmlDeviceGetEncoderUtilization", cat.ENC_UTIL)),
    Probe("decoder", (cat.DEC_UTIL,), _codec("nvmlDeviceGetDecoderUtilization", cat.DEC_UTIL)),
    Probe("vgpu_license", (cat.VGPU_LICENSE_STATUS,), _read_vgpu_license),
    Probe("memory", (cat.FB_FREE, cat.FB_USED, cat.FB_RESERVED), _read_memory),
    Probe("pcie_replay", (cat.PCIE_REPLAY,), _read_pcie_replay),
    Probe("ecc_sbe_vol", (cat.ECC_SBE_VOL,), _ecc(0, 0, cat.ECC_SBE_VOL)),
    Probe("ecc_dbe_vol", (cat.ECC_DBE_VOL,), _ecc(1, 0, cat.ECC_DBE_VOL)),
    Probe("ecc_sbe_agg", (cat.ECC_SBE_AGG,), _ecc(0, 1, cat.ECC_SBE_AGG)),
    Probe("ecc_dbe_agg", (cat.ECC_DBE_AGG,), _ecc(1, 1, cat.ECC_DBE_AGG)),
    Probe("retired_sbe", (cat.RETIRED_SBE,), _retired(0, cat.RETIRED_SBE)),
    Probe("retired_dbe", (cat.RETIRED_DBE,), _retired(1, cat.RETIRED_DBE)),
    Probe("retired_pending", (cat.RETIRED_PENDING,), _read_retired_pending),
    Probe(
        "remapped_rows",
        (
            cat.CORRECTABLE_REMAPPED_ROWS,
            cat.UNCORRECTABLE_REMAPPED_ROWS,
            cat.ROW_REMAP_PENDING,
            cat.ROW_REMAP_FAILURE,
        ),
        _read_remapped_rows,
    ),
    # GPM first: the wait for a meaningful GPM interval after open() also spaces
    # the NVLink data samples
    Probe(gpm.PROBE, tuple(metric for _, metric in gpm.GPM_METRICS), gpm.read_gpm),
    # the violation times come with these field values where NVML has them
    Probe(fields.PROBE, fields.FIELD_VALUE_METRICS, fields.read_field_values),
    Probe(
        CLOCK_EVENT_REASONS,
        (cat.CLOCK_THROTTLE_REASONS, cat.CLOCKS_EVENT_REASONS),
        _read_clock_reasons,
    ),
    Probe(
        "power_violation",
        (cat.POWER_VIOLATION,),
        fields.violation(fields.FI_POWER_VIOLATION, 0, cat.POWER_VIOLATION),
    ),
    Probe(
        "thermal_violation",
        (cat.THERMAL_VIOLATION,),
        fields.violation(fields.FI_THERMAL_VIOLATION, 1, cat.THERMAL_VIOLATION),
    ),
    # after GPM, which gives DCGM's PCIe rates where the GPU has it
    Probe("pcie_tx", (cat.PCIE_TX,), _pcie_throughput(0, gpm.GPM_PCIE_TX, cat.PCIE_TX)),
    Probe("pcie_rx", (cat.PCIE_RX,), _pcie_throughput(1, gpm.GPM_PCIE_RX, cat.PCIE_RX)),
)
PROBE_BY_NAME = {probe.name: probe for probe in PROBES}

# Probes whose support depends on the GPU's mode: with MIG instances NVML refuses the
# whole-GPU remapped rows, utilisation, codec and GPM queries. Asked again when the MIG
# mode changes and every reprobe_after_s, instead of never.
MODE_DEPENDENT_PROBES = frozenset(
    {"remapped_rows", "utilization", "encoder", "decoder", gpm.PROBE, "pcie_tx", "pcie_rx"}
)
