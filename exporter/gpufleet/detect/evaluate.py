"""Evaluate alert rules over a stored history through Prometheus's query API.

Each alert's expression (with recording rules inlined) is evaluated with
``/api/v1/query_range`` at the rule evaluation interval, in time chunks so no
query loads too many samples. ``for`` is then applied as Prometheus applies it:
a label set becomes pending at the first evaluation that returns it, fires once
it has been returned at every evaluation for ``for`` seconds, and resolves at
the first evaluation that no longer returns it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from gpufleet.promapi import PrometheusApi
from gpufleet.rules.inline import AlertRule


@dataclass(frozen=True, slots=True)
class Firing:
    alert: str
    severity: str
    labels: tuple[tuple[str, str], ...]
    start: float  # when it started firing
    end: float  # last evaluation that still returned it
    active_since: float  # when it became pending

    @property
    def node(self) -> str | None:
        return dict(self.labels).get("node")

    @property
    def training_job(self) -> str | None:
        return dict(self.labels).get("training_job")

    @property
    def is_page(self) -> bool:
        return self.severity in ("critical", "warning")


def apply_for(
    present: Iterable[float], step: float, for_seconds: float
) -> list[tuple[float, float, float]]:
    """(active since, firing start, firing end) runs from the evaluation times at which
    a label set was returned. A missing evaluation resets the pending time."""
    runs: list[tuple[float, float, float]] = []
    run_start: float | None = None
    previous: float | None = None
    fire_start: float | None = None

    def close() -> None:
        if run_start is not None and fire_start is not None and previous is not None:
            runs.append((run_start, fire_start, previous))

    for time in sorted(present):
        if previous is None or time - previous > step * 1.5:
            close()
            run_start, fire_start = time, None
        assert run_start is not None
        if fire_start is None and time - run_start >= for_seconds - 1e-6:
            fire_start = time
        previous = time
    close()
    return runs


def evaluate_alert(
    api: PrometheusApi,
    alert: AlertRule,
    start: float,
    end: float,
    step: float,
    *,
    chunk: float = 6 * 3600,
) -> list[Firing]:
    """Firings of one alert over [start, end] at evaluation interval ``step``."""
    present: dict[tuple[tuple[str, str], ...], list[float]] = {}
    chunk = max(step, chunk - chunk % step)
    cursor = start
    while cursor <= end:
        stop = min(end, cursor + chunk - step)
        for series in api.query_range(alert.expr, cursor, stop, step):
            metric = series["metric"]
            assert isinstance(metric, dict)
            labels = tuple(sorted((k, v) for k, v in metric.items() if k != "__name__"))
            values = series["values"]
            assert isinstance(values, list)
            present.setdefault(labels, []).extend(float(t) for t, _ in values)
        cursor = stop + step
    severity = alert.labels.get("severity", "")
    firings = []
    for labels, times in present.items():
        for active, fire, last in apply_for(times, step, alert.for_seconds):
            firings.append(Firing(alert.name, severity, labels, fire, last, active))
    return sorted(firings, key=lambda f: (f.start, f.alert))


def evaluate_all(
    api: PrometheusApi,
    alerts: list[AlertRule],
    start: float,
    end: float,
    step: float,
    *,
    workers: int = 1,
    progress: Callable[[str], None] | None = None,
) -> list[Firing]:
    """Firings of every alert; ``workers`` alerts are evaluated at once (Prometheus runs
    each query on one core, so two workers keep two cores busy)."""

    def one(alert: AlertRule) -> list[Firing]:
        if progress is not None:
            progress(alert.name)
        return evaluate_alert(api, alert, start, end, step)

    with ThreadPoolExecutor(max_workers=max(1, workers)) as pool:
        results = list(pool.map(one, alerts))
    firings = [firing for result in results for firing in result]
    return sorted(firings, key=lambda f: (f.start, f.alert, f.labels))
