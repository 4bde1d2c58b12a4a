"""Per-node aggregation of training events into a few counters per job and stage.

Series are keyed by (training_job, node, pp_stage) for steps and by
(training_job, node, op) for checkpoints; never by step number. Besides sums,
the aggregator keeps what the slowest local rank did on each step (averaged
over eight ranks one GPU 20% slower moves the node's mean by only 2.5%) and a
compute counter per rank, so rules can fall back to rank-level peers when few
nodes share a stage.

A batch is applied whole or not at all: caps are checked before anything
changes. The caps bound combinations (jobs, (job, stage) pairs, ranks per stage,
series in all), so the scrape stays bounded whatever a client sends. Jobs that
stop reporting are forgotten after a TTL. A scrape copies the values under the
lock and builds its families after releasing it.
"""

from __future__ import annotations

import bisect
import threading
import time
from collections import Counter, deque
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field

from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

from gpufleet.agent.training_events import (
    CheckpointBatch,
    FinishedBatch,
    LayoutBatch,
    LayoutEvent,
    StepBatch,
)
from gpufleet.agent.training_view import JobView
from gpufleet.schema import agent as agent_schema
from gpufleet.schema import training as ts

DEFAULT_STEP_BUCKETS = (0.25, 0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0)
_FINALIZED_MEMORY = 4096  # recent steps whose slowest-rank figure is already counted
_SWEEP_EVERY_S = 5.0
_MAX_IN_FLIGHT = 1024  # per job and op (a node has a few ranks; each has one or two open)
_MAX_PENDING_STEPS = 1024  # per stage: memory stays bounded however fast steps arrive


# Series each unit adds to the scrape (checked against the families by a test).
SERIES_PER_RANK = 2  # rank_compute_seconds, rank_steps
SERIES_PER_CHECKPOINT_OP = 7  # 3 outcomes, queue wait, service, bytes, in flight
SERIES_PER_ATTEMPT = 1  # the attempt gauge, once some rank of the stage reported one


def series_per_stage(step_buckets: Sequence[float] = DEFAULT_STEP_BUCKETS) -> int:
    """Series one (training_job, pp_stage) adds: 9 counters, the histogram's buckets
    (+Inf included), sum and count, 4 gauges, 2 x 3 phase counters."""
    return 9 + (len(step_buckets) + 1 + 2) + 4 + 6


@dataclass(frozen=True, slots=True)
class IngestLimits:
    """What one agent accepts. The cardinality caps apply to combinations, so that
    their product never decides the scrape: a real 8-GPU node needs 1-8 (job, stage)
    pairs of 8 ranks each (about 300 series); the defaults leave 10-20x headroom and
    bound the training series at ``max_series`` whatever a client sends."""

    job_ttl_s: float = 900.0
    max_jobs: int = 16
    max_stages: int = 64  # (training_job, pp_stage) pairs on this agent
    max_ranks_per_stage: int = 64
    max_series: int = 5000  # training and checkpoint series exported, in all
    # The client sends at most 4096 events per request (gpufleet.client.MAX_BATCH_EVENTS);
    # its largest such batch is 1.77 MiB (a test measures it), hence 2 MiB.
    max_batch_events: int = 4096
    max_body_bytes: int = 2 * 1024 * 1024
    # Requests read and parsed at once (503 beyond, which the client retries): memory for
    # bodies stays below this many times max_body_bytes however many connections send.
    max_concurrent_requests: int = 16
    rank_window_s: float = 120.0
    slowest_rank_wait_s: float = 10.0
    checkpoint_timeout_s: float = 6 * 3600.0
    step_buckets: tuple[float, ...] = DEFAULT_STEP_BUCKETS


