"""Reliability rules from the fleet ledger: repeat offenders, exclusion concentration,
MTBF, failing retry chains, the ledger's own presence."""

from __future__ import annotations

from dataclasses import dataclass

from gpufleet.rules.checkpoint import CheckpointSeries
from gpufleet.rules.common import Alert, Record, RuleGroup, SeriesNames, metric
from gpufleet.rules.config import RulesConfig
from gpufleet.rules.inline import duration_seconds
from gpufleet.rules.presence import presence_note, targets_missing, targets_record
from gpufleet.schema import ledger
from gpufleet.schema.alerts import AlertName


@dataclass(frozen=True, slots=True)
class ReliabilitySeries(SeriesNames):
    """What reliability.rules.yaml records, each named once here: the reliability alerts
    and the dashboards refer to these."""

    # exclusions per node within repeat_offender_window, then within reliability_window
    node_exclusions_recent: str = "node:gpufleet_fleet_exclusions:increase{repeat_offender_window}"
    node_exclusions: str = "node:gpufleet_fleet_exclusions:increase{reliability_window}"
    fleet_exclusions: str = "fleet:gpufleet_fleet_exclusions:increase{reliability_window}"
    # the top concentration_top_nodes nodes' share of them
    top_share: str = (
        "fleet:gpufleet_fleet_exclusions:top{concentration_top_nodes}_share{reliability_window}"
    )
    # hours between failures; Young/Daly's checkpoint interval per job, in seconds
    node_mtbf: str = "fleet:gpufleet_node_mtbf_hours:{reliability_window}"
    job_mtbf: str = "job:gpufleet_job_mtbf_hours:{reliability_window}"
    young_daly: str = "job:gpufleet_checkpoint_interval_young_daly_seconds:{reliability_window}"


def reliability_groups(config: RulesConfig) -> list[RuleGroup]:
    sel = config.fleet_selector
    exclusions = metric(ledger.EXCLUSIONS.name, sel), metric(ledger.EXCLUSIONS_CREATED.name, sel)
    failed = (
        metric(ledger.ATTEMPTS.name, sel, 'outcome="failed"'),
        metric(ledger.ATTEMPTS_CREATED.name, sel, 'outcome="failed"'),
    )

    def since(counter: tuple[str, str], window: str) -> str:
        # The counter's increase within the window. The ledger exports a series while it
        # changed recently, each in an exposition epoch (its _created, fleet/counters.py):
        # the value `window` ago is subtracted when it is of the same epoch (or from a ledger
        # that exports no _created), else the epoch began within the window and counts in
        # full, as a series seen for the first time does.
        series, created = counter
        before = f"{series} offset {window}"
        same_epoch = (
            f"({before} unless {created} offset {window})\n"
            f"  or ({before} and {created} offset {window} == {created})"
        )
        return f"({series} - (\n  {same_epoch}\n  or {series} * 0\n))"

    week, month = config.repeat_offender_window, config.reliability_window
    series = ReliabilitySeries.of(config)
    hours = f"{duration_seconds(month) / 3600:g}"
    top = config.concentration_top_nodes
    records: list[Record | Alert] = [
        Record(
            series.node_exclusions_recent,
            f"sum by (node) {since(exclusions, week)}",
        ),
        Record(
            series.node_exclusions,
            f"sum by (node) {since(exclusions, month)}",
        ),
        Record(
            series.fleet_exclusions,
            f"sum({series.node_exclusions})",
        ),
        Record(
            series.top_share,
            f"sum(topk({top}, {series.node_exclusions}))\n/ {series.fleet_exclusions}",
        ),
        Record(
            series.node_mtbf,
            f"count(max by (instance) ({metric('up', config.agent_selector)})) * {hours}\n/ {series.fleet_exclusions}",
        ),
        Record(
            series.job_mtbf,
            f"{hours} / sum by (training_job) {since(failed, month)}",
        ),
        Record(
            series.young_daly,
            f'sqrt(2 * {CheckpointSeries.of(config).seconds_per_op_daly}{{op="save"}}\n'
            f"  * on (training_job) group_left {series.job_mtbf} * 3600)",
        ),
    ]
    fleet_up = metric("up", sel)
    if config.ledger_presence == "seen":
        records.append(Record(targets_record("ledger"), f"count({fleet_up})"))
    ledger_missing = targets_missing(config, "ledger", sel)
    alerts: list[Record | Alert] = [
        Alert(
            AlertName.REPEAT_OFFENDER_NODE,
            f"{series.node_exclusions_recent} >= {config.repeat_offender_exclusions}",
            "warning",
            "A node was excluded repeatedly within a week.",
            f"{{{{ $labels.node }}}} was excluded {{{{ $value }}}} times in {week}: failures concentrate "
            "on a few nodes. Take it out for a full diagnostic (dcgmi diag -r 3) or RMA before it "
            "returns to jobs.",
        ),
        Alert(
            AlertName.EXCLUSION_CONCENTRATION,
            f"{series.top_share} > {config.concentration_share}\n"
            f"and on () {series.fleet_exclusions} >= {config.concentration_min_exclusions}",
            "info",
            "A few nodes cause most of the fleet's exclusions.",
            f"The top {top} nodes caused {{{{ $value | humanizePercentage }}}} of all exclusions in {month}: "
            "fixing or retiring them is the cheapest reliability win. See gpufleet exclusions top.",
        ),
        Alert(
            AlertName.RETRY_CHAIN_FAILING,
            f"max by (training_job) ({metric('gpufleet_fleet_retry_chain_failed_attempts', sel)})"
            f" >= {config.retry_chain_failed_attempts}",
            "critical",
            "Automatic retries of a job keep failing.",
            "Job {{ $labels.training_job }} failed {{ $value }} automatic retries in a row: the "
            "retry loop is not recovering it. Find the node or change that breaks it, then restart by hand.",
        ),
        Alert(
            AlertName.LEDGER_DOWN,
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
                AlertName.LEDGER_TARGET_MISSING,
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
        RuleGroup("gpufleet-reliability-recording", records),
        RuleGroup("gpufleet-reliability-alerts", alerts),
    ]
