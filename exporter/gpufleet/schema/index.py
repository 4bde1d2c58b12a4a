"""Every family in one place: look any exported name up here."""

from __future__ import annotations

from gpufleet.schema.agent import INGEST_FAMILIES, SELF_FAMILIES
from gpufleet.schema.external import NODE_EXPORTER_FAMILIES, PROMETHEUS_FAMILIES
from gpufleet.schema.family import MetricDef
from gpufleet.schema.gpu import GPU_FAMILIES
from gpufleet.schema.kube import KUBE_WATCH_FAMILIES
from gpufleet.schema.ledger import LEDGER_FAMILIES
from gpufleet.schema.slurm import SLURM_WATCH_FAMILIES
from gpufleet.schema.training import CHECKPOINT_FAMILIES, LAYOUT_FAMILIES, TRAINING_FAMILIES

# What gpufleet's own components export.
EXPORTED: tuple[MetricDef, ...] = (
    *GPU_FAMILIES,
    *TRAINING_FAMILIES,
    *CHECKPOINT_FAMILIES,
    *LAYOUT_FAMILIES,
    *INGEST_FAMILIES,
    *SELF_FAMILIES,
    *LEDGER_FAMILIES,
    *SLURM_WATCH_FAMILIES,
    *KUBE_WATCH_FAMILIES,
)
BY_NAME: dict[str, MetricDef] = {metric.name: metric for metric in EXPORTED}


def series_names(families: tuple[MetricDef, ...] = EXPORTED) -> frozenset[str]:
    """Every series name the families produce (a histogram's ``_bucket`` and so on)."""
    return frozenset(name for metric in families for name in metric.series_names())


def known_series() -> frozenset[str]:
    """What a query may read: gpufleet's families, what Prometheus writes itself and the
    node_exporter series the job layout panels read."""
    return series_names((*EXPORTED, *PROMETHEUS_FAMILIES, *NODE_EXPORTER_FAMILIES))
