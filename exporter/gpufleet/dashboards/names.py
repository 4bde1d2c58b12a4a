"""The recorded series the dashboards read: the series objects of the rule modules that
record them, filled in for one configuration, so each name is declared once, beside its
rule (tests check that every one the dashboards read is recorded by alerts/*.rules.yaml)."""

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
    gpu: GpuSeries
    training: TrainingSeries
    checkpoint: CheckpointSeries
    reliability: ReliabilitySeries
    attribution: AttributionSeries
    support: DashboardSeries
    health: str = HEALTH_SCORE

    @classmethod
    def of(cls, config: RulesConfig) -> Recorded:
        return cls(
            gpu=GpuSeries.of(config),
            training=TrainingSeries.of(config),
            checkpoint=CheckpointSeries.of(config),
            reliability=ReliabilitySeries.of(config),
            attribution=AttributionSeries.of(config),
            support=DashboardSeries.of(config),
        )
