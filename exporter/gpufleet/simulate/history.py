"""Multi-day history of a simulated cluster, as OpenMetrics for promtool, with ground truth.

``promtool tsdb create-blocks-from openmetrics FILE DIR`` turns each written
file into TSDB blocks; the ground truth lists every injected episode (node,
GPU, kind, cause, start, end, and the alerts that should fire).

What is written: the series the rules read, with the labels a live Prometheus
would store (``job="gpufleet-agent"``, ``instance`` = node): ``up``, per-GPU
``gpufleet_gpu_up``, the node's GPU counts and collector health, the training
and checkpoint counters, and the error counters, XIDs and throttle flags of
every GPU the timeline ever touches. Error counters of GPUs that stay healthy
for the whole history would be constant zeros; they are left out to keep the
history small, which changes no rule result: every hardware rule asks for a
counter that *rose* or a flag that is *set*. The per-rank compute and step
counters (``gpufleet_training_rank_*``, two series per reporting rank) are
written where the rules compare ranks rather than nodes: by default
(``rank_series="auto"``) for jobs with at most 4 nodes per pipeline stage.

Nodes are split into shards written by separate processes (one file each);
every process simulates the whole cluster, which is cheap, and writes only
its own nodes.
"""

from __future__ import annotations

import csv
import json
import multiprocessing
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any, TextIO

import numpy as np

from gpufleet.exposition import OpenMetricsWriter
from gpufleet.schema import agent as agent_schema
from gpufleet.schema import gpu as cat
from gpufleet.schema import training as ts
from gpufleet.schema.external import UP
from gpufleet.schema.family import MetricDef
from gpufleet.schema.gpu import GPU_LABELS
from gpufleet.simulate import layout as sim_layout
from gpufleet.simulate.cluster import (
    GPU_COUNTERS,
    HW_POWER_BRAKE,
    HW_SLOWDOWN,
    HW_THERMAL,
    Cluster,
    sm_clock_mhz,
)
from gpufleet.simulate.config import ClusterSpec, Scenario
from gpufleet.simulate.faults import CAUSES_BY_NAME, Effect, Kind
from gpufleet.simulate.serve import MODEL, PCI_BUS_IDS

JOB_LABEL = "gpufleet-agent"
# the labels of a GPU series that gpufleet_gpu_allocation_info keeps (its identity)
_ALLOCATION_GPU_LABELS = frozenset({cat.NODE_LABEL, "gpu", "UUID", "instance", "job"})
_THROTTLE_FLAGS = (
    ("hw_slowdown", HW_SLOWDOWN),
    ("hw_thermal_slowdown", HW_THERMAL),
    ("hw_power_brake_slowdown", HW_POWER_BRAKE),
)
_NODE_TRAINING: tuple[tuple[MetricDef, str], ...] = (
    # (family, NodeTraining attribute)
    (ts.STEPS, "steps"),
    (ts.STEP_SECONDS, "step_seconds"),
    (ts.COMPUTE_SECONDS, "compute"),
    (ts.DATA_WAIT_SECONDS, "data_wait"),
    (ts.COLLECTIVE_WAIT_SECONDS, "comm_wait"),
    (ts.TOKENS, "tokens"),
    (ts.SLOWEST_RANK_COMPUTE_SECONDS, "slowest_compute"),
    (ts.SLOWEST_RANK_STEPS, "slowest_steps"),
    (ts.SPLIT_STEPS, "split_steps"),
    (ts.LAST_STEP_TIMESTAMP, "last_step_time"),
    (ts.RANKS, "ranks"),
)
# Per-rank counters (``rank`` label), for rank-level peer comparison in small stages.
_RANK_TRAINING: tuple[tuple[MetricDef, str], ...] = (
    (ts.RANK_COMPUTE_SECONDS, "rank_compute"),
    (ts.RANK_STEPS, "rank_steps"),
)
# ``rank_series="auto"`` writes them for jobs whose stages have at most this many nodes:
# where the node-level comparison runs out of peers (they add 2 series per reporting rank).
RANK_SERIES_MAX_NODES_PER_STAGE = 4
RANK_SERIES = ("auto", "all", "none")
# Per-GPU gauges written with ``gpu_gauges`` (what the node dashboard draws). Every
# GPU's SM clock is written always: the subtle-straggler rule reads it.
GPU_GAUGES = tuple(
    metric.name
    for metric in (
        cat.GPU_UTIL,
        cat.SM_ACTIVE,
        cat.PIPE_TENSOR_ACTIVE,
        cat.GPU_TEMP,
        cat.MEMORY_TEMP,
        cat.POWER_USAGE,
        cat.MEM_CLOCK,
    )
)
_NODE_CHECKPOINT: tuple[tuple[MetricDef, str], ...] = (
    (ts.CHECKPOINT_QUEUE_WAIT_SECONDS, "ckpt_queue"),
    (ts.CHECKPOINT_SERVICE_SECONDS, "ckpt_service"),
    (ts.CHECKPOINT_BYTES, "ckpt_bytes"),
    (ts.CHECKPOINT_IN_FLIGHT, "ckpt_in_flight"),
)
_GPU_METRICS = {metric.name: metric for metric in cat.GPU_FAMILIES}


