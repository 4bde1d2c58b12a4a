"""The agent's families about itself: ingest bookkeeping, collector health, scrape cost."""

from __future__ import annotations

from gpufleet.schema.family import MetricDef

# -- ingest (the training aggregator's own counts) ------------------------------------

INGEST_ACCEPTED = MetricDef(
    "gpufleet_ingest_accepted_events_total",
    "counter",
    "Events accepted by the ingest API.",
    ("kind",),
)
INGEST_REJECTED = MetricDef(
    "gpufleet_ingest_rejected_total",
    "counter",
    "Events (or requests, when no event could be read) rejected, by reason.",
    ("reason",),
)
INGEST_CLIENT_DROPPED = MetricDef(
    "gpufleet_ingest_client_dropped_total",
    "counter",
    "Events clients reported dropping before they could send them (buffer full, "
    "agent unreachable).",
)
INGEST_JOBS = MetricDef("gpufleet_ingest_jobs", "gauge", "Training jobs this agent tracks.")
INGEST_SERIES = MetricDef(
    "gpufleet_ingest_series",
    "gauge",
    "Training and checkpoint series this agent exports (bounded by --max-series).",
)
INGEST_JOBS_EXPIRED = MetricDef(
    "gpufleet_ingest_jobs_expired_total",
    "counter",
    "Training jobs forgotten because they stopped reporting for the TTL.",
)
INGEST_KINDS = ("steps", "checkpoints", "finished", "layout")

# -- self-metrics -------------------------------------------------------------------

AGENT_INFO = MetricDef(
    "gpufleet_agent_info",
    "gauge",
    "The agent's version, node name and GPU source; the value is always 1.",
    ("version", "node", "gpu_source"),
)
AGENT_START_TIME = MetricDef(
    "gpufleet_agent_start_time_seconds",
    "gauge",
    "Unix time the agent started: its XID counters count from here, so a rule can tell "
    "a restarted agent's counter from one that kept counting.",
)
COLLECTOR_ERRORS = MetricDef(
    "gpufleet_collector_errors_total",
    "counter",
    "Failed calls per collector and NVML call (a hung call counts once).",
    ("collector", "call"),
)
COLLECTOR_UP = MetricDef(
    "gpufleet_collector_up",
    "gauge",
    "1 if the collector's last snapshot is fresh enough to be served.",
    ("collector",),
)
COLLECTOR_CYCLES = MetricDef(
    "gpufleet_collector_cycles_total", "counter", "Completed collection cycles.", ("collector",)
)
COLLECTOR_SNAPSHOT_AGE = MetricDef(
    "gpufleet_collector_snapshot_age_seconds",
    "gauge",
    "Seconds since the collector's last snapshot was taken.",
    ("collector",),
)
COLLECTOR_DURATION = MetricDef(
    "gpufleet_collector_duration_seconds",
    "gauge",
    "Duration of the collector's last cycle.",
    ("collector",),
)
COLLECTOR_HUNG = MetricDef(
    "gpufleet_collector_hung",
    "gauge",
    "1 while an NVML call has not returned within the call timeout.",
    ("collector",),
)
SCRAPE_DURATION = MetricDef(
    "gpufleet_scrape_duration_seconds", "summary", "Time spent rendering /metrics."
)
CONNECTIONS = MetricDef(
    "gpufleet_agent_connections", "gauge", "HTTP connections open to the agent."
)
CONNECTIONS_CLOSED = MetricDef(
    "gpufleet_agent_connections_closed_total",
    "counter",
    "Connections the agent cut: header_timeout, body_timeout, header_too_large, "
    "evicted (oldest idle one, to make room), over_limit.",
    ("reason",),
)

# -- job attempt events relayed to the fleet ledger ----------------------------------

ATTEMPT_EVENTS = MetricDef(
    "gpufleet_agent_attempt_events_total",
    "counter",
    "Job attempt events from training ranks, by what became of them: received, forwarded "
    "(the ledger stored it), duplicate (already queued here, or the ledger holds its key), "
    "refused (the ledger answered another 4xx), failed (the ledger could not be written in "
    "time), dropped (queue full), unforwarded (no --ledger-url).",
    ("outcome",),
)
ATTEMPT_REFUSALS = MetricDef(
    "gpufleet_agent_attempt_refusals_total",
    "counter",
    "Job attempt events the ledger refused, by reason (unauthorized, forbidden, invalid, "
    "ledger_cap, ...).",
    ("reason",),
)
ATTEMPT_QUEUE = MetricDef(
    "gpufleet_agent_attempt_queue",
    "gauge",
    "Job attempt events waiting to be written to the fleet ledger.",
)
POD_RESOURCES_REFRESHES = MetricDef(
    "gpufleet_agent_pod_resources_refreshes_total",
    "counter",
    "Calls to the kubelet's pod-resources List (pod attribution), by outcome: ok, error "
    "(socket missing, refused, a bad answer) or timeout.",
    ("outcome",),
)
POD_RESOURCES_LAST_SUCCESS = MetricDef(
    "gpufleet_agent_pod_resources_last_success_timestamp_seconds",
    "gauge",
    "Unix time of the last successful pod-resources List (absent until the first).",
)

INGEST_FAMILIES = (
    INGEST_ACCEPTED,
    INGEST_REJECTED,
    INGEST_CLIENT_DROPPED,
    INGEST_JOBS,
    INGEST_SERIES,
    INGEST_JOBS_EXPIRED,
)
SELF_FAMILIES = (
    AGENT_INFO,
    AGENT_START_TIME,
    COLLECTOR_ERRORS,
    COLLECTOR_UP,
    COLLECTOR_CYCLES,
    COLLECTOR_SNAPSHOT_AGE,
    COLLECTOR_DURATION,
    COLLECTOR_HUNG,
    SCRAPE_DURATION,
    CONNECTIONS,
    CONNECTIONS_CLOSED,
    ATTEMPT_EVENTS,
    ATTEMPT_REFUSALS,
    ATTEMPT_QUEUE,
    POD_RESOURCES_REFRESHES,
    POD_RESOURCES_LAST_SUCCESS,
)
