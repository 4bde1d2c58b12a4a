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
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np

from gpufleet.schema import agent as agent_schema
from gpufleet.schema import gpu as cat
from gpufleet.schema import training as ts
from gpufleet.schema.external import UP
from gpufleet.schema.gpu import GPU_LABELS
from gpufleet.simulate.cluster import GPU_COUNTERS, MAX_SM_CLOCK_MHZ, Cluster
from gpufleet.simulate.config import Scenario, ScenarioError
from gpufleet.simulate.history import (
    _GPU_METRICS,
    _NODE_CHECKPOINT,
    _NODE_TRAINING,
    _RANK_TRAINING,
    _THROTTLE_FLAGS,
    JOB_LABEL,
    HistoryResult,
    HistoryRun,
    _Recorder,
    _Writer,
    allocation_labels,
    wants_rank_series,
    write_ground_truth_data,
    write_shards,
)
from gpufleet.simulate.serve import MODEL, PCI_BUS_IDS

_OPEN = float("inf")
# Cleared by a repair (a GPU reset): a node leaves its slot only when it is repaired.
_RESET_BY_REPAIR = frozenset(
    metric.name for metric in (cat.ECC_SBE_VOL, cat.ECC_DBE_VOL, cat.ROW_REMAP_PENDING)
)


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


@dataclass(slots=True)
class _Segment:
    """One placement seen from the history: the ticks a node spent in one job's slot."""

    recorder: _Recorder
    column: int
    mask: np.ndarray  # ticks of the placement
    first: int
    last: int
    job: str
    stage: int
    slot: int


