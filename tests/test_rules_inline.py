"""Inlining recording rules into alert expressions (for evaluating backfilled history)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import yaml

from gpufleet.lab.processes import find_binary
from gpufleet.rules.inline import InlineError, Inliner, RecordRule, duration_seconds, inlined_alerts

ALERTS_DIR = Path(__file__).resolve().parents[1] / "alerts"


def test_names_are_replaced_recursively_and_strings_left_alone() -> None:
    inliner = Inliner(
        [
            RecordRule("node:a:rate5m", "sum by (node) (rate(a_total[5m]))", {}),
            RecordRule("stage:a:median5m", "quantile(0.5, node:a:rate5m)", {}),
        ]
    )
    expr = (
        "node:a:rate5m / on () group_left stage:a:median5m > 1"
        ' and label_replace(x, "y", "node:a:rate5m", "", "")'
    )
    assert inliner.inline(expr) == (
        "(sum by (node) (rate(a_total[5m]))) / on () group_left () "
        "(quantile(0.5, (sum by (node) (rate(a_total[5m]))))) > 1 "
        'and label_replace(x, "y", "node:a:rate5m", "", "")'
    )


def test_static_labels_and_matchers_select_and_filter() -> None:
    inliner = Inliner(
        [
            RecordRule("cat:info", "vector(1)", {"xid": "79", "class": "act_now"}),
            RecordRule("cat:info", "vector(1)", {"xid": "13", "class": "application"}),
            RecordRule("job:x:rate1h", "sum by (op) (rate(x[1h]))", {}),
        ]
    )
    picked = inliner.inline('cat:info{class="act_now"}')
    assert '"xid", "79"' in picked and '"13"' not in picked
    filtered = inliner.inline('job:x:rate1h{op="save"}')
    assert filtered == (
        '((sum by (op) (rate(x[1h]))) and on (op) label_replace(vector(1), "op", "save", "", ""))'
    )
    with pytest.raises(InlineError, match="no record cat:info matches"):
        inliner.inline('cat:info{class="nope"}')
    with pytest.raises(InlineError, match="only equality matchers"):
        inliner.inline('job:x:rate1h{op=~"s.*"}')


def test_every_inlined_alert_parses_and_reads_no_recorded_series(tmp_path: Path) -> None:
    paths = sorted(ALERTS_DIR.glob("*.rules.yaml"))
    alerts = inlined_alerts(paths)
    assert len(alerts) == 39  # three XID / recovery-action alerts (issue 34), two layout (37)
    recorded = {
        rule["record"]
        for path in paths
        for group in yaml.safe_load(path.read_text())["groups"]
        for rule in group["rules"]
        if "record" in rule
    }
    for alert in alerts:
        assert not any(name in alert.expr for name in recorded), alert.name
    document = {
        "groups": [
            {"name": "inlined", "rules": [{"alert": a.name, "expr": a.expr} for a in alerts]}
        ]
    }
    path = tmp_path / "inlined.rules.yaml"
    path.write_text(yaml.safe_dump(document))
    result = subprocess.run(
        [find_binary("promtool"), "check", "rules", str(path)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    straggler = next(a for a in alerts if a.name == "GpuFleetStragglerNode")
    assert straggler.for_seconds == 180 and straggler.labels == {"severity": "warning"}


def test_a_range_over_a_recorded_series_becomes_a_subquery() -> None:
    inliner = Inliner([RecordRule("node:gpus:count", "count by (node) (up)", {})])
    assert inliner.inline("max_over_time(node:gpus:count[1d])") == (
        "max_over_time((count by (node) (up))[1d:1800s])"
    )
    assert inliner.inline("max_over_time(node:gpus:count[10m:1m])") == (
        "max_over_time((count by (node) (up))[10m:1m])"
    )


def test_durations() -> None:
    assert [duration_seconds(t) for t in ("0m", "5m", "1h30m", "90s", "2d")] == [
        0,
        300,
        5400,
        90,
        172800,
    ]


def test_a_materialized_name_is_read_with_the_staleness_of_a_recorded_series() -> None:
    """Instants see only the sample of their own evaluation (a recorded series vanishes
    at the first evaluation that does not return it); ranges read the samples."""
    inliner = Inliner(
        [
            RecordRule("node:a:rate5m", "sum by (node) (rate(a_total[5m]))", {}),
            RecordRule("node:slow", "node:a:rate5m > 2", {}),
            RecordRule("job:slow:count", "count by (job) (node:slow)", {}),
        ],
        materialized={"node:slow": 30.0},
    )
    assert inliner.inline("job:slow:count") == (
        "(count by (job) (last_over_time(node:slow[29999ms])))"
    )
    assert inliner.inline('x unless on (node) node:slow{job="a"}') == (
        'x unless on (node) last_over_time(node:slow{job="a"}[29999ms])'
    )
    assert inliner.inline("max_over_time(node:slow[10m])") == "max_over_time(node:slow[10m])"
    assert inliner.inline("max_over_time(node:slow{job='a'}[10m:1m])") == (
        "max_over_time(last_over_time(node:slow{job='a'}[29999ms])[10m:1m])"
    )
    assert inliner.references("node:slow / node:a:rate5m + other") == {"node:slow", "node:a:rate5m"}
    assert inliner.references('x{reason="node:slow"}') == set()
