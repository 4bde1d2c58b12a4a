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
    "Failed automatic attempts in the job's open retry chain (0 when none is open).",
    ("training_job",),
)
WRITES_REJECTED = MetricDef(
    "gpufleet_fleet_writes_rejected_total",
    "counter",
    "Writes the ledger refused, by reason (unauthorized, not_loopback, bad_key, "
    "too_large, invalid, conflict, node_cap, training_job_cap, reason_cap, "
    "exclusion_series_cap, unavailable).",
    ("reason",),
)
LABEL_VALUES = MetricDef(
    "gpufleet_fleet_label_values",
    "gauge",
    "Distinct values of each capped label the ledger exports (they are never forgotten).",
    ("label",),
)
LABEL_VALUES_LIMIT = MetricDef(
    "gpufleet_fleet_label_values_limit",
    "gauge",
    "The cap on distinct values of each label; a write beyond it is refused (429).",
    ("label",),
)
INCIDENTS = MetricDef(
    "gpufleet_fleet_incidents_total",
    "counter",
    "Pages recorded as incidents (critical alerts of a node, from Alertmanager's webhook), "
    "by alert name; one per alert however often Alertmanager re-sent it. Alert names past "
    "the 64th are counted under alertname=\"_other\".",
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
    EXCLUDED,
    EXCLUDED_NODES,
    ATTEMPTS,
    DOWNTIME,
    CHAINS,
    CHAIN_FAILURES,
    WRITES_REJECTED,
    LABEL_VALUES,
    LABEL_VALUES_LIMIT,
    INCIDENTS,
    WEBHOOK_ALERTS_IGNORED,
)
