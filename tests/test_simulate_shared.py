"""A shared cluster: several jobs of different shapes, nodes moving through a spare pool,
and the per-rank series in the backfilled history."""

from __future__ import annotations

import json
import re
from collections import defaultdict
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from gpufleet.detect.score import score
from gpufleet.simulate.cluster import Cluster
from gpufleet.simulate.config import (
    ClusterSpec,
    Confounders,
    FaultRates,
    Scenario,
    ScenarioError,
    load_scenario,
)
from gpufleet.simulate.history import write_history
from gpufleet.simulate.recorder import wants_rank_series
from gpufleet.simulate.shared import SharedCluster

START = 1_800_000_000.0
QUIET = FaultRates(
    fail_stop_per_1000_node_days=0, fail_slow_compute_per_node_day=0, fail_slow_comm_per_node_day=0
)


def shapes(rates: FaultRates = QUIET, spares: int = 2) -> Scenario:
    scenario = load_scenario("shared-cluster")
    return replace(
        scenario,
        rates=rates,
        confounders=Confounders(cluster_slowdowns_per_day=0),
        spare_nodes=spares,
    )


def run(cluster: Cluster, seconds: float, tick: float = 5.0) -> None:
    for _ in range(int(seconds / tick)):
        cluster.advance(cluster.now + tick)


def by_name(shared: SharedCluster) -> dict[str, Cluster]:
    return {job.spec.job: job for job in shared.jobs}


def test_each_job_has_its_shape() -> None:
    jobs = by_name(SharedCluster(shapes(), 3, START, 3600.0))
    assert sorted(np.bincount(jobs["pp-2-nodes-per-stage"].stage).tolist()) == [2, 2, 2, 2]
    assert np.bincount(jobs["wide"].stage).tolist() == [8, 8, 8]
    tp0 = jobs["tp-rank-0-only"]
    # TP = 4 on 8-GPU nodes: two TP groups per node, rank 0 of each reports; 4 per stage
    assert tp0.reporters.tolist() == [2.0] * 8
    assert np.flatnonzero(tp0.report_mask[0]).tolist() == [0, 4]
    assert [int(tp0.reporters[tp0.stage == s].sum()) for s in range(4)] == [4, 4, 4, 4]
    for job in jobs.values():
        run(job, 600)
    t = tp0.training
    assert t.ranks.tolist() == [2.0] * 8
    assert (t.rank_steps[:, [1, 2, 3, 5, 6, 7]] == 0).all() and (t.rank_steps[:, [0, 4]] > 0).all()


def test_a_step_only_job_shows_its_step_time_as_compute_and_no_split() -> None:
    jobs = by_name(SharedCluster(shapes(), 3, START, 3600.0))
    job = jobs["step-time-only"]
    run(job, 600)
    t = job.training
    # what the agent makes of events without compute_s: all of the step is compute
    assert np.allclose(t.compute_s, t.duration_s)
    assert (t.data_wait_s == 0).all() and (t.comm_wait_s == 0).all()
    assert np.allclose(t.slowest_compute_s / t.slowest_steps, t.duration_s / t.steps)
    # no rank timed a split, while every step of the other jobs has one
    assert (t.steps > 0).all() and (t.split_steps == 0).all()
    for other in (jobs["wide"], jobs["tp-rank-0-only"], jobs["overlapped-comm"]):
        run(other, 600)
        assert (other.training.steps > 0).any()
        assert np.array_equal(other.training.split_steps, other.training.steps)


def test_overlapped_collectives_expose_only_what_compute_does_not_hide() -> None:
    jobs = by_name(SharedCluster(shapes(), 3, START, 3600.0))
    plain, hidden = jobs["wide"], jobs["overlapped-comm"]
    for job in (plain, hidden):
        run(job, 600)

    def comm_share(job: Cluster) -> float:
        t = job.training
        return float(t.comm_wait_s.sum() / t.duration_s.sum())

    assert comm_share(hidden) < 0.6 * comm_share(plain)
    assert hidden.step_time < plain.step_time


