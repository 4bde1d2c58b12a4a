"""Recorded series the dashboards read, taken from the series objects of the rule modules
that record them (tests check that every one of them is recorded by alerts/*.rules.yaml)."""

from __future__ import annotations

from dataclasses import dataclass

from gpufleet.rules.attribution import AttributionSeries
from gpufleet.rules.checkpoint import CheckpointSeries
from gpufleet.rules.config import RulesConfig
from gpufleet.rules.dashboard_support import DashboardSeries
from gpufleet.rules.gpu import GpuSeries
from gpufleet.rules.health import HEALTH_SCORE
from gpufleet.rules.reliability import ReliabilitySeries
from gpufleet.rules.training import TrainingSeries


@dataclass(frozen=True, slots=True)
class Recorded:
    health: str
    compute_ratio: str
    compute_zscore: str
    baseline_ratio: str
    detection_active: str
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
    gpu_tenant: str
    instance_allocation: str
    job_tenant: str
    node_seconds_per_op: str
    node_checkpoint_bytes: str

    @classmethod
    def of(cls, config: RulesConfig) -> Recorded:
        gpu, training = GpuSeries.of(config), TrainingSeries.of(config)
        checkpoint, reliability = CheckpointSeries.of(config), ReliabilitySeries.of(config)
        support = DashboardSeries.of(config)
        return cls(
            health=HEALTH_SCORE,
            compute_ratio=training.compute_ratio,
            compute_zscore=training.compute_zscore,
            baseline_ratio=training.baseline_ratio,
            detection_active=training.detection_active,
            job_step=training.job_step,
            job_steady=training.job_steady,
            job_steady_baseline=training.job_steady_baseline,
            phase_per_step=support.phase_per_step,
            xid_new=gpu.xid_new,
            hw_slowdown=gpu.hw_slowdown,
            queue_share=checkpoint.queue_share,
            writers=checkpoint.writers,
            queue_wait_per_op=checkpoint.queue_wait_per_op,
            seconds_per_op=checkpoint.seconds_per_op,
            exclusions_node=reliability.node_exclusions,
            exclusions_reason=support.exclusions_reason,
            top3_share=reliability.top_share,
            mtbf=reliability.node_mtbf,
            young_daly=reliability.young_daly,
            checkpoint_interval=support.checkpoint_interval,
            fleet_util=support.fleet_util,
            fleet_power=support.fleet_power,
            node_gpus=support.node_gpus,
            gpu_node=support.gpu_node,
            gpu_tenant=support.gpu_tenant,
            instance_allocation=AttributionSeries.of(config).instance_allocation,
            job_tenant=support.job_tenant,
            node_seconds_per_op=support.node_seconds_per_op,
            node_checkpoint_bytes=support.node_checkpoint_bytes,
        )
