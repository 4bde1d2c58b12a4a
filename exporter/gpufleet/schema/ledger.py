"""The fleet ledger's families: the counters the reliability rules read, and its self-report."""

from __future__ import annotations

from gpufleet.schema.family import MetricDef

EXCLUSIONS = MetricDef(
    "gpufleet_fleet_node_exclusions_total",
    "counter",
    "Node exclusions recorded in the ledger, by node, reason and source (the system that "
    "wrote it: torchrun, slurm, kubernetes, alertmanager, auto, manual).",
    ("node", "reason", "source"),
)
EXCLUDED = MetricDef(
    "gpufleet_fleet_node_excluded",
    "gauge",
    "1 for each node currently excluded from service.",
    ("node",),
)
EXCLUDED_NODES = MetricDef(
    "gpufleet_fleet_excluded_nodes", "gauge", "Nodes currently excluded from service."
)
ATTEMPTS = MetricDef(
    "gpufleet_fleet_job_attempts_total",
    "counter",
    "Job attempts by trigger (initial, auto, manual), outcome "
    "(success, failed, cancelled, running) and source (the system that reported it).",
    ("training_job", "trigger", "outcome", "source"),
)
DOWNTIME = MetricDef(
    "gpufleet_fleet_recovery_downtime_seconds",
    "histogram",
    "Recovery downtime: from a failed attempt's end to the next attempt's first step, "
    "by the next attempt's trigger.",
    ("training_job", "trigger"),
)
CHAINS = MetricDef(
    "gpufleet_fleet_retry_chains_total",
    "counter",
    "Closed retry chains (automatic attempts after a failure) by outcome: recovered, "
    "manual (a person stepped in), abandoned.",
    ("training_job", "outcome"),
)
CHAIN_FAILURES = MetricDef(
    "gpufleet_fleet_retry_chain_failed_attempts",
    "gauge",
    "Failed automatic attempts in the job's open retry chain, or in the chain its launcher "
    "gave up on until the job starts again (0 when neither).",
    ("training_job",),
)


def _created(counter: MetricDef) -> MetricDef:
    """A ledger counter's ``_created`` sample, as Prometheus stores it (a gauge): when the
    counter's exposition epoch began, in Unix seconds. The rules compare it across their
    window, so a series that left /metrics and came back counts from its return."""
    name = counter.name.removesuffix("_total") + "_created"
    return MetricDef(name, "gauge", counter.help, counter.labels)


EXCLUSIONS_CREATED = _created(EXCLUSIONS)
ATTEMPTS_CREATED = _created(ATTEMPTS)
CHAINS_CREATED = _created(CHAINS)
WRITES_REJECTED = MetricDef(
    "gpufleet_fleet_writes_rejected_total",
    "counter",
    "Writes the ledger refused, by reason (unauthorized, not_loopback, bad_key, "
    "too_large, invalid, conflict, unavailable).",
    ("reason",),
)
EXPOSITION_ENTRIES = MetricDef(
    "gpufleet_fleet_exposition_entries",
    "gauge",
    "What /metrics exports now, by kind: exclusion_series ((node, reason, source) series "
    "changed within the retention), excluded_node, training_job (jobs written within the "
    "retention or running). The ledger stores and answers every event, exported or not.",
    ("kind",),
)
EXPOSITION_LIMIT = MetricDef(
    "gpufleet_fleet_exposition_entries_limit",
    "gauge",
    "The cap on exported entries of each kind (the most recently changed are exported).",
    ("kind",),
)
EXPOSITION_LEFT_OUT = MetricDef(
    "gpufleet_fleet_exposition_left_out",
    "gauge",
    "Entries within the retention that the cap left out of /metrics, by kind; the rules "
    "under-count them (never over-count). Non-zero: raise the cap (--max-exclusion-series, "
    "--max-nodes, --max-training-jobs).",
    ("kind",),
)
INCIDENTS = MetricDef(
    "gpufleet_fleet_incidents_total",
    "counter",
    "Pages recorded as incidents (critical alerts of a node, from Alertmanager's webhook), "
    "by alert name; one per alert however often Alertmanager re-sent it. Alert names past "
    'the 64th are counted under alertname="_other".',
    ("alertname",),
)
WEBHOOK_ALERTS_IGNORED = MetricDef(
    "gpufleet_fleet_webhook_alerts_ignored_total",
    "counter",
    "Alerts in Alertmanager notifications the ledger did not record, by reason: not_a_page "
    "(not of a paging severity, or no node label), invalid (a node, alert name or job it "
    "cannot store as sent).",
    ("reason",),
)

LEDGER_FAMILIES = (
    EXCLUSIONS,
    EXCLUSIONS_CREATED,
    ATTEMPTS_CREATED,
    CHAINS_CREATED,
    EXCLUDED,
    EXCLUDED_NODES,
    ATTEMPTS,
    DOWNTIME,
    CHAINS,
    CHAIN_FAILURES,
    WRITES_REJECTED,
    EXPOSITION_ENTRIES,
    EXPOSITION_LIMIT,
    EXPOSITION_LEFT_OUT,
    INCIDENTS,
    WEBHOOK_ALERTS_IGNORED,
)
