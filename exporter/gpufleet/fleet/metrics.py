"""The ledger's counters, computed from the database at scrape time.

Because they are derived from what is stored, they survive a restart exactly:
nothing lives only in memory. The names are the contract with ``alerts/``.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Iterator

from prometheus_client.metrics_core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from gpufleet.fleet.chains import DEFAULT_HEALTHY_AFTER_S, histories
from gpufleet.fleet.store import LedgerStore

EXCLUSIONS = "gpufleet_fleet_node_exclusions"
EXCLUDED = "gpufleet_fleet_node_excluded"
EXCLUDED_NODES = "gpufleet_fleet_excluded_nodes"
ATTEMPTS = "gpufleet_fleet_job_attempts"
DOWNTIME = "gpufleet_fleet_recovery_downtime_seconds"
CHAINS = "gpufleet_fleet_retry_chains"
CHAIN_FAILURES = "gpufleet_fleet_retry_chain_failed_attempts"
DOWNTIME_BUCKETS = (60.0, 300.0, 600.0, 1800.0, 3600.0, 7200.0, 14400.0, 43200.0, 86400.0)


class LedgerCollector(Collector):
    def __init__(
        self,
        store: LedgerStore,
        clock: Callable[[], float] = time.time,
        healthy_after: float = DEFAULT_HEALTHY_AFTER_S,
    ) -> None:
        self._store = store
        self._clock = clock
        self._healthy_after = healthy_after

    def collect(self) -> Iterator[Metric]:
        exclusions = CounterMetricFamily(
            EXCLUSIONS,
            "Node exclusions recorded in the ledger, by node, reason and source (auto, manual).",
            labels=["node", "reason", "source"],
        )
        for row in self._store.exclusion_counts():
            exclusions.add_metric([row["node"], row["reason"], row["source"]], row["count"])
        yield exclusions

        current = self._store.excluded_now()
        excluded = GaugeMetricFamily(
            EXCLUDED, "1 for each node currently excluded from service.", labels=["node"]
        )
        for row in current:
            excluded.add_metric([row["node"]], 1.0)
        yield excluded
        count = GaugeMetricFamily(EXCLUDED_NODES, "Nodes currently excluded from service.")
        count.add_metric([], len(current))
        yield count

        attempts = self._store.attempts()
        outcomes: Counter[tuple[str, str, str]] = Counter(
            (a["training_job"], a["trigger"], a["outcome"] or "running") for a in attempts
        )
        attempt_family = CounterMetricFamily(
            ATTEMPTS,
            "Job attempts by trigger (initial, auto, manual) and outcome "
            "(success, failed, cancelled, running).",
            labels=["training_job", "trigger", "outcome"],
        )
        for (job, trigger, outcome), number in sorted(outcomes.items()):
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
        for job, history in sorted(histories(attempts, self._clock(), self._healthy_after).items()):
            by_trigger: dict[str, list[float]] = {}
            for recovery in history.recoveries:
                by_trigger.setdefault(recovery.trigger, []).append(recovery.downtime_s)
            for trigger, values in sorted(by_trigger.items()):
                buckets = []
                for bound in DOWNTIME_BUCKETS:
                    buckets.append((str(bound), float(sum(1 for v in values if v <= bound))))
                buckets.append(("+Inf", float(len(values))))
                downtime.add_metric([job, trigger], buckets, sum(values))
            closed = Counter(chain.outcome for chain in history.chains if chain.outcome)
            for outcome in ("recovered", "manual", "abandoned"):
                chains.add_metric([job, outcome], closed.get(outcome, 0))
            chain = history.open_chain
            open_failures.add_metric([job], chain.failed_attempts if chain else 0)
        yield downtime
        yield chains
        yield open_failures
