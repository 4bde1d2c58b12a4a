"""Reliability rules from the fleet ledger: repeat offenders, exclusion concentration,
MTBF, failing retry chains, the ledger's own presence."""

from __future__ import annotations

from gpufleet.rules.common import Alert, Group, Record, metric
from gpufleet.rules.config import RulesConfig
from gpufleet.rules.node import presence_note, targets_missing, targets_record


def reliability_groups(config: RulesConfig) -> list[Group]:
    sel = config.fleet_selector
    exclusions = metric("gpufleet_fleet_node_exclusions_total", sel)
    failed = metric("gpufleet_fleet_job_attempts_total", sel, 'outcome="failed"')

    def since(series: str, window: str) -> str:
        # Series the ledger creates at the first event count in full.
        return f"({series} - ({series} offset {window} or {series} * 0))"

    week, month = config.repeat_offender_window, "30d"
    records: list[Record | Alert] = [
        Record(
            f"node:gpufleet_fleet_exclusions:increase{week}",
            f"sum by (node) {since(exclusions, week)}",
        ),
        Record(
            f"node:gpufleet_fleet_exclusions:increase{month}",
            f"sum by (node) {since(exclusions, month)}",
        ),
        Record(
            f"fleet:gpufleet_fleet_exclusions:increase{month}",
            f"sum(node:gpufleet_fleet_exclusions:increase{month})",
        ),
        Record(
            f"fleet:gpufleet_fleet_exclusions:top3_share{month}",
            f"sum(topk(3, node:gpufleet_fleet_exclusions:increase{month}))\n/ fleet:gpufleet_fleet_exclusions:increase{month}",
        ),
        Record(
            f"fleet:gpufleet_node_mtbf_hours:{month}",
            f"count(max by (instance) ({metric('up', config.agent_selector)})) * 720\n/ fleet:gpufleet_fleet_exclusions:increase{month}",
        ),
        Record(
            f"job:gpufleet_job_mtbf_hours:{month}",
            f"720 / sum by (training_job) {since(failed, month)}",
        ),
        Record(
            f"job:gpufleet_checkpoint_interval_young_daly_seconds:{month}",
            f'sqrt(2 * job:gpufleet_checkpoint_seconds_per_op:rate1d{{op="save"}}\n'
            f"  * on (training_job) group_left job:gpufleet_job_mtbf_hours:{month} * 3600)",
        ),
    ]
    fleet_up = metric("up", sel)
    if config.ledger_presence == "seen":
        records.append(Record(targets_record("ledger"), f"count({fleet_up})"))
    ledger_missing = targets_missing(config, "ledger", sel)
    alerts: list[Record | Alert] = [
        Alert(
            "GpuFleetRepeatOffenderNode",
            f"node:gpufleet_fleet_exclusions:increase{week} >= {config.repeat_offender_exclusions}",
            "warning",
            "A node was excluded repeatedly within a week.",
            f"{{{{ $labels.node }}}} was excluded {{{{ $value }}}} times in {week}: failures concentrate "
            "on a few nodes. Take it out for a full diagnostic (dcgmi diag -r 3) or RMA before it "
            "returns to jobs.",
        ),
        Alert(
            "GpuFleetExclusionConcentration",
            f"fleet:gpufleet_fleet_exclusions:top3_share{month} > {config.concentration_share}\n"
            f"and on () fleet:gpufleet_fleet_exclusions:increase{month} >= {config.concentration_min_exclusions}",
            "info",
            "A few nodes cause most of the fleet's exclusions.",
            f"The top 3 nodes caused {{{{ $value | humanizePercentage }}}} of all exclusions in {month}: "
            "fixing or retiring them is the cheapest reliability win. See gpufleet exclusions top.",
        ),
        Alert(
            "GpuFleetRetryChainFailing",
            f"max by (training_job) ({metric('gpufleet_fleet_retry_chain_failed_attempts', sel)})"
            f" >= {config.retry_chain_failed_attempts}",
            "critical",
            "Automatic retries of a job keep failing.",
            "Job {{ $labels.training_job }} failed {{ $value }} automatic retries in a row: the "
            "retry loop is not recovering it. Find the node or change that breaks it, then restart by hand.",
        ),
        Alert(
            "GpuFleetLedgerDown",
            f"{fleet_up} == 0",
            "warning",
            "The fleet ledger does not answer.",
            "The fleet ledger ({{ $labels.instance }}) has not answered for "
            f"{config.ledger_down_for}: exclusions and job attempts are not being recorded.",
            config.ledger_down_for,
        ),
    ]
    if ledger_missing is not None:
        alerts.append(
            Alert(
                "GpuFleetLedgerTargetMissing",
                ledger_missing,
                "warning",
                "Prometheus scrapes no fleet ledger.",
                f"No target of {sel} has been scraped for {config.targets_missing_for}. "
                f"{presence_note(config, 'ledger')} Reliability alerts (repeat offenders, "
                "failing retries) cannot fire ({{ $value }} target(s) before).",
                config.targets_missing_for,
            )
        )
    return [
        Group("gpufleet-reliability-recording", records),
        Group("gpufleet-reliability-alerts", alerts),
    ]
