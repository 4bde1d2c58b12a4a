"""The metrics read as NVML field values, in one nvmlDeviceGetFieldValues call per GPU:
memory temperature, NVLink error counters and bandwidth, the recovery action, and the
power / thermal violation times (with nvmlDeviceGetViolationStatus as the fallback)."""

from __future__ import annotations

import time
from collections.abc import Callable

from gpufleet.gpu.device import FieldKey, GpuState
from gpufleet.gpu.nvml_call import ALL_LINKS, CallFailed, GpuDown, NvmlCalls, Unsupported
from gpufleet.schema import gpu as cat
from gpufleet.schema.family import MetricDef

# NVML field values read in one nvmlDeviceGetFieldValues call, with the metric each
# feeds; ids from nvml.h, and the DCGM field each becomes (dcgm_fields.cpp maps them).
FIELD_METRICS: tuple[tuple[FieldKey, MetricDef], ...] = (
    (82, cat.MEMORY_TEMP),  # NVML_FI_DEV_MEMORY_TEMP
    (38, cat.NVLINK_CRC_FLIT),  # NVML_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL (pre-Blackwell)
    (45, cat.NVLINK_CRC_DATA),  # NVML_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL (pre-Blackwell)
    (52, cat.NVLINK_REPLAY),  # NVML_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL (pre-Blackwell)
    (59, cat.NVLINK_RECOVERY),  # NVML_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL (pre-Blackwell)
    (160, cat.NVLINK_ECC_ERRORS),  # NVML_FI_DEV_NVLINK_ECC_DATA_ERROR_COUNT_TOTAL (Hopper+)
    # NVLink5 counters: DCGM asks for them with the all-links scope (NvLink aggregate)
    ((213, ALL_LINKS), cat.NVLINK_RECOVERY_SUCCESSFUL),  # ..._LINK_RECOVERY_SUCCESSFUL_EVENTS
    ((214, ALL_LINKS), cat.NVLINK_RECOVERY_FAILED),  # ..._COUNT_LINK_RECOVERY_FAILED_EVENTS
    ((215, ALL_LINKS), cat.NVLINK_RECOVERY_EVENTS),  # ..._COUNT_LINK_RECOVERY_EVENTS
    ((221, ALL_LINKS), cat.NVLINK_SYMBOL_ERRORS),  # NVML_FI_DEV_NVLINK_COUNT_SYMBOL_ERRORS
    ((219, ALL_LINKS), cat.NVLINK_EFFECTIVE_ERRORS),  # NVML_FI_DEV_NVLINK_COUNT_EFFECTIVE_ERRORS
    (230, cat.RECOVERY_ACTION),  # NVML_FI_DEV_GET_GPU_RECOVERY_ACTION
)
# NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX / _RX: KiB of data (no protocol) since boot.
_FI_NVLINK_DATA = ((138, ALL_LINKS), (139, ALL_LINKS))
# NVML_FI_DEV_PERF_POLICY_POWER / _THERMAL: time held back by the policy, in ns. DCGM
# reads DCGM_FI_DEV_POWER_VIOLATION / _THERMAL_VIOLATION from them unconverted
# (dcgm_fields.cpp); nvmlDeviceGetViolationStatus is the fallback (see violation).
FI_POWER_VIOLATION = 74
FI_THERMAL_VIOLATION = 75
_VIOLATION_FIELDS: tuple[tuple[int, MetricDef], ...] = (
    (FI_POWER_VIOLATION, cat.POWER_VIOLATION),
    (FI_THERMAL_VIOLATION, cat.THERMAL_VIOLATION),
)
# The probe that reads the field values, and what it exports (the violation times are
# their own probes', which fall back to another call where the fields are refused).
PROBE = "field_values"
FIELD_VALUE_METRICS = (*(metric for _, metric in FIELD_METRICS), cat.NVLINK_BANDWIDTH)


def read_field_values(calls: NvmlCalls, state: GpuState, values: dict[str, float]) -> None:
    unsupported = state.unsupported_field_ids
    wanted: list[FieldKey] = [
        key
        for key in (
            *(key for key, _ in FIELD_METRICS),
            *(key for key, _ in _VIOLATION_FIELDS),
            *_FI_NVLINK_DATA,
        )
        if key not in unsupported
    ]
    if not wanted:
        raise Unsupported
    stamps: dict[FieldKey, int] = {}
    result = calls.field_values(state, wanted, stamps)
    for key, value in result.items():
        if value is None:
            unsupported.add(key)
    for key, metric in FIELD_METRICS:
        value = result.get(key)
        if value is not None:
            values[metric.name] = float(value)
        elif key in unsupported:
            state.unsupported_fields.add(metric.name)
    for key, metric in _VIOLATION_FIELDS:
        value = result.get(key)
        if value is not None:
            values[metric.name] = float(value)  # ns, as DCGM publishes it
    if any(key in unsupported for key in _FI_NVLINK_DATA):
        state.unsupported_fields.add(cat.NVLINK_BANDWIDTH.name)
        return
    _nvlink_bandwidth(state, values, result, stamps)


def prime_nvlink(calls: NvmlCalls, state: GpuState) -> None:
    """A first NVLink data sample at open(), so that the first snapshot has the rate."""
    try:
        stamps: dict[FieldKey, int] = {}
        result = calls.field_values(state, list(_FI_NVLINK_DATA), stamps)
        _nvlink_bandwidth(state, {}, result, stamps)
    except (CallFailed, Unsupported, GpuDown):
        pass  # the first cycle tries again (and records what it finds)


def _nvlink_bandwidth(
    state: GpuState,
    values: dict[str, float],
    result: dict[FieldKey, float | int | None],
    stamps: dict[FieldKey, int],
) -> None:
    """DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL as DCGM computes it (DcgmCacheManager.cpp,
    ReadAndCacheNvLinkBandwidth): the TX + RX data counters' growth in KiB, per second
    between two samples, / 1000. The first sample has no rate: nothing is exported."""
    parts = [result.get(key) for key in _FI_NVLINK_DATA]
    if any(part is None for part in parts):
        return  # the call failed for a link this cycle (counted)
    total = int(sum(int(part) for part in parts if part is not None))
    stamp = max(stamps.get(key, 0) for key in _FI_NVLINK_DATA) or int(time.time() * 1e6)
    previous, state.nvlink_data = state.nvlink_data, (total, stamp)
    if previous is None:
        return
    seconds = (stamp - previous[1]) / 1e6
    if seconds <= 0 or total < previous[0]:
        return  # no time between the samples, or the counters were reset
    values[cat.NVLINK_BANDWIDTH.name] = float(int((total - previous[0]) / seconds / 1000.0))


def violation(
    field_id: int, policy: int, metric: MetricDef
) -> Callable[[NvmlCalls, GpuState, dict[str, float]], None]:
    """The fallback for drivers without the perf-policy field values:
    nvmlDeviceGetViolationStatus (deprecated in NVML 13), also in ns."""

    def read(calls: NvmlCalls, state: GpuState, values: dict[str, float]) -> None:
        fields_refused = PROBE in state.unsupported_probes
        if not fields_refused and field_id not in state.unsupported_field_ids:
            return  # read with the field values (or failed there this cycle, counted)
        violation = calls.device(state, "nvmlDeviceGetViolationStatus", policy)
        values[metric.name] = float(violation.violationTime)

    return read
