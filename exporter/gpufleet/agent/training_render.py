"""The training, checkpoint, layout and ingest families of one node, rendered from
counts: shared by the agent's aggregator and the simulator, so a simulated node exposes
exactly what a real agent does."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from prometheus_client.metrics_core import Metric

from gpufleet.agent.limits import DEFAULT_STEP_BUCKETS
from gpufleet.agent.training_events import LayoutEvent
from gpufleet.agent.training_view import JobCounts
from gpufleet.schema import agent as agent_schema
from gpufleet.schema import training as ts


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
    node: str, jobs: Mapping[str, JobCounts], step_buckets: Sequence[float] = DEFAULT_STEP_BUCKETS
) -> Iterable[Metric]:
    """The training and checkpoint families for one node's jobs."""
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
            step_s.add_metric(labels, stage.duration_s)
            compute_s.add_metric(labels, stage.compute_s)
            data_s.add_metric(labels, stage.data_wait_s)
            comm_s.add_metric(labels, stage.comm_wait_s)
            tokens.add_metric(labels, stage.tokens)
            slow_s.add_metric(labels, stage.slowest_compute_s)
            slow_n.add_metric(labels, stage.slowest_steps)
            split_n.add_metric(labels, stage.split_steps)
            cumulative, running = [], 0
            for bound, count in zip(bounds, stage.bucket_counts, strict=True):
                running += count
                cumulative.append((bound, float(running)))
            histogram.add_metric(labels, cumulative, stage.duration_s)
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
                rank_compute.add_metric([*labels, str(rank_id)], rank.compute_s)
                rank_steps.add_metric([*labels, str(rank_id)], rank.steps)
    yield from (steps, step_s, compute_s, data_s, comm_s, tokens, slow_s, slow_n, split_n)
    yield histogram
    yield from (last_ts, last_step, ranks, finished, attempt)
    yield from (phase_n, phase_s, rank_compute, rank_steps)
    yield from _checkpoint_families(node, jobs)


def _checkpoint_families(node: str, jobs: Mapping[str, JobCounts]) -> Iterable[Metric]:
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
            queue.add_metric(key, stats.queue_wait_s)
            service.add_metric(key, stats.service_s)
            size.add_metric(key, stats.bytes)
            in_flight.add_metric(key, len(stats.in_flight))
    yield from (operations, queue, service, size, in_flight)


def layout_family(node: str, layouts: Mapping[str, Mapping[int, LayoutEvent]]) -> Metric:
    """One series per local rank and parallel group, its value the group's size."""
    sizes = ts.PARALLEL_GROUP_SIZE.gauge()
    for job_name, layout in sorted(layouts.items()):
        for rank, event in sorted(layout.items()):
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
