"""Record chosen recording rules once over a backfilled history, as Prometheus would
have recorded them while it ran, so that alert expressions read them instead of
inlining them.

Inlining (``gpufleet.rules.inline``) is faithful but repeats a rule's whole
expression wherever it is read: the straggler rule is read by four alerts and by
two rules of its own, so an evaluation of the fail-slow alerts computed it about
six times. A materialized rule is computed once per evaluation interval with
``/api/v1/query_range`` (reading, in turn, the rules materialized before it),
written as OpenMetrics, imported with promtool next to the history, and read by
what follows as ``last_over_time(name[interval - 1ms])``: the sample of the same
evaluation or nothing, as a recorded series with its staleness marker reads.

Rules are recorded in levels: a rule comes after every materialized rule it reads,
directly or through a rule that is inlined.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

from gpufleet.exposition import escape_label_value
from gpufleet.promapi import PrometheusApi
from gpufleet.rules.inline import Inliner, RecordRule


@dataclass(frozen=True, slots=True)
class Materialized:
    record: RecordRule
    expr: str  # what to query: names of earlier levels read, the rest inlined


def plan(paths: list[Path], names: Iterable[str], interval: float) -> list[list[Materialized]]:
    """The records named ``names`` in the order they can be recorded: level by level."""
    chosen = set(names)
    inliner = Inliner.from_files(paths, {name: interval for name in chosen})
    records = inliner.records
    missing = chosen - records.keys()
    if missing:
        raise ValueError(f"no recording rule for {', '.join(sorted(missing))}")
    levels: dict[str, int] = {}

    def reads(name: str, seen: frozenset[str]) -> set[str]:
        """Materialized names the records of ``name`` read, through inlined records."""
        found: set[str] = set()
        for record in records[name]:
            for used in inliner.references(record.expr):
                if used in seen:
                    raise ValueError(f"recording rules read each other in a loop: {used}")
                if used in chosen:
                    found.add(used)
                else:
                    found |= reads(used, seen | {used})
        return found

    def level(name: str) -> int:
        if name not in levels:
            levels[name] = 1 + max((level(used) for used in reads(name, frozenset())), default=-1)
        return levels[name]

    ordered: list[list[Materialized]] = [[] for _ in range(1 + max(map(level, chosen), default=-1))]
    for name in sorted(chosen):
        for record in records[name]:
            ordered[level(name)].append(Materialized(record, inliner.inline(record.expr)))
    return ordered


def record_level(
    api: PrometheusApi,
    level: list[Materialized],
    start: float,
    end: float,
    step: float,
    *,
    out: Path,
    workers: int = 1,
    chunk: float = 6 * 3600,
    progress: Callable[[str], None] | None = None,
) -> int:
    """Evaluate every record of ``level`` at each ``step`` in [start, end] and write
    the series as OpenMetrics to ``out``; return the number of samples written."""
    span = max(step, chunk - chunk % step)
    windows = []
    cursor = start
    while cursor <= end:
        windows.append((cursor, min(end, cursor + span - step)))
        cursor = windows[-1][1] + step
    tasks = [(item, window) for item in level for window in windows]

    def one(task: tuple[Materialized, tuple[float, float]]) -> list[dict[str, Any]]:
        item, (first, last) = task
        if progress is not None and first == start:
            progress(item.record.name)
        return api.query_range(item.expr, first, last, step)

    # every chunk of every record is its own query: two workers keep two cores busy
    # even when a level holds one rule
    with ThreadPoolExecutor(max_workers=max(1, workers)) as pool:
        results = list(pool.map(one, tasks))
    by_name: dict[str, dict[tuple[tuple[str, str], ...], list[tuple[float, str]]]] = {}
    for (item, _), result in zip(tasks, results, strict=True):
        family = by_name.setdefault(item.record.name, {})
        for series in result:
            metric = series["metric"]
            values = series["values"]
            labels = {k: v for k, v in metric.items() if k != "__name__"}
            labels.update(item.record.labels)  # a record's static labels win, as in Prometheus
            family.setdefault(tuple(sorted(labels.items())), []).extend(
                (float(t), v) for t, v in values
            )
    written = 0
    with out.open("w") as stream:
        for name, family in sorted(by_name.items()):
            written += _write_family(stream, name, family)
        stream.write("# EOF\n")
    return written


def _write_family(
    stream: TextIO, name: str, series: dict[tuple[tuple[str, str], ...], list[tuple[float, str]]]
) -> int:
    stream.write(f"# TYPE {name} gauge\n")
    written = 0
    for labels, samples in sorted(series.items()):
        text = ",".join(f'{k}="{escape_label_value(v)}"' for k, v in labels)
        prefix = f"{name}{{{text}}} " if text else f"{name} "
        last = None
        for time, value in sorted(samples):
            if time == last:
                continue  # two records of one name that returned the same series
            stream.write(f"{prefix}{value} {time:.3f}\n")
            last = time
            written += 1
    return written
