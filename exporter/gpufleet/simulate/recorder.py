"""What a history is recorded from: the per-tick values of every written series, for the
nodes of one shard (``Recorder``), and the tables of which cluster attribute feeds which
family. ``gpufleet.simulate.history`` (one job) and ``gpufleet.simulate.shared`` (several
jobs on one pool of nodes) both record with it and write with ``gpufleet.simulate.series``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from gpufleet.schema import gpu as cat
from gpufleet.schema import training as ts
from gpufleet.schema.family import MetricDef
from gpufleet.simulate import layout as sim_layout
from gpufleet.simulate.cluster import Cluster
from gpufleet.simulate.config import ClusterSpec, Scenario
from gpufleet.simulate.faults import CAUSES_BY_NAME, Effect, Kind
from gpufleet.simulate.gpu_values import GPU_COUNTERS, sm_clock_mhz

JOB_LABEL = "gpufleet-agent"
NODE_TRAINING: tuple[tuple[MetricDef, str], ...] = (
    # (family, NodeTraining attribute)
    (ts.STEPS, "steps"),
    (ts.STEP_SECONDS, "duration_s"),
    (ts.COMPUTE_SECONDS, "compute_s"),
    (ts.DATA_WAIT_SECONDS, "data_wait_s"),
    (ts.COLLECTIVE_WAIT_SECONDS, "comm_wait_s"),
    (ts.TOKENS, "tokens"),
    (ts.SLOWEST_RANK_COMPUTE_SECONDS, "slowest_compute_s"),
    (ts.SLOWEST_RANK_STEPS, "slowest_steps"),
    (ts.SPLIT_STEPS, "split_steps"),
    (ts.LAST_STEP_TIMESTAMP, "last_step_time"),
    (ts.RANKS, "ranks"),
)
# Per-rank counters (``rank`` label), for rank-level peer comparison in small stages.
RANK_TRAINING: tuple[tuple[MetricDef, str], ...] = (
    (ts.RANK_COMPUTE_SECONDS, "rank_compute_s"),
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
NODE_CHECKPOINT: tuple[tuple[MetricDef, str], ...] = (
    (ts.CHECKPOINT_QUEUE_WAIT_SECONDS, "queue_wait_s"),
    (ts.CHECKPOINT_SERVICE_SECONDS, "service_s"),
    (ts.CHECKPOINT_BYTES, "ckpt_bytes"),
    (ts.CHECKPOINT_IN_FLIGHT, "ckpt_in_flight"),
)
GPU_METRICS = {metric.name: metric for metric in cat.GPU_FAMILIES}


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


class Recorder:
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
            attr: np.full((ticks, count), np.nan) for _, attr in NODE_TRAINING + NODE_CHECKPOINT
        }
        self.ckpt_ok = np.full((ticks, count), np.nan)
        self.rank_series = {
            attr: np.full((ticks, count, cluster.gpus), np.nan)
            for _, attr in (RANK_TRAINING if rank_series else ())
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
        for _, attr in NODE_TRAINING + NODE_CHECKPOINT:
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
