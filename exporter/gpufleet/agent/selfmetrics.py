"""The agent reports on itself: collection health, NVML errors, scrape cost."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

from gpufleet import __version__
from gpufleet.agent.connections import ConnectionGuard
from gpufleet.agent.ledger_forward import AttemptCounts
from gpufleet.agent.pod_resources import PodResourcesRefresher
from gpufleet.gpu.nvml_call import CallErrors
from gpufleet.gpu.sampler import GpuSampler
from gpufleet.schema import agent as schema


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
        started_at: float | None = None,
        attempts: AttemptCounts | None = None,
        pod_resources: PodResourcesRefresher | None = None,
    ) -> None:
        self._node = node
        # Made in Agent.open() with the XID ledger, so its counters count from about now.
        self._started_at = time.time() if started_at is None else started_at
        self._gpu_source = gpu_source
        self._errors = errors
        self._sampler = sampler
        self._scrapes = scrapes
        self._connections = connections
        self._attempts = attempts
        self._pod_resources = pod_resources

    def collect(self) -> Iterator[Metric]:
        info = schema.AGENT_INFO.gauge()
        info.add_metric([__version__, self._node, self._gpu_source], 1.0)
        yield info
        started = schema.AGENT_START_TIME.gauge()
        started.add_metric([], self._started_at)
        yield started

        errors = schema.COLLECTOR_ERRORS.counter()
        for (collector, call), count in sorted(self._errors.snapshot().items()):
            errors.add_metric([collector, call], float(count))
        yield errors

        if self._sampler is not None:
            status = self._sampler.status()
            up = schema.COLLECTOR_UP.gauge()
            up.add_metric(["gpu"], 0.0 if status.snapshot is None or status.stale else 1.0)
            yield up
            cycles = schema.COLLECTOR_CYCLES.counter()
            cycles.add_metric(["gpu"], float(status.cycles))
            yield cycles
            if status.snapshot is not None and status.age_seconds is not None:
                age = schema.COLLECTOR_SNAPSHOT_AGE.gauge()
                age.add_metric(["gpu"], status.age_seconds)
                yield age
                duration = schema.COLLECTOR_DURATION.gauge()
                duration.add_metric(["gpu"], status.snapshot.duration_seconds)
                yield duration
            hung = schema.COLLECTOR_HUNG.gauge()
            hung.add_metric(["gpu"], 1.0 if status.hung_call else 0.0)
            yield hung

        with_scrapes = schema.SCRAPE_DURATION.summary()
        with_scrapes.add_metric([], self._scrapes.count, self._scrapes.seconds)
        yield with_scrapes

        if self._connections is not None:
            open_now = schema.CONNECTIONS.gauge()
            open_now.add_metric([], self._connections.open_connections)
            yield open_now
            closed = schema.CONNECTIONS_CLOSED.counter()
            for reason, count in sorted(self._connections.closed().items()):
                closed.add_metric([reason], count)
            yield closed

        if self._attempts is not None:
            events = schema.ATTEMPT_EVENTS.counter()
            for outcome, count in self._attempts.outcomes().items():
                events.add_metric([outcome], count)
            yield events
            refusals = schema.ATTEMPT_REFUSALS.counter()
            for reason, count in sorted(self._attempts.refusals().items()):
                refusals.add_metric([reason], count)
            yield refusals
            queue = schema.ATTEMPT_QUEUE.gauge()
            queue.add_metric([], self._attempts.queued)
            yield queue

        if self._pod_resources is not None:
            yield from _pod_resources_families(self._pod_resources)


def _pod_resources_families(refresher: PodResourcesRefresher) -> Iterator[Metric]:
    refreshes = schema.POD_RESOURCES_REFRESHES.counter()
    for outcome, count in refresher.outcomes().items():
        refreshes.add_metric([outcome], count)
    yield refreshes
    if refresher.last_success is not None:
        success = schema.POD_RESOURCES_LAST_SUCCESS.gauge()
        success.add_metric([], refresher.last_success)
        yield success
