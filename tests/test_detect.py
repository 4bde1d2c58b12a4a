"""The detection benchmark's evaluation and scoring, on constructed inputs, and the
whole benchmark end to end on a small simulated history against a real Prometheus."""

from __future__ import annotations

import argparse
import copy
import math
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpufleet.detect.evaluate import Firing, apply_for
from gpufleet.detect.figures import EpisodeScore
from gpufleet.detect.score import GROUP_INTERVAL_S, PAGE_GROUP_BY, score
from gpufleet.simulate.config import parse_duration

T0 = 1_800_000_000.0
DAY = 86400.0


class TestApplyFor:
    def test_fires_after_for_and_ends_at_the_last_evaluation(self) -> None:
        times = [T0 + 30 * i for i in range(11)]  # 0 .. 300 s
        assert apply_for(times, 30, 120) == [(T0, T0 + 120, T0 + 300)]

    def test_a_run_shorter_than_for_never_fires(self) -> None:
        assert apply_for([T0, T0 + 30, T0 + 60], 30, 120) == []

    def test_a_missing_evaluation_resets_the_pending_time(self) -> None:
        first = [T0 + 30 * i for i in range(4)]  # 0 .. 90 s
        second = [T0 + 150 + 30 * i for i in range(6)]  # 150 .. 300 s, 120 s missing
        assert apply_for(first + second, 30, 120) == [(T0 + 150, T0 + 270, T0 + 300)]

    def test_zero_for_fires_at_once_and_order_does_not_matter(self) -> None:
        times = [T0 + 60, T0, T0 + 30, T0 + 600]
        assert apply_for(times, 30, 0) == [(T0, T0, T0 + 60), (T0 + 600, T0 + 600, T0 + 600)]


def episode(id_: int, kind: str, start: float, end: float, **fields: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "id": id_,
        "kind": kind,
        "start": start,
        "end": end,
        "node": None,
        "gpu": None,
        "cause": None,
        "xid": None,
        "magnitude": 1.0,
        "expected_alerts": [],
        "scope": "none",
        "details": {},
        "fault": False,
    }
    base.update(fields)
    return base


def fault(
    id_: int,
    kind: str,
    start: float,
    end: float,
    node: str,
    expected_alerts: list[str],
    slowdown: float | None = None,
    **fields: Any,
) -> dict[str, Any]:
    """A fault episode on ``node`` from ``start`` to ``end`` seconds after T0; a fail-slow
    one has its ``slowdown`` (a communication fault's scope is the job unless ``scope``
    says otherwise)."""
    if slowdown is not None:
        fields["details"] = {"slowdown": slowdown}
    fields.setdefault("scope", "job" if kind == "fail_slow_comm" else "node")
    return episode(
        id_,
        kind,
        T0 + start,
        T0 + end,
        node=node,
        fault=True,
        expected_alerts=expected_alerts,
        **fields,
    )


def attempt(
    number: int, start: float, first_step: float, end: float | None, **fields: Any
) -> dict[str, Any]:
    """Attempt ``number`` of a job, its times in seconds after T0 (``end`` None: running)."""
    return {
        **fields,
        "number": number,
        "start": T0 + start,
        "first_step": T0 + first_step,
        "end": None if end is None else T0 + end,
    }


@pytest.fixture
def truth() -> dict[str, Any]:
    hour = 3600.0
    xid, slow = "GpuFleetCriticalXid", "GpuFleetStragglerNode"
    return {
        "start": T0,
        "end": T0 + DAY,
        "cluster": {"job": "llm", "nodes": 4, "node_names": ["n0", "n1", "n2", "n3"]},
        "attempts": [
            attempt(1, 0, 0, 10 * hour),
            attempt(2, 10.2 * hour, 10.3 * hour, None),
        ],
        "exclusions": [{"node": "n1", "start": T0 + 10 * hour, "end": T0 + 14 * hour}],
        "episodes": [
            fault(0, "fail_stop", 10 * hour, 14 * hour, "n1", [xid, "GpuFleetGpuLost"]),
            fault(1, "fail_slow_compute", 2 * hour, 3 * hour, "n2", [slow], 1.3, magnitude=1.3),
            # subtle: 5-10% slower for an hour, scored in a class of its own
            fault(2, "fail_slow_compute", 4 * hour, 5 * hour, "n3", [slow], 1.05),
            fault(3, "fail_slow_comm", 6 * hour, 7 * hour, "n0", ["GpuFleetJobSlowdown"], 1.2),
            episode(4, "data_loader_stall", T0 + 8 * hour, T0 + 8 * hour + 120, node="n3"),
            # Starts during the warm-up: neither scored nor counted against recall.
            fault(5, "fail_stop", 60, 600, "n0", [xid]),
        ],
    }


