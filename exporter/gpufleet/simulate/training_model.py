"""The simulated job's training model: lock-step steps, each as long as the slowest
rank plus the collectives, split into compute, data wait and collective wait, the
counters a node's agent would hold (``NodeTraining``), checkpoints and evals
(``TrainingModel``, a part of ``Cluster``)."""

from __future__ import annotations

import bisect
import math
from dataclasses import dataclass

import numpy as np

from gpufleet.simulate.config import ClusterSpec, Layout, Scenario
from gpufleet.simulate.faults import Episode, Kind
from gpufleet.simulate.timeline_types import Timeline, Window


@dataclass(slots=True)
class NodeTraining:
    """One node's training counters, as its agent would hold them."""

    steps: np.ndarray
    duration_s: np.ndarray
    compute_s: np.ndarray
    data_wait_s: np.ndarray
    comm_wait_s: np.ndarray
    tokens: np.ndarray
    slowest_compute_s: np.ndarray
    slowest_steps: np.ndarray
    split_steps: np.ndarray  # steps whose rank timed its compute (none in a step-only job)
    last_step_time: np.ndarray
    ranks: np.ndarray
    eval_steps: np.ndarray
    eval_seconds: np.ndarray
    buckets: np.ndarray  # (nodes, buckets + 1)
    rank_compute_s: np.ndarray  # (nodes, gpus)
    rank_steps: np.ndarray
    ckpt_ok: np.ndarray
    queue_wait_s: np.ndarray
    service_s: np.ndarray
    ckpt_bytes: np.ndarray
    ckpt_in_flight: np.ndarray

    @classmethod
    def zeros(cls, nodes: int, gpus: int, buckets: int) -> NodeTraining:
        def z() -> np.ndarray:
            return np.zeros(nodes)

        return cls(
            z(), z(), z(), z(), z(), z(), z(), z(), z(), z(), z(), z(), z(),
            np.zeros((nodes, buckets + 1)), np.zeros((nodes, gpus)), np.zeros((nodes, gpus)),
            z(), z(), z(), z(), z(),
        )  # fmt: skip

    def reset_node(self, node: int) -> None:
        for name in self.__slots__:
            getattr(self, name)[node] = 0


