"""What one agent accepts: its ingest limits and its HTTP connection limits.

Standard library only, so that the CLI takes its defaults from here (``gpufleet agent
--help`` runs in a bare install, without the agent's extra).
"""

from __future__ import annotations

from dataclasses import dataclass

from gpufleet.reporter.wire import MAX_BATCH_EVENTS

DEFAULT_STEP_BUCKETS = (0.25, 0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0)


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
    # What the client sends at most per request; its largest such batch is 1.77 MiB
    # (a test measures it), hence 2 MiB.
    max_batch_events: int = MAX_BATCH_EVENTS
    max_body_bytes: int = 2 * 1024 * 1024
    # Requests read and parsed at once (503 beyond, which the client retries): memory for
    # bodies stays below this many times max_body_bytes however many connections send.
    max_concurrent_requests: int = 16
    rank_window_s: float = 120.0
    slowest_rank_wait_s: float = 10.0
    checkpoint_timeout_s: float = 6 * 3600.0
    step_buckets: tuple[float, ...] = DEFAULT_STEP_BUCKETS


@dataclass(frozen=True, slots=True)
class ConnectionLimits:
    """The agent's HTTP server's limits (``gpufleet.agent.connections``)."""

    max_connections: int = 512
    # One client address (a flood's) never holds more; a node's ranks need one each.
    max_connections_per_client: int = 64
    header_timeout_s: float = 10.0
    body_timeout_s: float = 30.0
    max_header_bytes: int = 16 * 1024
    keep_alive_s: float = 15.0  # longer than Prometheus's usual interval is not needed