def firing(
    alert: str, start: float, end: float, severity: str = "warning", **labels: str
) -> Firing:
    return Firing(alert, severity, tuple(sorted(labels.items())), start, end, start)


def straggler_page(node: str) -> Firing:
    """GpuFleetStragglerNode 9 minutes into episode 1 (n2 30% slower from 2 h to 3 h)."""
    return firing(
        "GpuFleetStragglerNode", T0 + 2 * 3600 + 540, T0 + 3 * 3600, node=node, training_job="llm"
    )


def job_slowdown_page(delay_s: float, **labels: str) -> Firing:
    """GpuFleetJobSlowdown ``delay_s`` into episode 3 (the job 20% slower from 6 h to 7 h)."""
    return firing("GpuFleetJobSlowdown", T0 + 6 * 3600 + delay_s, T0 + 7 * 3600, **labels)


def episode_score(truth: dict[str, Any], id_: int) -> EpisodeScore:
    """Episode ``id_`` as scored with no firings at all."""
    return next(e for e in score(truth, []).episodes if e.id == id_)


class TestScore:
    def test_right_alert_for_the_right_node_detects_with_its_delay(
        self, truth: dict[str, Any]
    ) -> None:
        hour = 3600.0
        scores = score(
            truth,
            [
                firing(
                    "GpuFleetGpuLost", T0 + 10 * hour + 45, T0 + 11 * hour, "critical", node="n1"
                ),
                straggler_page("n2"),
                job_slowdown_page(480, training_job="llm"),
            ],
        )
        by_id = {e.id: e for e in scores.episodes}
        assert (by_id[0].detected, by_id[0].ttd_s, by_id[0].detected_by) == (
            True,
            45,
            "GpuFleetGpuLost",
        )
        assert (by_id[1].detected, by_id[1].ttd_s) == (True, 540)
        assert (by_id[3].detected, by_id[3].ttd_s) == (True, 480)
        assert by_id[2].scored and by_id[2].klass == "fail-slow compute 5-10%"
        assert not by_id[2].detected and by_id[2].band == "5-10%"
        assert scores.recall("fail-slow compute 5-10%") == 0.0
        assert not by_id[5].scored and "before the rules have data" in by_id[5].note
        assert scores.recall("fail-stop (node)") == 1.0
        assert scores.recall("fail-slow compute") == 1.0
        assert scores.recall("fail-slow communication") == 1.0
        assert scores.ttd_median("fail-slow compute") == 540
        both = ("fail-slow compute", "fail-slow communication")
        assert scores.recall(*both) == 1.0 and scores.ttd_median(*both) == 510
        assert scores.false_pages == [] and scores.precision == 1.0
        assert scores.days == pytest.approx((DAY - 20 * 60) / DAY)
        bands = {(row["kind"], row["band"]): row for row in scores.by_band()}
        assert bands[("compute", ">20%")]["detected"] == 1  # episode 1, 1.3x
        assert bands[("compute", "5-10%")]["episodes"] == 1
        assert bands[("communication", "10-20%")]["episodes"] == 1  # episode 3: 1.2x
        assert sum(row["episodes"] for row in bands.values()) == 3

    def test_too_small_or_too_short_fail_slow_is_not_scored(self, truth: dict[str, Any]) -> None:
        for slowdown, minutes, klass in (
            (1.04, 60, "fail-slow compute (<10% or <10 min)"),  # under 5%
            (1.08, 15, "fail-slow compute (<10% or <10 min)"),  # subtle, but under 20 min
            (1.15, 9, "fail-slow compute (<10% or <10 min)"),  # large, but under 10 min
            (1.08, 25, "fail-slow compute 5-10%"),
        ):
            start = T0 + 3 * 3600
            truth["episodes"] = [
                episode(
                    1,
                    "fail_slow_compute",
                    start,
                    start + minutes * 60,
                    node="n1",
                    scope="node",
                    fault=True,
                    details={"slowdown": slowdown},
                    expected_alerts=["GpuFleetStragglerNode"],
                )
            ]
            (result,) = score(truth, []).episodes
            assert result.klass == klass, (slowdown, minutes)
            assert result.scored == klass.endswith("5-10%"), (slowdown, minutes)

    def test_a_page_for_the_wrong_node_is_false_and_detects_nothing(
        self, truth: dict[str, Any]
    ) -> None:
        scores = score(truth, [straggler_page("n3")])
        assert not next(e for e in scores.episodes if e.id == 1).detected
        assert scores.recall("fail-slow compute") == 0.0
        assert scores.recall("fail-slow compute", "fail-slow communication") == 0.0
        assert math.isnan(scores.ttd_median("fail-slow compute"))
        [page] = scores.false_pages
        assert page.node == "n3" and scores.precision == 0.0
        assert scores.false_pages_per_day == pytest.approx(1 / scores.days)

    def test_a_node_page_during_a_data_stall_is_attributed_to_it(
        self, truth: dict[str, Any]
    ) -> None:
        hour = 3600.0
        scores = score(
            truth,
            [firing("GpuFleetStragglerNode", T0 + 8 * hour + 300, T0 + 8 * hour + 600, node="n3")],
        )
        assert scores.confounder_node_pages() == {"data_loader_stall": 1}

    def test_a_job_page_is_not_credited_to_a_node_episode_and_vice_versa(
        self, truth: dict[str, Any]
    ) -> None:
        scores = score(
            truth,
            [
                job_slowdown_page(480, node="n0", training_job="llm"),
                job_slowdown_page(600, training_job="other-job"),
            ],
        )
        assert scores.recall("fail-slow communication") == 0.0

    def test_a_job_page_during_a_thermal_fail_stops_lead_is_explained_by_it(
        self, truth: dict[str, Any]
    ) -> None:
        hour = 3600.0
        # n2's GPU throttles from 11 h 40 and fails at 12 h: the job slows in between.
        truth["episodes"].append(
            fault(6, "fail_stop", 12 * hour, 16 * hour, "n2", ["GpuFleetHwSlowdown"],
                  cause="thermal", details={"slowdown_from": T0 + 11 * hour + 2400})
        )  # fmt: skip
        during = firing("GpuFleetJobSlowdown", T0 + 11 * hour + 3000, T0 + 12 * hour,
                        training_job="llm")  # fmt: skip
        hours_later = firing("GpuFleetJobSlowdown", T0 + 14 * hour, T0 + 14 * hour + 600,
                             training_job="llm")  # fmt: skip
        other_job = firing("GpuFleetJobSlowdown", T0 + 11 * hour + 3000, T0 + 12 * hour,
                           training_job="other-job")  # fmt: skip
        scores = score(truth, [during, hours_later, other_job])
        explained = {(p.start, p.training_job): p.explained_by for p in scores.pages}
        assert explained[(during.start, "llm")] == "fail_stop:6"
        assert explained[(hours_later.start, "llm")] is None
        assert explained[(other_job.start, "other-job")] is None

    def test_an_hbm_bursts_xids_are_one_page_per_alert_as_alertmanager_groups_them(
        self, truth: dict[str, Any]
    ) -> None:
        # The HBM error on n1 at 10 h: XIDs 48, 95 and 154 critical, one firing each,
        # in one notification group; 94 and 63 one group of warnings.
        at = T0 + 10 * 3600
        burst = [
            firing("GpuFleetCriticalXid", at + 30, at + 630, "critical", node="n1", gpu="2", xid=x)
            for x in ("48", "95", "154")
        ] + [
            firing("GpuFleetMaintenanceXid", at + 30 + d, at + 630, node="n1", gpu="2", xid=x)
            for d, x in ((0, "94"), (30, "63"))
        ]
        ecc = firing("GpuFleetEccUncorrectable", at + 30, at + 630, "critical", node="n1", gpu="2")
        scores = score(truth, [*burst, ecc])
        assert sorted((p.alert, p.node, p.explained_by) for p in scores.pages) == [
            ("GpuFleetCriticalXid", "n1", "fail_stop:0"),
            ("GpuFleetEccUncorrectable", "n1", "fail_stop:0"),
            ("GpuFleetMaintenanceXid", "n1", "fail_stop:0"),
        ]
        # the group's page lasts from the first firing to the last
        maintenance = next(p for p in scores.pages if p.alert == "GpuFleetMaintenanceXid")
        assert (maintenance.start, maintenance.end) == (at + 30, at + 630)

    def test_a_group_that_fires_again_after_it_resolved_pages_again(
        self, truth: dict[str, Any]
    ) -> None:
        at = T0 + 10 * 3600
        first = firing("GpuFleetCriticalXid", at, at + 600, "critical", node="n1", xid="48")
        # within a group_interval of the first's end: the same notification group
        joined = firing("GpuFleetCriticalXid", at + 630, at + 700, "critical", node="n1", xid="64")
        later = firing("GpuFleetCriticalXid", at + 1800, at + 2400, "critical", node="n1", xid="48")
        other_node = firing("GpuFleetCriticalXid", at, at + 600, "critical", node="n2", xid="48")
        other_job = firing("GpuFleetJobHung", at, at + 600, "critical", training_job="x")
        job = firing("GpuFleetJobHung", at, at + 600, "critical", training_job="llm")
        pages = score(truth, [first, joined, later, other_node, other_job, job]).pages
        assert sorted((p.alert, p.node or p.training_job, p.start, p.end) for p in pages) == [
            ("GpuFleetCriticalXid", "n1", at, at + 700),
            ("GpuFleetCriticalXid", "n1", at + 1800, at + 2400),
            ("GpuFleetCriticalXid", "n2", at, at + 600),
            ("GpuFleetJobHung", "llm", at, at + 600),
            ("GpuFleetJobHung", "x", at, at + 600),
        ]

    def test_info_firings_are_not_pages_and_ledger_alerts_are_ignored(
        self, truth: dict[str, Any]
    ) -> None:
        scores = score(
            truth,
            [
                firing("GpuFleetStageImbalance", T0 + 7200, T0 + 9000, "info", training_job="llm"),
                firing("GpuFleetRepeatOffenderNode", T0 + 7200, T0 + 9000, node="n2"),
            ],
        )
        assert scores.pages == []
        assert math.isnan(scores.precision)

    def test_a_slow_episode_while_its_node_was_excluded_is_not_scored(
        self, truth: dict[str, Any]
    ) -> None:
        hour = 3600.0
        moved = copy.deepcopy(truth)
        slow = next(e for e in moved["episodes"] if e["id"] == 1)
        slow.update(node="n1", start=T0 + 11 * hour, end=T0 + 12 * hour)
        result = episode_score(moved, 1)
        assert not result.scored and "not training" in result.note

    def test_eval_and_checkpoint_time_is_not_training_time(self, truth: dict[str, Any]) -> None:
        # 11 minutes slow, of which 5 in an eval and 2 in a checkpoint: 4 minutes of
        # training, too short to count; without them the same episode is scored.
        moved = copy.deepcopy(truth)
        slow = next(e for e in moved["episodes"] if e["id"] == 1)
        start = T0 + 2 * 3600.0
        slow.update(end=start + 660)
        assert episode_score(moved, 1).scored
        moved["episodes"] += [
            episode(20, "eval", start + 360, start + 660),
            episode(21, "checkpoint", start + 100, start + 220),
        ]
        result = episode_score(moved, 1)
        assert not result.scored and "not training" in result.note

    def test_a_job_fail_stop_while_the_job_is_already_down_is_not_scored(
        self, truth: dict[str, Any]
    ) -> None:
        hour = 3600.0
        moved = copy.deepcopy(truth)
        moved["episodes"] += [
            # during the stall after episode 0 (10 h to 10.3 h): nothing runs to time out
            episode(22, "fail_stop", T0 + 10.1 * hour, T0 + 10.1 * hour, node="n2",
                    scope="job", fault=True, expected_alerts=["GpuFleetJobHung"]),
            # the same fault while the job runs is scored, and missed without a firing
            episode(23, "fail_stop", T0 + 12 * hour, T0 + 12 * hour, node="n2",
                    scope="job", fault=True, expected_alerts=["GpuFleetJobHung"]),
        ]  # fmt: skip
        results = {e.id: e for e in score(moved, []).episodes}
        assert not results[22].scored and "already stopped" in results[22].note
        assert results[23].scored and not results[23].detected
        # the episode that caused the stall is itself still scored
        assert results[0].scored


