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
lock and builds its families after releasing it (``training_render``).
"""

from __future__ import annotations

import bisect
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator

from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

from gpufleet.agent.limits import IngestLimits
from gpufleet.agent.training_events import (
    CheckpointBatch,
    FinishedBatch,
    LayoutBatch,
    StepBatch,
)
from gpufleet.agent.training_render import IngestCounts, layout_family, training_families
from gpufleet.agent.training_state import (
    SERIES_PER_ATTEMPT,
    SERIES_PER_CHECKPOINT_OP,
    SERIES_PER_RANK,
    CheckpointStats,
    JobState,
    PendingStep,
    RankStats,
    StageStats,
    series_per_stage,
)

_SWEEP_EVERY_S = 5.0
_MAX_IN_FLIGHT = 1024  # per job and op (a node has a few ranks; each has one or two open)
_MAX_PENDING_STEPS = 1024  # per stage: memory stays bounded however fast steps arrive


class CapExceededError(Exception):
    """Accepting the batch would exceed a cardinality cap (HTTP 429)."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


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
                stage.duration_s += event.duration_s
                stage.compute_s += compute
                stage.data_wait_s += event.data_wait_s
                stage.comm_wait_s += event.comm_wait_s
                stage.tokens += event.tokens
                if event.timed_split:
                    stage.split_steps += 1
                stage.bucket_counts[bisect.bisect_left(bounds, event.duration_s)] += 1
                stage.phase_steps["train"] += 1
                stage.phase_seconds["train"] = (
                    stage.phase_seconds.get("train", 0.0) + event.duration_s
                )
                rank.steps += 1
                rank.compute_s += compute
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
                stats.queue_wait_s += event.queue_wait_s
                stats.service_s += event.service_s
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
            job.expire(now, limits)

    def _forget(self, name: str) -> None:
        job = self._jobs.pop(name)
        self._stages -= len(job.stages)
        self._series -= self._series_per_stage * len(job.stages) + job.series
        self._jobs_expired += 1

    # -- exposition ---------------------------------------------------------------

    def collect(self) -> Iterator[Metric]:
        # Only the copy is made under the lock (O(series), no family objects, no text):
        # building and rendering the families happen after it, so ingest never waits on them.
        with self._lock:
            self._sweep(self._clock())
            jobs = {name: job.counts() for name, job in self._jobs.items()}
            layouts = {name: job.layout.copy() for name, job in self._jobs.items()}
            counts = IngestCounts(
                Counter(self._accepted),
                Counter(self._rejected),
                self._client_dropped,
                len(self._jobs),
                self._jobs_expired,
                self._series,
            )
        yield from training_families(self.node, jobs, self.limits.step_buckets)
        yield layout_family(self.node, layouts)
        yield from counts.families()
