"""``gpufleet kube-watch`` as a service: the Node watcher, and its own /metrics."""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

from gpufleet.fleet.ledger_client import LedgerClient
from gpufleet.schema.family import MetricDef
from gpufleet.sources.kube import NodeWatcher, drain
from gpufleet.sources.kube_signals import NodeRules
from gpufleet.sources.kubeapi import ApiAccess, KubeApi

log = logging.getLogger(__name__)

EVENTS = MetricDef(
    "gpufleet_kube_watch_events_total",
    "counter",
    "Node watch events received, by type (ADDED, MODIFIED, DELETED, BOOKMARK).",
    ("type",),
)
CHANGES = MetricDef(
    "gpufleet_kube_watch_changes_total",
    "counter",
    "Nodes seen going out of service (exclude) or back (release), each queued once for the ledger.",
    ("action",),
)
WRITES = MetricDef(
    "gpufleet_kube_watch_ledger_writes_total",
    "counter",
    "Writes the ledger answered: accepted (stored or replayed), conflict (already so), "
    "refused (a 4xx: not retried).",
    ("action", "outcome"),
)
SEND_FAILURES = MetricDef(
    "gpufleet_kube_watch_ledger_failures_total",
    "counter",
    "Tries that did not reach the ledger or got a 5xx (writes are retried with their key; "
    "read: the open exclusions could not be read).",
    ("action",),
)
PENDING = MetricDef(
    "gpufleet_kube_watch_ledger_pending", "gauge", "Writes queued for the ledger, not yet answered."
)
RESYNCS = MetricDef(
    "gpufleet_kube_watch_resyncs_total",
    "counter",
    "Full lists of the nodes, by why: startup, gone (410: the watch's version was compacted), "
    "error (the last list failed).",
    ("reason",),
)
API_ERRORS = MetricDef(
    "gpufleet_kube_watch_api_errors_total",
    "counter",
    "Failed lists and watches, by reason (unreachable, decode, http_<code>).",
    ("reason",),
)
NODES = MetricDef("gpufleet_kube_watch_nodes", "gauge", "Node objects in the watcher's view.")
OUT_OF_SERVICE = MetricDef(
    "gpufleet_kube_watch_nodes_out_of_service",
    "gauge",
    "Nodes cordoned, tainted or with a condition that counts as out of service.",
)
WATCHING = MetricDef(
    "gpufleet_kube_watch_up", "gauge", "1 while a watch of the nodes is open, else 0."
)
LAST_LIST = MetricDef(
    "gpufleet_kube_watch_last_list_timestamp_seconds",
    "gauge",
    "When the nodes were last listed in full (Unix time).",
)
KUBE_WATCH_FAMILIES = (
    EVENTS, CHANGES, WRITES, SEND_FAILURES, PENDING, RESYNCS, API_ERRORS, NODES,
    OUT_OF_SERVICE, WATCHING, LAST_LIST,
)  # fmt: skip


class KubeWatchCollector(Collector):
    """The watcher's report on itself, from one snapshot per scrape."""

    def __init__(self, watcher: NodeWatcher) -> None:
        self.watcher = watcher

    def collect(self) -> Iterator[Metric]:
        stats = self.watcher.snapshot()
        labelled: tuple[tuple[MetricDef, Mapping[Any, int], tuple[str, ...]], ...] = (
            (EVENTS, stats.events, ("ADDED", "MODIFIED", "DELETED", "BOOKMARK")),
            (CHANGES, stats.changes, ("exclude", "release")),
            (SEND_FAILURES, stats.send_failures, ("exclude", "release", "read")),
            (RESYNCS, stats.resyncs, ("startup", "gone", "error")),
            (API_ERRORS, stats.api_errors, ()),
        )
        for definition, counts, always in labelled:
            family = definition.counter()
            for label in sorted(set(always) | set(counts)):
                family.add_metric([label], counts.get(label, 0))
            yield family
        writes = WRITES.counter()
        pairs = {
            (a, o) for a in ("exclude", "release") for o in ("accepted", "conflict", "refused")
        }
        for action, outcome in sorted(pairs | set(stats.writes)):
            writes.add_metric([action, outcome], stats.writes.get((action, outcome), 0))
        yield writes
        for definition, value in (
            (PENDING, stats.pending),
            (NODES, stats.nodes),
            (OUT_OF_SERVICE, stats.out_of_service),
            (WATCHING, int(stats.watching)),
            (LAST_LIST, stats.last_list),
        ):
            gauge = definition.gauge()
            gauge.add_metric([], float(value))
            yield gauge


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