def shared_truth() -> dict[str, Any]:
    """Two jobs on one cluster: n0-n1 run "big", n2-n3 run "small"; n3 moves to "big"
    after n1's repair. Each job stalls once, at different times."""
    hour = 3600.0
    slow, job_slow, hung = "GpuFleetStragglerNode", "GpuFleetJobSlowdown", "GpuFleetJobHung"
    return {
        "start": T0,
        "end": T0 + DAY,
        "cluster": {
            "job": "big",
            "jobs": [{"job": "big"}, {"job": "small"}],
            "nodes": 4,
            "node_names": ["n0", "n1", "n2", "n3"],
        },
        "placements": [
            {"node": "n0", "job": "big", "slot": 0, "start": T0, "end": T0 + DAY},
            {"node": "n1", "job": "big", "slot": 1, "start": T0, "end": T0 + 14 * hour},
            {"node": "n3", "job": "big", "slot": 1, "start": T0 + 14 * hour, "end": T0 + DAY},
            {"node": "n2", "job": "small", "slot": 0, "start": T0, "end": T0 + DAY},
            {"node": "n3", "job": "small", "slot": 1, "start": T0, "end": T0 + 14 * hour},
            {"node": "n1", "job": "small", "slot": 1, "start": T0 + 14 * hour, "end": T0 + DAY},
        ],
        "attempts": [
            attempt(1, 0, 0, 10 * hour, job="big"),
            attempt(2, 10.2 * hour, 10.3 * hour, None, job="big"),
            attempt(1, 0, 0, 3 * hour, job="small"),
            attempt(2, 3.5 * hour, 4 * hour, None, job="small"),
        ],
        "exclusions": [
            {"node": "n1", "job": "big", "start": T0 + 10 * hour, "end": T0 + 14 * hour}
        ],
        "episodes": [
            fault(0, "fail_stop", 10 * hour, 14 * hour, "n1", ["GpuFleetGpuLost"], job="big"),
            fault(1, "fail_slow_compute", 5 * hour, 6 * hour, "n3", [slow], 1.3, job="small"),
            fault(2, "fail_slow_compute", 16 * hour, 17 * hour, "n3", [slow], 1.3, job="big"),
            fault(3, "fail_slow_comm", 7 * hour, 8 * hour, "n2", [job_slow], 1.2, job="small"),
            # "big" is down then, "small" is not: scored for "small"
            fault(4, "fail_stop", 10.1 * hour, 10.1 * hour, "n2", [hung], scope="job", job="small"),
        ],
    }


