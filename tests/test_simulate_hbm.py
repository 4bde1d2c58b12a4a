"""An uncorrectable HBM error in the simulator: the XID burst NVIDIA documents (48, then
94 or 95, then 63 or 64, then 154), in order, once each, with the ECC and remap counters
and the recovery action it reports, until the repair resets the GPU."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from gpufleet.schema import gpu as cat
from gpufleet.schema.family import MetricDef
from gpufleet.simulate.cluster import Cluster
from gpufleet.simulate.config import (
    ClusterSpec,
    Confounders,
    FaultRates,
    Scenario,
    ScenarioError,
    load_scenario,
)
from gpufleet.simulate.faults import Episode, Kind, dbe_burst
from gpufleet.simulate.history import write_history
from gpufleet.simulate.timeline import build_timeline
from gpufleet.simulate.timeline_types import Timeline

START = 1_800_000_000.0
NODE, GPU = 3, 1
ONSET, REPAIR = 60.0, 3600.0


def hbm_scenario(xid: int | None = None, **rates: float) -> Scenario:
    episode = {"kind": "fail_stop", "cause": "hbm", "node": NODE, "gpu": GPU, "start": ONSET,
               "duration": REPAIR}  # fmt: skip
    if xid is not None:
        episode["xid"] = xid
    return Scenario(
        cluster=ClusterSpec(nodes=8),
        rates=FaultRates(fail_stop_per_1000_node_days=0.0, **rates),
        confounders=Confounders(checkpoints=False, evals=False),
        episodes=[episode],
    )


def hbm_error(timeline: Timeline) -> Episode:
    [episode] = [e for e in timeline.episodes if e.kind == Kind.FAIL_STOP]
    return episode


def run(
    scenario: Scenario, seed: int = 7, until: float = ONSET + 30, tick: float = 0.25
) -> Cluster:
    cluster = Cluster(scenario, seed, START, 2 * REPAIR)
    now = START
    while now < START + until:
        now += tick
        cluster.advance(now)
    return cluster


def counter(cluster: Cluster, metric: MetricDef) -> float:
    return float(cluster.counters[metric.name][NODE, GPU])


@pytest.mark.parametrize("seed", range(6))
def test_one_error_is_one_burst_in_nvidias_order(seed: int) -> None:
    cluster = run(hbm_scenario(), seed)
    episode = hbm_error(cluster.timeline)
    codes = [code for _, code in episode.details["xid_burst"]]
    offsets = [offset for offset, _ in episode.details["xid_burst"]]
    assert codes[0] == 48 and codes[1] in (94, 95) and codes[2] in (63, 64) and codes[3] == 154
    assert offsets == sorted(offsets) and offsets[0] == 0.0 and offsets[-1] <= 3.0
    assert episode.xid == 48
    record = cluster.xids[(NODE, GPU)]
    assert record.counts == dict.fromkeys(codes, 1)
    assert record.last == 154
    assert record.last_time == pytest.approx(START + ONSET + offsets[-1])
    # only that GPU
    assert set(cluster.xids) == {(NODE, GPU)}
    assert counter(cluster, cat.ECC_DBE_VOL) == counter(cluster, cat.ECC_DBE_AGG) == 1
    assert counter(cluster, cat.UNCORRECTABLE_REMAPPED_ROWS) == 1
    assert counter(cluster, cat.ROW_REMAP_PENDING) == 1
    assert counter(cluster, cat.ROW_REMAP_FAILURE) == (1 if codes[2] == 64 else 0)
    values = cluster.gpu_values(NODE, GPU)
    assert values[cat.RECOVERY_ACTION.name] == 1.0  # NVML's GPU_RESET
    others = [cluster.gpu_values(NODE, gpu)[cat.RECOVERY_ACTION.name] for gpu in range(8)]
    assert sum(others) == 1.0


def test_each_xid_reports_its_own_part_when_it_arrives() -> None:
    """Ticked finer than the gaps: the counters move with their XID, not before."""
    scenario = hbm_scenario(hbm_xid_gap_max_s=1.0)
    cluster = Cluster(scenario, 3, START, 2 * REPAIR)
    episode = hbm_error(cluster.timeline)
    arrivals = {code: START + ONSET + offset for offset, code in episode.details["xid_burst"]}
    seen: list[int] = []
    now = START + ONSET - 0.5
    cluster.advance(now)
    while now < START + ONSET + 5:
        now += 0.01
        cluster.advance(now)
        record = cluster.xids.get((NODE, GPU))
        codes = set(record.counts) if record else set()
        seen += [code for code in codes if code not in seen]
        dbe, remap = arrivals[48], min(arrivals.get(63, np.inf), arrivals.get(64, np.inf))
        assert counter(cluster, cat.ECC_DBE_VOL) == (1 if now > dbe else 0)
        assert counter(cluster, cat.ROW_REMAP_PENDING) == (1 if now > remap else 0)
        action = cluster.gpu_values(NODE, GPU)[cat.RECOVERY_ACTION.name]
        assert action == (1.0 if now > arrivals[154] else 0.0)
    assert seen == [code for _, code in episode.details["xid_burst"]]


def test_the_repair_resets_the_gpu() -> None:
    cluster = run(hbm_scenario(64), until=ONSET + REPAIR - 60, tick=30.0)
    assert cluster.gpu_values(NODE, GPU)[cat.RECOVERY_ACTION.name] == 1.0
    assert counter(cluster, cat.ROW_REMAP_FAILURE) == 1
    cluster = run(hbm_scenario(64), until=ONSET + REPAIR + 60, tick=30.0)
    assert cluster.gpu_values(NODE, GPU)[cat.RECOVERY_ACTION.name] == 0.0
    assert counter(cluster, cat.ROW_REMAP_FAILURE) == 0  # no spare rows: replaced
    assert counter(cluster, cat.ROW_REMAP_PENDING) == 0
    assert counter(cluster, cat.ECC_DBE_VOL) == 0  # volatile: cleared by the reset
    assert counter(cluster, cat.ECC_DBE_AGG) == 1
    assert counter(cluster, cat.UNCORRECTABLE_REMAPPED_ROWS) == 1
    assert (NODE, GPU) not in cluster.xids


@pytest.mark.parametrize(
    ("xid", "second", "third"), [(95, {95}, {63, 64}), (94, {94}, {63, 64}), (64, {94, 95}, {64}),
                                 (63, {94, 95}, {63})]
)  # fmt: skip
def test_a_scenario_naming_an_xid_of_the_burst_fixes_that_variant(
    xid: int, second: set[int], third: set[int]
) -> None:
    for seed in range(8):
        timeline = build_timeline(hbm_scenario(xid), seed, START, START + 2 * REPAIR)
        episode = hbm_error(timeline)
        codes = [code for _, code in episode.details["xid_burst"]]
        assert codes[1] in second and codes[2] in third, (seed, codes)


def test_a_scenario_naming_an_xid_no_hbm_error_reports_is_refused() -> None:
    with pytest.raises(ScenarioError, match=r"episodes\[0\]\.xid: XID 79 is not one of"):
        build_timeline(hbm_scenario(79), 1, START, START + REPAIR)


def test_the_shares_are_configured_and_checked(tmp_path: pytest.TempPathFactory) -> None:
    always = np.random.default_rng(1)
    bursts = [dbe_burst(always, 1.0, 1.0, 0.0) for _ in range(20)]
    assert {tuple(code for _, code in b) for b in bursts} == {(48, 94, 64, 154)}
    never = [dbe_burst(always, 0.0, 0.0, 0.0) for _ in range(20)]
    assert {tuple(code for _, code in b) for b in never} == {(48, 95, 63, 154)}
    assert {offset for b in never for offset, _ in b} == {0.0}
    path = tmp_path / "bad.yaml"  # type: ignore[operator]
    path.write_text("rates: {hbm_contained_share: 1.5}\n")
    with pytest.raises(ScenarioError, match=r"rates\.hbm_contained_share: 1\.5 is not a share"):
        load_scenario(str(path))


def test_an_ecc_degradations_uncorrectable_error_is_the_same_burst() -> None:
    scenario = Scenario(
        cluster=ClusterSpec(nodes=8),
        rates=FaultRates(fail_stop_per_1000_node_days=0.0),
        confounders=Confounders(checkpoints=False, evals=False),
        episodes=[{"kind": "ecc_degradation", "node": NODE, "gpu": GPU, "start": 0.0,
                   "duration": 1000.0}],
    )  # fmt: skip
    cluster = run(scenario, until=1100.0, tick=10.0)
    [episode] = [e for e in cluster.timeline.episodes if e.kind == "ecc_degradation"]
    codes = [code for _, code in episode.details["xid_burst"]]
    assert codes[2] == 63  # the remap that fails is the last one, at the end
    counts = cluster.xids[(NODE, GPU)].counts
    assert counts == {48: 1, codes[1]: 1, 63: 1, 154: 1, 64: 1}
    assert counter(cluster, cat.ECC_DBE_VOL) == 1
    assert counter(cluster, cat.ROW_REMAP_FAILURE) == 1
    assert cluster.gpu_values(NODE, GPU)[cat.RECOVERY_ACTION.name] == 1.0


def test_the_history_holds_the_burst_and_the_recovery_action(tmp_path: Path) -> None:
    """What the detection benchmark imports: the burst's XIDs and the recovery action of
    the failing GPU, reset to 0 by the repair."""
    scenario = hbm_scenario(64)
    end = START + 2 * REPAIR
    result = write_history(scenario, 7, 2 * REPAIR / 86400, tmp_path, end=end, shards=1)
    text = "".join(path.read_text() for path in result.files)
    begins = end - 2 * REPAIR

    def samples(name: str, **labels: str) -> list[tuple[float, float]]:
        found = []
        for line in text.splitlines():
            if not line.startswith(name + "{") or f'gpu="{GPU}"' not in line:
                continue
            if 'Hostname="node-003"' not in line:
                continue
            if any(f'{key}="{value}"' not in line for key, value in labels.items()):
                continue
            value, stamp = line.rsplit(" ", 2)[1:]
            found.append((float(stamp) - begins, float(value)))
        return found

    seen = {xid: samples(cat.XID_TOTAL.name, xid=xid) for xid in ("48", "94", "95", "64", "154")}
    assert len([xid for xid in ("94", "95") if seen[xid]]) == 1
    for xid, counts in seen.items():
        assert not counts or (counts[0][0] >= ONSET and {v for _, v in counts} == {1.0}), xid
    assert seen["48"] and seen["64"] and seen["154"]
    action = samples(cat.RECOVERY_ACTION.name)
    assert {v for t, v in action if t < ONSET} == {0.0}
    assert {v for t, v in action if ONSET + 30 <= t < ONSET + REPAIR} == {1.0}
    assert {v for t, v in action if t >= ONSET + REPAIR + 30} == {0.0}