class CapExceededError(Exception):
    """Accepting the batch would exceed a cardinality cap (HTTP 429)."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


@dataclass(slots=True)
class RankStats:
    steps: int = 0
    compute_seconds: float = 0.0
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
    buckets: int
    created: float
    steps: int = 0
    step_seconds: float = 0.0
    compute_seconds: float = 0.0
    data_wait_seconds: float = 0.0
    comm_wait_seconds: float = 0.0
    tokens: int = 0
    slowest_compute_seconds: float = 0.0
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

    def export_copy(self) -> StageStats:
        """What the families read, copied (the pending-step bookkeeping is left out)."""
        copy = StageStats(self.buckets, self.created)
        for name in _STAGE_SCALARS:
            setattr(copy, name, getattr(self, name))
        copy.bucket_counts = self.bucket_counts.copy()
        copy.phase_steps = self.phase_steps.copy()
        copy.phase_seconds = self.phase_seconds.copy()
        copy.ranks = {
            rank_id: RankStats(rank.steps, rank.compute_seconds)
            for rank_id, rank in self.ranks.items()
        }
        return copy

    def finalize(self, step: int) -> None:
        self.slowest_compute_seconds += self.pending.pop(step).slowest_compute_s
        self.slowest_steps += 1
        self.finalized.add(step)
        self.finalized_order.append(step)
        if len(self.finalized_order) > _FINALIZED_MEMORY:
            self.finalized.discard(self.finalized_order.popleft())


_STAGE_SCALARS = (
    "steps",
    "step_seconds",
    "compute_seconds",
    "data_wait_seconds",
    "comm_wait_seconds",
    "tokens",
    "slowest_compute_seconds",
    "slowest_steps",
    "split_steps",
    "last_step_time",
    "last_step",
    "finished_time",
    "attempt",
    "active_ranks",
)


@dataclass(slots=True)
class CheckpointStats:
    outcomes: Counter[str] = field(default_factory=Counter)
    queue_wait_seconds: float = 0.0
    service_seconds: float = 0.0
    bytes: int = 0
    # (rank, id) -> begin time
    in_flight: dict[tuple[int, str], float] = field(default_factory=dict)

    def export_copy(self) -> CheckpointStats:
        return CheckpointStats(
            self.outcomes.copy(),
            self.queue_wait_seconds,
            self.service_seconds,
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

    def export_copy(self) -> JobState:
        return JobState(
            self.last_seen,
            {pp_stage: stage.export_copy() for pp_stage, stage in self.stages.items()},
            {op: stats.export_copy() for op, stats in self.checkpoints.items()},
            self.layout.copy(),
        )

    @property
    def layout_series(self) -> int:
        return sum(len(event.groups) for event in self.layout.values())


class TrainingAggregator(Collector):
    """Thread-safe; ``add_*`` run on the ingest path, ``collect`` on scrapes."""

    def __init__(
        self,
        node: str,
        limits: IngestLimits | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.node = node
        self.limits = limits or IngestLimits()
        self._clock = clock
        self._lock = threading.Lock()
        self._jobs: dict[str, JobState] = {}
        self._stages = 0  # (training_job, pp_stage) pairs
        self._series = 0  # training and checkpoint series exported
        self._series_per_stage = series_per_stage(self.limits.step_buckets)
        self._last_sweep = 0.0
        self._accepted: Counter[str] = Counter()
        self._rejected: Counter[str] = Counter()
        self._client_dropped = 0
        self._jobs_expired = 0

    # -- ingest -----------------------------------------------------------------

    def reject(self, reason: str, events: int) -> None:
        with self._lock:
            self._rejected[reason] += max(1, events)

    def add_steps(self, batch: StepBatch) -> None:
        now = self._clock()
        events = batch.events
        with self._lock:
            self._sweep(now)
            self._check_step_caps(batch)
            self._client_dropped += batch.dropped
            self._accepted["steps"] += len(events)
            bounds = self.limits.step_buckets
            for event in events:
                job = self._job(event.training_job, now)
                stage = self._stage(job, event.training_job, event.pp_stage)
                rank = stage.ranks.get(event.rank)
                if rank is None:
                    rank = stage.ranks[event.rank] = RankStats()
                    self._series += SERIES_PER_RANK
                    stage.active_ranks += 1
                rank.last_seen = now
                if event.attempt is not None:
                    if stage.attempt is None:
                        stage.attempt = event.attempt
                        self._series += SERIES_PER_ATTEMPT
                    elif event.attempt > stage.attempt:
                        stage.attempt = event.attempt
                if rank.finished:  # the rank runs again (a new attempt, or fit after test)
                    rank.finished = False
                    stage.finished_time = 0.0
                stage.last_step_time = now
                stage.last_step = max(stage.last_step, event.step)
                if event.phase != "train":
                    stage.phase_steps[event.phase] += 1
                    seconds = stage.phase_seconds.get(event.phase, 0.0) + event.duration_s
                    stage.phase_seconds[event.phase] = seconds
                    continue
                compute = event.compute_seconds
                stage.steps += 1
                stage.step_seconds += event.duration_s
                stage.compute_seconds += compute
                stage.data_wait_seconds += event.data_wait_s
                stage.comm_wait_seconds += event.comm_wait_s
                stage.tokens += event.tokens
                if event.timed_split:
                    stage.split_steps += 1
                stage.bucket_counts[bisect.bisect_left(bounds, event.duration_s)] += 1
                stage.phase_steps["train"] += 1
                stage.phase_seconds["train"] = (
                    stage.phase_seconds.get("train", 0.0) + event.duration_s
                )
                rank.steps += 1
                rank.compute_seconds += compute
                self._note_slowest(stage, event.step, compute, now)

    def _note_slowest(self, stage: StageStats, step: int, compute: float, now: float) -> None:
        if step in stage.finalized:
            return  # a late rank: this step's slowest figure is already counted
        pending = stage.pending.get(step)
        if pending is None:
            if len(stage.pending) >= _MAX_PENDING_STEPS:
                stage.finalize(next(iter(stage.pending)))  # the oldest waits no longer
            pending = stage.pending[step] = PendingStep(compute, now)
        elif compute > pending.slowest_compute_s:
            pending.slowest_compute_s = compute
        pending.ranks_reported += 1
        # Until the stage has run for one wait window its ranks are still being discovered
        # (rank 0 alone would look like "all ranks"): then steps complete by time only.
        warmed_up = now - stage.created >= self.limits.slowest_rank_wait_s
        if warmed_up and pending.ranks_reported >= stage.active_ranks:
            stage.finalize(step)

    def add_checkpoints(self, batch: CheckpointBatch) -> None:
        now = self._clock()
        events = batch.events
        with self._lock:
            self._sweep(now)
            self._check_checkpoint_caps(batch)
            self._client_dropped += batch.dropped
            self._accepted["checkpoints"] += len(events)
            for event in events:
                job = self._job(event.training_job, now)
                stats = job.checkpoints.get(event.op)
                if stats is None:
                    stats = job.checkpoints[event.op] = CheckpointStats()
                    self._series += SERIES_PER_CHECKPOINT_OP
                key = (event.rank, event.id)
                if event.event == "begin":
                    if len(stats.in_flight) >= _MAX_IN_FLIGHT and key not in stats.in_flight:
                        # Begins that never end (crashed ranks) must not grow without bound.
                        del stats.in_flight[next(iter(stats.in_flight))]
                        stats.outcomes["abandoned"] += 1
                    stats.in_flight[key] = now
                    continue
                stats.in_flight.pop(key, None)
                stats.outcomes["ok" if event.ok else "failed"] += 1
                stats.queue_wait_seconds += event.queue_wait_s
                stats.service_seconds += event.service_s
                stats.bytes += event.bytes

    def add_finished(self, batch: FinishedBatch) -> None:
        """Mark ranks finished. A rank the agent never saw creates nothing."""
        now = self._clock()
        with self._lock:
            self._client_dropped += batch.dropped
            self._accepted["finished"] += len(batch.events)
            for event in batch.events:
                job = self._jobs.get(event.training_job)
                stage = job.stages.get(event.pp_stage) if job else None
                rank = stage.ranks.get(event.rank) if stage else None
                if job is None or stage is None or rank is None:
                    continue
                job.last_seen = now
                rank.finished = True
                if all(r.finished for r in stage.ranks.values()):
                    stage.finished_time = now

    def add_layout(self, batch: LayoutBatch) -> None:
        """Record ranks' parallel layouts: a rank's latest replaces its earlier one, and
        one of a later attempt forgets the job's layouts of earlier attempts here."""
        now = self._clock()
        with self._lock:
            self._sweep(now)
            self._check_layout_caps(batch)
            self._client_dropped += batch.dropped
            self._accepted["layout"] += len(batch.events)
            for event in batch.events:
                job = self._job(event.training_job, now)
                layout = job.layout
                latest = max((e.attempt or 0 for e in layout.values()), default=0)
                if (event.attempt or 0) < latest:
                    continue  # a late report of an attempt that has been replaced
                if (event.attempt or 0) > latest:
                    self._series -= job.layout_series
                    layout.clear()
                previous = layout.get(event.rank)
                self._series += len(event.groups) - (len(previous.groups) if previous else 0)
                layout[event.rank] = event

    def _check_layout_caps(self, batch: LayoutBatch) -> None:
        jobs = self._jobs
        new_jobs = {e.training_job for e in batch.events if e.training_job not in jobs}
        self._check_jobs(new_jobs, len(batch.events))
        ranks: dict[str, set[int]] = {}
        attempts: dict[str, int] = {}
        for event in batch.events:
            name, attempt = event.training_job, event.attempt or 0
            if name not in ranks:
                job = jobs.get(name)
                layout = job.layout if job else {}
                ranks[name] = set(layout)
                attempts[name] = max((e.attempt or 0 for e in layout.values()), default=0)
            if attempt > attempts[name]:  # a later attempt: what is here now is forgotten
                ranks[name], attempts[name] = set(), attempt
            if attempt == attempts[name]:
                ranks[name].add(event.rank)
        for name, known in sorted(ranks.items()):
            if len(known) > self.limits.max_ranks_per_stage:
                self._refuse(
                    "rank_cap",
                    len(batch.events),
                    f"training_job {name!r} would have {len(known)} ranks' layouts on this agent "
                    f"(cap {self.limits.max_ranks_per_stage}, --max-ranks-per-stage). Is every "
                    "rank of the job sending to this node's agent?",
                )
        # at most: every event's groups new (replacements only shrink it)
        self._check_series(sum(len(e.groups) for e in batch.events), len(batch.events))

    def _job(self, name: str, now: float) -> JobState:
        job = self._jobs.get(name)
        if job is None:
            job = self._jobs[name] = JobState(last_seen=now)
        job.last_seen = now
        return job

    def _stage(self, job: JobState, name: str, pp_stage: int) -> StageStats:
        stage = job.stages.get(pp_stage)
        if stage is None:
            stage = job.stages[pp_stage] = StageStats(len(self.limits.step_buckets), self._clock())
            self._stages += 1
            self._series += self._series_per_stage
        return stage

    def _check_step_caps(self, batch: StepBatch) -> None:
        # Every cap is checked before anything changes: a batch is applied whole or not at all.
        jobs = self._jobs
        new_jobs: set[str] = set()
        new_stages: set[tuple[str, int]] = set()
        new_ranks: dict[tuple[str, int], set[int]] = {}
        new_attempts: set[tuple[str, int]] = set()  # stages whose attempt gauge appears
        for event in batch.events:
            job = jobs.get(event.training_job)
            if job is None:
                new_jobs.add(event.training_job)
            key = (event.training_job, event.pp_stage)
            stage = job.stages.get(event.pp_stage) if job is not None else None
            if stage is None:
                new_stages.add(key)
            if stage is None or event.rank not in stage.ranks:
                new_ranks.setdefault(key, set()).add(event.rank)
            if event.attempt is not None and (stage is None or stage.attempt is None):
                new_attempts.add(key)
        if not new_ranks and not new_attempts:
            return  # every event lands on series that already exist
        self._check_jobs(new_jobs, len(batch.events))
        limits = self.limits
        if self._stages + len(new_stages) > limits.max_stages:
            self._refuse(
                "stage_cap",
                len(batch.events),
                f"this agent already tracks {self._stages} (training_job, pp_stage) pairs (cap "
                f"{limits.max_stages}, --max-stages); new pair(s) {sorted(new_stages)[:3]} "
                "refused.",
            )
        for (job_name, pp_stage), ranks in sorted(new_ranks.items()):
            job = jobs.get(job_name)
            stage = job.stages.get(pp_stage) if job is not None else None
            known = len(stage.ranks) if stage is not None else 0
            if known + len(ranks) > limits.max_ranks_per_stage:
                self._refuse(
                    "rank_cap",
                    len(batch.events),
                    f"training_job {job_name!r} pp_stage {pp_stage} already has {known} ranks on "
                    f"this agent (cap {limits.max_ranks_per_stage} per stage, "
                    f"--max-ranks-per-stage); new rank(s) {sorted(ranks)[:3]} refused. Is every "
                    "rank of the job sending to this node's agent?",
                )
        added = (
            len(new_stages) * self._series_per_stage
            + SERIES_PER_RANK * sum(len(ranks) for ranks in new_ranks.values())
            + SERIES_PER_ATTEMPT * len(new_attempts)
        )
        self._check_series(added, len(batch.events))

    def _check_checkpoint_caps(self, batch: CheckpointBatch) -> None:
        jobs = self._jobs
        new_jobs: set[str] = set()
        new_ops: set[tuple[str, str]] = set()
        for event in batch.events:
            job = jobs.get(event.training_job)
            if job is None:
                new_jobs.add(event.training_job)
            if job is None or event.op not in job.checkpoints:
                new_ops.add((event.training_job, event.op))
        if not new_ops:
            return
        self._check_jobs(new_jobs, len(batch.events))
        self._check_series(SERIES_PER_CHECKPOINT_OP * len(new_ops), len(batch.events))

    def _check_jobs(self, new_jobs: set[str], events: int) -> None:
        limits = self.limits
        if len(self._jobs) + len(new_jobs) > limits.max_jobs:
            self._refuse(
                "job_cap",
                events,
                f"this agent already tracks {len(self._jobs)} training jobs (cap "
                f"{limits.max_jobs}, --max-jobs); new job(s) {sorted(new_jobs)[:3]} refused. "
                f"Jobs that stop reporting are forgotten after {limits.job_ttl_s:.0f} s.",
            )

    def _check_series(self, added: int, events: int) -> None:
        cap = self.limits.max_series
        if self._series + added > cap:
            self._refuse(
                "series_cap",
                events,
                f"this agent already exports {self._series} training series (cap {cap}, "
                f"--max-series); the batch would add {added}. Jobs that stop reporting are "
                f"forgotten after {self.limits.job_ttl_s:.0f} s.",
            )

    def _refuse(self, reason: str, events: int, message: str) -> None:
        self._rejected[reason] += events
        raise CapExceededError(reason, message)

    @property
    def series(self) -> int:
        """Training and checkpoint series exported now (what ``max_series`` bounds)."""
        return self._series

    # -- hygiene ------------------------------------------------------------------

    def sweep(self) -> None:
        with self._lock:
            self._sweep(self._clock(), force=True)

    def _sweep(self, now: float, force: bool = False) -> None:
        if not force and now - self._last_sweep < _SWEEP_EVERY_S:
            return
        self._last_sweep = now
        limits = self.limits
        for name in [n for n, job in self._jobs.items() if now - job.last_seen > limits.job_ttl_s]:
            self._forget(name)
        for job in self._jobs.values():
            for stage in job.stages.values():
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
            for stats in job.checkpoints.values():
                expired = [
                    key
                    for key, began in stats.in_flight.items()
                    if now - began > limits.checkpoint_timeout_s
                ]
                for key in expired:
                    del stats.in_flight[key]
                    stats.outcomes["abandoned"] += 1

    def _forget(self, name: str) -> None:
        job = self._jobs.pop(name)
        self._stages -= len(job.stages)
        self._series -= self._series_per_stage * len(job.stages)
        self._series -= SERIES_PER_RANK * sum(len(stage.ranks) for stage in job.stages.values())
        self._series -= SERIES_PER_ATTEMPT * sum(
            stage.attempt is not None for stage in job.stages.values()
        )
        self._series -= SERIES_PER_CHECKPOINT_OP * len(job.checkpoints)
        self._series -= job.layout_series
        self._jobs_expired += 1

    # -- exposition ---------------------------------------------------------------

    def collect(self) -> Iterator[Metric]:
        # Only the copy is made under the lock (O(series), no family objects, no text):
        # building and rendering the families happen after it, so ingest never waits on them.
        with self._lock:
            self._sweep(self._clock())
            jobs = {name: job.export_copy() for name, job in self._jobs.items()}
            counts = IngestCounts(
                Counter(self._accepted),
                Counter(self._rejected),
                self._client_dropped,
                len(self._jobs),
                self._jobs_expired,
                self._series,
            )
        yield from training_families(self.node, jobs, self.limits.step_buckets)
        yield layout_family(self.node, jobs)
        yield from counts.families()


