"""``gpufleet slurm-watch`` as a service: the watcher polling Slurm, and its own /metrics."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

from gpufleet.fleet.ledger_client import LedgerClient
from gpufleet.schema import slurm as schema
from gpufleet.sources.slurm import (
    ACTIONS,
    DEFAULT_MAX_EVENT_AGE_S,
    OUTCOMES,
    SlurmWatcher,
)
from gpufleet.sources.slurmstate import SlurmCommands, SlurmError
from gpufleet.sources.watch_metrics import Labelled, watcher_families

log = logging.getLogger(__name__)


class SlurmWatchCollector(Collector):
    """The watcher's report on itself, from one snapshot per scrape."""

    def __init__(self, watcher: SlurmWatcher) -> None:
        self.watcher = watcher

    def collect(self) -> Iterator[Metric]:
        stats = self.watcher.snapshot()
        polls = schema.POLLS.counter()
        polls.add_metric([], stats.polls)
        yield polls
        labelled: tuple[Labelled, ...] = (
            (schema.POLL_ERRORS, stats.poll_errors, ("sinfo", "squeue")),
            (schema.CHANGES, stats.changes, ACTIONS),
            (schema.SKIPPED, stats.skipped, ACTIONS),
        )
        yield from watcher_families(
            labelled,
            writes=schema.WRITES,
            write_counts=stats.writes,
            actions=ACTIONS,
            outcomes=OUTCOMES,
            gauges=(
                (schema.PENDING, stats.pending),
                (schema.NODES, stats.nodes),
                (schema.OUT_OF_SERVICE, stats.out_of_service),
                (schema.UP, int(stats.up)),
                (schema.LAST_POLL, stats.last_poll),
            ),
        )


@dataclass(frozen=True)
class SlurmWatchSettings:
    listen: tuple[str, int]
    fleet_url: str
    fleet_token: str | None
    cluster: str | None  # None: slurm.conf's ClusterName
    interval_s: float = 15.0
    state_file: Path | None = None
    attempts: str = "requeued"
    max_event_age_s: float = DEFAULT_MAX_EVENT_AGE_S
    commands: SlurmCommands = field(default_factory=SlurmCommands)


def serve_slurm_watch(settings: SlurmWatchSettings, stop: threading.Event | None = None) -> int:
    """Poll Slurm and serve /metrics until SIGTERM (or ``stop``)."""
    import signal

    from prometheus_client import CollectorRegistry, start_http_server

    stop = stop or threading.Event()
    cluster = settings.cluster
    while cluster is None:
        try:
            cluster = settings.commands.cluster_name()
        except SlurmError as error:
            log.warning("cannot read the cluster name (%s); retrying", error)
            if stop.wait(settings.interval_s):
                return 0
    watcher = SlurmWatcher(
        settings.commands,
        LedgerClient(settings.fleet_url, settings.fleet_token),
        cluster,
        state_file=settings.state_file,
        attempts=settings.attempts,
        max_event_age_s=settings.max_event_age_s,
    )
    registry = CollectorRegistry(auto_describe=False)
    registry.register(SlurmWatchCollector(watcher))
    host, port = settings.listen
    server, _ = start_http_server(port, host, registry)
    if threading.current_thread() is threading.main_thread():
        for number in (signal.SIGTERM, signal.SIGINT):
            signal.signal(number, lambda *_: stop.set())
    log.info("watching Slurm cluster %s every %gs for %s; metrics on %s:%d", cluster,
             settings.interval_s, settings.fleet_url, host, port)  # fmt: skip
    while True:
        began = time.monotonic()
        watcher.poll()
        if stop.wait(max(0.0, settings.interval_s - (time.monotonic() - began))):
            break
    left = len(watcher.pending)
    if left:
        log.warning("%d writes not delivered; kept in the state file for the next start", left)
    server.shutdown()
    return 0
