"""Reads every GPU through NVML (the ``pynvml`` module, or a stand-in with its API).

One ``NvmlReader.read()`` is one collection cycle and returns an immutable
``GpuSnapshot``. The reader never raises on a GPU's failure: an unsupported
field is omitted and remembered (NVML is not asked again, except for the calls
whose support depends on the GPU's mode, which are asked again when the MIG mode
changes and every ``reprobe_after_s``), a lost GPU is reported as down, and any
other failure is counted per NVML call.

A GPU in MIG mode is read as a whole (what NVML serves for the parent: clocks,
temperature, power, ECC, remapped rows where allowed, NVLink, PCIe, violations)
and then once per GPU instance on it, through its MIG device handle: memory and
the GPM profiling metrics, which is what NVML serves per instance (the GPU's own
memory series give way to its instances'). XIDs stay on
the parent (the XID watcher registers the parents' handles).

The parts: ``nvml_call`` (calls, errors, the call in flight), ``device`` (what is kept
per GPU between cycles), ``probes`` (one per NVML call, in the order asked),
``fields`` (the field values: NVLink counters and bandwidth, violations), ``gpm``
(the profiling fields), ``mig`` (GPU instances), ``fabric`` (the NVLink domain).
"""

from __future__ import annotations

import time
from typing import Any

from gpufleet.gpu import gpm, mig
from gpufleet.gpu.device import GpuState
from gpufleet.gpu.fabric import read_fabric
from gpufleet.gpu.fields import prime_nvlink
from gpufleet.gpu.nvml_call import (
    CallErrors,
    CallFailed,
    GpuDown,
    InFlightCall,
    NvmlApi,
    NvmlCalls,
    Unsupported,
    init_nvml,
    text,
)
from gpufleet.gpu.probes import (
    CLOCK_EVENT_REASONS,
    MODE_DEPENDENT_PROBES,
    PROBE_BY_NAME,
    PROBES,
)
from gpufleet.gpu.snapshot import GpuIdentity, GpuReading, GpuSnapshot

DEFAULT_REPROBE_AFTER_S = 300.0