def test_pages_are_grouped_as_the_shipped_alertmanager_routing_groups_them() -> None:
    config = yaml.safe_load(
        (Path(__file__).resolve().parents[1] / "deploy/alertmanager/alertmanager.yml").read_text()
    )
    assert tuple(config["route"]["group_by"]) == PAGE_GROUP_BY
    assert parse_duration(config["route"]["group_interval"]) == GROUP_INTERVAL_S


def test_a_shared_cluster_is_scored_per_job() -> None:
    truth = shared_truth()
    hour = 3600.0
    scores = score(
        truth,
        [
            firing("GpuFleetGpuLost", T0 + 10 * hour + 30, T0 + 11 * hour, node="n1"),
            # n3 served "big" by then: detected, and its page is the job's
            firing("GpuFleetStragglerNode", T0 + 16 * hour + 420, T0 + 17 * hour, node="n3",
                   training_job="big"),
            # the other job's slowdown is not this episode's detection, and no fault of
            # "big" explains it: a false page for "big"
            firing("GpuFleetJobSlowdown", T0 + 7 * hour + 300, T0 + 8 * hour,
                   training_job="big"),
        ],
    )  # fmt: skip
    by_id = {e.id: e for e in scores.episodes}
    assert [by_id[i].job for i in range(5)] == ["big", "small", "big", "small", "small"]
    assert by_id[0].detected and by_id[2].detected and by_id[2].ttd_s == 420
    assert not by_id[1].detected and not by_id[3].detected
    assert by_id[4].scored  # "small" was running when it hung
    assert [(p.job, p.explained_by is None) for p in scores.pages] == [
        ("big", False),
        ("big", False),
        ("big", True),
    ]
    rows = {(row["job"], row["class"]): row for row in scores.by_job()}
    assert set(rows) == {
        ("big", "fail-stop (node)"),
        ("big", "fail-slow compute"),
        ("small", "fail-slow compute"),
        ("small", "fail-slow communication"),
        ("small", "fail-stop (job)"),
    }
    assert rows[("big", "fail-slow compute")]["recall"] == 1.0
    assert rows[("big", "fail-slow compute")]["ttd_median_s"] == 420
    assert rows[("small", "fail-slow compute")]["recall"] == 0.0
    assert rows[("big", "fail-stop (node)")]["false pages"] == 1
    assert rows[("small", "fail-stop (job)")]["pages"] == 0
    # the single-job views still add up over jobs
    assert scores.recall("fail-slow compute") == 0.5


