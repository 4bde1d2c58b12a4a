"""The ledger's metrics: the counters the rules read, and the ledger's report on itself.

The counters are kept materialised by the store (``counters.py``): a scrape
reads one row per series, whatever the length of the history, and because
they are committed with each write they resume exactly after a restart. The
names are the contract with ``alerts/``.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Iterator

from prometheus_client.metrics_core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from gpufleet.fleet.counters import CHAIN_OUTCOMES, DOWNTIME_BUCKETS, LedgerSnapshot
from gpufleet.fleet.store import CAPPED_LABELS, LedgerStore

EXCLUSIONS = "gpufleet_fleet_node_exclusions"
EXCLUDED = "gpufleet_fleet_node_excluded"
EXCLUDED_NODES = "gpufleet_fleet_excluded_nodes"
ATTEMPTS = "gpufleet_fleet_job_attempts"
DOWNTIME = "gpufleet_fleet_recovery_downtime_seconds"
CHAINS = "gpufleet_fleet_retry_chains"
CHAIN_FAILURES = "gpufleet_fleet_retry_chain_failed_attempts"
WRITES_REJECTED = "gpufleet_fleet_writes_rejected"
LABEL_VALUES = "gpufleet_fleet_label_values"
LABEL_VALUES_LIMIT = "gpufleet_fleet_label_values_limit"


def ledger_families(snapshot: LedgerSnapshot) -> Iterator[Metric]:
    """The families the rules read, from one snapshot (materialised or recomputed)."""
    exclusions = CounterMetricFamily(
        EXCLUSIONS,
        "Node exclusions recorded in the ledger, by node, reason and source (auto, manual).",
        labels=["node", "reason", "source"],
    )
    for node, reason, source, number in snapshot.exclusion_counts:
        exclusions.add_metric([node, reason, source], number)
    yield exclusions

    excluded = GaugeMetricFamily(
        EXCLUDED, "1 for each node currently excluded from service.", labels=["node"]
    )
    for node in snapshot.excluded:
        excluded.add_metric([node], 1.0)
    yield excluded
    count = GaugeMetricFamily(EXCLUDED_NODES, "Nodes currently excluded from service.")
    count.add_metric([], len(snapshot.excluded))
    yield count

    jobs = sorted(snapshot.jobs.items())
    attempt_family = CounterMetricFamily(
        ATTEMPTS,
        "Job attempts by trigger (initial, auto, manual) and outcome "
        "(success, failed, cancelled, running).",
        labels=["training_job", "trigger", "outcome"],
    )
    for job, summary in jobs:
        for (trigger, outcome), number in sorted(summary.attempts.items()):
            attempt_family.add_metric([job, trigger, outcome], number)
    yield attempt_family

    downtime = HistogramMetricFamily(
        DOWNTIME,
        "Recovery downtime: from a failed attempt's end to the next attempt's first step, "
        "by the next attempt's trigger.",
        labels=["training_job", "trigger"],
    )
    chains = CounterMetricFamily(
        CHAINS,
        "Closed retry chains (automatic attempts after a failure) by outcome: recovered, "
        "manual (a person stepped in), abandoned.",
        labels=["training_job", "outcome"],
    )
    open_failures = GaugeMetricFamily(
        CHAIN_FAILURES,
        "Failed automatic attempts in the job's open retry chain (0 when none is open).",
        labels=["training_job"],
    )
    bounds = [str(bound) for bound in DOWNTIME_BUCKETS] + ["+Inf"]
    for job, summary in jobs:
        for trigger, histogram in sorted(summary.downtime.items()):
            buckets = [(b, float(n)) for b, n in zip(bounds, histogram.buckets, strict=True)]
            downtime.add_metric([job, trigger], buckets, histogram.sum)
        for outcome in CHAIN_OUTCOMES:
            chains.add_metric([job, outcome], summary.chains.get(outcome, 0))
        open_failures.add_metric([job], summary.open_failed)
    yield downtime
    yield chains
    yield open_failures


class Rejections:
    """Refused writes by reason; in memory (a counter may reset when the ledger restarts)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counts: Counter[str] = Counter()

    def add(self, reason: str) -> None:
        with self._lock:
            self._counts[reason] += 1

    def snapshot(self) -> dict[str, int]:
        with self._lock:
            return dict(self._counts)


class LedgerCollector(Collector):
    def __init__(self, store: LedgerStore, rejections: Rejections | None = None) -> None:
        self._store = store
        self._rejections = rejections or Rejections()

    def collect(self) -> Iterator[Metric]:
        snapshot = self._store.snapshot()
        yield from ledger_families(snapshot)

        rejected = CounterMetricFamily(
            WRITES_REJECTED,
            "Writes the ledger refused, by reason (unauthorized, not_loopback, bad_key, "
            "too_large, invalid, conflict, node_cap, training_job_cap, reason_cap, "
            "exclusion_series_cap, unavailable).",
            labels=["reason"],
        )
        for reason, number in sorted(self._rejections.snapshot().items()):
            rejected.add_metric([reason], number)
        yield rejected
        values = GaugeMetricFamily(
            LABEL_VALUES,
            "Distinct values of each capped label the ledger exports (they are never forgotten).",
            labels=["label"],
        )
        limit = GaugeMetricFamily(
            LABEL_VALUES_LIMIT,
            "The cap on distinct values of each label; a write beyond it is refused (429).",
            labels=["label"],
        )
        for label, field, _ in CAPPED_LABELS:
            values.add_metric([label], snapshot.label_values.get(label, 0))
            limit.add_metric([label], getattr(self._store.limits, field))
        yield values
        yield limit
