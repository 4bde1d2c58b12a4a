"""Assembles gpufleet's rule files from the rule modules, one file per area, and
turns each into the document written to ``alerts/*.rules.yaml``."""

from __future__ import annotations

import difflib
from dataclasses import replace
from typing import Any

from gpufleet.rules.checkpoint import checkpoint_groups
from gpufleet.rules.common import Alert, RuleFile
from gpufleet.rules.config import ConfigError, RulesConfig
from gpufleet.rules.dashboard_support import dashboard_support_group
from gpufleet.rules.gpu_groups import gpu_groups
from gpufleet.rules.health import health_recording
from gpufleet.rules.layout import layout_groups
from gpufleet.rules.node import node_alerts
from gpufleet.rules.reliability import reliability_groups
from gpufleet.rules.training import training_groups

# Where the rule files run when scraping is sharded (docs/SCALING.md). gpu.rules.yaml
# works per GPU and per node: each shard Prometheus evaluates it on its own nodes,
# next to the bulk of the data. Every other file compares nodes of a job with each
# other (stage medians, job step time) or reads the ledger, and runs once, on a
# ruler that sees every node (vmalert, Thanos Ruler, Mimir's ruler).
SHARD_LOCAL_FILES = frozenset({"gpu"})


def rule_files(config: RulesConfig | None = None) -> list[RuleFile]:
    """Every rule file built from ``config``; a severity override for an alert that does
    not exist raises ConfigError naming it."""
    config = config or RulesConfig()
    files = [
        RuleFile("gpu", gpu_groups(config)),
        RuleFile("node", [health_recording(config), node_alerts(config)]),
        RuleFile("training", training_groups(config)),
        RuleFile("checkpoint", checkpoint_groups(config)),
        RuleFile("layout", layout_groups(config)),
        RuleFile("reliability", reliability_groups(config)),
        RuleFile("dashboards", [dashboard_support_group(config)]),
    ]
    if config.severities:
        # Every alert, including the presence ones a site may have turned off.
        every = replace(
            config,
            severities={},
            gpu_presence="seen",
            agent_presence="seen",
            ledger_presence="seen",
        )
        known = alert_names(rule_files(every))
        for alert in config.severities:
            if alert not in known:
                close = difflib.get_close_matches(alert, known, n=1)
                hint = f"; did you mean {close[0]!r}?" if close else ""
                raise ConfigError(f"severities: no alert is named {alert!r}{hint}")
    return files


def alert_names(files: list[RuleFile]) -> list[str]:
    return [
        str(rule.alert)
        for rule_file in files
        for group in rule_file.groups
        for rule in group.rules
        if isinstance(rule, Alert)
    ]


def as_document(rule_file: RuleFile, config: RulesConfig) -> dict[str, Any]:
    return {
        "groups": [
            {
                "name": group.name,
                **({"interval": group.interval} if group.interval else {}),
                "rules": [
                    rule.as_dict(config) if isinstance(rule, Alert) else rule.as_dict()
                    for rule in group.rules
                ],
            }
            for group in rule_file.groups
        ]
    }