def test_a_slow_gpu_of_a_job_that_sends_step_time_only_is_scored_in_a_class_of_its_own() -> None:
    """Its step time is the job's on every rank, so nothing there names the GPU: its
    episodes must not dilute "fail-slow compute", and must not drop out of sight either."""
    truth = shared_truth()
    truth["cluster"]["jobs"][1]["step_only"] = True
    hour = 3600.0
    truth["episodes"].append(
        fault(5, "fail_slow_compute", 18 * hour, 19 * hour, "n2", ["GpuFleetStragglerNode"],
              1.07, job="small")
    )  # fmt: skip
    scores = score(truth, [])
    klass = {e.id: e.klass for e in scores.episodes}
    assert klass[1] == "fail-slow compute, step time only"
    assert klass[5] == "fail-slow compute, step time only 5-10%"
    assert klass[2] == "fail-slow compute"  # "big" times a split
    assert klass[3] == "fail-slow communication"  # a slow link slows the job's step time
    assert all(e.scored for e in scores.episodes if e.id in (1, 2, 3, 5))
    assert scores.recall("fail-slow compute") == 0.0
    assert scores.recall("fail-slow compute, step time only") == 0.0
    assert {row["class"]: row["episodes"] for row in scores.by_class()} == {
        "fail-slow communication": 1,
        "fail-slow compute": 1,
        "fail-slow compute, step time only": 1,
        "fail-slow compute, step time only 5-10%": 1,
        "fail-stop (job)": 1,
        "fail-stop (node)": 1,
    }
    bands = {(row["kind"], row["band"]): row["episodes"] for row in scores.by_band()}
    assert bands[("compute", ">20%")] == 1 and bands[("compute", "5-10%")] == 0
    # "big"'s slow GPU found: the compute class is whole, not halved by "small"'s
    found = score(truth, [firing("GpuFleetStragglerNode", T0 + 16 * hour + 420,
                                 T0 + 17 * hour, node="n3", training_job="big")])  # fmt: skip
    assert found.recall("fail-slow compute") == 1.0
    assert found.recall("fail-slow compute, step time only") == 0.0
    assert [row["detected"] for row in found.by_band() if row["kind"] == "compute"] == [0, 0, 1]


