"""Checkpoint rules: time queued for storage, seconds per save and restore."""

from __future__ import annotations

from dataclasses import dataclass

from gpufleet.rules.common import Alert, Record, RuleGroup, SeriesNames, metric
from gpufleet.rules.config import RulesConfig
from gpufleet.schema.alerts import AlertName


@dataclass(frozen=True, slots=True)
class CheckpointSeries(SeriesNames):
    """What checkpoint.rules.yaml records, each named once here: the checkpoint alerts,
    the reliability rules and the dashboards refer to these."""

    # per job: share of checkpoint time queued, and nodes that wrote, in checkpoint_window
    queue_share: str = "job:gpufleet_checkpoint_queue_share:rate{checkpoint_window}"
    writers: str = "job:gpufleet_checkpoint_writers:count{checkpoint_window}"
    # per job and op over checkpoint_op_window, and over checkpoint_daly_window
    seconds_per_op: str = "job:gpufleet_checkpoint_seconds_per_op:rate{checkpoint_op_window}"
    queue_wait_per_op: str = "job:gpufleet_checkpoint_queue_wait_per_op:rate{checkpoint_op_window}"
    seconds_per_op_daly: str = "job:gpufleet_checkpoint_seconds_per_op:rate{checkpoint_daly_window}"


def checkpoint_groups(config: RulesConfig) -> list[RuleGroup]:
    sel = config.agent_selector
    w = config.checkpoint_window
    series = CheckpointSeries.of(config)
    op_w, daly_w = config.checkpoint_op_window, config.checkpoint_daly_window

    def rate_by(name: str, by: str, window: str = w, extra: str = "") -> str:
        return f"sum by ({by}) (rate({metric(name, sel, extra)}[{window}]))"

    queue, service = (
        "gpufleet_checkpoint_queue_wait_seconds_total",
        "gpufleet_checkpoint_service_seconds_total",
    )
    records: list[Record | Alert] = [
        Record(
            series.queue_share,
            f"{rate_by(queue, 'training_job')}\n/ ({rate_by(queue, 'training_job')} + {rate_by(service, 'training_job')})",
        ),
        Record(
            series.writers,
            f"count by (training_job) (\n  sum by (training_job, node) (increase({metric('gpufleet_checkpoint_operations_total', sel)}[{w}])) > 0\n)",
        ),
        Record(
            series.seconds_per_op,
            f"({rate_by(queue, 'training_job, op', op_w)} + {rate_by(service, 'training_job, op', op_w)})\n"
            f"/ {rate_by('gpufleet_checkpoint_operations_total', 'training_job, op', op_w)}",
        ),
        Record(
            series.queue_wait_per_op,
            f"{rate_by(queue, 'training_job, op', op_w)}\n"
            f"/ {rate_by('gpufleet_checkpoint_operations_total', 'training_job, op', op_w)}",
        ),
        Record(
            series.seconds_per_op_daly,
            f"({rate_by(queue, 'training_job, op', daly_w)} + {rate_by(service, 'training_job, op', daly_w)})\n"
            f"/ {rate_by('gpufleet_checkpoint_operations_total', 'training_job, op', daly_w)}",
        ),
    ]
    alerts: list[Record | Alert] = [
        Alert(
            AlertName.CHECKPOINT_QUEUE_BOUND,
            f"{series.queue_share} > {config.checkpoint_queue_share}\n"
            f"and on (training_job) {series.writers} >= {config.checkpoint_min_writers}",
            "warning",
            "Checkpoints spend most of their time queued for storage, not writing.",
            "Checkpoints of job {{ $labels.training_job }} spent {{ $value | humanizePercentage }} of "
            "their time queued for storage: the storage, not the writers, is the bottleneck. "
            "Stagger the writers or add storage bandwidth.",
            config.checkpoint_queue_for,
        ),
        Alert(
            AlertName.CHECKPOINT_SLOW,
            f'{series.seconds_per_op}{{op="save"}} > {config.checkpoint_save_budget_s:g}',
            "warning",
            "Checkpoint saves take longer than their budget.",
            "Checkpoint saves of job {{ $labels.training_job }} take {{ $value | humanizeDuration }} "
            f"each (budget {config.checkpoint_save_budget_s:g} s): every save stalls the whole job.",
        ),
        Alert(
            AlertName.RESTORE_SLOW,
            f'{series.seconds_per_op}{{op="restore"}} > {config.checkpoint_restore_budget_s:g}',
            "warning",
            "Checkpoint restores take longer than their budget.",
            "Restores of job {{ $labels.training_job }} take {{ $value | humanizeDuration }} each "
            f"(budget {config.checkpoint_restore_budget_s:g} s): every recovery is that much longer.",
        ),
    ]
    return [
        RuleGroup("gpufleet-checkpoint-recording", records, config.slow_recording_interval),
        RuleGroup("gpufleet-checkpoint-alerts", alerts),
    ]