@dataclass(frozen=True, slots=True)
class IngestCounts:
    """The ingest bookkeeping, copied out of the aggregator for one scrape."""

    accepted: Counter[str]
    rejected: Counter[str]
    client_dropped: int
    jobs: int
    jobs_expired: int
    series: int

    def families(self) -> Iterable[Metric]:
        accepted = agent_schema.INGEST_ACCEPTED.counter()
        for kind in agent_schema.INGEST_KINDS:
            accepted.add_metric([kind], self.accepted.get(kind, 0))
        rejected = agent_schema.INGEST_REJECTED.counter()
        for reason, count in sorted(self.rejected.items()):
            rejected.add_metric([reason], count)
        dropped = agent_schema.INGEST_CLIENT_DROPPED.counter()
        dropped.add_metric([], self.client_dropped)
        jobs = agent_schema.INGEST_JOBS.gauge()
        jobs.add_metric([], self.jobs)
        series = agent_schema.INGEST_SERIES.gauge()
        series.add_metric([], self.series)
        expired = agent_schema.INGEST_JOBS_EXPIRED.counter()
        expired.add_metric([], self.jobs_expired)
        yield from (accepted, rejected, dropped, jobs, series, expired)


def training_families(
    node: str, jobs: Mapping[str, JobView], step_buckets: Sequence[float] = DEFAULT_STEP_BUCKETS
) -> Iterable[Metric]:
    """The training and checkpoint families for one node's jobs.

    Shared by the agent's aggregator and the simulator, so a simulated node
    exposes exactly what a real agent does.
    """
    steps = ts.STEPS.counter()
    step_s = ts.STEP_SECONDS.counter()
    compute_s = ts.COMPUTE_SECONDS.counter()
    data_s = ts.DATA_WAIT_SECONDS.counter()
    comm_s = ts.COLLECTIVE_WAIT_SECONDS.counter()
    tokens = ts.TOKENS.counter()
    slow_s = ts.SLOWEST_RANK_COMPUTE_SECONDS.counter()
    slow_n = ts.SLOWEST_RANK_STEPS.counter()
    split_n = ts.SPLIT_STEPS.counter()
    histogram = ts.STEP_DURATION.histogram()
    last_ts = ts.LAST_STEP_TIMESTAMP.gauge()
    last_step = ts.STEP_NUMBER.gauge()
    ranks = ts.RANKS.gauge()
    finished = ts.FINISHED_TIMESTAMP.gauge()
    attempt = ts.ATTEMPT.gauge()
    phase_n = ts.PHASE_STEPS.counter()
    phase_s = ts.PHASE_SECONDS.counter()
    rank_compute = ts.RANK_COMPUTE_SECONDS.counter()
    rank_steps = ts.RANK_STEPS.counter()
    bounds = [*(str(b) for b in step_buckets), "+Inf"]
    for job_name, job in sorted(jobs.items()):
        for pp_stage, stage in sorted(job.stages.items()):
            labels = [job_name, node, str(pp_stage)]
            steps.add_metric(labels, stage.steps)
            step_s.add_metric(labels, stage.step_seconds)
            compute_s.add_metric(labels, stage.compute_seconds)
            data_s.add_metric(labels, stage.data_wait_seconds)
            comm_s.add_metric(labels, stage.comm_wait_seconds)
            tokens.add_metric(labels, stage.tokens)
            slow_s.add_metric(labels, stage.slowest_compute_seconds)
            slow_n.add_metric(labels, stage.slowest_steps)
            split_n.add_metric(labels, stage.split_steps)
            cumulative, running = [], 0
            for bound, count in zip(bounds, stage.bucket_counts, strict=True):
                running += count
                cumulative.append((bound, float(running)))
            histogram.add_metric(labels, cumulative, stage.step_seconds)
            last_ts.add_metric(labels, stage.last_step_time)
            last_step.add_metric(labels, stage.last_step)
            ranks.add_metric(labels, stage.active_ranks)
            finished.add_metric(labels, stage.finished_time)
            if stage.attempt is not None:
                attempt.add_metric(labels, stage.attempt)
            for phase in ts.PHASES:
                phase_n.add_metric([*labels, phase], stage.phase_steps.get(phase, 0))
                phase_s.add_metric([*labels, phase], stage.phase_seconds.get(phase, 0.0))
            for rank_id, rank in sorted(stage.ranks.items()):
                rank_compute.add_metric([*labels, str(rank_id)], rank.compute_seconds)
                rank_steps.add_metric([*labels, str(rank_id)], rank.steps)
    yield from (steps, step_s, compute_s, data_s, comm_s, tokens, slow_s, slow_n, split_n)
    yield histogram
    yield from (last_ts, last_step, ranks, finished, attempt)
    yield from (phase_n, phase_s, rank_compute, rank_steps)
    yield from _checkpoint_families(node, jobs)


