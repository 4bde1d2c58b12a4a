"""A shared cluster: several concurrent jobs on one pool of nodes, with spares.

Each job of a scenario's ``jobs`` section runs as its own lock-step job (its own
layout, reporting, fault timeline and seed) on *slots*; a slot is held by one
physical node at a time. When a node a fault excluded is repaired, it goes back
to the spare pool and the slot takes the node that has waited there longest
(possibly that same node): over days, nodes move between jobs. Until then the
slot is empty, and the nodes of its data-parallel replica (in the other pipeline
stages) wait with it: the job trains that replica short. Spare nodes idle
(agent up, GPUs healthy, no training) and draw no faults of their own.

The history names physical nodes: a node's hardware series (``up``, its GPUs,
error counters, XIDs) run through every job it served and its idle time, its
counters continuing where they were; its training series carry the job and
stage it served at the time.
"""

from __future__ import annotations

import hashlib
import time
from collections import deque
from dataclasses import dataclass, replace
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np

from gpufleet.simulate.cluster import Cluster
from gpufleet.simulate.config import Scenario, ScenarioError
from gpufleet.simulate.node_view import NodeView, Segment
from gpufleet.simulate.recorder import HistoryRun, Recorder, wants_rank_series
from gpufleet.simulate.series import (
    HistoryResult,
    SeriesWriter,
    touched_gpus,
    write_allocations,
    write_gpu_errors,
    write_gpu_state,
    write_ground_truth_data,
    write_node_health,
    write_shards,
    write_training,
    write_xids,
)

_OPEN = float("inf")


@dataclass(frozen=True, slots=True)
class Placement:
    """Physical ``node`` held ``slot`` of job ``job`` (an index) over [start, end)."""

    node: int
    job: int
    slot: int
    start: float
    end: float


def job_scenario(scenario: Scenario, index: int) -> Scenario:
    """The single-job scenario of one job of a shared cluster (its episodes only)."""
    spec = scenario.jobs[index]
    episodes = [
        {key: value for key, value in episode.items() if key != "job"}
        for episode in scenario.episodes
        if episode.get("job") == spec.job
    ]
    return replace(
        scenario,
        name=f"{scenario.name}/{spec.job}",
        cluster=spec,
        episodes=episodes,
        jobs=[],
        spare_nodes=0,
    )


def job_seed(seed: int, index: int) -> int:
    """Each job's own seed, derived from the scenario's: jobs draw independent faults."""
    return int(np.random.SeedSequence([seed, 97, index]).generate_state(1)[0])


