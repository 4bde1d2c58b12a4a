"""The families both watchers (kube-watch, slurm-watch) report on themselves, built one way."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from typing import Any

from prometheus_client.metrics_core import Metric

from gpufleet.schema.family import MetricDef

# (family, counts by label value, label values shown at 0 before their first count)
Labelled = tuple[MetricDef, Mapping[Any, int], Iterable[str]]


def watcher_families(
    labelled: Iterable[Labelled],
    *,
    writes: MetricDef,
    write_counts: Mapping[tuple[str, str], int],
    actions: Iterable[str],
    outcomes: Iterable[str],
    gauges: Iterable[tuple[MetricDef, float]],
) -> Iterator[Metric]:
    """Counters by one label, ledger writes by action and outcome (every pair shown), gauges."""
    for definition, counts, always in labelled:
        family = definition.counter()
        for label in sorted(set(always) | set(counts)):
            family.add_metric([label], counts.get(label, 0))
        yield family
    family = writes.counter()
    pairs = {(action, outcome) for action in actions for outcome in outcomes}
    for action, outcome in sorted(pairs | set(write_counts)):
        family.add_metric([action, outcome], write_counts.get((action, outcome), 0))
    yield family
    for definition, value in gauges:
        gauge = definition.gauge()
        gauge.add_metric([], float(value))
        yield gauge
