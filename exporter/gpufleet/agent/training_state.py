"""What the aggregator holds per job, stage, rank and checkpoint op, and the series each
adds to the scrape. Not thread-safe: the aggregator's lock guards it.

A stage keeps what the slowest local rank did on each step: pending steps wait for
the stage's other active ranks (or for ``slowest_rank_wait_s``), then the most
compute any rank reported for the step is counted once.
"""

from __future__ import annotations

from collections import Counter, deque
from collections.abc import Sequence
from dataclasses import dataclass, field, fields

from gpufleet.agent.limits import DEFAULT_STEP_BUCKETS, IngestLimits
from gpufleet.agent.training_events import LayoutEvent
from gpufleet.agent.training_view import CheckpointCounts, JobCounts, RankCounts, StageCounts

_FINALIZED_MEMORY = 4096  # recent steps whose slowest-rank figure is already counted

# Series each unit adds to the scrape (checked against the families by a test).
SERIES_PER_RANK = 2  # rank_compute_seconds, rank_steps
SERIES_PER_CHECKPOINT_OP = 7  # 3 outcomes, queue wait, service, bytes, in flight
SERIES_PER_ATTEMPT = 1  # the attempt gauge, once some rank of the stage reported one


def series_per_stage(step_buckets: Sequence[float] = DEFAULT_STEP_BUCKETS) -> int:
    """Series one (training_job, pp_stage) adds: 9 counters, the histogram's buckets
    (+Inf included), sum and count, 4 gauges, 2 x 3 phase counters."""
    return 9 + (len(step_buckets) + 1 + 2) + 4 + 6


@dataclass(slots=True)
class RankStats:
    steps: int = 0
    compute_s: float = 0.0
    last_seen: float = 0.0
    finished: bool = False


@dataclass(slots=True)
class PendingStep:
    """A step some local ranks reported, waiting for the rest (or for the wait to pass)."""

    slowest_compute_s: float  # the most compute any local rank reported for it so far
    first_seen: float
    ranks_reported: int = 0


@dataclass(slots=True)
class StageStats:
    """A stage's counts (named as ``StageCounts``'s) and the slowest-rank bookkeeping."""

    buckets: int
    created: float
    steps: int = 0
    duration_s: float = 0.0
    compute_s: float = 0.0
    data_wait_s: float = 0.0
    comm_wait_s: float = 0.0
    tokens: int = 0
    slowest_compute_s: float = 0.0
    slowest_steps: int = 0
    split_steps: int = 0
    last_step_time: float = 0.0
    last_step: int = 0
    finished_time: float = 0.0  # when every rank seen here had finished; 0 while any runs
    attempt: int | None = None  # the highest launcher restart count reported; None: none was
    bucket_counts: list[int] = field(default_factory=list)
    phase_steps: Counter[str] = field(default_factory=Counter)
    phase_seconds: dict[str, float] = field(default_factory=dict)
    ranks: dict[int, RankStats] = field(default_factory=dict)
    active_ranks: int = 0
    pending: dict[int, PendingStep] = field(default_factory=dict)
    finalized: set[int] = field(default_factory=set)
    finalized_order: deque[int] = field(default_factory=deque)

    def __post_init__(self) -> None:
        self.bucket_counts = [0] * (self.buckets + 1)  # the last one is +Inf

    def counts(self) -> StageCounts:
        """What the families read, copied."""
        return StageCounts(
            **{name: getattr(self, name) for name in _STAGE_SCALARS},
            bucket_counts=self.bucket_counts.copy(),
            phase_steps=self.phase_steps.copy(),
            phase_seconds=self.phase_seconds.copy(),
            ranks={
                rank_id: RankCounts(rank.steps, rank.compute_s)
                for rank_id, rank in self.ranks.items()
            },
        )

    def finalize(self, step: int) -> None:
        self.slowest_compute_s += self.pending.pop(step).slowest_compute_s
        self.slowest_steps += 1
        self.finalized.add(step)
        self.finalized_order.append(step)
        if len(self.finalized_order) > _FINALIZED_MEMORY:
            self.finalized.discard(self.finalized_order.popleft())


_STAGE_CONTAINERS = ("bucket_counts", "phase_steps", "phase_seconds", "ranks")
# StageCounts's scalar fields, in their order (the containers are copied by name).
_STAGE_SCALARS = tuple(f.name for f in fields(StageCounts) if f.name not in _STAGE_CONTAINERS)


@dataclass(slots=True)
class CheckpointStats:
    outcomes: Counter[str] = field(default_factory=Counter)
    queue_wait_s: float = 0.0
    service_s: float = 0.0
    bytes: int = 0
    # (rank, id) -> begin time
    in_flight: dict[tuple[int, str], float] = field(default_factory=dict)

    def counts(self) -> CheckpointCounts:
        return CheckpointCounts(
            self.outcomes.copy(),
            self.queue_wait_s,
            self.service_s,
            self.bytes,
            self.in_flight.copy(),  # at most _MAX_IN_FLIGHT entries, copied in C
        )


@dataclass(slots=True)
class JobState:
    last_seen: float
    stages: dict[int, StageStats] = field(default_factory=dict)
    checkpoints: dict[str, CheckpointStats] = field(default_factory=dict)
    # each local rank's parallel layout, of the latest attempt reported (frozen: shared)
    layout: dict[int, LayoutEvent] = field(default_factory=dict)

    def counts(self) -> JobCounts:
        return JobCounts(
            {pp_stage: stage.counts() for pp_stage, stage in self.stages.items()},
            {op: stats.counts() for op, stats in self.checkpoints.items()},
        )

    @property
    def layout_series(self) -> int:
        return sum(len(event.groups) for event in self.layout.values())

    @property
    def series(self) -> int:
        """The series this job adds to the scrape, given a stage's (``series_per_stage``)."""
        stages = self.stages.values()
        return (
            SERIES_PER_RANK * sum(len(stage.ranks) for stage in stages)
            + SERIES_PER_ATTEMPT * sum(stage.attempt is not None for stage in stages)
            + SERIES_PER_CHECKPOINT_OP * len(self.checkpoints)
            + self.layout_series
        )

    def expire(self, now: float, limits: IngestLimits) -> None:
        """Recount the active ranks, count the late steps' slowest rank, and abandon the
        checkpoint operations open longer than ``checkpoint_timeout_s``."""
        for stage in self.stages.values():
            stage.active_ranks = sum(
                1 for r in stage.ranks.values() if now - r.last_seen <= limits.rank_window_s
            )
            late = [
                step
                for step, pending in stage.pending.items()
                if now - pending.first_seen >= limits.slowest_rank_wait_s
            ]
            for step in late:
                stage.finalize(step)
        for stats in self.checkpoints.values():
            expired = [
                key
                for key, began in stats.in_flight.items()
                if now - began > limits.checkpoint_timeout_s
            ]
            for key in expired:
                del stats.in_flight[key]
                stats.outcomes["abandoned"] += 1
