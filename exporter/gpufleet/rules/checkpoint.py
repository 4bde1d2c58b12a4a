"""Checkpoint rules: time queued for storage, seconds per save and restore."""

from __future__ import annotations

from gpufleet.rules.common import Alert, Group, Record, metric
from gpufleet.rules.config import RulesConfig


def checkpoint_groups(config: RulesConfig) -> list[Group]:
    sel = config.agent_selector
    w = config.checkpoint_window

    def rate_by(name: str, by: str, window: str = w, extra: str = "") -> str:
        return f"sum by ({by}) (rate({metric(name, sel, extra)}[{window}]))"

    queue, service = (
        "gpufleet_checkpoint_queue_wait_seconds_total",
        "gpufleet_checkpoint_service_seconds_total",
    )
    records: list[Record | Alert] = [
        Record(
            f"job:gpufleet_checkpoint_queue_share:rate{w}",
            f"{rate_by(queue, 'training_job')}\n/ ({rate_by(queue, 'training_job')} + {rate_by(service, 'training_job')})",
        ),
        Record(
            f"job:gpufleet_checkpoint_writers:count{w}",
            f"count by (training_job) (\n  sum by (training_job, node) (increase({metric('gpufleet_checkpoint_operations_total', sel)}[{w}])) > 0\n)",
        ),
        Record(
            "job:gpufleet_checkpoint_seconds_per_op:rate1h",
            f"({rate_by(queue, 'training_job, op', '1h')} + {rate_by(service, 'training_job, op', '1h')})\n"
            f"/ {rate_by('gpufleet_checkpoint_operations_total', 'training_job, op', '1h')}",
        ),
        Record(
            "job:gpufleet_checkpoint_queue_wait_per_op:rate1h",
            f"{rate_by(queue, 'training_job, op', '1h')}\n"
            f"/ {rate_by('gpufleet_checkpoint_operations_total', 'training_job, op', '1h')}",
        ),
        Record(
            "job:gpufleet_checkpoint_seconds_per_op:rate1d",
            f"({rate_by(queue, 'training_job, op', '1d')} + {rate_by(service, 'training_job, op', '1d')})\n"
            f"/ {rate_by('gpufleet_checkpoint_operations_total', 'training_job, op', '1d')}",
        ),
    ]
    alerts: list[Record | Alert] = [
        Alert(
            "GpuFleetCheckpointQueueBound",
            f"job:gpufleet_checkpoint_queue_share:rate{w} > {config.checkpoint_queue_share}\n"
            f"and on (training_job) job:gpufleet_checkpoint_writers:count{w} >= {config.checkpoint_min_writers}",
            "warning",
            "Checkpoints spend most of their time queued for storage, not writing.",
            "Checkpoints of job {{ $labels.training_job }} spent {{ $value | humanizePercentage }} of "
            "their time queued for storage: the storage, not the writers, is the bottleneck. "
            "Stagger the writers or add storage bandwidth.",
            config.checkpoint_queue_for,
        ),
        Alert(
            "GpuFleetCheckpointSlow",
            f'job:gpufleet_checkpoint_seconds_per_op:rate1h{{op="save"}} > {config.checkpoint_save_budget_s:g}',
            "warning",
            "Checkpoint saves take longer than their budget.",
            "Checkpoint saves of job {{ $labels.training_job }} take {{ $value | humanizeDuration }} "
            f"each (budget {config.checkpoint_save_budget_s:g} s): every save stalls the whole job.",
        ),
        Alert(
            "GpuFleetRestoreSlow",
            f'job:gpufleet_checkpoint_seconds_per_op:rate1h{{op="restore"}} > {config.checkpoint_restore_budget_s:g}',
            "warning",
            "Checkpoint restores take longer than their budget.",
            "Restores of job {{ $labels.training_job }} take {{ $value | humanizeDuration }} each "
            f"(budget {config.checkpoint_restore_budget_s:g} s): every recovery is that much longer.",
        ),
    ]
    return [
        Group("gpufleet-checkpoint-recording", records),
        Group("gpufleet-checkpoint-alerts", alerts),
    ]