@dataclass(frozen=True, slots=True)
class HistoryResult:
    files: list[Path]
    ground_truth: Path
    samples: int
    seconds: float
    start: float
    end: float


@dataclass(frozen=True, slots=True)
class HistoryRun:
    """What every shard of one history is written from: the scenario and its seed, the
    span and the sample step, and which jobs' per-rank series (``rank_series`` mode)."""

    scenario: Scenario
    seed: int
    start: float
    end: float
    step: float
    rank_series: str

    @property
    def ticks(self) -> int:
        """Samples per series: one a step after ``start``, up to ``end``."""
        return int((self.end - self.start) // self.step)

    def at(self, tick: int) -> float:
        """The time of sample ``tick`` (from 0)."""
        return self.start + (tick + 1) * self.step


def wants_rank_series(spec: ClusterSpec, mode: str) -> bool:
    """Whether a job's per-rank series are written under ``rank_series=mode``."""
    if mode not in RANK_SERIES:
        raise ValueError(f"rank_series {mode!r} is not one of {RANK_SERIES}")
    if mode != "auto":
        return mode == "all"
    layout = spec.resolved_layout()
    return layout.dp * layout.tp <= RANK_SERIES_MAX_NODES_PER_STAGE * spec.gpus_per_node


def touched_gpus(cluster: Cluster) -> list[tuple[int, int]]:
    """GPUs whose error counters, XIDs, recovery action or throttle flags ever move in
    this timeline."""
    touched: set[tuple[int, int]] = set()
    for episode in cluster.timeline.episodes:
        if episode.node is None:
            continue
        if (
            episode.kind
            in (
                Kind.FAIL_STOP,
                Kind.PRECURSOR,
                Kind.XID_STORM,
                Kind.ECC_DEGRADATION,
                Kind.NVLINK_FLAPPING,
            )
            and episode.gpu is not None
        ):
            touched.add((episode.node, episode.gpu))
        if episode.cause and CAUSES_BY_NAME[episode.cause].effect == Effect.POWER_BRAKE:
            touched.update((episode.node, gpu) for gpu in range(cluster.gpus))
    return sorted(touched)  # fmt: skip


class _Recorder:
    """Per-tick values of the written series, for the nodes of one shard."""

    def __init__(
        self,
        cluster: Cluster,
        nodes: list[int],
        ticks: int,
        every_gpu: bool = False,
        gpu_gauges: bool = False,
        *,
        rank_series: bool = False,
    ) -> None:
        self.cluster = cluster
        self.nodes = nodes
        self.gpus = cluster.gpus
        self.times = np.zeros(ticks)
        count = len(nodes)
        self.up = np.full((ticks, count), np.nan)
        self.gpu_up = np.full((ticks, count, cluster.gpus), np.nan)
        self.sm_clock = np.full((ticks, count, cluster.gpus), np.nan)
        self.gauges = {
            name: np.full((ticks, count, cluster.gpus), np.nan)
            for name in (GPU_GAUGES if gpu_gauges else ())
        }
        self.seen = np.full((ticks, count), np.nan)
        self.collector_up = np.full((ticks, count), np.nan)
        self.agent_started = np.full((ticks, count), np.nan)
        self.node_series = {
            attr: np.full((ticks, count), np.nan) for _, attr in _NODE_TRAINING + _NODE_CHECKPOINT
        }
        self.ckpt_ok = np.full((ticks, count), np.nan)
        self.rank_series = {
            attr: np.full((ticks, count, cluster.gpus), np.nan)
            for _, attr in (_RANK_TRAINING if rank_series else ())
        }
        mine = self.mine = set(nodes)
        touched_pairs = (
            [(node, gpu) for node in nodes for gpu in range(cluster.gpus)]
            if every_gpu
            else touched_gpus(cluster)
        )
        self.touched = sorted(pair for pair in touched_pairs if pair[0] in mine)
        touched = len(self.touched)
        self.gpu_counters = {name: np.full((ticks, touched), np.nan) for name in GPU_COUNTERS}
        self.throttle = np.full((ticks, touched), np.nan)
        self.xid_last = np.full((ticks, touched), np.nan)
        self.recovery_action = np.full((ticks, touched), np.nan)
        self.xid_counts: dict[tuple[int, int, int], np.ndarray] = {}
        # the job layout panels' data (simulate/layout.py), with parallel_layout on only
        self.layout = cluster.spec.parallel_layout
        shape = (ticks, count, cluster.gpus) if self.layout else (0, count, cluster.gpus)
        self.nvlink = np.full(shape, np.nan)
        self.training_now = np.full((ticks if self.layout else 0, count), np.nan)
        self.tick = 0

    def record(self) -> None:
        cluster = self.cluster
        tick = self.tick
        self.times[tick] = cluster.now
        nodes = self.nodes
        alive = ~cluster.node_down[nodes]
        self.up[tick] = alive.astype(float)
        hung = cluster.nvml_hung[nodes]
        gpu_up = (~cluster.gpu_lost[nodes] & ~hung[:, None]).astype(float)
        gpu_up[~alive] = np.nan
        self.gpu_up[tick] = gpu_up
        self.sm_clock[tick] = np.where(gpu_up == 1, sm_clock_mhz(cluster.slowdown[nodes]), np.nan)
        if self.gauges:
            for column, node in enumerate(nodes):
                for gpu in np.flatnonzero(gpu_up[column] == 1).tolist():
                    values = cluster.gpu_values(node, gpu)
                    for name, array in self.gauges.items():
                        array[tick, column, gpu] = values[name]
        self.seen[tick] = np.where(alive, np.nansum(gpu_up, axis=1), np.nan)
        self.collector_up[tick] = np.where(alive, (~hung).astype(float), np.nan)
        self.agent_started[tick] = np.where(alive, cluster.agent_started[nodes], np.nan)
        training = cluster.training
        visible = np.array([cluster.training_visible(n) for n in nodes]) & alive
        for _, attr in _NODE_TRAINING + _NODE_CHECKPOINT:
            values = getattr(training, attr)[nodes]
            self.node_series[attr][tick] = np.where(visible, values, np.nan)
        self.ckpt_ok[tick] = np.where(visible, training.ckpt_ok[nodes], np.nan)
        if self.rank_series:
            # only ranks that report, on nodes whose agent holds the job
            shown = visible[:, None] & cluster.report_mask[nodes]
            for attr, array in self.rank_series.items():
                array[tick] = np.where(shown, getattr(training, attr)[nodes], np.nan)
        for slot, (node, gpu) in enumerate(self.touched):
            if cluster.node_down[node] or cluster.gpu_lost[node, gpu] or cluster.nvml_hung[node]:
                continue
            for name in GPU_COUNTERS:
                self.gpu_counters[name][tick, slot] = cluster.counters[name][node, gpu]
            self.throttle[tick, slot] = cluster.throttle[node, gpu]
            record = cluster.xids.get((node, gpu))
            self.xid_last[tick, slot] = record.last if record else 0.0
            self.recovery_action[tick, slot] = cluster.recovery_action[node, gpu]
        if self.layout:
            self._record_layout(tick, gpu_up, alive)
        for (node, gpu), record in cluster.xids.items():
            if node not in self.mine or cluster.node_down[node]:
                continue
            for xid, count in record.counts.items():
                series = self.xid_counts.get((node, gpu, xid))
                if series is None:
                    series = self.xid_counts[(node, gpu, xid)] = np.full(len(self.times), np.nan)
                series[tick] = count
        self.tick += 1

    def _record_layout(self, tick: int, gpu_up: np.ndarray, alive: np.ndarray) -> None:
        cluster = self.cluster
        for column, node in enumerate(self.nodes):
            if not alive[column]:
                continue
            self.training_now[tick, column] = float(
                cluster.training_now and bool(cluster.in_training[node])
            )
            for gpu in np.flatnonzero(gpu_up[column] == 1).tolist():
                bandwidth = cluster.gpu_values(node, gpu)[sim_layout.NVLINK.name]
                self.nvlink[tick, column, gpu] = bandwidth


def _gpu_labels(cluster: Cluster, node: int, gpu: int) -> list[tuple[str, str]]:
    name = cluster.node_names[node]
    values = (
        str(gpu),
        cluster.uuids[node][gpu],
        f"00000000:{PCI_BUS_IDS[gpu % len(PCI_BUS_IDS)]}:00.0",
        f"nvidia{gpu}",
        MODEL,
        name,
    )
    return [*zip(GPU_LABELS, values, strict=True), ("instance", name), ("job", JOB_LABEL)]


class _Writer(OpenMetricsWriter):
    """The one OpenMetrics writer, fed from the recorder's arrays: NaN there means the
    series had no sample at that tick (the node was down, the job not yet visible)."""

    def __init__(self, handle: TextIO, times: np.ndarray) -> None:
        super().__init__(handle)
        self.stamps = [str(int(t)) for t in times]

    def declare(self, metric: MetricDef) -> None:
        self.family(*metric.openmetrics(), metric.help)

    def present(self, sample: str, labels: list[tuple[str, str]], values: np.ndarray) -> None:
        where = np.flatnonzero(~np.isnan(values))
        if len(where) == len(values):
            self.series(sample, labels, values.tolist(), self.stamps)
        elif len(where):
            stamps = self.stamps
            self.series(sample, labels, values[where].tolist(), [stamps[i] for i in where.tolist()])


def allocation_labels(
    spec: ClusterSpec, slot: int, gpu_labels: list[tuple[str, str]]
) -> list[tuple[str, str]]:
    """gpufleet_gpu_allocation_info's labels for GPU ``gpu_labels`` held by the job's pod
    on its node ``slot``: the GPU's node, index and UUID, the pod, its container and job."""
    identity = [(name, value) for name, value in gpu_labels if name in _ALLOCATION_GPU_LABELS]
    return [*identity, *spec.pod_labels(slot), ("container", "trainer"), ("training_job", spec.job)]


def write_allocations(
    out: _Writer, spec: ClusterSpec, recorder: _Recorder
) -> list[list[tuple[str, str]]]:
    """A job with pods: they hold every GPU of their nodes while the agent answers there.
    Each node's pod labels for its training series (none for a job without pods)."""
    cluster = recorder.cluster
    if spec.namespace:
        out.declare(cat.ALLOCATION_INFO)
    for column, node in enumerate(recorder.nodes if spec.namespace else ()):
        held = np.where(recorder.up[:, column] == 1, 1.0, np.nan)
        for gpu in range(cluster.gpus):
            labels = allocation_labels(spec, node, _gpu_labels(cluster, node, gpu))
            out.present(cat.ALLOCATION_INFO.name, labels, held)
    return [spec.pod_labels(node) for node in recorder.nodes]


def _write_shard(recorder: _Recorder, path: Path) -> int:
    cluster = recorder.cluster
    with open(path, "w", encoding="utf-8", buffering=1 << 20) as handle:
        out = _Writer(handle, recorder.times)
        names = [cluster.node_names[n] for n in recorder.nodes]
        node_labels = [[("instance", name), ("job", JOB_LABEL)] for name in names]

        out.declare(UP)
        for column, labels in enumerate(node_labels):
            out.present(UP.name, labels, recorder.up[:, column])

        per_gpu = [(cat.GPU_UP, recorder.gpu_up), (cat.SM_CLOCK, recorder.sm_clock)]
        per_gpu += [(_GPU_METRICS[name], gauge) for name, gauge in recorder.gauges.items()]
        for family, per_tick in per_gpu:
            out.declare(family)
            for column, node in enumerate(recorder.nodes):
                for gpu in range(cluster.gpus):
                    labels = _gpu_labels(cluster, node, gpu)
                    out.present(family.name, labels, per_tick[:, column, gpu])
        for metric, array in ((cat.GPUS_SEEN, recorder.seen), (cat.GPUS_EXPECTED, None)):
            out.declare(metric)
            for column, name in enumerate(names):
                values = (
                    array[:, column]
                    if array is not None
                    else np.where(
                        np.isnan(recorder.up[:, column]) | (recorder.up[:, column] == 0),
                        np.nan,
                        cluster.gpus,
                    )
                )
                out.present(metric.name, [(cat.NODE_LABEL, name), *node_labels[column]], values)
        collector_up = agent_schema.COLLECTOR_UP
        out.declare(collector_up)
        for column, labels in enumerate(node_labels):
            out.present(
                collector_up.name, [("collector", "gpu"), *labels], recorder.collector_up[:, column]
            )
        out.declare(agent_schema.AGENT_START_TIME)
        for column, labels in enumerate(node_labels):
            out.present(
                agent_schema.AGENT_START_TIME.name, labels, recorder.agent_started[:, column]
            )

        job = cluster.spec.job
        pods = _write_job_placement(out, recorder, names)
        for metric, attr in _NODE_TRAINING:
            out.declare(metric)
            for column, node in enumerate(recorder.nodes):
                labels = [
                    ("training_job", job),
                    ("node", names[column]),
                    ("pp_stage", str(cluster.stage[node])),
                    *pods[column],
                    *node_labels[column],
                ]
                out.present(metric.name, labels, recorder.node_series[attr][:, column])
        for metric, attr in _RANK_TRAINING if recorder.rank_series else ():
            out.declare(metric)
            for column, node in enumerate(recorder.nodes):
                for gpu in range(cluster.gpus):
                    labels = [
                        ("training_job", job),
                        ("node", names[column]),
                        ("pp_stage", str(cluster.stage[node])),
                        ("rank", str(node * cluster.gpus + gpu)),
                        *pods[column],
                        *node_labels[column],
                    ]
                    out.present(metric.name, labels, recorder.rank_series[attr][:, column, gpu])
        out.declare(ts.CHECKPOINT_OPERATIONS)
        for column in range(len(names)):
            labels = [
                ("training_job", job),
                ("node", names[column]),
                ("op", "save"),
                ("outcome", "ok"),
                *pods[column],
                *node_labels[column],
            ]
            out.present(ts.CHECKPOINT_OPERATIONS.name, labels, recorder.ckpt_ok[:, column])
        for metric, attr in _NODE_CHECKPOINT:
            out.declare(metric)
            for column in range(len(names)):
                labels = [
                    ("training_job", job),
                    ("node", names[column]),
                    ("op", "save"),
                    *pods[column],
                    *node_labels[column],
                ]
                out.present(metric.name, labels, recorder.node_series[attr][:, column])

        for name in GPU_COUNTERS:
            out.declare(_GPU_METRICS[name])
            for slot, (node, gpu) in enumerate(recorder.touched):
                out.present(
                    name, _gpu_labels(cluster, node, gpu), recorder.gpu_counters[name][:, slot]
                )
        out.declare(cat.THROTTLE_ACTIVE)
        for slot, (node, gpu) in enumerate(recorder.touched):
            bits = recorder.throttle[:, slot]
            for reason, bit in _THROTTLE_FLAGS:
                flag = np.where(
                    np.isnan(bits), np.nan, (np.nan_to_num(bits).astype(np.int64) & bit) > 0
                )
                labels = [*_gpu_labels(cluster, node, gpu), ("reason", reason)]
                out.present(cat.THROTTLE_ACTIVE.name, labels, flag.astype(float))
        out.declare(_GPU_METRICS[cat.RECOVERY_ACTION.name])
        for slot, (node, gpu) in enumerate(recorder.touched):
            labels = _gpu_labels(cluster, node, gpu)
            out.present(cat.RECOVERY_ACTION.name, labels, recorder.recovery_action[:, slot])
        out.declare(cat.XID_LAST)
        for slot, (node, gpu) in enumerate(recorder.touched):
            out.present(
                cat.XID_LAST.name, _gpu_labels(cluster, node, gpu), recorder.xid_last[:, slot]
            )
        out.declare(cat.XID_TOTAL)
        for (node, gpu, xid), values in sorted(recorder.xid_counts.items()):
            labels = [*_gpu_labels(cluster, node, gpu), ("xid", str(xid))]
            out.present(cat.XID_TOTAL.name, labels, values)
        out.close()
        return out.samples  # fmt: skip


def _write_job_placement(
    out: _Writer, recorder: _Recorder, names: list[str]
) -> list[list[tuple[str, str]]]:
    """Where the job runs: its pods (write_allocations, whose labels are returned) and,
    with parallel_layout on, its ranks' layout and traffic (_write_layout)."""
    pods = write_allocations(out, recorder.cluster.spec, recorder)
    if recorder.layout:
        _write_layout(out, recorder, names, pods)
    return pods


def _write_layout(
    out: _Writer, recorder: _Recorder, names: list[str], pods: list[list[tuple[str, str]]]
) -> None:
    """Each node's ranks' layout series, its GPUs' NVLink bandwidth, its InfiniBand bytes."""
    cluster = recorder.cluster
    layout, job = cluster.layout, cluster.spec.job
    out.declare(sim_layout.LAYOUT)
    for column, node in enumerate(recorder.nodes):
        visible = ~np.isnan(recorder.ckpt_ok[:, column])
        agent = [("instance", names[column]), ("job", JOB_LABEL)]
        for gpu in range(cluster.gpus):
            rank = node * cluster.gpus + gpu
            for placed in sim_layout.rank_groups(layout, rank):
                labels = sim_layout.layout_labels(job, names[column], rank, placed)
                values = np.where(visible, float(placed.size), np.nan)
                out.present(sim_layout.LAYOUT.name, [*labels, *pods[column], *agent], values)
    out.declare(sim_layout.NVLINK)
    for column, node in enumerate(recorder.nodes):
        for gpu in range(cluster.gpus):
            labels = _gpu_labels(cluster, node, gpu)
            out.present(sim_layout.NVLINK.name, labels, recorder.nvlink[:, column, gpu])
    device, port = sim_layout.IB_DEVICE
    rate = sim_layout.network_rate(layout, cluster.gpus)
    for family in sim_layout.IB_FAMILIES:
        out.declare(family)
        for column, name in enumerate(names):
            labels = [
                ("device", device),
                ("port", port),
                ("instance", f"{name}:{sim_layout.NODE_EXPORTER_PORT}"),
                ("job", sim_layout.NODE_EXPORTER_JOB),
            ]
            counter = sim_layout.network_counter(
                recorder.training_now[:, column], recorder.times, rate
            )
            out.present(family.name, labels, counter)


def write_shards(
    out: Path, nodes: int, shards: int, worker: Callable[[list[int], Path], int]
) -> tuple[list[Path], int]:
    """Nodes dealt round-robin to at most ``shards`` processes, each running ``worker`` on
    its nodes and its file ``history-NN.om`` (one file per process keeps writing parallel
    and each file small for promtool): the files and the samples written in all."""
    shards = max(1, min(shards, nodes))
    paths = [out / f"history-{index:02d}.om" for index in range(shards)]
    work = [(list(range(nodes))[index::shards], path) for index, path in enumerate(paths)]
    if shards == 1:
        return paths, worker(*work[0])
    with multiprocessing.get_context("fork").Pool(shards) as pool:
        return paths, sum(pool.starmap(worker, work))


def _shard_job(
    nodes: list[int], path: Path, *, run: HistoryRun, every_gpu: bool, gpu_gauges: bool
) -> int:
    cluster = Cluster(run.scenario, run.seed, run.start, run.end - run.start)
    ranks = wants_rank_series(run.scenario.cluster, run.rank_series)
    recorder = _Recorder(cluster, nodes, run.ticks, every_gpu, gpu_gauges, rank_series=ranks)
    for tick in range(run.ticks):
        cluster.advance(run.at(tick))
        recorder.record()
    return _write_shard(recorder, path)


def write_history(
    scenario: Scenario,
    seed: int,
    days: float,
    out: Path,
    *,
    end: float | None = None,
    step: float = 30.0,
    shards: int = 2,
    every_gpu: bool = False,
    gpu_gauges: bool = False,
    rank_series: str = "auto",
) -> HistoryResult:
    """Simulate ``days`` ending at ``end`` (default: now) and write OpenMetrics + ground truth.

    ``every_gpu`` writes the error counters and throttle flags of every GPU, also the
    healthy ones (constant zeros): what a live Prometheus holds, for measuring rule cost.
    ``gpu_gauges`` adds every GPU's utilisation, activity, temperatures, power and clocks.
    ``rank_series`` writes the per-rank compute and step counters: ``auto`` for jobs with
    at most 4 nodes per pipeline stage, ``all`` or ``none``. A scenario with ``jobs``
    (a shared cluster) is written by ``gpufleet.simulate.shared``.
    """
    started = time.monotonic()
    out.mkdir(parents=True, exist_ok=True)
    end = float(int(end if end is not None else time.time()))
    start = end - days * 86400.0
    if scenario.jobs:
        from gpufleet.simulate.shared import write_shared_history

        return write_shared_history(
            scenario, seed, start, end, out, step=step, shards=shards, rank_series=rank_series
        )
    run = HistoryRun(scenario, seed, start, end, step, rank_series)
    worker = partial(_shard_job, run=run, every_gpu=every_gpu, gpu_gauges=gpu_gauges)
    paths, samples = write_shards(out, scenario.cluster.nodes, shards, worker)
    cluster = Cluster(scenario, seed, start, end - start)
    truth = write_ground_truth(cluster, out, start, end, step)
    return HistoryResult(paths, truth, samples, time.monotonic() - started, start, end)


def ground_truth(cluster: Cluster, start: float, end: float, step: float) -> dict[str, Any]:
    timeline = cluster.timeline
    names = cluster.node_names
    return {
        "start": start,
        "end": end,
        "step_seconds": step,
        "scenario": cluster.scenario.name,
        "seed": cluster.seed,
        "cluster": {
            "nodes": cluster.nodes,
            "gpus_per_node": cluster.gpus,
            "layout": str(cluster.layout),
            "job": cluster.spec.job,
            "node_names": names,
            "pp_stage_of_node": [int(stage) for stage in cluster.stage],
        },
        "episodes": [episode.record(names) for episode in timeline.episodes],
        "exclusions": [
            {"node": names[e.node], "start": e.start, "end": e.end, "reason": e.reason,
             "source": e.source, "episode": e.episode}
            for e in timeline.exclusions
        ],
        "attempts": [
            {"number": a.number, "trigger": a.trigger, "start": a.start, "first_step": a.first_step,
             "end": a.end, "outcome": a.outcome, "cause": a.cause}
            for a in timeline.attempts
        ],
    }  # fmt: skip


def write_ground_truth(cluster: Cluster, out: Path, start: float, end: float, step: float) -> Path:
    return write_ground_truth_data(ground_truth(cluster, start, end, step), out)


def write_ground_truth_data(truth: dict[str, Any], out: Path) -> Path:
    """``ground_truth.json`` and ``ground_truth.csv`` (one row per episode) under ``out``."""
    path = out / "ground_truth.json"
    path.write_text(json.dumps(truth, indent=1))
    with open(out / "ground_truth.csv", "w", newline="", encoding="utf-8") as handle:
        writer = csv.writer(handle)
        writer.writerow(["id", "kind", "fault", "cause", "node", "gpu", "xid", "start", "end",
                         "magnitude", "scope", "expected_alerts"])  # fmt: skip
        for row in _rows(truth):
            writer.writerow(row)
    return path


def _rows(truth: dict[str, Any]) -> Iterator[list[Any]]:
    for e in truth["episodes"]:
        alerts = " ".join(e["expected_alerts"])
        yield [e["id"], e["kind"], e["fault"], e["cause"], e["node"], e["gpu"], e["xid"],
               e["start"], e["end"], e["magnitude"], e["scope"], alerts]  # fmt: skip