def _segments(
    shared: SharedCluster, recorders: list[_Recorder | None], node: int, times: np.ndarray
) -> list[_Segment]:
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
            _Segment(
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


class _NodeView:
    """A physical node's series over the whole history, assembled from its placements."""

    def __init__(self, shared: SharedCluster, node: int, segments: list[_Segment], ticks: int):
        self.shared = shared
        self.node = node
        self.name = shared.node_names[node]
        self.segments = segments
        self.idle = np.ones(ticks, dtype=bool)
        for segment in segments:
            self.idle &= ~segment.mask
        self.ticks = ticks
        self.labels = [("instance", self.name), ("job", JOB_LABEL)]

    def hardware(self, pick: Any, idle_value: float) -> np.ndarray:
        values = np.full(self.ticks, np.nan)
        for segment in self.segments:
            values[segment.mask] = pick(segment)[segment.mask]
        values[self.idle] = idle_value
        return values

    def grouped(self, key: Any, pick: Any) -> Iterator[tuple[Any, np.ndarray]]:
        """Training series, one per distinct ``key(segment)`` (job and stage, ...)."""
        groups: dict[Any, np.ndarray] = {}
        for segment in self.segments:
            values = groups.setdefault(key(segment), np.full(self.ticks, np.nan))
            values[segment.mask] = pick(segment)[segment.mask]
        yield from groups.items()

    def gpu_labels(self, gpu: int) -> list[tuple[str, str]]:
        values = (
            str(gpu),
            self.shared.uuid(self.node, gpu),
            f"00000000:{PCI_BUS_IDS[gpu % len(PCI_BUS_IDS)]}:00.0",
            f"nvidia{gpu}",
            MODEL,
            self.name,
        )
        return [*zip(GPU_LABELS, values, strict=True), *self.labels]

    def touched(self, gpu: int) -> bool:
        return any((s.slot, gpu) in s.recorder.touched for s in self.segments)

    def gpu_series(
        self, gpu: int, pick: Any, idle_value: float, counter: bool, reset: bool = False
    ) -> np.ndarray:
        """A GPU's series across placements. A counter continues from where it was (the
        slot's changes are added to the node's own value), or from 0 if ``reset``: the
        repair that ended the placement cleared it."""
        values = np.full(self.ticks, np.nan)
        index = np.arange(self.ticks)
        base = idle_value
        cursor = 0
        for segment in self.segments:
            values[self.idle & (index >= cursor) & (index < segment.first)] = base
            cursor = segment.last + 1
            up = segment.recorder.up[:, segment.column] == 1
            slots = segment.recorder.touched
            raw = (
                pick(segment, slots.index((segment.slot, gpu)))
                if (segment.slot, gpu) in slots
                else np.where(up, 0.0, np.nan)
            )
            part = raw[segment.mask]
            present = part[~np.isnan(part)]
            if counter and len(present):
                values[segment.mask] = base + part - present[0]
                base = 0.0 if reset else base + float(present[-1] - present[0])
            elif not counter:
                values[segment.mask] = part
        values[self.idle & (index >= cursor)] = base
        return values


def _shared_shard(nodes: list[int], path: Path, *, run: HistoryRun) -> int:
    shared = SharedCluster(run.scenario, run.seed, run.start, run.end - run.start)
    ticks = run.ticks
    mine = set(nodes)
    recorders: list[_Recorder | None] = []
    for index, job in enumerate(shared.jobs):
        slots = sorted({p.slot for p in shared.placements if p.job == index and p.node in mine})
        recorders.append(
            _Recorder(job, slots, ticks, rank_series=wants_rank_series(job.spec, run.rank_series))
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
    views = [_NodeView(shared, n, _segments(shared, recorders, n, times), ticks) for n in nodes]
    with open(path, "w", encoding="utf-8", buffering=1 << 20) as handle:
        out = _Writer(handle, times)
        _write_views(out, shared, views)
        out.close()
    return out.samples


def _write_views(out: _Writer, shared: SharedCluster, views: list[_NodeView]) -> None:
    _write_hardware(out, shared, views)
    _write_training(out, shared, views)
    _write_gpu_errors(out, shared, views)


def _write_hardware(out: _Writer, shared: SharedCluster, views: list[_NodeView]) -> None:
    """Scrape health, GPUs up and seen: from the job a node served, or idle and healthy."""
    gpus = shared.gpus
    out.declare(UP)
    ups = {view.node: view.hardware(lambda s: s.recorder.up[:, s.column], 1.0) for view in views}
    for view in views:
        out.present(UP.name, view.labels, ups[view.node])
    out.declare(cat.GPU_UP)
    for view in views:
        for gpu in range(gpus):
            values = view.hardware(lambda s, g=gpu: s.recorder.gpu_up[:, s.column, g], 1.0)
            out.present(cat.GPU_UP.name, view.gpu_labels(gpu), values)
    _write_allocations(out, shared, views)
    out.declare(cat.SM_CLOCK)
    for view in views:
        for gpu in range(gpus):
            values = view.hardware(
                lambda s, g=gpu: s.recorder.sm_clock[:, s.column, g], MAX_SM_CLOCK_MHZ
            )
            out.present(cat.SM_CLOCK.name, view.gpu_labels(gpu), values)
    out.declare(cat.GPUS_SEEN)
    for view in views:
        values = view.hardware(lambda s: s.recorder.seen[:, s.column], float(gpus))
        out.present(cat.GPUS_SEEN.name, [(cat.NODE_LABEL, view.name), *view.labels], values)
    out.declare(cat.GPUS_EXPECTED)
    for view in views:
        up = ups[view.node]
        values = np.where(np.isnan(up) | (up == 0), np.nan, float(gpus))
        out.present(cat.GPUS_EXPECTED.name, [(cat.NODE_LABEL, view.name), *view.labels], values)
    out.declare(agent_schema.COLLECTOR_UP)
    for view in views:
        values = view.hardware(lambda s: s.recorder.collector_up[:, s.column], 1.0)
        labels = [("collector", "gpu"), *view.labels]
        out.present(agent_schema.COLLECTOR_UP.name, labels, values)
    out.declare(agent_schema.AGENT_START_TIME)
    for view in views:
        values = view.hardware(lambda s: s.recorder.agent_started[:, s.column], np.nan)
        out.present(agent_schema.AGENT_START_TIME.name, view.labels, values)


def _write_allocations(out: _Writer, shared: SharedCluster, views: list[_NodeView]) -> None:
    """The pods of jobs with a namespace hold every GPU of a node while the job is placed
    there and the node answers (a pod per job and node, named after the node)."""
    specs = {job.spec.job: job.spec for job in shared.jobs}
    if not any(spec.namespace for spec in specs.values()):
        return
    out.declare(cat.ALLOCATION_INFO)
    for view in views:
        for segment in view.segments:
            spec = specs[segment.job]
            if not spec.namespace:
                continue
            up = segment.recorder.up[:, segment.column] == 1
            held = np.where(segment.mask & up, 1.0, np.nan)
            for gpu in range(shared.gpus):
                labels = allocation_labels(spec, view.node, view.gpu_labels(gpu))
                out.present(cat.ALLOCATION_INFO.name, labels, held)


def _node_attr(attr: str) -> Callable[[_Segment], np.ndarray]:
    def pick(segment: _Segment) -> np.ndarray:
        return np.asarray(segment.recorder.node_series[attr][:, segment.column])

    return pick


def _rank_attr(attr: str, gpu: int) -> Callable[[_Segment], np.ndarray]:
    def pick(segment: _Segment) -> np.ndarray:
        return np.asarray(segment.recorder.rank_series[attr][:, segment.column, gpu])

    return pick


def _stage_key(segment: _Segment) -> tuple[str, int]:
    return segment.job, segment.stage


def _rank_key(segment: _Segment) -> tuple[str, int, int]:
    return segment.job, segment.stage, segment.slot


def _job_key(segment: _Segment) -> str:
    return segment.job


def _write_training(out: _Writer, shared: SharedCluster, views: list[_NodeView]) -> None:
    """Training and checkpoint series, labelled with the job and stage served at the time."""
    gpus = shared.gpus
    specs = {job.spec.job: job.spec for job in shared.jobs}
    for metric, attr in _NODE_TRAINING:
        out.declare(metric)
        for view in views:
            for (job, stage), values in view.grouped(_stage_key, _node_attr(attr)):
                labels = [("training_job", job), ("node", view.name), ("pp_stage", str(stage))]
                pod = specs[job].pod_labels(view.node)
                out.present(metric.name, [*labels, *pod, *view.labels], values)
    ranked = any(s.recorder.rank_series for view in views for s in view.segments)
    for metric, attr in _RANK_TRAINING if ranked else ():
        out.declare(metric)
        for view in views:
            with_ranks = [s for s in view.segments if s.recorder.rank_series]
            holder = _NodeView(shared, view.node, with_ranks, view.ticks)
            for gpu in range(gpus):
                for (job, stage, slot), values in holder.grouped(_rank_key, _rank_attr(attr, gpu)):
                    labels = [
                        ("training_job", job),
                        ("node", view.name),
                        ("pp_stage", str(stage)),
                        ("rank", str(slot * gpus + gpu)),
                        *specs[job].pod_labels(view.node),
                    ]
                    out.present(metric.name, [*labels, *view.labels], values)
    out.declare(ts.CHECKPOINT_OPERATIONS)
    for view in views:
        for job, values in view.grouped(_job_key, lambda s: s.recorder.ckpt_ok[:, s.column]):
            labels = [("training_job", job), ("node", view.name), ("op", "save"), ("outcome", "ok")]
            pod = specs[job].pod_labels(view.node)
            out.present(ts.CHECKPOINT_OPERATIONS.name, [*labels, *pod, *view.labels], values)
    for metric, attr in _NODE_CHECKPOINT:
        out.declare(metric)
        for view in views:
            for job, values in view.grouped(_job_key, _node_attr(attr)):
                labels = [("training_job", job), ("node", view.name), ("op", "save")]
                pod = specs[job].pod_labels(view.node)
                out.present(metric.name, [*labels, *pod, *view.labels], values)


def _counter_of(name: str) -> Callable[[_Segment, int], np.ndarray]:
    def pick(segment: _Segment, slot: int) -> np.ndarray:
        return np.asarray(segment.recorder.gpu_counters[name][:, slot])

    return pick


def _write_gpu_errors(out: _Writer, shared: SharedCluster, views: list[_NodeView]) -> None:
    """Error counters, throttle flags and XIDs of every physical GPU a fault ever touched."""
    touched = [(view, gpu) for view in views for gpu in range(shared.gpus) if view.touched(gpu)]
    for name in GPU_COUNTERS:
        out.declare(_GPU_METRICS[name])
        for view, gpu in touched:
            values = view.gpu_series(
                gpu, _counter_of(name), 0.0, counter=True, reset=name in _RESET_BY_REPAIR
            )
            out.present(name, view.gpu_labels(gpu), values)
    out.declare(cat.THROTTLE_ACTIVE)
    for view, gpu in touched:
        bits = view.gpu_series(gpu, lambda s, i: s.recorder.throttle[:, i], 0.0, counter=False)
        for reason, bit in _THROTTLE_FLAGS:
            flag = np.where(
                np.isnan(bits), np.nan, (np.nan_to_num(bits).astype(np.int64) & bit) > 0
            )
            labels = [*view.gpu_labels(gpu), ("reason", reason)]
            out.present(cat.THROTTLE_ACTIVE.name, labels, flag.astype(float))
    out.declare(cat.XID_LAST)
    for view, gpu in touched:
        values = view.gpu_series(gpu, lambda s, i: s.recorder.xid_last[:, i], 0.0, counter=False)
        out.present(cat.XID_LAST.name, view.gpu_labels(gpu), values)
    out.declare(cat.XID_TOTAL)
    for view in views:
        counts: dict[tuple[int, int], np.ndarray] = {}
        for segment in view.segments:
            for (slot, gpu, xid), values in segment.recorder.xid_counts.items():
                if slot != segment.slot:
                    continue
                merged = counts.setdefault((gpu, xid), np.full(view.ticks, np.nan))
                merged[segment.mask] = values[segment.mask]
        for (gpu, xid), values in sorted(counts.items()):
            labels = [*view.gpu_labels(gpu), ("xid", str(xid))]
            out.present(cat.XID_TOTAL.name, labels, values)


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