def test_a_slow_gpu_shows_through_its_tp_rank_0() -> None:
    scenario = replace(
        shapes(),
        episodes=[
            {"kind": "fail_slow_compute", "job": "tp-rank-0-only", "node": 3, "gpu": 6,
             "start": 0.0, "duration": 3600.0, "magnitude": 1.3},
        ],
    )  # fmt: skip
    job = by_name(SharedCluster(scenario, 3, START, 3600.0))["tp-rank-0-only"]
    run(job, 900)
    t = job.training
    per_step = t.rank_compute_s[:, 4] / t.rank_steps[:, 4]  # TP rank 0 of GPUs 4-7
    assert per_step[3] > 1.2 * np.median(per_step)


def test_repaired_nodes_move_between_jobs_through_the_spare_pool() -> None:
    rates = replace(QUIET, fail_stop_per_1000_node_days=3000.0, repair_hours_median=0.5)
    shared = SharedCluster(shapes(rates, spares=3), 5, START, 86400.0)
    jobs_of = defaultdict(set)
    for placement in shared.placements:
        jobs_of[placement.node].add(placement.job)
    assert any(len(jobs) > 1 for jobs in jobs_of.values())
    # at every moment each slot has one node and no node is in two slots
    for when in np.linspace(START, START + 86399, 97):
        held = [
            shared.node_of(j, s, when)
            for j, job in enumerate(shared.jobs)
            for s in range(job.nodes)
        ]
        assert len(held) == len(set(held))
    truth = shared.ground_truth(START, START + 86400, 30.0)
    assert {e["job"] for e in truth["episodes"]} == {job.spec.job for job in shared.jobs}
    assert all(a["job"] for a in truth["attempts"])


def series(text: str, family: str) -> dict[str, list[float]]:
    found: dict[str, list[float]] = defaultdict(list)
    for line in text.splitlines():
        if line.startswith(family + "{"):
            labels, value, _ = line.rsplit(" ", 2)
            found[labels.removeprefix(family)].append(float(value))
    return found


def label(labels: str, name: str) -> str:
    match = re.search(rf'{name}="([^"]*)"', labels)
    assert match, (labels, name)
    return match.group(1)


def test_the_shared_history_writes_physical_nodes_and_rank_series(tmp_path: Path) -> None:
    result = write_history(shapes(), 3, 2 / 24, tmp_path, end=START, shards=1)
    text = result.files[0].read_text()
    truth = json.loads(result.ground_truth.read_text())
    assert len(series(text, "up")) == 58 == truth["cluster"]["nodes"]
    ranks = series(text, "gpufleet_training_rank_steps_total")
    per_job: dict[str, set[str]] = defaultdict(set)
    for labels in ranks:
        per_job[label(labels, "training_job")].add(label(labels, "rank"))
    # rank series where stages are small (at most 4 nodes), only for ranks that report
    assert "wide" not in per_job
    assert len(per_job["pp-2-nodes-per-stage"]) == 64
    assert sorted(per_job["tp-rank-0-only"], key=int) == [str(r) for r in range(0, 64, 4)]
    compute = series(text, "gpufleet_training_compute_seconds_total")
    steps = series(text, "gpufleet_training_step_seconds_total")
    step_only = [k for k in compute if label(k, "training_job") == "step-time-only"]
    assert len(step_only) == 8
    for labels in step_only:
        assert np.allclose(compute[labels], steps[labels])
    # split steps: none for the step-only job, every step for the others
    counted = series(text, "gpufleet_training_steps_total")
    split = series(text, "gpufleet_training_split_steps_total")
    assert split.keys() == counted.keys()
    for labels, values in split.items():
        expected = 0 * np.array(counted[labels]) if labels in step_only else counted[labels]
        assert np.array_equal(values, expected), labels
    assert any(max(values) > 0 for values in split.values())


