"""The simulator's fault model and cluster: determinism, statistics, lock-step semantics."""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from gpufleet.rules.config import RulesConfig
from gpufleet.simulate.cluster import Cluster
from gpufleet.simulate.config import (
    ClusterSpec,
    Confounders,
    FaultRates,
    Layout,
    Scenario,
    ScenarioError,
    load_scenario,
    parse_duration,
    scenario_names,
)
from gpufleet.simulate.faults import CAUSES, Kind
from gpufleet.simulate.gpu_values import HW_POWER_BRAKE, HW_SLOWDOWN, HW_THERMAL
from gpufleet.simulate.history import write_history
from gpufleet.simulate.timeline import TimelineBuilder, build_timeline

START = 1_800_000_000.0
DAY = 86400.0


def quiet(**cluster: object) -> Scenario:
    """No random faults, no cluster-wide slowdowns: only what a test adds."""
    return Scenario(
        cluster=ClusterSpec(**cluster),  # type: ignore[arg-type]
        rates=FaultRates(
            fail_stop_per_1000_node_days=0,
            fail_slow_compute_per_node_day=0,
            fail_slow_comm_per_node_day=0,
        ),
        confounders=Confounders(cluster_slowdowns_per_day=0, workload_imbalances_per_day=0),
    )


def run(cluster: Cluster, seconds: float, tick: float = 5.0) -> None:
    for _ in range(int(seconds / tick)):
        cluster.advance(cluster.now + tick)


# -- configuration ------------------------------------------------------------------