def _checkpoint_families(node: str, jobs: Mapping[str, JobView]) -> Iterable[Metric]:
    operations = ts.CHECKPOINT_OPERATIONS.counter()
    queue = ts.CHECKPOINT_QUEUE_WAIT_SECONDS.counter()
    service = ts.CHECKPOINT_SERVICE_SECONDS.counter()
    size = ts.CHECKPOINT_BYTES.counter()
    in_flight = ts.CHECKPOINT_IN_FLIGHT.gauge()
    for job_name, job in sorted(jobs.items()):
        for op, stats in sorted(job.checkpoints.items()):
            key = [job_name, node, op]
            for outcome in ts.CHECKPOINT_OUTCOMES:
                operations.add_metric([*key, outcome], stats.outcomes.get(outcome, 0))
            queue.add_metric(key, stats.queue_wait_seconds)
            service.add_metric(key, stats.service_seconds)
            size.add_metric(key, stats.bytes)
            in_flight.add_metric(key, len(stats.in_flight))
    yield from (operations, queue, service, size, in_flight)


def layout_family(node: str, jobs: Mapping[str, JobState]) -> Metric:
    """One series per local rank and parallel group, its value the group's size."""
    sizes = ts.PARALLEL_GROUP_SIZE.gauge()
    for job_name, job in sorted(jobs.items()):
        for rank, event in sorted(job.layout.items()):
            attempt = "" if event.attempt is None else str(event.attempt)
            for group in event.groups:
                labels = [
                    job_name,
                    node,
                    str(rank),
                    attempt,
                    group.group,
                    str(group.group_first_rank),
                    str(group.group_rank),
                    event.nvlink_domain or "",
                ]
                sizes.add_metric(labels, group.size)
    return sizes