@pytest.mark.parametrize("shared", [False, True], ids=["one job", "shared cluster"])
def test_every_gpu_s_sm_clock_is_in_the_history_lower_on_a_slow_gpu(
    tmp_path: Path, shared: bool
) -> None:
    slow = {"kind": "fail_slow_compute", "node": 2, "gpu": 5, "start": 600.0,
            "duration": 7200.0, "magnitude": 1.25}  # fmt: skip
    scenario = (
        replace(shapes(spares=0), episodes=[{**slow, "job": "pp-2-nodes-per-stage"}])
        if shared
        else replace(load_scenario("healthy").with_cluster(nodes=8), episodes=[slow])
    )
    result = write_history(scenario, 3, 1 / 24, tmp_path, end=START, shards=1)
    text = result.files[0].read_text()
    nodes = json.loads(result.ground_truth.read_text())["cluster"]["nodes"]
    clocks = series(text, "DCGM_FI_DEV_SM_CLOCK")
    assert len(clocks) == nodes * 8  # every GPU of every node, not only those with events
    slowed = {k for k, values in clocks.items() if min(values) < 1980}
    assert len(slowed) == 1
    (key,) = slowed
    assert label(key, "gpu") == "5" and min(clocks[key]) == round(1980 / 1.25)
    assert all(set(values) == {1980.0} for k, values in clocks.items() if k != key)


