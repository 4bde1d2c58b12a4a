"""The agent reports on itself: collection health, NVML errors, scrape cost."""

from __future__ import annotations

import threading
from collections.abc import Iterator

from prometheus_client.metrics_core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    Metric,
    SummaryMetricFamily,
)
from prometheus_client.registry import Collector

from gpufleet import __version__
from gpufleet.agent.connections import ConnectionGuard
from gpufleet.gpu.reader import CallErrors
from gpufleet.gpu.sampler import GpuSampler


class ScrapeStats:
    """Running count and total time of /metrics renders."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.count = 0
        self.seconds = 0.0

    def observe(self, seconds: float) -> None:
        with self._lock:
            self.count += 1
            self.seconds += seconds


class AgentSelfCollector(Collector):
    def __init__(
        self,
        node: str,
        gpu_source: str,
        errors: CallErrors,
        sampler: GpuSampler | None,
        scrapes: ScrapeStats,
        *,
        connections: ConnectionGuard | None = None,
    ) -> None:
        self._node = node
        self._gpu_source = gpu_source
        self._errors = errors
        self._sampler = sampler
        self._scrapes = scrapes
        self._connections = connections

    def collect(self) -> Iterator[Metric]:
        info = GaugeMetricFamily(
            "gpufleet_agent_info",
            "The agent's version, node name and GPU source; the value is always 1.",
            labels=["version", "node", "gpu_source"],
        )
        info.add_metric([__version__, self._node, self._gpu_source], 1.0)
        yield info

        errors = CounterMetricFamily(
            "gpufleet_collector_errors",
            "Failed calls per collector and NVML call (a hung call counts once).",
            labels=["collector", "call"],
        )
        for (collector, call), count in sorted(self._errors.snapshot().items()):
            errors.add_metric([collector, call], float(count))
        yield errors

        if self._sampler is not None:
            status = self._sampler.status()
            up = GaugeMetricFamily(
                "gpufleet_collector_up",
                "1 if the collector's last snapshot is fresh enough to be served.",
                labels=["collector"],
            )
            up.add_metric(["gpu"], 0.0 if status.snapshot is None or status.stale else 1.0)
            yield up
            cycles = CounterMetricFamily(
                "gpufleet_collector_cycles",
                "Completed collection cycles.",
                labels=["collector"],
            )
            cycles.add_metric(["gpu"], float(status.cycles))
            yield cycles
            if status.snapshot is not None and status.age_seconds is not None:
                age = GaugeMetricFamily(
                    "gpufleet_collector_snapshot_age_seconds",
                    "Seconds since the collector's last snapshot was taken.",
                    labels=["collector"],
                )
                age.add_metric(["gpu"], status.age_seconds)
                yield age
                duration = GaugeMetricFamily(
                    "gpufleet_collector_duration_seconds",
                    "Duration of the collector's last cycle.",
                    labels=["collector"],
                )
                duration.add_metric(["gpu"], status.snapshot.duration_seconds)
                yield duration
            hung = GaugeMetricFamily(
                "gpufleet_collector_hung",
                "1 while an NVML call has not returned within the call timeout.",
                labels=["collector"],
            )
            hung.add_metric(["gpu"], 1.0 if status.hung_call else 0.0)
            yield hung

        with_scrapes = SummaryMetricFamily(
            "gpufleet_scrape_duration_seconds", "Time spent rendering /metrics."
        )
        with_scrapes.add_metric([], self._scrapes.count, self._scrapes.seconds)
        yield with_scrapes

        if self._connections is not None:
            open_now = GaugeMetricFamily(
                "gpufleet_agent_connections", "HTTP connections open to the agent."
            )
            open_now.add_metric([], self._connections.open_connections)
            yield open_now
            closed = CounterMetricFamily(
                "gpufleet_agent_connections_closed",
                "Connections the agent cut: header_timeout, body_timeout, header_too_large, "
                "evicted (oldest idle one, to make room), over_limit.",
                labels=["reason"],
            )
            for reason, count in sorted(self._connections.closed().items()):
                closed.add_metric([reason], count)
            yield closed
