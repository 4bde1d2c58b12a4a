"""lab.sharded.compare, the verdict of the scale identity check and its bench: the same
alerts for the same nodes, the median within the tight bound and each within the loose."""

from __future__ import annotations

from gpufleet.lab.sharded import compare

EXPECTED = {("A", "node-1"), ("B", "node-2"), ("C", "job"), ("D", "node-3"), ("E", "job")}
ONE = {key: 10.0 * i for i, key in enumerate(sorted(EXPECTED))}


def test_one_late_alert_on_a_busy_machine_passes_within_the_loose_bound() -> None:
    sharded = dict(ONE)
    sharded[("C", "job")] += 12.0  # one starved evaluation, the others on time
    ok, lines = compare(ONE, sharded, EXPECTED, 7.0, each_s=30.0)
    assert ok, lines
    assert ok is not compare(ONE, sharded, EXPECTED, 7.0)[0]  # strict: each within 7 s


def test_a_layout_late_on_most_alerts_fails_on_the_median() -> None:
    sharded = {key: t + (20.0 if key[0] in "ABC" else 0.0) for key, t in ONE.items()}
    ok, lines = compare(ONE, sharded, EXPECTED, 7.0, each_s=30.0)
    assert not ok
    assert "median gap 20.0 s" in lines[-1]


def test_a_missing_or_extra_alert_fails_however_timely() -> None:
    missing = {key: t for key, t in ONE.items() if key != ("D", "node-3")}
    extra = {**ONE, ("A", "node-9"): 5.0}
    assert not compare(ONE, missing, EXPECTED, 7.0, each_s=30.0)[0]
    ok, lines = compare(ONE, extra, EXPECTED, 7.0, each_s=30.0)
    assert not ok
    assert any("node-9" in line and "not in the story" in line for line in lines)


def test_an_alert_later_than_the_loose_bound_fails() -> None:
    sharded = dict(ONE)
    sharded[("E", "job")] += 31.0
    assert not compare(ONE, sharded, EXPECTED, 7.0, each_s=30.0)[0]