class NvmlReader:
    """Collects one snapshot of every GPU per ``read()`` call; used by one thread."""

    def __init__(
        self,
        nvml: NvmlApi,
        hostname: str,
        expected_gpus: int | None = None,
        errors: CallErrors | None = None,
        collector: str = "gpu",
        *,
        reprobe_after_s: float = DEFAULT_REPROBE_AFTER_S,
    ) -> None:
        self.nvml = nvml
        self.hostname = hostname
        self.errors = errors if errors is not None else CallErrors()
        self._calls = NvmlCalls(nvml, self.errors, collector)
        self._reprobe_after_s = reprobe_after_s
        self._configured_expected = expected_gpus
        self._gpus: list[GpuState] = []
        self._first_seen = 0
        self._seq = 0
        self.driver_version = ""
        self.cuda_driver_version = ""
        self._opened = False

    @property
    def in_flight(self) -> InFlightCall | None:
        """The NVML call under way, for the sampler's watchdog."""
        return self._calls.in_flight

    # -- lifecycle -----------------------------------------------------------------

    def open(self) -> None:
        """Initialise NVML and enumerate GPUs; raises NvmlUnavailable with a remedy."""
        calls = self._calls
        init_nvml(self.nvml)
        self._opened = True
        self.driver_version = calls.system_text("nvmlSystemGetDriverVersion")
        cuda = calls.system_value("nvmlSystemGetCudaDriverVersion")
        if isinstance(cuda, int) and cuda > 0:
            self.cuda_driver_version = f"{cuda // 1000}.{(cuda % 1000) // 10}"
        try:
            count = int(calls.call("nvmlDeviceGetCount", None, self.nvml.nvmlDeviceGetCount))
        except (CallFailed, Unsupported, GpuDown):
            count = 0
        for index in range(count):
            self._gpus.append(self._enumerate(index))
        self._first_seen = count
        # One NVLink data and one GPM sample now, so that the first snapshot (what /readyz
        # waits for) already has the rates (NVLink bandwidth, DCGM_FI_PROF_*), as
        # dcgm-exporter's first scrape does.
        for state in self._gpus:
            if state.handle is not None:
                prime_nvlink(calls, state)
                gpm.prime_gpm(calls, state)
                mig.prime_instances(calls, state)

    def close(self) -> None:
        for state in self._gpus:
            gpm.free_sample(self._calls, state)
            mig.drop_instances(self._calls, state)
        if self._opened:
            self._opened = False
            try:
                self.nvml.nvmlShutdown()
            except Exception:  # noqa: BLE001 - shutting down; nothing useful to do
                self._calls.count_error("nvmlShutdown")

    @property
    def handles(self) -> list[tuple[Any, GpuIdentity]]:
        return [(state.handle, state.identity) for state in self._gpus]

    @property
    def gpus_expected(self) -> int:
        return max(self._configured_expected or 0, self._first_seen)

    # -- one cycle ---------------------------------------------------------------

    def read(self) -> GpuSnapshot:
        calls = self._calls
        started_wall = time.time()
        started = time.monotonic()
        gathered: list[GpuReading] = []
        for state in self._gpus:
            reading = self._read_gpu(state)
            gathered.append(reading)
            if reading.up:
                try:
                    mig.sync_instances(calls, state)
                except GpuDown:
                    # lost since its own reading: the next cycle says so
                    mig.drop_instances(calls, state)
                gathered.extend(mig.read_instance(calls, state, each) for each in state.instances)
            else:
                mig.drop_instances(calls, state)
        readings = tuple(gathered)
        unsupported: dict[str, int] = {}
        for state in self._gpus:
            for name in state.unsupported_fields:
                unsupported[name] = unsupported.get(name, 0) + 1
        finished = time.monotonic()
        self._seq += 1
        return GpuSnapshot(
            seq=self._seq,
            taken_at=started_wall,
            taken_monotonic=finished,
            duration_seconds=finished - started,
            driver_version=self.driver_version,
            cuda_driver_version=self.cuda_driver_version,
            gpus=readings,
            gpus_expected=self.gpus_expected,
            unsupported=unsupported,
        )

    def _read_gpu(self, state: GpuState) -> GpuReading:
        calls = self._calls
        if state.handle is None:
            state.handle = calls.handle_or_none(state.identity.index)
            if state.handle is None:
                return GpuReading(identity=state.identity, up=False)
        values: dict[str, float] = {}
        reasons: int | None = None
        try:
            self._reprobe_mode_dependent(state)
            for probe in PROBES:
                if probe.name in state.unsupported_probes:
                    continue
                try:
                    result = probe.read(calls, state, values)
                except Unsupported:
                    state.unsupported_probes.add(probe.name)
                    state.unsupported_fields.update(metric.name for metric in probe.metrics)
                    if probe.name in MODE_DEPENDENT_PROBES:
                        state.refused_at[probe.name] = time.monotonic()
                except CallFailed:
                    continue
                else:
                    if probe.name == CLOCK_EVENT_REASONS:
                        reasons = result
            fabric = read_fabric(calls, state)
        except GpuDown:
            return GpuReading(identity=state.identity, up=False)
        return GpuReading(
            identity=state.identity,
            up=True,
            values=values,
            clock_event_reasons=reasons,
            fabric=fabric,
        )

    def _reprobe_mode_dependent(self, state: GpuState) -> None:
        """Forget that mode-dependent probes were refused when the MIG mode changed or
        they were refused long enough ago; they are asked again this cycle."""
        mig_changed = mig.update_mig_mode(self._calls, state)
        if not state.refused_at:
            return
        now = time.monotonic()
        for name, refused in list(state.refused_at.items()):
            if mig_changed or now - refused >= self._reprobe_after_s:
                del state.refused_at[name]
                state.unsupported_probes.discard(name)
                probe = PROBE_BY_NAME[name]
                state.unsupported_fields.difference_update(m.name for m in probe.metrics)
                if name == gpm.PROBE:
                    state.gpm_supported = None
                    state.gpm_unsupported_ids.clear()
                    # a rate over the refused stretch would mean nothing: start afresh
                    gpm.free_sample(self._calls, state)

    def _enumerate(self, index: int) -> GpuState:
        calls = self._calls
        handle = calls.handle_or_none(index)
        placeholder = GpuIdentity(index, "", "", index, "", self.hostname)
        if handle is None:
            return GpuState(handle=None, identity=placeholder)
        state = GpuState(handle=handle, identity=placeholder)

        def device_text(name: str) -> str:
            try:
                return text(calls.device(state, name))
            except (CallFailed, Unsupported, GpuDown):
                return ""

        try:
            bus_id = text(calls.device(state, "nvmlDeviceGetPciInfo").busId)
        except (CallFailed, Unsupported, GpuDown):
            bus_id = ""
        try:
            minor = int(calls.device(state, "nvmlDeviceGetMinorNumber"))
        except (CallFailed, Unsupported, GpuDown):
            minor = index
        state.identity = GpuIdentity(
            index=index,
            uuid=device_text("nvmlDeviceGetUUID"),
            pci_bus_id=bus_id,
            minor_number=minor,
            model=device_text("nvmlDeviceGetName"),
            hostname=self.hostname,
        )
        return state
