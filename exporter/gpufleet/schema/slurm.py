"""``gpufleet slurm-watch``'s report on itself (its own /metrics, beside slurmctld)."""

from __future__ import annotations

from gpufleet.schema.family import MetricDef

POLLS = MetricDef(
    "gpufleet_slurm_watch_polls_total",
    "counter",
    "Polls of Slurm (sinfo --json and squeue --json), each one counted once.",
)
POLL_ERRORS = MetricDef(
    "gpufleet_slurm_watch_poll_errors_total",
    "counter",
    "Slurm commands that failed or answered what could not be read, by command "
    "(sinfo, squeue, scontrol).",
    ("command",),
)
CHANGES = MetricDef(
    "gpufleet_slurm_watch_changes_total",
    "counter",
    "Changes seen in Slurm, each queued once for the ledger: exclude (a node drained, down or "
    "failed), release (back in service), started / ended (a job attempt).",
    ("action",),
)
SKIPPED = MetricDef(
    "gpufleet_slurm_watch_skipped_total",
    "counter",
    "Changes not sent because they are older than the ledger keeps idempotency keys and the "
    "watcher's state does not say whether they were sent (sending could count them twice).",
    ("action",),
)
WRITES = MetricDef(
    "gpufleet_slurm_watch_ledger_writes_total",
    "counter",
    "Ledger answers to the watcher's writes: stored, replayed (the key was already used for "
    "it), conflict (already so: 409), refused (another 4xx, not retried), failed (not "
    "reached or a 5xx: retried with its key).",
    ("action", "outcome"),
)
PENDING = MetricDef(
    "gpufleet_slurm_watch_ledger_pending",
    "gauge",
    "Writes queued for the ledger, not yet answered.",
)
NODES = MetricDef("gpufleet_slurm_watch_nodes", "gauge", "Nodes Slurm listed at the last poll.")
OUT_OF_SERVICE = MetricDef(
    "gpufleet_slurm_watch_nodes_out_of_service",
    "gauge",
    "Nodes drained, draining, down or failed at the last poll.",
)
UP = MetricDef(
    "gpufleet_slurm_watch_up", "gauge", "1 when the last poll of Slurm succeeded, else 0."
)
LAST_POLL = MetricDef(
    "gpufleet_slurm_watch_last_poll_timestamp_seconds",
    "gauge",
    "When Slurm was last polled successfully (Unix time).",
)
SLURM_WATCH_FAMILIES = (
    POLLS, POLL_ERRORS, CHANGES, SKIPPED, WRITES, PENDING, NODES, OUT_OF_SERVICE, UP, LAST_POLL,
)  # fmt: skip
