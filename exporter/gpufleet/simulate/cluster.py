"""The simulated cluster's state, advanced tick by tick, vectorised over nodes and GPUs.

Lock-step semantics: every rank of a synchronous job takes as long per step as
the slowest rank (plus the collectives), so a slow GPU shows more compute time
on its node while its healthy peers show more collective wait.

``Cluster`` holds the state and advances it; its parts, one module each: what faults
do to the hardware (``fault_effects``), the training model (``training_model``) and
what a GPU reads (``gpu_values``).
"""

from __future__ import annotations

import hashlib

import numpy as np

from gpufleet.agent.limits import DEFAULT_STEP_BUCKETS
from gpufleet.simulate.config import ClusterSpec, Scenario
from gpufleet.simulate.fault_effects import FaultEffects
from gpufleet.simulate.faults import Episode
from gpufleet.simulate.gpu_values import GPU_COUNTERS, GpuValues, XidRecord
from gpufleet.simulate.timeline import build_timeline
from gpufleet.simulate.timeline_types import Timeline
from gpufleet.simulate.training_model import NodeTraining, TrainingModel

AGENT_TTL_S = 900.0  # the agent forgets a job that stopped reporting (its default)


def _replica_mates(spec: ClusterSpec) -> np.ndarray:
    """Node x node: whether the two hold ranks of one data-parallel replica."""
    mates = np.zeros((spec.nodes, spec.nodes), dtype=bool)
    for node, group in enumerate(spec.replica_groups()):
        mates[node, list(group)] = True
    return mates


class Cluster(FaultEffects, TrainingModel, GpuValues):
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

    def agent_alive(self, node: int) -> bool:
        return not self.node_down[node]

    def training_visible(self, node: int) -> bool:
        """Whether the node's agent still holds the job (it forgets it after its TTL)."""
        last = float(self.training.last_step_time[node])
        return last > 0 and self.now - last <= AGENT_TTL_S
