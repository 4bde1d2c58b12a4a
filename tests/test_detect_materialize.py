"""Recording rules recorded once over a history (``gpufleet.detect.materialize``)
give the alerts the same firings as the same rules inlined."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from gpufleet.detect import materialize
from gpufleet.rules.inline import Inliner


def test_levels_put_each_record_after_every_recorded_rule_it_reads(tmp_path: Path) -> None:
    rules = tmp_path / "x.rules.yaml"
    rules.write_text(
        "groups:\n- name: g\n  rules:\n"
        "  - {record: 'node:a:rate5m', expr: 'sum by (node) (rate(a_total[5m]))'}\n"
        "  - {record: 'node:a:ratio', expr: 'node:a:rate5m / on () group_left () "
        "quantile(0.5, node:a:rate5m)'}\n"
        "  - {record: 'node:slow', expr: 'node:a:ratio > 1.1'}\n"
        "  - {record: 'job:slow:count', expr: 'count(node:slow)'}\n"
    )
    levels = materialize.plan([rules], ["job:slow:count", "node:a:rate5m", "node:slow"], 30.0)
    assert [[m.record.name for m in level] for level in levels] == [
        ["node:a:rate5m"],
        ["node:slow"],
        ["job:slow:count"],
    ]
    # node:a:ratio is not recorded: inlined, it reads the recorded node:a:rate5m
    assert levels[1][0].expr == (
        "(last_over_time(node:a:rate5m[29999ms]) / on () group_left () "
        "quantile(0.5, last_over_time(node:a:rate5m[29999ms]))) > 1.1"
    )
    with pytest.raises(ValueError, match="no recording rule"):
        materialize.plan([rules], ["node:b"], 30.0)


def test_every_materialized_record_exists_in_the_rules(bench_detect: Any) -> None:
    bench = bench_detect
    inliner = Inliner.from_files(bench.rule_files())
    assert set(bench.MATERIALIZED) <= inliner.records.keys()


def test_recorded_and_inlined_rules_give_the_same_firings(
    tmp_path: Path, bench_detect: Any
) -> None:
    """The quick run's history (slow and failing nodes at boosted rates) through a real
    Prometheus, every alert that reads a recorded rule evaluated both ways."""
    bench = bench_detect
    end = bench.parse_end(bench.DEFAULT_END)
    history = bench.imported_history(
        bench.scenario_for(32, bench.QUICK_RATES), 201, 0.5, end=end, workdir=tmp_path, cache=None
    )
    readers = frozenset(
        alert.name
        for alert in bench.inlined_alerts(
            bench.rule_files(), dict.fromkeys(bench.MATERIALIZED, bench.STEP_S)
        )
        if any(name in alert.expr for name in bench.MATERIALIZED)
    )
    assert {"GpuFleetStragglerNode", "GpuFleetJobSlowdown", "GpuFleetCriticalXid"} <= readers
    runs = []
    for recorded in ((), bench.MATERIALIZED):
        workdir = tmp_path / f"recorded-{len(recorded)}"
        workdir.mkdir()
        firings, _ = bench.evaluate_history(
            history, workdir, None, only=readers, materialized=recorded
        )
        runs.append(sorted(firings, key=lambda f: (f.alert, f.labels, f.start)))
    inlined, recorded_firings = runs
    # something to compare: slow nodes and XIDs
    assert {"GpuFleetStragglerNode", "GpuFleetCriticalXid"} <= {f.alert for f in inlined}
    assert recorded_firings == inlined
