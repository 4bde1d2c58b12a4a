"""The training rules (alerts/training.rules.yaml), by signal: ``straggler`` (a node
against its stage peers and its own baseline), ``job`` (job-wide slowdowns, data-loader
stalls), ``hang`` (jobs that stop); ``series`` names what they record."""

from __future__ import annotations

from gpufleet.rules.common import Alert, Record, RuleGroup
from gpufleet.rules.config import RulesConfig
from gpufleet.rules.training import hang, job, straggler
from gpufleet.rules.training.series import TrainingSeries

__all__ = ["TrainingSeries", "training_groups"]


def training_groups(config: RulesConfig) -> list[RuleGroup]:
    series = TrainingSeries.of(config)
    # Windows of 15 minutes to 2 hours move little in a minute: evaluated once a minute
    # (slow_recording_interval); the rules that read them every 30 s (training_interval)
    # see the latest value.
    long_windows = [
        *straggler.long_window_records(config, series),
        *job.job_baseline_records(config, series),
        hang.step_average_record(config, series),
        *job.data_wait_records(config, series),
    ]
    trends = [
        *straggler.node_trend_records(config, series),
        *job.step_time_records(config, series),
        *job.collective_wait_records(config, series),
        *hang.end_records(config, series),
    ]
    # The straggler page in the group that records what it reads: a group of its own,
    # evaluated at its own offset, would page up to one interval later.
    coverage: list[Record | Alert] = [
        *straggler.coverage_records(config, series),
        straggler.straggler_alert(config, series),
    ]
    alerts = [
        straggler.baseline_alert(config, series),
        job.job_slowdown_alert(config, series),
        straggler.stage_imbalance_alert(config, series),
        straggler.replica_imbalance_alert(config, series),
        straggler.detection_inactive_alert(config, series),
        hang.job_hung_alert(config, series),
        job.data_loader_stall_alert(config, series),
        hang.application_xid_alert(config),
    ]
    every = config.training_interval
    return [
        RuleGroup("gpufleet-training-peers", straggler.peer_records(config, series), every),
        RuleGroup("gpufleet-training-long-windows", long_windows, config.slow_recording_interval),
        RuleGroup("gpufleet-training-coverage", coverage, every),
        RuleGroup("gpufleet-training-trends", trends, every),
        RuleGroup("gpufleet-training-alerts", alerts, every),
    ]