def test_rank_series_of_the_default_job_on_request(tmp_path: Path) -> None:
    # auto: only where stages have at most 4 nodes (the default quick job has 8: unchanged)
    assert not wants_rank_series(ClusterSpec(nodes=32), "auto")
    assert wants_rank_series(ClusterSpec(nodes=16), "auto")  # 4 nodes per stage
    scenario = Scenario(cluster=ClusterSpec(nodes=32), rates=QUIET)
    plain = write_history(scenario, 1, 1 / 24, tmp_path / "a", end=START, shards=1)
    ranked = write_history(
        scenario, 1, 1 / 24, tmp_path / "b", end=START, shards=1, rank_series="all"
    )
    assert "gpufleet_training_rank_" not in plain.files[0].read_text()
    text = ranked.files[0].read_text()
    assert len(series(text, "gpufleet_training_rank_compute_seconds_total")) == 256
    assert len(series(text, "gpufleet_training_rank_steps_total")) == 256


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("jobs: [{job: a, report_ranks: tp1}]", "jobs[0].report_ranks: 'tp1' is not one of"),
        ("jobs: [{job: a, comm_overlap: 1.5}]", "jobs[0].comm_overlap: 1.5 is not in [0, 1)"),
        ("jobs: [{job: a, nodes: 8, layout: 2x2x8}]", "layout 2x2x8 has 32 ranks"),
        ("jobs: [{job: a}, {job: a}]", "job names repeat"),
        ("jobs: [{nodes: 4}]", "jobs[0]: expected a mapping with a job name"),
        ("spare_nodes: 2", "spare_nodes needs a jobs section"),
        (
            "jobs: [{job: a}]\nepisodes: [{kind: fail_slow_compute, node: 1, job: b}]",
            "episodes[0].job: 'b' is not one of ['a']",
        ),
    ],
)
def test_bad_shared_scenarios_say_what_is_wrong(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    with pytest.raises(ScenarioError, match=re.escape(message)):
        load_scenario(str(path))


def test_the_cli_writes_a_shared_history_and_refuses_to_serve_one(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from gpufleet.cli import main

    argv = ["simulate", "--scenario", "shared-cluster", "--history", "0.01", "--shards", "1"]
    assert main([*argv, "--out", str(tmp_path), "--end", str(START), "--rank-series", "none"]) == 0
    assert "samples of 60 nodes" in capsys.readouterr().out
    assert "gpufleet_training_rank_" not in (tmp_path / "history-00.om").read_text()
    with pytest.raises(SystemExit) as stopped:
        main(["simulate", "--scenario", "shared-cluster", "--targets-file", ""])
    assert stopped.value.code == 2
    assert "write its history with --history" in capsys.readouterr().err


def test_a_moving_node_keeps_its_own_counters(tmp_path: Path) -> None:
    """A node's error counters follow the node through jobs and the spare pool: they
    never go back except where a repair clears them, and a repaired spare's pending
    remap is cleared."""
    rates = replace(QUIET, fail_stop_per_1000_node_days=6000.0, repair_hours_median=0.5)
    scenario = Scenario(
        rates=rates,
        confounders=Confounders(cluster_slowdowns_per_day=0),
        jobs=[
            ClusterSpec(job="a", nodes=4, layout="2x2x8"),
            ClusterSpec(job="b", nodes=4, layout="2x2x8", report_ranks="tp0"),
        ],
        spare_nodes=2,
    )
    result = write_history(scenario, 1, 0.25, tmp_path, end=START, shards=1)
    text = result.files[0].read_text()
    truth = json.loads(result.ground_truth.read_text())
    moved = {p["node"] for p in truth["placements"] if p["start"] > truth["start"]}
    assert moved
    jobs_of = defaultdict(set)
    for placement in truth["placements"]:
        jobs_of[placement["node"]].add(placement["job"])
    assert any(len(jobs) > 1 for jobs in jobs_of.values())
    checked = 0
    for family in ("DCGM_FI_DEV_ECC_DBE_AGG_TOTAL", "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS"):
        for labels, values in series(text, family).items():
            assert values == sorted(values), labels
            checked += label(labels, "instance") in moved
    assert checked
    # a node in the spare pool at the end was repaired: nothing pending on it
    idle = set(truth["cluster"]["node_names"]) - {
        p["node"] for p in truth["placements"] if p["end"] >= truth["end"]
    }
    for labels, values in series(text, "DCGM_FI_DEV_ROW_REMAP_PENDING").items():
        if label(labels, "instance") in idle:
            assert values[-1] == 0, labels


def test_a_live_node_exposes_only_its_reporting_ranks() -> None:
    from gpufleet.simulate.serve import node_exposition

    spec = ClusterSpec(nodes=8, layout="4x4x4", report_ranks="tp0")
    cluster = Cluster(Scenario(cluster=spec, rates=QUIET), 2, START, 3600.0)
    run(cluster, 600)
    text = node_exposition(cluster, 3).decode()
    ranks = {
        label(line, "rank")
        for line in text.splitlines()
        if line.startswith("gpufleet_training_rank_steps_total{")
    }
    assert ranks == {"24", "28"}  # node 3 holds ranks 24-31: TP rank 0 of two groups
    assert 'gpufleet_training_ranks{node="node-003",pp_stage="1",training_job="sim-llm"} 2.0' in (
        text
    )
    stage = '{node="node-003",pp_stage="1",training_job="sim-llm"}'
    values = dict(line.rsplit(" ", 1) for line in text.splitlines() if stage in line)
    steps = float(values[f"gpufleet_training_steps_total{stage}"])
    assert steps > 0 and float(values[f"gpufleet_training_split_steps_total{stage}"]) == steps


def test_a_precursor_belongs_to_the_node_that_fails_and_explains_the_one_before_it() -> None:
    # A precursor leads up to a fail-stop of its slot for hours; the slot may change hands
    # (a repair) within them. The signal from then on is the failing node's, and so is
    # the ground truth: its page there is not a false one. The node that held the slot
    # before showed the signal while it did: a record of its own, not scored.
    rates = replace(QUIET, fail_stop_per_1000_node_days=3000.0, repair_hours_median=0.5)
    shared = SharedCluster(shapes(rates, spares=3), 5, START, 86400.0)
    truth = shared.ground_truth(START, START + 86400, 30.0)
    placements = defaultdict(list)
    for p in truth["placements"]:
        placements[(p["job"], p["slot"])].append(p)
    precursors = [
        e for e in truth["episodes"] if e["kind"] == "precursor" and "left_slot" not in e["details"]
    ]
    earlier = [
        e for e in truth["episodes"] if e["kind"] == "precursor" and "left_slot" in e["details"]
    ]
    swapped = 0
    for job_index, job in enumerate(shared.jobs):
        for raw in (e for e in job.timeline.episodes if e.kind == "precursor"):
            before = shared.node_of(job_index, raw.node, raw.start)
            swapped += before != shared.node_of(job_index, raw.node, raw.end)
    assert precursors and swapped, "no precursor spans a change of hands: pick another seed"
    for precursor in precursors:
        failing = next(
            e
            for e in truth["episodes"]
            if e["kind"] == "fail_stop"
            and (e["job"], e["slot"]) == (precursor["job"], precursor["slot"])
            and e["start"] == precursor["end"]
        )
        assert precursor["node"] == failing["node"], precursor
        held = next(
            p
            for p in placements[(precursor["job"], precursor["slot"])]
            if p["node"] == precursor["node"] and p["start"] <= precursor["end"] <= p["end"]
        )
        assert precursor["start"] >= held["start"], precursor
    assert earlier, "no precursor spans a change of hands"
    index = {job.spec.job: number for number, job in enumerate(shared.jobs)}
    for part in earlier:
        # within the simulator's own precursor on that slot, and over before the node that
        # fails at its end took the slot; on a node that held the slot meanwhile
        number = index[part["job"]]
        raw = next(
            e
            for e in shared.jobs[number].timeline.episodes
            if e.kind == "precursor"
            and e.node == part["slot"]
            and e.start <= part["start"] < part["end"] <= e.end
        )
        assert part["end"] <= shared.placement_at(number, raw.node, raw.end).start, part
        assert any(
            p["node"] == part["node"] and p["start"] <= part["start"] and part["end"] <= p["end"]
            for p in placements[(part["job"], part["slot"])]
        ), part
    scores = score(truth, [])
    assert {e.klass for e in scores.episodes if e.kind == "precursor" and not e.scored} >= {
        "precursor (on a node that left the slot)"
    }


def test_a_slow_gpu_or_link_leaves_with_its_node_and_never_slows_the_next_holder() -> None:
    # A node pulled from its job for a fail-stop takes its slowness to the repair bench;
    # the slot comes back on another node, a healthy one. (The simulator kept slowing the
    # slot, and the ground truth named the node that had left: on seed 509 the spare that
    # took the slot paged as a straggler, scored as a false node page.)
    rates = replace(
        QUIET,
        fail_stop_per_1000_node_days=3000.0,
        repair_hours_median=0.5,
        fail_slow_compute_per_node_day=6.0,
        fail_slow_comm_per_node_day=3.0,
        compute_mean_minutes=240.0,
    )
    shared = SharedCluster(shapes(rates, spares=3), 5, START, 86400.0)
    truth = shared.ground_truth(START, START + 86400, 30.0)
    slow = [e for e in truth["episodes"] if e["kind"].startswith("fail_slow")]
    cut = 0
    for episode in slow:
        held = [
            p
            for p in truth["placements"]
            if (p["job"], p["slot"], p["node"])
            == (episode["job"], episode["slot"], episode["node"])
            and p["start"] <= episode["start"] < p["end"]
        ]
        assert held and min(episode["end"], truth["end"]) <= held[0]["end"], episode
        cut += any(
            x["node"] == episode["node"] and x["start"] == episode["end"]
            for x in truth["episodes"]
            if x["kind"] == "fail_stop"
        )
    assert cut, "no slow episode ran into its node's fail-stop: pick another seed"
