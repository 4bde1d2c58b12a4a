"""DCGM's profiling fields (DCGM_FI_PROF_*) from NVML GPM (Hopper and later), for a
whole GPU and for each GPU instance of one in MIG mode: rates between two samples."""

from __future__ import annotations

import time
from typing import Any

from gpufleet.gpu.device import GpuState, MigState
from gpufleet.gpu.nvml_call import (
    MIB,
    NOT_SUPPORTED,
    CallFailed,
    GpuDown,
    NvmlCalls,
    Unsupported,
)
from gpufleet.schema import gpu as cat
from gpufleet.schema.family import MetricDef

# The probe that reads the whole GPU's GPM metrics.
PROBE = "gpm"
# GPM metric IDs (percent) for the DCGM profiling fields (ratios).
GPM_METRICS: tuple[tuple[int, MetricDef], ...] = (
    (1, cat.GR_ENGINE_ACTIVE),  # NVML_GPM_METRIC_GRAPHICS_UTIL
    (2, cat.SM_ACTIVE),  # NVML_GPM_METRIC_SM_UTIL
    (3, cat.SM_OCCUPANCY),  # NVML_GPM_METRIC_SM_OCCUPANCY
    (5, cat.PIPE_TENSOR_ACTIVE),  # NVML_GPM_METRIC_ANY_TENSOR_UTIL
    (10, cat.DRAM_ACTIVE),  # NVML_GPM_METRIC_DRAM_BW_UTIL
)
# GPM metric IDs in MiB/s for DCGM_FI_PROF_PCIE_TX/RX_BYTES (bytes/s; DCGM multiplies
# by 1024 * 1024, DcgmCacheManager.cpp). Without GPM, NVML's PCIe throughput stands in.
GPM_PCIE_TX = 20  # NVML_GPM_METRIC_PCIE_TX_PER_SEC
GPM_PCIE_RX = 21  # NVML_GPM_METRIC_PCIE_RX_PER_SEC
_GPM_PCIE: tuple[tuple[int, MetricDef], ...] = (
    (GPM_PCIE_TX, cat.PCIE_TX),
    (GPM_PCIE_RX, cat.PCIE_RX),
)

# GPM metrics are rates between two samples; closer ones are noise.
_GPM_MIN_INTERVAL_S = 0.1


def gpm_supported(calls: NvmlCalls, state: GpuState) -> bool:
    if state.gpm_supported is None:
        support = calls.device(state, "nvmlGpmQueryDeviceSupport")
        state.gpm_supported = bool(support.isSupportedDevice)
    return state.gpm_supported


def prime_gpm(calls: NvmlCalls, state: GpuState) -> None:
    """A first sample at open(), so that the first snapshot has the rates."""
    try:
        if gpm_supported(calls, state):
            take_sample(calls, state, state)
    except (CallFailed, Unsupported, GpuDown):
        pass  # the first cycle tries again (and records what it finds)


def read_gpm(calls: NvmlCalls, state: GpuState, values: dict[str, float]) -> None:
    """The whole GPU's profiling fields (a probe: Unsupported where the GPU has no GPM)."""
    if not gpm_supported(calls, state):
        raise Unsupported
    # only right after open(): give the priming sample a meaningful interval
    _wait_for_interval(state)
    previous = take_sample(calls, state, state)
    if previous is None:
        return  # GPM metrics are rates between two samples: the next cycle has them
    request = _metrics(calls, state, previous, state.gpm_previous)
    for metric_id, metric in _decode(request, values):
        if metric_id in (GPM_PCIE_TX, GPM_PCIE_RX):
            state.gpm_unsupported_ids.add(metric_id)  # the PCIe fallback reads it
        else:
            state.unsupported_fields.add(metric.name)