class TrainingModel:
    """How far the job trains in each tick, and what every node's counters show of it
    (a part of ``Cluster``; the state it reads and changes is set by ``Cluster.__init__``)."""

    scenario: Scenario
    spec: ClusterSpec
    layout: Layout
    nodes: int
    gpus: int
    rng: np.random.Generator
    timeline: Timeline
    training: NodeTraining
    plain: bool
    report_mask: np.ndarray
    reporters: np.ndarray
    replica_mates: np.ndarray
    dp_rank: np.ndarray
    stage_compute: np.ndarray
    gpu_speed: np.ndarray
    comm_base: float
    data_base: float
    bucket_bounds: tuple[float, ...]
    slowdown: np.ndarray
    excluded: np.ndarray
    node_down: np.ndarray
    in_training: np.ndarray
    training_now: bool
    step_number: int
    step_time: float
    _carry: float
    _eval_carry: float
    _active: list[Episode]

    def _global_factor(self, start: float, end: float, dt: float) -> float:
        conf = self.scenario.confounders
        middle = (start + end) / 2
        diurnal = 1.0 + conf.diurnal_amplitude * math.sin(
            2 * math.pi * (middle % 86400.0) / 86400.0
        )
        sequence = float(
            np.exp(self.rng.normal(0.0, conf.seq_len_sigma / math.sqrt(max(1.0, dt / 5))))
        )
        factor = diurnal * sequence
        for episode in self._active:
            if episode.kind == Kind.CLUSTER_SLOWDOWN:
                share = max(0.0, min(episode.end, end) - max(episode.start, start)) / dt
                factor *= 1.0 + (episode.magnitude - 1.0) * share
        return factor

    def _work_factor(self, start: float, end: float, dt: float) -> np.ndarray | float:
        """How much more work each rank has than usual (uneven work across replicas)."""
        factor: np.ndarray | float = 1.0
        for episode in self._active:
            if episode.kind == Kind.WORKLOAD_IMBALANCE:
                share = max(0.0, min(episode.end, end) - max(episode.start, start)) / dt
                more = 1.0 + (episode.magnitude - 1.0) * share
                factor = factor * np.where(self.dp_rank == episode.details["dp_rank"], more, 1.0)
        return factor

    def _comm_factor(self, start: float, end: float, dt: float) -> float:
        factor = 1.0
        for episode in self._active:
            if episode.kind == Kind.FAIL_SLOW_COMM and episode.node is not None:
                if not self.in_training[episode.node]:
                    continue
                share = max(0.0, min(episode.end, end) - max(episode.start, start)) / dt
                factor = max(factor, 1.0 + (episode.magnitude - 1.0) * share)
        return factor

    def _data_wait(self, start: float, end: float, dt: float) -> np.ndarray:
        extra = np.zeros(self.nodes)
        for episode in self._active:
            if episode.kind == Kind.DATA_LOADER_STALL and episode.node is not None:
                share = max(0.0, min(episode.end, end) - max(episode.start, start)) / dt
                extra[episode.node] += episode.magnitude * share
        return self.data_base + extra

    def _blocked(
        self, windows: list[Window], start: float, end: float
    ) -> tuple[float, float | None]:
        """Seconds of [start, end) inside windows, and the time progress last happened."""
        blocked = 0.0
        last_free: float | None = end
        for window in windows:
            if window.end <= start or window.start >= end:
                continue
            blocked += window.overlap(start, end)
            if window.start <= end <= window.end or window.start < end < window.end:
                last_free = window.start if window.start > start else None
        return min(blocked, end - start), last_free

    def _train(self, start: float, end: float, dt: float) -> None:
        timeline = self.timeline
        stalled, last_free = self._blocked(timeline.stalls, start, end)
        checkpointing, last_free_ck = self._blocked(timeline.checkpoints, start, end)
        evaluating, _ = self._blocked(timeline.evals, start, end)
        train_time = max(0.0, dt - stalled - checkpointing - evaluating)
        eval_time = max(0.0, min(evaluating, dt - stalled))
        active = self.in_training
        t = self.training
        if not active.any():
            self.training_now = False
            return

        gc = (
            self.rng.random(self.nodes)
            < self.scenario.confounders.gc_pauses_per_node_hour * dt / 3600
        )
        gc_gpu = self.rng.integers(self.gpus, size=self.nodes)
        compute = (
            self.stage_compute[:, None]
            * self.gpu_speed
            * self.slowdown
            * self._global_factor(start, end, dt)
            * self._work_factor(start, end, dt)
        )
        compute[gc, gc_gpu[gc]] *= 1.0 + self.rng.uniform(0.02, 0.08, int(gc.sum()))
        compute *= 1.0 + self.rng.normal(0.0, 0.003, compute.shape)
        data = self._data_wait(start, end, dt)
        per_rank = compute + data[:, None]
        if self.plain:
            step_time = float(per_rank[active].max()) + self.comm_base * self._comm_factor(
                start, end, dt
            )
        else:
            # Collectives overlapped with compute: only what the compute cannot hide is
            # exposed, and a slower link first eats into the hidden share's slack.
            hidden = self.spec.comm_overlap * self.comm_base
            exposed = max(
                self.comm_base - hidden, self.comm_base * self._comm_factor(start, end, dt) - hidden
            )
            step_time = float(per_rank[active].max()) + exposed
        self.step_time = step_time
        comm = step_time - per_rank

        steps_float = train_time / step_time + self._carry
        steps = int(steps_float)
        self._carry = steps_float - steps
        eval_float = eval_time / (0.4 * step_time) + self._eval_carry
        evals = int(eval_float)
        self._eval_carry = eval_float - evals
        self.training_now = train_time > 0.5 * dt
        gpus = self.gpus
        if steps and self.plain:
            self._count_steps(active, steps, compute, data, comm, step_time=step_time)
        elif steps:
            self._count_reported_steps(active, steps, compute, data, step_time)
        reporters = gpus if self.plain else self.reporters[active]
        if evals:
            t.eval_steps[active] += evals * reporters
            t.eval_seconds[active] += evals * reporters * 0.4 * step_time
        progressed = steps > 0 or evals > 0
        if progressed:
            when = end
            for candidate in (last_free, last_free_ck):
                if candidate is not None and candidate < when:
                    when = candidate
            seen = active if self.plain else active & (self.reporters > 0)
            t.last_step_time[seen] = when
            t.ranks[active] = reporters
        t.ranks[~active] = 0

    def _training_nodes(self) -> np.ndarray:
        """The nodes that train: not excluded or down, nor in a replica that lost a node
        (it cannot step until the slot is filled; the data-parallel width shrinks)."""
        lost = self.excluded | self.node_down
        return np.asarray(~self.replica_mates[lost].any(axis=0))

    def _count_steps(
        self,
        active: np.ndarray,
        steps: int,
        compute: np.ndarray,
        data: np.ndarray,
        comm: np.ndarray,
        *,
        step_time: float,
    ) -> None:
        """Add ``steps`` lock-step steps to every active node's counters."""
        t = self.training
        gpus = self.gpus
        a = active
        t.steps[a] += steps * gpus
        t.duration_s[a] += steps * gpus * step_time
        t.compute_s[a] += steps * compute[a].sum(axis=1)
        t.data_wait_s[a] += steps * gpus * data[a]
        t.comm_wait_s[a] += steps * comm[a].sum(axis=1)
        t.tokens[a] += steps * gpus * self.spec.tokens_per_rank_step
        t.slowest_compute_s[a] += steps * compute[a].max(axis=1)
        t.slowest_steps[a] += steps
        t.split_steps[a] += steps * gpus
        t.rank_compute_s[a] += steps * compute[a]
        t.rank_steps[a] += steps
        t.buckets[a, bisect.bisect_left(self.bucket_bounds, step_time)] += steps * gpus
        self.step_number += steps

    def _count_reported_steps(
        self,
        active: np.ndarray,
        steps: int,
        compute: np.ndarray,
        data: np.ndarray,
        step_time: float,
    ) -> None:
        """``_count_steps`` for a job that does not report every rank's full split.

        With ``tp0`` only tensor-parallel rank 0 of each group reports, and its compute
        is its group's slowest (TP ranks synchronise inside every layer). A step-only job
        sends the step time alone: the agent counts it all as compute, so every rank shows
        the same compute and nothing of the split.
        """
        t = self.training
        spec = self.spec
        mask = self.report_mask
        tp = self.layout.tp
        seen = compute
        if spec.report_ranks == "tp0":
            if tp <= self.gpus and self.gpus % tp == 0:
                groups = compute.reshape(self.nodes, self.gpus // tp, tp).max(axis=2)
                seen = np.repeat(groups, tp, axis=1)
            else:
                seen = np.repeat(compute.max(axis=1, keepdims=True), self.gpus, axis=1)
        waited = np.repeat(data[:, None], self.gpus, axis=1)
        if spec.step_only:
            seen = np.full(compute.shape, step_time)
            waited = np.zeros(compute.shape)
        comm = np.maximum(0.0, step_time - seen - waited)
        a = active
        count = self.reporters[a]
        reporting = count > 0
        t.steps[a] += steps * count
        t.duration_s[a] += steps * count * step_time
        t.compute_s[a] += steps * (seen[a] * mask[a]).sum(axis=1)
        t.data_wait_s[a] += steps * (waited[a] * mask[a]).sum(axis=1)
        t.comm_wait_s[a] += steps * (comm[a] * mask[a]).sum(axis=1)
        t.tokens[a] += steps * count * spec.tokens_per_rank_step
        slowest = np.where(mask[a], seen[a], 0.0).max(axis=1)
        t.slowest_compute_s[a] += steps * slowest
        t.slowest_steps[a] += steps * reporting
        if not spec.step_only:
            t.split_steps[a] += steps * count
        t.rank_compute_s[a] += steps * seen[a] * mask[a]
        t.rank_steps[a] += steps * mask[a]
        t.buckets[a, bisect.bisect_left(self.bucket_bounds, step_time)] += steps * count
        self.step_number += steps

    def _checkpoints(self, start: float, end: float) -> None:
        t = self.training
        active = self.in_training
        gpus = self.gpus if self.plain else self.reporters[active]
        t.ckpt_in_flight[:] = 0
        for window in self.timeline.checkpoints:
            if window.start <= end < window.end:
                t.ckpt_in_flight[active] = gpus
            if start <= window.end < end:
                queue, service = (float(part) for part in window.reason.split(":"))
                t.ckpt_ok[active] += gpus
                t.queue_wait_s[active] += gpus * queue
                t.service_s[active] += gpus * service
                t.ckpt_bytes[active] += self.spec.checkpoint_bytes_per_node
