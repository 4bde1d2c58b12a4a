"""What the training and checkpoint families are rendered from: a read-only view.

``training_families`` reads one node's jobs through these protocols. The agent's
aggregator hands over copies of its own records, which have these attributes;
the simulator builds the small frozen records below from its arrays. Neither
fills the other's classes, and the renderer cannot change what it reads.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence, Sized
from dataclasses import dataclass, field
from typing import Protocol


class RankView(Protocol):
    @property
    def steps(self) -> int: ...
    @property
    def compute_seconds(self) -> float: ...


class StageView(Protocol):
    """One (training_job, node, pp_stage): training-phase sums and the stage's state."""

    @property
    def steps(self) -> int: ...
    @property
    def step_seconds(self) -> float: ...
    @property
    def compute_seconds(self) -> float: ...
    @property
    def data_wait_seconds(self) -> float: ...
    @property
    def comm_wait_seconds(self) -> float: ...
    @property
    def tokens(self) -> int: ...
    @property
    def slowest_compute_seconds(self) -> float: ...
    @property
    def slowest_steps(self) -> int: ...
    @property
    def split_steps(self) -> int: ...  # steps whose rank timed its compute or collective wait
    @property
    def bucket_counts(self) -> Sequence[int]: ...  # per bucket, not cumulative; +Inf last
    @property
    def last_step_time(self) -> float: ...
    @property
    def last_step(self) -> int: ...
    @property
    def active_ranks(self) -> int: ...
    @property
    def finished_time(self) -> float: ...
    @property
    def attempt(self) -> int | None: ...  # the highest a rank reported; None: none did
    @property
    def phase_steps(self) -> Mapping[str, int]: ...
    @property
    def phase_seconds(self) -> Mapping[str, float]: ...
    @property
    def ranks(self) -> Mapping[int, RankView]: ...


class CheckpointView(Protocol):
    """One (training_job, node, op)."""

    @property
    def outcomes(self) -> Mapping[str, int]: ...
    @property
    def queue_wait_seconds(self) -> float: ...
    @property
    def service_seconds(self) -> float: ...
    @property
    def bytes(self) -> int: ...
    @property
    def in_flight(self) -> Sized: ...  # the operations open now; only their number is shown


class JobView(Protocol):
    @property
    def stages(self) -> Mapping[int, StageView]: ...
    @property
    def checkpoints(self) -> Mapping[str, CheckpointView]: ...


@dataclass(frozen=True, slots=True)
class RankCounts:
    steps: int
    compute_seconds: float


@dataclass(frozen=True, slots=True)
class StageCounts:
    steps: int
    step_seconds: float
    compute_seconds: float
    data_wait_seconds: float
    comm_wait_seconds: float
    tokens: int
    slowest_compute_seconds: float
    slowest_steps: int
    split_steps: int
    bucket_counts: tuple[int, ...]
    last_step_time: float
    last_step: int
    active_ranks: int
    finished_time: float = 0.0
    attempt: int | None = None
    phase_steps: Mapping[str, int] = field(default_factory=dict)
    phase_seconds: Mapping[str, float] = field(default_factory=dict)
    ranks: Mapping[int, RankCounts] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class CheckpointCounts:
    outcomes: Mapping[str, int]
    queue_wait_seconds: float
    service_seconds: float
    bytes: int
    in_flight: Sized = ()


@dataclass(frozen=True, slots=True)
class JobCounts:
    stages: Mapping[int, StageCounts]
    checkpoints: Mapping[str, CheckpointCounts] = field(default_factory=dict)