def read_instance_gpm(
    calls: NvmlCalls, state: GpuState, mig: MigState, values: dict[str, float]
) -> None:
    """One GPU instance's profiling fields (nvmlGpmMigSampleGet on the parent)."""
    try:
        if mig.gpm_refused or not gpm_supported(calls, state):
            return
        _wait_for_interval(mig)
        previous = take_sample(calls, state, mig)
    except Unsupported:
        mig.gpm_refused = True
        return
    except CallFailed:
        return
    if previous is None:
        return
    try:
        request = _metrics(calls, state, previous, mig.gpm_previous)
    except (CallFailed, Unsupported):
        return
    _decode(request, values)


def free_sample(calls: NvmlCalls, holder: GpuState | MigState) -> None:
    """Frees the latest sample of a GPU or instance, if any (best effort: it is gone, the
    agent is stopping, or a rate over a refused stretch would mean nothing)."""
    sample, holder.gpm_previous = holder.gpm_previous, None
    if sample is None:
        return
    try:
        calls.nvml.nvmlGpmSampleFree(sample)
    except Exception:  # noqa: BLE001 - nothing useful to do
        calls.count_error("nvmlGpmSampleFree")


def _wait_for_interval(holder: GpuState | MigState) -> None:
    if holder.gpm_previous is not None:
        young = _GPM_MIN_INTERVAL_S - (time.monotonic() - holder.gpm_previous_at)
        if young > 0:
            time.sleep(young)


def take_sample(calls: NvmlCalls, state: GpuState, holder: GpuState | MigState) -> Any:
    """A new GPM sample of the GPU (``holder`` is ``state``) or of one of its GPU instances
    becomes the holder's latest; returns the one it replaces."""
    nvml = calls.nvml
    index = state.identity.index
    sample = calls.call("nvmlGpmSampleAlloc", index, nvml.nvmlGpmSampleAlloc)
    try:
        if isinstance(holder, MigState):
            calls.device(state, "nvmlGpmMigSampleGet", holder.identity.mig_instance_id, sample)
        else:
            calls.device(state, "nvmlGpmSampleGet", sample)
    except Exception:
        calls.call("nvmlGpmSampleFree", index, nvml.nvmlGpmSampleFree, sample)
        raise
    previous, holder.gpm_previous = holder.gpm_previous, sample
    holder.gpm_previous_at = time.monotonic()
    return previous


def _metrics(calls: NvmlCalls, state: GpuState, previous: Any, sample: Any) -> Any:
    """The GPM metrics between two samples (of the GPU, or of one GPU instance);
    frees ``previous``."""
    nvml = calls.nvml
    index = state.identity.index
    try:
        request = nvml.c_nvmlGpmMetricsGet_t()
        request.version = nvml.NVML_GPM_METRICS_GET_VERSION
        request.numMetrics = len(GPM_METRICS) + len(_GPM_PCIE)
        request.sample1 = previous
        request.sample2 = sample
        for slot, (metric_id, _) in enumerate((*GPM_METRICS, *_GPM_PCIE)):
            request.metrics[slot].metricId = metric_id
        calls.call("nvmlGpmMetricsGet", index, nvml.nvmlGpmMetricsGet, request)
    finally:
        calls.call("nvmlGpmSampleFree", index, nvml.nvmlGpmSampleFree, previous)
    return request


def _decode(request: Any, values: dict[str, float]) -> list[tuple[int, MetricDef]]:
    """Puts the metrics GPM answered into ``values``; returns those it refused."""
    refused: list[tuple[int, MetricDef]] = []
    for slot, (metric_id, metric) in enumerate(GPM_METRICS):
        result = request.metrics[slot]
        if int(result.nvmlReturn) == 0:
            values[metric.name] = float(result.value) / 100.0
        elif int(result.nvmlReturn) == NOT_SUPPORTED:
            refused.append((metric_id, metric))
    for slot, (metric_id, metric) in enumerate(_GPM_PCIE, start=len(GPM_METRICS)):
        result = request.metrics[slot]
        if int(result.nvmlReturn) == 0:
            values[metric.name] = float(int(float(result.value) * MIB))  # MiB/s -> B/s
        elif int(result.nvmlReturn) == NOT_SUPPORTED:
            refused.append((metric_id, metric))
    return refused
