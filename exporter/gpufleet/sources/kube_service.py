"""``gpufleet kube-watch`` as a service: the Node watcher, and its own /metrics."""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator
from dataclasses import dataclass

from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

from gpufleet.fleet.ledger_client import LedgerClient
from gpufleet.schema import kube as schema
from gpufleet.sources.kube import NodeWatcher, drain
from gpufleet.sources.kube_signals import NodeRules
from gpufleet.sources.kubeapi import ApiAccess, KubeApi
from gpufleet.sources.watch_metrics import Labelled, watcher_families

log = logging.getLogger(__name__)


class KubeWatchCollector(Collector):
    """The watcher's report on itself, from one snapshot per scrape."""

    def __init__(self, watcher: NodeWatcher) -> None:
        self.watcher = watcher

    def collect(self) -> Iterator[Metric]:
        stats = self.watcher.snapshot()
        labelled: tuple[Labelled, ...] = (
            (schema.EVENTS, stats.events, ("ADDED", "MODIFIED", "DELETED", "BOOKMARK")),
            (schema.CHANGES, stats.changes, ("exclude", "release")),
            (schema.SEND_FAILURES, stats.send_failures, ("exclude", "release", "read")),
            (schema.RESYNCS, stats.resyncs, ("startup", "gone", "error")),
            (schema.API_ERRORS, stats.api_errors, ()),
        )
        yield from watcher_families(
            labelled,
            writes=schema.WRITES,
            write_counts=stats.writes,
            actions=("exclude", "release"),
            outcomes=("accepted", "conflict", "refused"),
            gauges=(
                (schema.PENDING, stats.pending),
                (schema.NODES, stats.nodes),
                (schema.OUT_OF_SERVICE, stats.out_of_service),
                (schema.WATCHING, int(stats.watching)),
                (schema.LAST_LIST, stats.last_list),
            ),
        )


@dataclass(frozen=True)
class KubeWatchSettings:
    listen: tuple[str, int]
    fleet_url: str
    fleet_token: str | None
    access: ApiAccess
    rules: NodeRules
    watch_timeout_s: int = 300


def serve_kube_watch(settings: KubeWatchSettings, stop: threading.Event | None = None) -> int:
    """Run the watcher and its /metrics until SIGTERM (or ``stop``)."""
    import signal

    from prometheus_client import CollectorRegistry, start_http_server

    stop = stop or threading.Event()
    watcher = NodeWatcher(
        KubeApi(settings.access),
        LedgerClient(settings.fleet_url, settings.fleet_token),
        settings.rules,
        watch_timeout_s=settings.watch_timeout_s,
    )
    registry = CollectorRegistry(auto_describe=False)
    registry.register(KubeWatchCollector(watcher))
    host, port = settings.listen
    server, _ = start_http_server(port, host, registry)
    if threading.current_thread() is threading.main_thread():
        for number in (signal.SIGTERM, signal.SIGINT):
            signal.signal(number, lambda *_: stop.set())
    log.info("watching the nodes of %s for %s; metrics on %s:%d",
             settings.access.server, settings.fleet_url, host, port)  # fmt: skip
    worker = threading.Thread(target=watcher.run, args=(stop,), daemon=True, name="kube-watch")
    worker.start()
    stop.wait()
    left = drain(watcher, 5.0)
    if left:
        log.warning("%d writes not delivered; the next start's list finds them again", left)
    server.shutdown()
    return 0
