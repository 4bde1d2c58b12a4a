"""One exported family's definition, and the shapes it takes in each exposition."""

from __future__ import annotations

from dataclasses import dataclass

from prometheus_client.metrics_core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    SummaryMetricFamily,
)

from gpufleet.exposition import MetricKind


@dataclass(frozen=True, slots=True)
class MetricDef:
    """An exported family. ``name`` is what /metrics shows in ``# TYPE``: a counter's
    name ends in ``_total`` unless it keeps dcgm-exporter's bare DCGM name."""

    name: str
    kind: MetricKind
    help: str
    labels: tuple[str, ...] = ()
    # labels a series may carry beyond ``labels`` (the agent's namespace / pod of a job)
    optional_labels: tuple[str, ...] = ()

    def series_names(self) -> tuple[str, ...]:
        """The series names a query can read (a histogram's buckets, sum and count)."""
        if self.kind == "histogram":
            return (f"{self.name}_bucket", f"{self.name}_sum", f"{self.name}_count")
        if self.kind == "summary":
            return (self.name, f"{self.name}_sum", f"{self.name}_count")
        return (self.name,)

    def openmetrics(self) -> tuple[str, str]:
        """(family name, type) in OpenMetrics, where a counter's samples must end in
        ``_total``: a bare DCGM counter can only be ``unknown`` there."""
        if self.kind == "counter":
            if self.name.endswith("_total"):
                return self.name.removesuffix("_total"), "counter"
            return self.name, "unknown"
        return self.name, "unknown" if self.kind == "untyped" else self.kind

    def _check(self, kind: MetricKind) -> None:
        if self.kind != kind:
            raise TypeError(f"{self.name} is a {self.kind}, not a {kind}")

    # prometheus-client families, for collectors (it strips a counter's ``_total``).

    def counter(self) -> CounterMetricFamily:
        self._check("counter")
        return CounterMetricFamily(self.name, self.help, labels=self.labels)

    def gauge(self) -> GaugeMetricFamily:
        self._check("gauge")
        return GaugeMetricFamily(self.name, self.help, labels=self.labels)

    def histogram(self) -> HistogramMetricFamily:
        self._check("histogram")
        return HistogramMetricFamily(self.name, self.help, labels=self.labels)

    def summary(self) -> SummaryMetricFamily:
        self._check("summary")
        return SummaryMetricFamily(self.name, self.help, labels=self.labels)
