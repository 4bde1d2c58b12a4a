"""``gpufleet kube-watch``'s report on itself (its own /metrics, beside the ledger)."""

from __future__ import annotations

from gpufleet.schema.family import MetricDef

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
