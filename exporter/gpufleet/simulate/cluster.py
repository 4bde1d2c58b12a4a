"""The simulated cluster's state, advanced tick by tick, vectorised over nodes and GPUs.

Lock-step semantics: every rank of a synchronous job takes as long per step as
the slowest rank (plus the collectives), so a slow GPU shows more compute time
on its node while its healthy peers show more collective wait.
"""

from __future__ import annotations

import bisect
import hashlib
import math
from dataclasses import dataclass, field

import numpy as np

from gpufleet.agent.limits import DEFAULT_STEP_BUCKETS
from gpufleet.schema import gpu as cat
from gpufleet.simulate.config import ClusterSpec, Scenario
from gpufleet.simulate.faults import (
    CAUSES_BY_NAME,
    DBE,
    RECOVERY_ACTION_CHANGED,
    RECOVERY_GPU_RESET,
    REMAP_FAILED,
    REMAP_RECORDED,
    Effect,
    Episode,
    Kind,
)
from gpufleet.simulate.timeline import Timeline, Window, build_timeline

# Per-GPU error counters, by the DCGM field (GPU catalogue entry) they feed.
GPU_COUNTERS = tuple(
    metric.name
    for metric in (
        cat.ECC_SBE_VOL,
        cat.ECC_DBE_VOL,
        cat.ECC_SBE_AGG,
        cat.ECC_DBE_AGG,
        cat.CORRECTABLE_REMAPPED_ROWS,
        cat.UNCORRECTABLE_REMAPPED_ROWS,
        cat.ROW_REMAP_PENDING,
        cat.ROW_REMAP_FAILURE,
        cat.NVLINK_CRC_FLIT,
        cat.NVLINK_CRC_DATA,
        cat.NVLINK_REPLAY,
        cat.NVLINK_RECOVERY,
        cat.PCIE_REPLAY,
    )
)
# Volatile counters reset when the GPU is reset (after a repair).
_VOLATILE = (cat.ECC_SBE_VOL.name, cat.ECC_DBE_VOL.name)
HW_SLOWDOWN = 0x8
HW_THERMAL = 0x40
MAX_SM_CLOCK_MHZ = 1980.0  # an H100 SXM's SM clock under load, unthrottled


def sm_clock_mhz(slowdown: np.ndarray) -> np.ndarray:
    """SM clocks of GPUs slowed by ``slowdown`` (clock-locked, throttled: the clock drops)."""
    return np.round(MAX_SM_CLOCK_MHZ / slowdown)


HW_POWER_BRAKE = 0x80
AGENT_TTL_S = 900.0  # the agent forgets a job that stopped reporting (its default)


@dataclass(slots=True)
class NodeTraining:
    """One node's training counters, as its agent would hold them."""

    steps: np.ndarray
    step_seconds: np.ndarray
    compute: np.ndarray
    data_wait: np.ndarray
    comm_wait: np.ndarray
    tokens: np.ndarray
    slowest_compute: np.ndarray
    slowest_steps: np.ndarray
    split_steps: np.ndarray  # steps whose rank timed its compute (none in a step-only job)
    last_step_time: np.ndarray
    ranks: np.ndarray
    eval_steps: np.ndarray
    eval_seconds: np.ndarray
    buckets: np.ndarray  # (nodes, buckets + 1)
    rank_compute: np.ndarray  # (nodes, gpus)
    rank_steps: np.ndarray
    ckpt_ok: np.ndarray
    ckpt_queue: np.ndarray
    ckpt_service: np.ndarray
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


@dataclass(slots=True)
class XidRecord:
    counts: dict[int, int] = field(default_factory=dict)
    last: int = 0
    last_time: float = 0.0


def _replica_mates(spec: ClusterSpec) -> np.ndarray:
    """Node x node: whether the two hold ranks of one data-parallel replica."""
    mates = np.zeros((spec.nodes, spec.nodes), dtype=bool)
    for node, group in enumerate(spec.replica_groups()):
        mates[node, list(group)] = True
    return mates


