"""Every gpufleet dashboard, built from one ``RulesConfig``."""

from __future__ import annotations

from grafana_foundation_sdk.models import dashboard as dm

from gpufleet.dashboards import checkpoint, fail_slow, node, overview, reliability
from gpufleet.rules.config import RulesConfig

# file stem -> builder; the stem is the UID without its "gpufleet-" prefix
BUILDERS = {
    "overview": overview.build,
    "fail-slow": fail_slow.build,
    "node": node.build,
    "checkpoint": checkpoint.build,
    "reliability": reliability.build,
}


def dashboards(config: RulesConfig | None = None) -> dict[str, dm.Dashboard]:
    config = config or RulesConfig()
    return {stem: build(config) for stem, build in BUILDERS.items()}