class SharedCluster:
    """The jobs of a shared cluster, simulated side by side, and who held which node when."""

    def __init__(self, scenario: Scenario, seed: int, start: float, horizon_s: float) -> None:
        if not scenario.jobs:
            raise ScenarioError(f"scenario {scenario.name}: a shared cluster needs jobs")
        gpus = {spec.gpus_per_node for spec in scenario.jobs}
        if len(gpus) != 1:
            raise ScenarioError(f"scenario {scenario.name}: jobs differ in gpus_per_node {gpus}")
        self.scenario = scenario
        self.seed = seed
        self.start = start
        self.end = start + horizon_s
        self.gpus = gpus.pop()
        self.jobs = [
            Cluster(job_scenario(scenario, index), job_seed(seed, index), start, horizon_s)
            for index in range(len(scenario.jobs))
        ]
        self.nodes = sum(job.nodes for job in self.jobs) + scenario.spare_nodes
        width = max(3, len(str(self.nodes - 1)))
        self.node_names = [f"node-{index:0{width}d}" for index in range(self.nodes)]
        self.placements = self._place()
        self._by_slot: dict[tuple[int, int], list[Placement]] = {}
        for placement in self.placements:
            self._by_slot.setdefault((placement.job, placement.slot), []).append(placement)

    def _place(self) -> list[Placement]:
        """Slots to nodes: swapped through the spare pool when an excluded node is repaired."""
        current: dict[tuple[int, int], tuple[int, float]] = {}
        node = 0
        for index, job in enumerate(self.jobs):
            for slot in range(job.nodes):
                current[(index, slot)] = (node, self.start)
                node += 1
        pool = deque(range(node, self.nodes))
        repairs = sorted(
            (exclusion.end, index, exclusion.node)
            for index, job in enumerate(self.jobs)
            for exclusion in job.timeline.exclusions
            if exclusion.end < self.end
        )
        placements = []
        for when, index, slot in repairs:
            held, since = current[(index, slot)]
            placements.append(Placement(held, index, slot, since, when))
            pool.append(held)
            current[(index, slot)] = (pool.popleft(), when)
        placements += [
            Placement(held, index, slot, since, _OPEN)
            for (index, slot), (held, since) in current.items()
        ]
        return sorted(placements, key=lambda p: (p.node, p.start))

    def placement_at(self, job: int, slot: int, when: float) -> Placement:
        """The placement of ``slot`` of ``job`` at ``when``."""
        held = self._by_slot[(job, slot)]
        for placement in held:
            if placement.start <= when < placement.end:
                return placement
        return held[0] if when < held[0].start else held[-1]

    def node_of(self, job: int, slot: int, when: float) -> int:
        """The physical node holding ``slot`` of ``job`` at ``when``."""
        return self.placement_at(job, slot, when).node

    def uuid(self, node: int, gpu: int) -> str:
        """A physical GPU's UUID: the same whichever job the node serves."""
        digest = hashlib.sha256(f"shared:{self.seed}:{node}:{gpu}".encode()).hexdigest()
        return f"GPU-{digest[:8]}-{digest[8:12]}-{digest[12:16]}-{digest[16:20]}-{digest[20:32]}"

    def ground_truth(self, start: float, end: float, step: float) -> dict[str, Any]:
        """The ground truth of every job, in physical node names, each record with its job."""
        names = self.node_names
        episodes: list[dict[str, Any]] = []
        # the fail-stop that caused each exclusion: (job, slot, start) -> its record
        causes: dict[tuple[int, int | None, float], dict[str, Any]] = {}
        for index, job in enumerate(self.jobs):
            for episode in job.timeline.episodes:
                record = episode.record(job.node_names)
                record["job"] = job.spec.job
                record["slot"] = episode.node
                if episode.kind == "precursor" and episode.node is not None:
                    # A precursor is the failing GPU's: its signal (counters on the slot)
                    # leads up to the fail-stop of the node that holds the slot then, from
                    # when that node took the slot (a node swapped in after a repair
                    # carries the rest of it, not the node that left).
                    held = self.placement_at(index, episode.node, episode.end)
                    record["node"] = names[held.node]
                    record["start"] = max(episode.start, held.start)
                    # The nodes that held the slot earlier in it showed the signal too
                    # while they did: a record of their own each, context for their
                    # pages, not a precursor of any failure to be found.
                    for earlier in self._by_slot[(index, episode.node)]:
                        if earlier.start < held.start and earlier.end > episode.start:
                            episodes.append(
                                {
                                    **record,
                                    "node": names[earlier.node],
                                    "start": max(episode.start, earlier.start),
                                    "end": min(episode.end, earlier.end),
                                    "details": {**record["details"], "left_slot": True},
                                }
                            )
                elif episode.node is not None:
                    record["node"] = names[self.node_of(index, episode.node, episode.start)]
                episodes.append(record)
                if episode.kind == "fail_stop":
                    causes[(index, episode.node, episode.start)] = record
        episodes.sort(key=lambda e: (e["start"], e["kind"], e["job"]))
        for number, record in enumerate(episodes):
            record["id"] = number
        jobs = []
        for job in self.jobs:
            spec, layout = job.spec, job.layout
            jobs.append(
                {
                    "job": spec.job,
                    "nodes": job.nodes,
                    "layout": str(layout),
                    "nodes_per_stage": layout.dp * layout.tp / job.gpus,
                    "report_ranks": spec.report_ranks,
                    "reporting_ranks_per_node": sorted({int(n) for n in job.reporters}),
                    "step_only": spec.step_only,
                    "comm_overlap": spec.comm_overlap,
                    "step_seconds": spec.step_seconds,
                }
            )
        return {
            "start": start,
            "end": end,
            "step_seconds": step,
            "scenario": self.scenario.name,
            "seed": self.seed,
            "cluster": {
                "nodes": self.nodes,
                "gpus_per_node": self.gpus,
                "job": self.jobs[0].spec.job,
                "jobs": jobs,
                "spare_nodes": self.scenario.spare_nodes,
                "node_names": names,
            },
            "placements": [
                {
                    "node": names[p.node],
                    "job": self.jobs[p.job].spec.job,
                    "slot": p.slot,
                    "pp_stage": int(self.jobs[p.job].stage[p.slot]),
                    "start": p.start,
                    "end": min(p.end, end),
                }
                for p in self.placements
            ],
            "episodes": episodes,
            "exclusions": [
                {
                    "node": names[self.node_of(index, e.node, e.start)],
                    "job": job.spec.job,
                    "start": e.start,
                    "end": e.end,
                    "reason": e.reason,
                    "source": e.source,
                    "episode": causes[(index, e.node, e.start)]["id"]
                    if (index, e.node, e.start) in causes else None,
                }
                for index, job in enumerate(self.jobs)
                for e in job.timeline.exclusions
            ],
            "attempts": [
                {"job": job.spec.job, "number": a.number, "trigger": a.trigger, "start": a.start,
                 "first_step": a.first_step, "end": a.end, "outcome": a.outcome, "cause": a.cause}
                for job in self.jobs
                for a in job.timeline.attempts
            ],
        }  # fmt: skip


