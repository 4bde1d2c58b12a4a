"""Runs the NVML reader on a fixed interval in a background thread.

``/metrics`` reads ``GpuSampler.snapshot`` and never calls NVML. A watchdog
thread notices an NVML call that hangs: it counts an error for that call, and
once the snapshot is older than ``stale_after`` the GPU values are no longer
served (they would be lies), which makes the hang visible in Prometheus.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass

from gpufleet.gpu.reader import NvmlReader
from gpufleet.gpu.snapshot import GpuSnapshot

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class SamplerStatus:
    snapshot: GpuSnapshot | None
    age_seconds: float | None
    stale: bool
    cycles: int
    hung_call: str | None


class GpuSampler:
    def __init__(
        self,
        reader: NvmlReader,
        interval: float = 5.0,
        stale_after: float | None = None,
        call_timeout: float | None = None,
    ) -> None:
        self.reader = reader
        self.interval = interval
        self.stale_after = stale_after if stale_after is not None else max(3 * interval, 15.0)
        self.call_timeout = call_timeout if call_timeout is not None else max(interval, 5.0)
        self._snapshot: GpuSnapshot | None = None
        self._cycles = 0
        self._stop = threading.Event()
        self._first = threading.Event()
        self._threads: list[threading.Thread] = []
        self._flagged_token = -1
        self._hung_call: str | None = None

    @property
    def snapshot(self) -> GpuSnapshot | None:
        return self._snapshot

    def wait_first(self, timeout: float) -> bool:
        return self._first.wait(timeout)

    def start(self) -> None:
        for target, name in (
            (self._sample_loop, "gpufleet-nvml-sampler"),
            (self._watchdog_loop, "gpufleet-nvml-watchdog"),
        ):
            thread = threading.Thread(target=target, name=name, daemon=True)
            thread.start()
            self._threads.append(thread)

    def stop(self, timeout: float = 5.0) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout)

    def sample_once(self) -> GpuSnapshot:
        snapshot = self.reader.read()
        self._snapshot = snapshot
        self._cycles += 1
        self._first.set()
        return snapshot

    def status(self) -> SamplerStatus:
        snapshot = self._snapshot
        age = None if snapshot is None else time.monotonic() - snapshot.taken_monotonic
        stale = snapshot is not None and age is not None and age > self.stale_after
        return SamplerStatus(snapshot, age, stale, self._cycles, self._hung_call)

    def _sample_loop(self) -> None:
        while not self._stop.is_set():
            started = time.monotonic()
            try:
                self.sample_once()
            except Exception:  # the reader already absorbs NVML errors; this is a bug
                log.exception("GPU collection cycle failed")
                self.reader.errors.count("gpu", "cycle")
            elapsed = time.monotonic() - started
            self._stop.wait(max(0.0, self.interval - elapsed))

    def _watchdog_loop(self) -> None:
        tick = min(1.0, self.call_timeout / 4)
        while not self._stop.wait(tick):
            in_flight = self.reader.in_flight
            if in_flight is None:
                self._hung_call = None
                continue
            if time.monotonic() - in_flight.started < self.call_timeout:
                continue
            self._hung_call = in_flight.call
            if in_flight.token != self._flagged_token:
                self._flagged_token = in_flight.token
                self.reader.errors.count("gpu", in_flight.call)
                log.error(
                    "NVML call %s on GPU %s has not returned for %.0f s",
                    in_flight.call,
                    in_flight.gpu,
                    time.monotonic() - in_flight.started,
                )