class Cluster:
    """State of every node and GPU at time ``now``; ``advance()`` moves it forward."""

    def __init__(
        self,
        scenario: Scenario,
        seed: int,
        start: float,
        horizon_s: float,
        timeline: Timeline | None = None,
    ) -> None:
        spec = scenario.cluster
        self.scenario = scenario
        self.spec = spec
        self.seed = seed
        self.nodes = spec.nodes
        self.gpus = spec.gpus_per_node
        self.layout = spec.resolved_layout()
        width = max(3, len(str(self.nodes - 1)))
        self.node_names = [f"node-{index:0{width}d}" for index in range(self.nodes)]
        self.stage, self.dp_rank = self._placement()
        self.replica_mates = _replica_mates(spec)
        # which ranks send steps (nodes x GPUs), and how many per node
        self.report_mask, self.reporters = self._reporting_ranks()
        self.plain = spec.plain_reporting
        self.timeline = timeline or build_timeline(scenario, seed, start, start + horizon_s)
        self.now = start
        self.start = start

        noise_seed = np.random.SeedSequence([seed, 2])
        self.rng = np.random.default_rng(noise_seed)
        static = np.random.default_rng(np.random.SeedSequence([seed, 3]))
        self.gpu_speed = 1.0 + static.normal(0.0, 0.008, (self.nodes, self.gpus))
        self.gpu_power_base = static.uniform(560.0, 640.0, (self.nodes, self.gpus))
        self.uuids = [
            [self._uuid(node, gpu) for gpu in range(self.gpus)] for node in range(self.nodes)
        ]

        base = spec.step_seconds * spec.compute_share
        last = int(self.stage.max())
        skew = 1.0 + (spec.last_stage_skew if scenario.confounders.stage_skew else 0.0)
        self.stage_compute = (
            np.where(self.stage == last, base * skew, base) if last else np.full(self.nodes, base)
        )
        self.comm_base = spec.step_seconds * (1.0 - spec.compute_share - spec.data_share)
        self.data_base = spec.step_seconds * spec.data_share
        self.bucket_bounds = DEFAULT_STEP_BUCKETS

        nodes, gpus = self.nodes, self.gpus
        self.counters = {name: np.zeros((nodes, gpus)) for name in GPU_COUNTERS}
        self.energy_mj = static.uniform(2e12, 2.4e12, (nodes, gpus))
        self.xids: dict[tuple[int, int], XidRecord] = {}
        # NVML's recovery action, until the repair resets it; when each node's agent
        # started (its XID counters count from then; a repair reboots the node)
        self.recovery_action, self.agent_started = np.zeros((nodes, gpus)), np.full(nodes, start)
        self.gpu_lost = np.zeros((nodes, gpus), dtype=bool)
        self.node_down = np.zeros(nodes, dtype=bool)
        self.nvml_hung = np.zeros(nodes, dtype=bool)
        # excluded by a fault; training (set each tick by advance)
        self.excluded, self.in_training = np.zeros(nodes, dtype=bool), np.ones(nodes, dtype=bool)
        self.throttle = np.zeros((nodes, gpus), dtype=np.int64)
        self.slowdown = np.ones((nodes, gpus))
        self.training_now = False
        self.training = NodeTraining.zeros(nodes, gpus, len(self.bucket_bounds))
        self.step_number = 0
        self.step_time = spec.step_seconds
        self._carry = self._eval_carry = 0.0
        self.tick = 0

        # Admitted when they first show: a thermal fail-stop throttles its GPU before it fails.
        self._episodes = sorted(self.timeline.episodes, key=lambda e: e.shows_from)
        self._next_episode = 0
        self._active: list[Episode] = []
        self._storms: dict[int, float] = {}

    def _placement(self) -> tuple[np.ndarray, np.ndarray]:
        """Each node's pipeline stage, and each rank's data-parallel replica (nodes x GPUs)."""
        ranks_per_stage = self.layout.dp * self.layout.tp
        dp_rank = [[self.spec.dp_rank(n, g) for g in range(self.gpus)] for n in range(self.nodes)]
        return np.arange(self.nodes) * self.gpus // ranks_per_stage, np.array(dp_rank)

    def _reporting_ranks(self) -> tuple[np.ndarray, np.ndarray]:
        """Which ranks send steps: all, or rank 0 of each TP group; and how many per node."""
        ranks = np.arange(self.nodes * self.gpus).reshape(self.nodes, self.gpus)
        mask = (
            ranks % self.layout.tp == 0
            if self.spec.report_ranks == "tp0"
            else np.ones((self.nodes, self.gpus), dtype=bool)
        )
        return mask, mask.sum(axis=1).astype(float)

    def _uuid(self, node: int, gpu: int) -> str:
        digest = hashlib.sha256(f"{self.seed}:{node}:{gpu}".encode()).hexdigest()
        return f"GPU-{digest[:8]}-{digest[8:12]}-{digest[12:16]}-{digest[16:20]}-{digest[20:32]}"

    # -- the tick ---------------------------------------------------------------------

    def advance(self, until: float) -> None:
        """Move the cluster from ``now`` to ``until``."""
        start, end = self.now, until
        if end <= start:
            return
        dt = end - start
        self._admit_episodes(end)
        self._instant_events(start, end)
        self._continuous_effects(start, end, dt)
        self._repairs(start, end)
        self.in_training = self._training_nodes()
        self._train(start, end, dt)
        self._checkpoints(start, end)
        self.energy_mj += self._power_watts() * dt * 1000.0 * ~self.gpu_lost
        self.now = end
        self.tick += 1

    def _admit_episodes(self, end: float) -> None:
        episodes = self._episodes
        while self._next_episode < len(episodes) and episodes[self._next_episode].shows_from < end:
            self._active.append(episodes[self._next_episode])
            self._next_episode += 1

    def _instant_events(self, start: float, end: float) -> None:
        for episode in self._active:
            if episode.kind == Kind.FAIL_STOP:
                if start <= episode.start < end:
                    self._apply_fail_stop(episode)
                if "xid_burst" in episode.details:
                    self._dbe_incident(episode, episode.start, start, end)
            elif episode.kind == Kind.XID_STORM:
                self._xid_storm(episode, start, end)
            elif episode.kind == Kind.ECC_DEGRADATION:
                self._ecc_degradation(episode, start, end)

    def _record_xid(self, node: int, gpu: int, xid: int, when: float) -> None:
        record = self.xids.setdefault((node, gpu), XidRecord())
        record.counts[xid] = record.counts.get(xid, 0) + 1
        record.last = xid
        record.last_time = when

    def _dbe_incident(self, episode: Episode, at: float, start: float, end: float) -> None:
        """The XIDs of the episode's uncorrectable HBM error that fall in [start, end), the
        burst starting at ``at``, each with what it reports: 48 the double-bit error
        counted; 63 (or 64) its row remapped, the remap pending a reset (or the remap
        failed); 154 the GPU's recovery action turned to GPU reset."""
        assert episode.node is not None and episode.gpu is not None
        node, gpu = episode.node, episode.gpu
        counters = self.counters
        for offset, code in episode.details["xid_burst"]:
            when = at + float(offset)
            if not start <= when < end:
                continue
            self._record_xid(node, gpu, int(code), when)
            if code == DBE:
                counters[cat.ECC_DBE_VOL.name][node, gpu] += 1
                counters[cat.ECC_DBE_AGG.name][node, gpu] += 1
            elif code in (REMAP_RECORDED, REMAP_FAILED):
                counters[cat.UNCORRECTABLE_REMAPPED_ROWS.name][node, gpu] += 1
                counters[cat.ROW_REMAP_PENDING.name][node, gpu] = 1
                if code == REMAP_FAILED:
                    counters[cat.ROW_REMAP_FAILURE.name][node, gpu] = 1
            elif code == RECOVERY_ACTION_CHANGED:
                self.recovery_action[node, gpu] = RECOVERY_GPU_RESET

    def _apply_fail_stop(self, episode: Episode) -> None:
        assert episode.node is not None and episode.gpu is not None and episode.cause
        node, gpu = episode.node, episode.gpu
        cause = CAUSES_BY_NAME[episode.cause]
        rng = self.rng
        effect = cause.effect
        if episode.xid is not None and effect != Effect.HBM_ECC:  # HBM: the whole burst
            self._record_xid(node, gpu, episode.xid, episode.start)
        counters = self.counters
        if effect == Effect.GPU_LOST:
            self.gpu_lost[node, gpu] = True
        elif effect == Effect.NVLINK:
            counters[cat.NVLINK_REPLAY.name][node, gpu] += rng.integers(50, 500)
            counters[cat.NVLINK_RECOVERY.name][node, gpu] += rng.integers(1, 10)
            counters[cat.NVLINK_CRC_FLIT.name][node, gpu] += rng.integers(100, 5000)
            counters[cat.NVLINK_CRC_DATA.name][node, gpu] += rng.integers(10, 500)
        elif effect == Effect.SRAM_ECC:
            counters[cat.ECC_DBE_VOL.name][node, gpu] += 1
            counters[cat.ECC_DBE_AGG.name][node, gpu] += 1
        elif effect in (Effect.NODE_DOWN, Effect.POWER_BRAKE):
            self.node_down[node] = True
        if cause.excludes_node:
            self.excluded[node] = True

    def _xid_storm(self, episode: Episode, start: float, end: float) -> None:
        assert episode.node is not None and episode.gpu is not None
        period = float(episode.details.get("period", 30.0))
        count = int(episode.details.get("count", 12))
        xid = episode.xid or 94
        fired = self._storms.get(episode.id, 0.0)
        while fired < count:
            when = episode.start + fired * period
            if when >= end:
                break
            if when >= start:
                self._record_xid(episode.node, episode.gpu, xid, when)
            fired += 1
        self._storms[episode.id] = fired

    def _ecc_degradation(self, episode: Episode, start: float, end: float) -> None:
        """Correctable remaps climb; at 70% an uncorrectable error; at the end remapping fails."""
        assert episode.node is not None and episode.gpu is not None
        node, gpu = episode.node, episode.gpu
        span = max(1.0, episode.end - episode.start)
        counters = self.counters
        climb_end = episode.start + 0.7 * span
        climbed = min(end, climb_end) - max(start, episode.start)
        if climbed > 0:
            counters[cat.CORRECTABLE_REMAPPED_ROWS.name][node, gpu] += self.rng.poisson(
                climbed / 120.0
            )
            counters[cat.ECC_SBE_VOL.name][node, gpu] += self.rng.poisson(climbed / 20.0)
        self._dbe_incident(episode, climb_end, start, end)
        if start <= episode.end < end:
            self._record_xid(node, gpu, REMAP_FAILED, episode.end)
            counters[cat.ROW_REMAP_FAILURE.name][node, gpu] = 1

    def _continuous_effects(self, start: float, end: float, dt: float) -> None:
        rng = self.rng
        slowdown = np.ones((self.nodes, self.gpus))
        throttle = np.zeros((self.nodes, self.gpus), dtype=np.int64)
        self.nvml_hung[:] = False
        still_active = []
        for episode in self._active:
            if episode.end <= start and episode.kind != Kind.FAIL_STOP:
                continue
            if episode.kind == Kind.FAIL_STOP and episode.end <= start:
                continue
            still_active.append(episode)
            share = max(0.0, min(episode.end, end) - max(episode.start, start)) / dt
            node, gpu = episode.node, episode.gpu
            if episode.kind == Kind.FAIL_SLOW_COMPUTE and node is not None and gpu is not None:
                slowdown[node, gpu] *= 1.0 + (episode.magnitude - 1.0) * share
            elif episode.kind == Kind.PRECURSOR and node is not None and gpu is not None:
                signal = episode.details.get("signal")
                if signal == "remaps":
                    self.counters[cat.CORRECTABLE_REMAPPED_ROWS.name][node, gpu] += rng.poisson(
                        share * dt / 1800.0
                    )
                else:
                    self.counters[cat.PCIE_REPLAY.name][node, gpu] += rng.poisson(share * dt / 60.0)
            elif episode.kind == Kind.NVLINK_FLAPPING and node is not None and gpu is not None:
                if share > 0 and rng.random() < 0.5:
                    self.counters[cat.NVLINK_REPLAY.name][node, gpu] += rng.integers(5, 60)
                    self.counters[cat.NVLINK_RECOVERY.name][node, gpu] += 1
                    if rng.random() < 0.2:
                        self._record_xid(node, gpu, 74, start)
            elif episode.kind == Kind.FAIL_STOP and node is not None:
                self._fail_stop_window(episode, start, end, slowdown, throttle)
        self._active = still_active
        self.slowdown = slowdown
        self.throttle = throttle

    def _fail_stop_window(
        self,
        episode: Episode,
        start: float,
        end: float,
        slowdown: np.ndarray,
        throttle: np.ndarray,
    ) -> None:
        assert episode.node is not None and episode.gpu is not None and episode.cause
        effect = CAUSES_BY_NAME[episode.cause].effect
        node, gpu = episode.node, episode.gpu
        slow_from = episode.details.get("slowdown_from")
        if isinstance(slow_from, float) and slow_from < end and start < episode.start:
            if effect == Effect.THERMAL:
                throttle[node, gpu] |= HW_THERMAL | HW_SLOWDOWN
                slowdown[node, gpu] *= 1.45
            else:
                throttle[node, :] |= HW_POWER_BRAKE | HW_SLOWDOWN
                slowdown[node, :] *= 1.3
        hang_from = episode.details.get("hang_from")
        if isinstance(hang_from, float) and hang_from < end and start < episode.end:
            self.nvml_hung[node] = True

    def _repairs(self, start: float, end: float) -> None:
        for exclusion in self.timeline.exclusions:
            if start <= exclusion.end < end:
                node = exclusion.node
                self.excluded[node] = False
                self.node_down[node] = False
                self.gpu_lost[node, :] = False
                self.counters[cat.ROW_REMAP_PENDING.name][node, :] = 0
                # a GPU whose remap failed has no spare rows: the repair replaced it
                self.counters[cat.ROW_REMAP_FAILURE.name][node, :] = 0
                self.recovery_action[node, :] = 0
                for name in _VOLATILE:
                    self.counters[name][node, :] = 0
                # The node was rebooted: its agent starts afresh.
                self.agent_started[node] = exclusion.end
                self.training.reset_node(node)
                for gpu in range(self.gpus):
                    self.xids.pop((node, gpu), None)

    # -- training ---------------------------------------------------------------------

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
        t.step_seconds[a] += steps * gpus * step_time
        t.compute[a] += steps * compute[a].sum(axis=1)
        t.data_wait[a] += steps * gpus * data[a]
        t.comm_wait[a] += steps * comm[a].sum(axis=1)
        t.tokens[a] += steps * gpus * self.spec.tokens_per_rank_step
        t.slowest_compute[a] += steps * compute[a].max(axis=1)
        t.slowest_steps[a] += steps
        t.split_steps[a] += steps * gpus
        t.rank_compute[a] += steps * compute[a]
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
        t.step_seconds[a] += steps * count * step_time
        t.compute[a] += steps * (seen[a] * mask[a]).sum(axis=1)
        t.data_wait[a] += steps * (waited[a] * mask[a]).sum(axis=1)
        t.comm_wait[a] += steps * (comm[a] * mask[a]).sum(axis=1)
        t.tokens[a] += steps * count * spec.tokens_per_rank_step
        slowest = np.where(mask[a], seen[a], 0.0).max(axis=1)
        t.slowest_compute[a] += steps * slowest
        t.slowest_steps[a] += steps * reporting
        if not spec.step_only:
            t.split_steps[a] += steps * count
        t.rank_compute[a] += steps * seen[a] * mask[a]
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
                t.ckpt_queue[active] += gpus * queue
                t.ckpt_service[active] += gpus * service
                t.ckpt_bytes[active] += self.spec.checkpoint_bytes_per_node

    # -- what a node's agent would see -----------------------------------------------

    def _power_watts(self) -> np.ndarray:
        load = 0.97 if self.training_now else 0.08
        return 75.0 + (self.gpu_power_base - 75.0) * load / np.maximum(self.slowdown, 1.0)

    def agent_alive(self, node: int) -> bool:
        return not self.node_down[node]

    def training_visible(self, node: int) -> bool:
        """Whether the node's agent still holds the job (it forgets it after its TTL)."""
        last = float(self.training.last_step_time[node])
        return last > 0 and self.now - last <= AGENT_TTL_S

    def gpu_values(self, node: int, gpu: int) -> dict[str, float]:
        """DCGM field values of one GPU, as the agent's reader would produce them."""
        load = 0.97 if self.training_now and self.in_training[node] else 0.05
        slow = float(self.slowdown[node, gpu])
        watts = float(self._power_watts()[node, gpu]) if load > 0.5 else 72.0
        values = {
            cat.SM_CLOCK.name: float(sm_clock_mhz(self.slowdown[node, gpu])),
            cat.MEM_CLOCK.name: 2619.0,
            cat.GPU_TEMP.name: round(30 + watts / 20),
            cat.MEMORY_TEMP.name: round(36 + watts / 18),
            cat.POWER_USAGE.name: round(watts, 3),
            cat.TOTAL_ENERGY.name: float(self.energy_mj[node, gpu]),
            cat.GPU_UTIL.name: round(100 * load),
            cat.MEM_COPY_UTIL.name: round(45 * load),
            cat.FB_FREE.name: 6400.0 if load > 0.5 else 80993.0,
            cat.FB_USED.name: 74593.0 if load > 0.5 else 0.0,
            cat.FB_RESERVED.name: 566.0,
            cat.PCIE_TX.name: 3.1e6 * load,
            cat.PCIE_RX.name: 2.9e6 * load,
            cat.CLOCK_THROTTLE_REASONS.name: float(self.throttle[node, gpu]),
            cat.CLOCKS_EVENT_REASONS.name: float(self.throttle[node, gpu]),
            cat.VGPU_LICENSE_STATUS.name: 0.0,  # bare metal, as DCGM reports it
            cat.NVLINK_ECC_ERRORS.name: 0.0,  # an H100 has it (Hopper+); no NVLink5 counters
            cat.POWER_VIOLATION.name: 0.0,
            cat.THERMAL_VIOLATION.name: 0.0,
            cat.SM_ACTIVE.name: round(0.9 * load / slow, 4),
            cat.SM_OCCUPANCY.name: round(0.35 * load, 4),
            cat.PIPE_TENSOR_ACTIVE.name: round(0.55 * load / slow, 4),
            cat.DRAM_ACTIVE.name: round(0.42 * load, 4),
            # DCGM's unit: data KiB/s over all links / 1000 (~460 GB/s while training)
            cat.NVLINK_BANDWIDTH.name: round(449_000.0 * load),
            cat.RECOVERY_ACTION.name: float(self.recovery_action[node, gpu]),
        }
        for name, array in self.counters.items():
            values[name] = float(array[node, gpu])
        return values
