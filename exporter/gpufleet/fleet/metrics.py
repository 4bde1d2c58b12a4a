"""The ledger's metrics: the counters the rules read, and the ledger's report on itself.

The counters are kept materialised by the store (``counters.py``): a scrape
reads one row per exported series, whatever the length of the history, and
because they are committed with each write they resume exactly after a
restart. Only the series changed within the retention are exported, each
counter with its ``_created`` (when its exposition epoch began), and
``gpufleet_fleet_exposition_left_out`` says how many the caps left out
(``counters.py`` says why the rules stay right). The families are defined in
``gpufleet.schema.ledger``: the contract with ``alerts/``.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Iterator

from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

from gpufleet.fleet.counters import CHAIN_OUTCOMES, DOWNTIME_BUCKETS, LedgerSnapshot
from gpufleet.fleet.exported import EXPOSITION_KINDS
from gpufleet.fleet.store import LedgerStore
from gpufleet.schema import ledger as schema


def ledger_families(snapshot: LedgerSnapshot) -> Iterator[Metric]:
    """The families the rules read, from one snapshot (materialised or recomputed)."""
    exclusions = schema.EXCLUSIONS.counter()
    for node, reason, source, number in snapshot.exclusion_counts:
        created = snapshot.created.get((node, reason, source))
        exclusions.add_metric([node, reason, source], number, created=created)
    yield exclusions

    excluded = schema.EXCLUDED.gauge()
    for node in snapshot.excluded:
        excluded.add_metric([node], 1.0)
    yield excluded
    count = schema.EXCLUDED_NODES.gauge()
    count.add_metric([], snapshot.excluded_total or len(snapshot.excluded))
    yield count

    jobs = sorted(snapshot.jobs.items())
    attempt_family = schema.ATTEMPTS.counter()
    for job, summary in jobs:
        created = snapshot.job_created.get(job)
        for (trigger, outcome, source), number in sorted(summary.attempts.items()):
            attempt_family.add_metric([job, trigger, outcome, source], number, created=created)
    yield attempt_family

    downtime = schema.DOWNTIME.histogram()
    chains = schema.CHAINS.counter()
    open_failures = schema.CHAIN_FAILURES.gauge()
    bounds = [str(bound) for bound in DOWNTIME_BUCKETS] + ["+Inf"]
    for job, summary in jobs:
        for trigger, histogram in sorted(summary.downtime.items()):
            buckets = [(b, float(n)) for b, n in zip(bounds, histogram.buckets, strict=True)]
            downtime.add_metric([job, trigger], buckets, histogram.sum)
        for outcome in CHAIN_OUTCOMES:
            chains.add_metric(
                [job, outcome],
                summary.chains.get(outcome, 0),
                created=snapshot.job_created.get(job),
            )
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

        rejected = schema.WRITES_REJECTED.counter()
        for reason, number in sorted(self._rejections.snapshot().items()):
            rejected.add_metric([reason], number)
        yield rejected
        exported = schema.EXPOSITION_ENTRIES.gauge()
        limit = schema.EXPOSITION_LIMIT.gauge()
        left_out = schema.EXPOSITION_LEFT_OUT.gauge()
        entries = {
            "exclusion_series": len(snapshot.exclusion_counts),
            "excluded_node": len(snapshot.excluded),
            "training_job": len(snapshot.jobs),
        }
        for kind in EXPOSITION_KINDS:
            exported.add_metric([kind], entries[kind])
            limit.add_metric([kind], self._store.limits.cap(kind))
            left_out.add_metric([kind], snapshot.left_out.get(kind, 0))
        yield exported
        yield limit
        yield left_out
