"""What the training and checkpoint families are rendered from: one node's counts.

``gpufleet.agent.training_render`` reads these records. The agent's aggregator copies
its state into them for each scrape; the simulator builds them from its arrays. Each
quantity is named as on the wire (``duration_s``, ``comm_wait_s``...): here a sum over
the steps or operations counted.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence, Sized
from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class RankCounts:
    steps: int
    compute_s: float


@dataclass(frozen=True, slots=True)
class StageCounts:
    """One (training_job, node, pp_stage): training-phase sums and the stage's state."""

    steps: int
    duration_s: float
    compute_s: float
    data_wait_s: float
    comm_wait_s: float
    tokens: int
    slowest_compute_s: float
    slowest_steps: int
    split_steps: int  # steps whose rank timed its compute or collective wait
    bucket_counts: Sequence[int]  # per bucket, not cumulative; +Inf last
    last_step_time: float
    last_step: int
    active_ranks: int
    finished_time: float = 0.0
    attempt: int | None = None  # the highest a rank reported; None: none did
    phase_steps: Mapping[str, int] = field(default_factory=dict)
    phase_seconds: Mapping[str, float] = field(default_factory=dict)
    ranks: Mapping[int, RankCounts] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class CheckpointCounts:
    """One (training_job, node, op)."""

    outcomes: Mapping[str, int]
    queue_wait_s: float
    service_s: float
    bytes: int
    in_flight: Sized = ()  # the operations open now; only their number is shown


@dataclass(frozen=True, slots=True)
class JobCounts:
    stages: Mapping[int, StageCounts]
    checkpoints: Mapping[str, CheckpointCounts] = field(default_factory=dict)