def _segments(
    shared: SharedCluster, recorders: list[Recorder | None], node: int, times: np.ndarray
) -> list[Segment]:
    found = []
    for placement in shared.placements:
        recorder = recorders[placement.job]
        if placement.node != node or recorder is None:
            continue
        mask = (times >= placement.start) & (times < placement.end)
        ticks = np.flatnonzero(mask)
        if not len(ticks):
            continue
        job = shared.jobs[placement.job]
        found.append(
            Segment(
                recorder,
                recorder.nodes.index(placement.slot),
                mask,
                int(ticks[0]),
                int(ticks[-1]),
                job.spec.job,
                int(job.stage[placement.slot]),
                placement.slot,
            )
        )
    return sorted(found, key=lambda segment: segment.first)


def _shared_shard(nodes: list[int], path: Path, *, run: HistoryRun) -> int:
    shared = SharedCluster(run.scenario, run.seed, run.start, run.end - run.start)
    ticks = run.ticks
    mine = set(nodes)
    recorders: list[Recorder | None] = []
    for index, job in enumerate(shared.jobs):
        slots = sorted({p.slot for p in shared.placements if p.job == index and p.node in mine})
        recorders.append(
            Recorder(job, slots, ticks, rank_series=wants_rank_series(job.spec, run.rank_series))
            if slots
            else None
        )
    for tick in range(ticks):
        when = run.at(tick)
        for job, recorder in zip(shared.jobs, recorders, strict=True):
            job.advance(when)
            if recorder is not None:
                recorder.record()
    times = run.start + run.step * np.arange(1, ticks + 1)
    views = [
        NodeView(
            n,
            shared.node_names[n],
            [shared.uuid(n, gpu) for gpu in range(shared.gpus)],
            _segments(shared, recorders, n, times),
            ticks,
            rebase_counters=True,
        )
        for n in nodes
    ]
    specs = [job.spec for job in shared.jobs]
    with open(path, "w", encoding="utf-8", buffering=1 << 20) as handle:
        out = SeriesWriter(handle, times)
        write_node_health(out, views)
        write_allocations(out, specs, views)
        write_gpu_state(out, views)
        write_training(out, specs, views)
        touched = touched_gpus(views)
        write_gpu_errors(out, touched)
        write_xids(out, views, touched)
        out.close()
    return out.samples


def write_shared_history(
    scenario: Scenario,
    seed: int,
    start: float,
    end: float,
    out: Path,
    *,
    step: float = 30.0,
    shards: int = 2,
    rank_series: str = "auto",
) -> HistoryResult:
    """The history of a shared cluster (``write_history`` calls it for a scenario with jobs)."""
    started = time.monotonic()
    shared = SharedCluster(scenario, seed, start, end - start)
    run = HistoryRun(scenario, seed, start, end, step, rank_series)
    worker = partial(_shared_shard, run=run)
    paths, samples = write_shards(out, shared.nodes, shards, worker)
    truth = write_ground_truth_data(shared.ground_truth(start, end, step), out)
    return HistoryResult(paths, truth, samples, time.monotonic() - started, start, end)