def test_quick_benchmark_finds_injected_faults_through_real_prometheus(
    tmp_path: Path, bench_detect: Any
) -> None:
    """The whole pipeline: simulated history → promtool blocks → Prometheus → every
    alert of alerts/ evaluated → scored. Small and with boosted fault rates, so the
    thresholds are loose; the figures worth quoting come from the full benchmark."""
    bench = bench_detect
    end = bench.parse_end(bench.DEFAULT_END)  # fixed: the seed and the end fix the history
    scores = bench.run_seed(
        bench.scenario_for(32, bench.QUICK_RATES), 201, 0.5, end=end, workdir=tmp_path, log=[]
    )
    assert len([e for e in scores.episodes if e.klass == "fail-stop (node)" and e.scored]) >= 3
    assert scores.recall("fail-stop (node)") >= 0.8
    assert scores.recall("fail-slow compute") >= 0.8
    assert scores.ttd_median("fail-stop (node)") < 5 * 60
    assert scores.ttd_median("fail-slow compute") < 15 * 60
    assert scores.precision >= 0.9
    assert scores.confounder_node_pages() == {}


def test_the_benchmark_history_ends_at_a_fixed_time_never_the_wall_clock(bench_detect: Any) -> None:
    """Diurnal drift follows the time of day: a history ending "now" made the same seed
    score differently at different hours. The default end is a constant; --end moves it."""
    bench = bench_detect
    parser_default = bench.parse_end(bench.DEFAULT_END)
    assert parser_default == 1_795_996_800.0  # 2026-11-30T00:00:00Z
    assert bench.parse_end("2026-11-30T06:30:59") == parser_default + 6.5 * 3600
    assert bench.parse_end("1795996800") == parser_default
    with pytest.raises(argparse.ArgumentTypeError, match="ISO 8601"):
        bench.parse_end("yesterday")
