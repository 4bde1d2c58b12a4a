"""Recorded series the dashboards read, named from the rules' config exactly as the rules
name them (tests check that every one of them is recorded by alerts/*.rules.yaml)."""

from __future__ import annotations

from dataclasses import dataclass

from gpufleet.rules.config import RulesConfig
from gpufleet.rules.fail_slow import job_steady_step


@dataclass(frozen=True, slots=True)
class Recorded:
    health: str
    compute_ratio: str
    compute_zscore: str
    baseline_ratio: str
    job_step: str
    job_steady: str
    job_steady_baseline: str
    phase_per_step: str
    xid_new: str
    hw_slowdown: str
    queue_share: str
    writers: str
    queue_wait_per_op: str
    seconds_per_op: str
    exclusions_node: str
    exclusions_reason: str
    top3_share: str
    mtbf: str
    young_daly: str
    checkpoint_interval: str
    fleet_util: str
    fleet_power: str
    node_gpus: str
    gpu_node: str
    node_seconds_per_op: str
    node_checkpoint_bytes: str

    @classmethod
    def of(cls, config: RulesConfig) -> Recorded:
        w = config.rate_window
        steady, steady_baseline = job_steady_step(config)
        return cls(
            health="node:gpufleet_health:score",
            compute_ratio=f"node:gpufleet_training_compute_ratio:rate{w}",
            compute_zscore=f"node:gpufleet_training_compute_zscore:rate{w}",
            baseline_ratio=f"node:gpufleet_training_baseline_ratio:rate{w}",
            job_step="job:gpufleet_training_step_seconds:rate2m",
            job_steady=steady,
            job_steady_baseline=steady_baseline,
            phase_per_step=f"node:gpufleet_training_phase_seconds_per_step:rate{w}",
            xid_new=f"gpu:gpufleet_gpu_xid_errors:new{config.xid_window}",
            hw_slowdown="gpu:gpufleet_gpu_hw_slowdown:active",
            queue_share=f"job:gpufleet_checkpoint_queue_share:rate{config.checkpoint_window}",
            writers=f"job:gpufleet_checkpoint_writers:count{config.checkpoint_window}",
            queue_wait_per_op="job:gpufleet_checkpoint_queue_wait_per_op:rate1h",
            seconds_per_op="job:gpufleet_checkpoint_seconds_per_op:rate1h",
            exclusions_node="node:gpufleet_fleet_exclusions:increase30d",
            exclusions_reason="reason:gpufleet_fleet_exclusions:increase30d",
            top3_share="fleet:gpufleet_fleet_exclusions:top3_share30d",
            mtbf="fleet:gpufleet_node_mtbf_hours:30d",
            young_daly="job:gpufleet_checkpoint_interval_young_daly_seconds:30d",
            checkpoint_interval="job:gpufleet_checkpoint_interval_seconds:rate1h",
            fleet_util="fleet:DCGM_FI_DEV_GPU_UTIL:avg",
            fleet_power="fleet:DCGM_FI_DEV_POWER_USAGE:sum",
            node_gpus="node:gpufleet_gpus_reporting:count",
            gpu_node="gpu:gpufleet_gpu_node:info",
            node_seconds_per_op=f"node:gpufleet_checkpoint_seconds_per_op:rate{w}",
            node_checkpoint_bytes=f"node:gpufleet_checkpoint_bytes:rate{w}",
        )