def test_every_bundled_scenario_loads_and_describes_itself() -> None:
    names = scenario_names()
    assert {
        "healthy", "single-straggler", "gpu-off-bus", "xid-storm", "ecc-degradation",
        "nvlink-flapping", "checkpoint-storm", "stage-skew", "cluster-slowdown",
        "realistic-week", "demo",
    } <= set(names)  # fmt: skip
    for name in names:
        scenario = load_scenario(name)
        assert scenario.description, name
        Cluster(scenario, 0, START, 3600.0)  # its episodes fit its cluster


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("cluster: {nodez: 4}", "cluster.nodez: unknown setting"),
        ("rates: {fail_stop_per_1000_node_days: lots}", "is not a number"),
        ("episodes: [{kind: meltdown}]", "episodes[0].kind: 'meltdown' is not one of"),
        ("episodes: [{kind: fail_stop, cause: gremlins, node: 1}]", "episodes[0].cause"),
        ("episodes: [{kind: fail_slow_compute, node: 1, gpu: 0, start: soon}]", "not a duration"),
        ("episodes: [{kind: fail_slow_compute, node: 99, gpu: 0}]", "node 99 is not in"),
        ("episodes: [{kind: xid_storm, node: 1}]", "needs a node and a gpu"),
        ("episodes: [{kind: checkpoint, node: 1}]", "a checkpoint is the whole job's"),
        ("chaos: true", "unknown sections ['chaos']"),
        ("- a list", "expected a mapping at the top"),
    ],
)
def test_bad_scenarios_say_what_is_wrong(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    with pytest.raises(ScenarioError, match=re_escape(message)):
        Cluster(load_scenario(str(path)).with_cluster(nodes=16), 0, START, 3600.0)


def re_escape(text: str) -> str:
    import re

    return re.escape(text)


def test_durations_and_layouts() -> None:
    assert [parse_duration(x) for x in ("90s", "2m", "1.5h", "1d", 30)] == [
        90,
        120,
        5400,
        86400,
        30,
    ]
    assert Layout.parse("8x4x8") == Layout(8, 4, 8) == Layout.parse("8×4×8")  # noqa: RUF001
    with pytest.raises(ScenarioError, match="has 64 ranks; 16 nodes x 8 GPUs have 128"):
        ClusterSpec(nodes=16, layout="2x4x8").resolved_layout()
    assert ClusterSpec(nodes=64).resolved_layout() == Layout(16, 4, 8)


def test_pipeline_stages_follow_the_layout() -> None:
    cluster = Cluster(quiet(nodes=16, layout="2x4x16"), 0, START, 3600.0)
    assert list(cluster.stage) == [0] * 4 + [1] * 4 + [2] * 4 + [3] * 4


# -- determinism ----------------------------------------------------------------------


def test_same_seed_same_history(tmp_path: Path) -> None:
    scenario = replace(
        load_scenario("realistic-week"), rates=FaultRates(fail_stop_per_1000_node_days=200)
    )
    scenario = scenario.with_cluster(nodes=8)
    outputs = []
    for run_dir in ("a", "b", "c"):
        seed = 7 if run_dir != "c" else 8
        result = write_history(scenario, seed, 0.25, tmp_path / run_dir, end=START, shards=2)
        outputs.append(
            [path.read_bytes() for path in result.files] + [result.ground_truth.read_bytes()]
        )
    assert outputs[0] == outputs[1]
    assert outputs[0] != outputs[2]


# -- the fault model over many node-days ---------------------------------------------------


@pytest.fixture(scope="module")
def big_timeline() -> tuple[Scenario, object]:
    scenario = Scenario(
        cluster=ClusterSpec(nodes=1000), confounders=Confounders(checkpoints=False, evals=False)
    )
    return scenario, build_timeline(scenario, 11, START, START + 120 * DAY)


def test_fail_stop_rate_matches_the_configured_rate(big_timeline: tuple[Scenario, object]) -> None:
    scenario, timeline = big_timeline
    fail_stops = [e for e in timeline.episodes if e.kind == Kind.FAIL_STOP]  # type: ignore[attr-defined]
    expected = scenario.rates.fail_stop_per_1000_node_days / 1000 * 1000 * 120
    # a node under repair cannot fail again, which removes a few percent of draws
    assert 0.85 * expected < len(fail_stops) < expected + 4 * math.sqrt(expected), (
        len(fail_stops),
        expected,
    )


def test_cause_shares_follow_llama3(big_timeline: tuple[Scenario, object]) -> None:
    _, timeline = big_timeline
    causes = Counter(e.cause for e in timeline.episodes if e.kind == Kind.FAIL_STOP)  # type: ignore[attr-defined]
    total = sum(causes.values())
    weights = sum(cause.weight for cause in CAUSES)
    for cause in CAUSES:
        share = cause.weight / weights
        sigma = math.sqrt(share * (1 - share) / total)
        assert abs(causes[cause.name] / total - share) < 4 * sigma + 0.005, cause.name
    assert causes["hbm"] / total == pytest.approx(17 / weights, abs=0.03)


def test_xids_follow_the_cause(big_timeline: tuple[Scenario, object]) -> None:
    _, timeline = big_timeline
    xids: dict[str, set[int | None]] = {}
    for episode in timeline.episodes:  # type: ignore[attr-defined]
        if episode.kind == Kind.FAIL_STOP:
            xids.setdefault(episode.cause, set()).add(episode.xid)
    assert xids["gpu_fell_off_bus"] == {79}
    assert xids["nvlink"] == {74}
    assert xids["hbm"] == {48}  # the burst's first XID; the others follow it
    assert xids["gsp"] <= {119, 120}
    assert xids["software"] <= {13, 31, 43}
    assert xids["host"] == {None}


def test_hbm_bursts_follow_the_configured_shares(big_timeline: tuple[Scenario, object]) -> None:
    scenario, timeline = big_timeline
    rates = scenario.rates
    bursts = [
        [code for _, code in episode.details["xid_burst"]]
        for episode in timeline.episodes  # type: ignore[attr-defined]
        if episode.kind == Kind.FAIL_STOP and episode.cause == "hbm"
    ]
    assert len(bursts) > 120
    assert {burst[0] for burst in bursts} == {48}
    assert {burst[3] for burst in bursts} == {154}
    for position, code, share in (
        (1, 94, rates.hbm_contained_share),
        (2, 64, rates.hbm_remap_failure_share),
    ):
        seen = sum(burst[position] == code for burst in bursts) / len(bursts)
        sigma = math.sqrt(share * (1 - share) / len(bursts))
        assert abs(seen - share) < 4 * sigma, (code, seen, share)
    assert {burst[1] for burst in bursts} == {94, 95}
    assert {burst[2] for burst in bursts} == {63, 64}


def test_some_failures_have_precursors_most_do_not(big_timeline: tuple[Scenario, object]) -> None:
    _, timeline = big_timeline
    episodes = timeline.episodes  # type: ignore[attr-defined]
    hbm = [e for e in episodes if e.kind == Kind.FAIL_STOP and e.cause == "hbm"]
    precursors = [e for e in episodes if e.kind == Kind.PRECURSOR and e.cause == "hbm"]
    assert 0.15 < len(precursors) / len(hbm) < 0.45
    for precursor in precursors:
        assert precursor.details["signal"] == "remaps"
        assert precursor.end - precursor.start <= 12 * 3600 + 1


def test_fail_slow_episodes_have_the_configured_size_and_length(
    big_timeline: tuple[Scenario, object],
) -> None:
    _, timeline = big_timeline
    episodes = timeline.episodes  # type: ignore[attr-defined]
    compute = [e for e in episodes if e.kind == Kind.FAIL_SLOW_COMPUTE]
    comm = [e for e in episodes if e.kind == Kind.FAIL_SLOW_COMM]
    assert all(1.10 <= e.magnitude <= 1.30 for e in compute)
    assert np.mean([e.end - e.start for e in compute]) / 60 == pytest.approx(10, rel=0.15)
    assert np.mean([e.end - e.start for e in comm]) / 60 == pytest.approx(24, rel=0.15)
    assert all(
        e.expected_alerts == ("GpuFleetStragglerNode", "GpuFleetNodeSlowerThanBaseline")
        for e in compute
    )


def test_no_fail_slow_episode_runs_while_its_replica_waits_for_a_node(
    big_timeline: tuple[Scenario, object],
) -> None:
    scenario, timeline = big_timeline
    groups = scenario.cluster.replica_groups()
    assert len(groups[0]) == 4  # 1,000 nodes as 250x4x8: a replica is a node per stage
    away: dict[int, list[tuple[float, float]]] = {}
    for x in timeline.exclusions:  # type: ignore[attr-defined]
        for mate in groups[x.node]:
            away.setdefault(mate, []).append((x.start, x.end))
    slow = [
        e
        for e in timeline.episodes  # type: ignore[attr-defined]
        if e.kind in (Kind.FAIL_SLOW_COMPUTE, Kind.FAIL_SLOW_COMM)
    ]
    sidelined = [
        e
        for e in slow
        if any(e.start < end and start < e.end for start, end in away.get(e.node, []))
    ]
    assert slow and not sidelined
    # not by luck: at random, this many episodes would have started on a waiting node
    waiting = sum(end - start for spans in away.values() for start, end in spans)
    assert waiting / (1000 * 120 * DAY) * len(slow) > 10


def test_failures_concentrate_on_a_few_nodes_as_in_production() -> None:
    # The 63-node production study: the top 3 nodes caused over half of all exclusions.
    shares = []
    for seed in range(5):
        scenario = Scenario(
            cluster=ClusterSpec(nodes=63),
            confounders=Confounders(checkpoints=False, evals=False, data_loader_stalls_per_hour=0),
        )
        timeline = build_timeline(scenario, seed, START, START + 365 * DAY)
        per_node = Counter(exclusion.node for exclusion in timeline.exclusions)
        top3 = sum(count for _, count in per_node.most_common(3))
        shares.append(top3 / sum(per_node.values()))
    assert np.median(shares) > 0.5, shares
    assert min(shares) > 0.35, shares


def test_auto_retries_mostly_succeed_and_chains_are_recorded(
    big_timeline: tuple[Scenario, object],
) -> None:
    _, timeline = big_timeline
    attempts = timeline.attempts  # type: ignore[attr-defined]
    triggers = Counter(attempt.trigger for attempt in attempts)
    assert triggers["initial"] == 1
    assert triggers["auto"] > triggers["manual"] > 0
    assert all(a.outcome == "failed" for a in attempts[:-1]) and attempts[-1].outcome == "running"


# -- storage -------------------------------------------------------------------------


@pytest.mark.parametrize(("writers", "low", "high"), [(4, 0.0, 0.0), (60, 0.9, 1.0)])
def test_checkpoint_queue_wait_grows_with_writers(writers: int, low: float, high: float) -> None:
    builder = TimelineBuilder(quiet(nodes=writers), 0, START, START + DAY)
    duration, queue, service = builder.checkpoint_cost(START)
    assert duration == pytest.approx(queue + service)
    assert low <= queue / duration <= high


# -- lock-step training ------------------------------------------------------------------


def test_a_slow_gpu_shows_as_compute_on_its_node_and_as_waiting_on_its_peers() -> None:
    scenario = load_scenario("single-straggler")
    cluster = Cluster(scenario, 0, START, DAY)
    run(cluster, 150)  # up to just after the episode starts (at 2 minutes)
    t = cluster.training
    before = (t.compute_s.copy(), t.comm_wait_s.copy(), t.steps.copy(), t.slowest_compute_s.copy())
    run(cluster, 600)  # inside the episode
    steps = t.steps - before[2]
    compute = (t.compute_s - before[0]) / steps
    comm = (t.comm_wait_s - before[1]) / steps
    slowest = (t.slowest_compute_s - before[3]) / (steps / cluster.gpus)
    stage0 = [n for n in range(cluster.nodes) if cluster.stage[n] == cluster.stage[5] and n != 5]
    peer_compute = np.median(compute[stage0])
    # one GPU in eight is ~25% slower: the node's mean moves ~3%, its slowest rank ~25%
    assert compute[5] / peer_compute == pytest.approx(1 + 0.25 / 8, abs=0.01)
    assert slowest[5] / np.median(slowest[stage0]) == pytest.approx(1.25, abs=0.03)
    assert comm[5] < np.median(comm[stage0])  # everyone else waits for node-005
    step_seconds = (t.duration_s - 0) / t.steps
    assert np.ptp(step_seconds[t.steps > 0]) < 1e-9  # lock-step: the same step time everywhere


@pytest.mark.parametrize(
    ("cause", "bits", "gpus_slowed"),
    [("thermal", HW_THERMAL | HW_SLOWDOWN, 1), ("psu", HW_POWER_BRAKE | HW_SLOWDOWN, 8)],
)
def test_a_fail_stop_with_a_lead_throttles_before_it_fails(
    cause: str, bits: int, gpus_slowed: int
) -> None:
    scenario = replace(
        quiet(nodes=16),
        episodes=[{"kind": "fail_stop", "cause": cause, "node": 3, "gpu": 2, "start": 3600.0}],
    )
    cluster = Cluster(scenario, 0, START, DAY)
    episode = next(e for e in cluster.timeline.episodes if e.kind == Kind.FAIL_STOP)
    lead = float(episode.details["slowdown_from"])  # type: ignore[arg-type]
    assert 600 <= episode.start - lead <= 1800 and episode.shows_from == lead
    run(cluster, lead - START - 10)
    assert not cluster.throttle.any() and cluster.gpu_values(3, 2)["DCGM_FI_DEV_SM_CLOCK"] == 1980
    run(cluster, 60)  # inside the lead, before the failure
    assert cluster.now < episode.start
    assert int(cluster.throttle[3, 2]) & bits == bits
    assert int((cluster.slowdown[3] > 1.0).sum()) == gpus_slowed
    assert cluster.gpu_values(3, 2)["DCGM_FI_DEV_SM_CLOCK"] < 1600
    assert not cluster.throttle[np.arange(16) != 3].any()  # only that node


def test_uneven_work_slows_one_replica_in_every_stage_on_healthy_gpus() -> None:
    scenario = replace(
        quiet(nodes=32, layout="8x4x8", last_stage_skew=0.0),
        episodes=[
            {"kind": "workload_imbalance", "dp_rank": 3, "start": 60.0, "duration": 3600.0,
             "magnitude": 1.06}
        ],
    )  # fmt: skip
    cluster = Cluster(scenario, 0, START, DAY)
    run(cluster, 120)
    t = cluster.training
    before = (t.slowest_compute_s.copy(), t.slowest_steps.copy())
    watts = cluster._power_watts().copy()
    run(cluster, 600)
    per_step = (t.slowest_compute_s - before[0]) / (t.slowest_steps - before[1])
    replica = cluster.dp_rank[:, 0] == 3  # TP 8: a node is one rank of one replica per stage
    assert replica.sum() == 4 and sorted(cluster.stage[replica].tolist()) == [0, 1, 2, 3]
    for stage in range(4):
        members = cluster.stage == stage
        ratio = per_step[members & replica] / np.median(per_step[members & ~replica])
        assert ratio == pytest.approx(1.06, abs=0.01)
    # the GPUs are not slower: clocks, throttling and power are what they were
    assert {cluster.gpu_values(n, 0)["DCGM_FI_DEV_SM_CLOCK"] for n in range(32)} == {1980}
    assert not cluster.throttle.any() and np.allclose(cluster._power_watts(), watts)
    (episode,) = [e for e in cluster.timeline.episodes if e.kind == Kind.WORKLOAD_IMBALANCE]
    assert not episode.is_fault and episode.details == {"dp_rank": 3}


def test_uneven_work_is_drawn_apart_from_every_other_episode() -> None:
    def episodes(per_day: float) -> list[tuple[str, float]]:
        scenario = replace(
            load_scenario("realistic-week").with_cluster(nodes=32),
            confounders=Confounders(workload_imbalances_per_day=per_day),
        )
        timeline = build_timeline(scenario, 7, START, START + 3 * DAY)
        return [(str(e.kind), e.start) for e in timeline.episodes]

    with_it, without = episodes(3.0), episodes(0.0)
    uneven = [e for e in with_it if e[0] == Kind.WORKLOAD_IMBALANCE]
    assert 3 <= len(uneven) <= 20
    assert [e for e in with_it if e[0] != Kind.WORKLOAD_IMBALANCE] == without


def test_stage_skew_is_visible_per_stage_not_per_node() -> None:
    cluster = Cluster(load_scenario("stage-skew"), 0, START, DAY)
    run(cluster, 600)
    t = cluster.training
    per_step = t.compute_s / t.steps
    last = cluster.stage == cluster.stage.max()
    assert np.median(per_step[last]) / np.median(per_step[~last]) == pytest.approx(1.25, abs=0.02)
    for stage in set(cluster.stage.tolist()):
        members = per_step[cluster.stage == stage]
        assert members.max() / np.median(members) < 1.02  # peers in a stage agree


def test_the_job_stalls_on_a_failure_and_restarts_without_the_node_and_its_replica() -> None:
    cluster = Cluster(load_scenario("gpu-off-bus"), 0, START, DAY)
    episode = next(e for e in cluster.timeline.episodes if e.kind == Kind.FAIL_STOP)
    run(cluster, episode.start - START - 5)
    steps_before = cluster.step_number
    assert not cluster.gpu_lost[9, 2]
    run(cluster, 60)
    assert cluster.gpu_lost[9, 2] and cluster.excluded[9]
    assert cluster.xids[(9, 2)].counts == {79: 1}
    stalled_steps = cluster.step_number
    run(cluster, 120)
    assert cluster.step_number == stalled_steps  # no progress while the job is down
    restarted = float(episode.details["restarted_at"])  # type: ignore[arg-type]
    run(cluster, restarted - cluster.now + 60)
    assert cluster.step_number > stalled_steps > steps_before
    # 16 nodes as 4x4x8: node 9 holds replica 1 of stage 2; replica 1 cannot step without
    # it, so its nodes in the other stages wait too, and the job trains 3 replicas wide
    replica = [1, 5, 9, 13]
    assert sorted(np.flatnonzero(cluster.replica_mates[9]).tolist()) == replica
    frozen = cluster.training.steps.copy()
    run(cluster, 60)
    moved = cluster.training.steps > frozen
    assert not moved[replica].any()
    assert moved[[n for n in range(16) if n not in replica]].all()
    assert cluster.gpu_values(5, 0)["DCGM_FI_DEV_GPU_UTIL"] == 5  # idle, not excluded
    assert cluster.gpu_values(4, 0)["DCGM_FI_DEV_GPU_UTIL"] == 97


def test_replica_groups_follow_the_layout() -> None:
    # TP 8 on 8 GPUs: a node is one replica's rank group in its stage
    assert ClusterSpec(nodes=8, layout="4x2x8").replica_groups()[1] == {1, 5}
    # TP 4: a node holds two replicas of its stage
    groups = ClusterSpec(nodes=4, layout="4x2x4").replica_groups()
    assert groups[0] == {0, 2} and groups[1] == {1, 3}
    # TP 16 spans two nodes: both hold the same replica, in every stage
    assert ClusterSpec(nodes=8, layout="2x2x16").replica_groups()[0] == {0, 1, 4, 5}
    # no pipeline, TP on the node: a node is a replica of its own
    assert ClusterSpec(nodes=4, layout="4x1x8").replica_groups()[2] == {2}


def test_checkpoint_storm_is_queue_bound_and_visible_in_flight() -> None:
    cluster = Cluster(load_scenario("checkpoint-storm"), 0, START, DAY)
    window = cluster.timeline.checkpoints[0]
    run(cluster, window.start - START + 5, tick=1.0)
    assert cluster.training.ckpt_in_flight.sum() == 64 * 8  # everyone is writing at once
    run(cluster, window.end - cluster.now + 2, tick=1.0)
    t = cluster.training
    share = t.queue_wait_s.sum() / (t.queue_wait_s.sum() + t.service_s.sum())
    assert share > 0.9
    assert t.ckpt_in_flight.sum() == 0


def test_a_checkpoint_episode_makes_every_node_write_at_once() -> None:
    scenario = replace(quiet(nodes=64), episodes=[{"kind": "checkpoint", "start": 120.0}])
    timeline = build_timeline(scenario, 0, START, START + 3600)
    storm = timeline.checkpoints[0]
    assert storm.start == START + 120  # before the periodic ones (the first at 15 min)
    assert timeline.checkpoints[1].start == START + 900
    queue, service = (float(part) for part in storm.reason.split(":"))
    assert storm.end - storm.start == pytest.approx(32.0) and queue / (queue + service) > 0.9


def test_a_compressed_scenario_tells_the_same_story_faster() -> None:
    normal = build_timeline(load_scenario("demo"), 0, START, START + DAY)
    fast = build_timeline(load_scenario("demo").compressed(5), 0, START, START + DAY / 5)

    def story(timeline: object, factor: float) -> tuple[list[str], list[float]]:
        early = [
            e
            for e in timeline.episodes  # type: ignore[attr-defined]
            if e.start < START + 600 / factor
        ]
        times = [t for e in early for t in ((e.start - START) * factor, (e.end - START) * factor)]
        return [str(e.kind) for e in early], times

    kinds, times = story(normal, 1)
    assert kinds == ["fail_slow_compute", "checkpoint", "fail_stop"]
    assert story(fast, 5)[0] == kinds and story(fast, 5)[1] == pytest.approx(times)
    for a, b in zip(normal.stalls, fast.stalls, strict=True):
        assert (b.start - START) * 5 == pytest.approx(a.start - START)
        assert (b.end - START) * 5 == pytest.approx(a.end - START)
    share = [
        float(w.reason.split(":")[0]) / (w.end - w.start)
        for w in (normal.checkpoints[0], fast.checkpoints[0])
    ]
    assert share[0] == pytest.approx(share[1])
    with pytest.raises(ScenarioError, match="not a positive number"):
        load_scenario("demo").compressed(0)


def test_the_demo_story_leaves_each_alert_time_to_page_before_the_next_event() -> None:
    """The demo's timeline against the rules' windows and ``for`` durations (the live
    story itself: tests/test_demo_story.py)."""
    rules = RulesConfig()
    timeline = build_timeline(load_scenario("demo"), 0, START, START + 30 * DAY)
    by_kind = {e.kind: e for e in sorted(timeline.episodes, key=lambda e: -e.start)}
    slow, failure = by_kind[Kind.FAIL_SLOW_COMPUTE], by_kind[Kind.FAIL_STOP]
    storm = timeline.checkpoints[0]
    # The straggler goes pending within a minute (its rate window holds only the 20 s of
    # healthy history before it), then its `for` elapses, all while the job trains.
    straggler_pages = slow.start + 60 + parse_duration(rules.straggler_for)
    assert (slow.node, slow.gpu) == (12, 5) and straggler_pages + 45 < failure.start
    # every node checkpoints at once, while training runs, and the queue-wait alert's
    # `for` elapses after the storm, still before the failure
    assert storm.start > slow.start and not timeline.stalls[0].start < storm.end
    assert storm.end + parse_duration(rules.checkpoint_queue_for) + 30 < failure.start
    assert (failure.node, failure.gpu, failure.xid) == (40, 3, 79)
    # the automatic retry restarts without node-040, well before the job-hung alert
    [stall] = timeline.stalls
    # with 30 s to spare for the restarted job's first step (the alert then waits its `for`)
    assert stall.end - stall.start + 30 < rules.hang_min_seconds
    assert [(x.node, x.source) for x in timeline.exclusions] == [(40, "auto")]
    assert [(a.trigger, a.outcome) for a in timeline.attempts] == [
        ("initial", "failed"),
        ("auto", "running"),
    ]
    assert stall.end - START < 10 * 60
