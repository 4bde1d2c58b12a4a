"""lab.sharded: compare, the verdict of the scale identity check and its bench (the same
alerts for the same nodes, the median within the tight bound and each within the loose),
and the story both run, whose checkpoint storm must last as long at every size."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from gpufleet.lab.sharded import compare, story
from gpufleet.simulate.cluster import Cluster
from gpufleet.simulate.config import load_scenario

EXPECTED = {("A", "node-1"), ("B", "node-2"), ("C", "job"), ("D", "node-3"), ("E", "job")}
ONE = {key: 10.0 * i for i, key in enumerate(sorted(EXPECTED))}


def test_one_late_alert_on_a_busy_machine_passes_within_the_loose_bound() -> None:
    sharded = dict(ONE)
    sharded[("C", "job")] += 12.0  # one starved evaluation, the others on time
    ok, lines = compare(ONE, sharded, EXPECTED, 7.0, each_s=30.0)
    assert ok, lines
    strict, _ = compare(ONE, sharded, EXPECTED, 7.0)  # each alert within 7 s
    assert not strict


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


def test_an_alert_of_a_slower_group_is_held_to_its_own_interval() -> None:
    # the bench's bound: each alert within one interval of its own group (a 30 s group's
    # input that arrives just after its evaluation waits a whole 30 s), the median tight
    sharded = dict(ONE)
    sharded[("A", "node-1")] += 28.0
    per_alert = {"A": 35.0}  # A's group runs every 30 s; the others at the default
    ok, lines = compare(ONE, sharded, EXPECTED, 7.0, each_s=per_alert)
    assert ok, lines
    assert "A 35 s" in lines[-1]
    assert not compare(ONE, sharded, EXPECTED, 7.0)[0]  # the same gap against 7 s each
    sharded[("E", "job")] += 8.0  # E has no entry: held to the median's 7 s
    ok, lines = compare(ONE, sharded, EXPECTED, 7.0, each_s=per_alert)
    assert not ok
    assert "late: E 8.0 s > 7 s" in lines[-1]


def checkpoint_windows(nodes: int, tmp_path: Path) -> list[tuple[float, float, float]]:
    """(duration, queue wait, service) of each checkpoint of the story on ``nodes``."""
    scenario = load_scenario(str(story(nodes, tmp_path / f"story-{nodes}.yaml")))
    cluster = Cluster(scenario, 0, time.time(), 3600.0)
    return [
        (window.end - window.start, *(float(part) for part in window.reason.split(":")))
        for window in cluster.timeline.checkpoints
    ]


def test_the_storys_checkpoint_storm_lasts_as_long_at_2048_nodes_as_at_64(
    tmp_path: Path,
) -> None:
    small, large = checkpoint_windows(64, tmp_path), checkpoint_windows(2048, tmp_path)
    assert len(small) == len(large) >= 1
    (duration, queue, service), *_ = small
    assert queue > service > 0  # a storm: most of the write is queue wait
    assert large[0] == pytest.approx(small[0])
    assert duration < 60  # over before the straggler's and the XID's pages are due
