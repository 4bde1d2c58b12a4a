"""Presence of each component's scrape targets: how many answer now (what the "seen"
mode remembers) and the expression that says none is left."""

from __future__ import annotations

from gpufleet.rules.common import Alert, Record, metric
from gpufleet.rules.config import RulesConfig


def targets_record(component: str) -> str:
    return f"fleet:gpufleet_{component}_targets:count"


def presence_records(config: RulesConfig) -> list[Record | Alert]:
    """Targets per component now, what the "seen" presence alerts remember."""
    selectors = {"gpu": config.gpu_selector, "agent": config.agent_selector}
    return [
        Record(targets_record(component), f"count({metric('up', selector)})")
        for component, selector in selectors.items()
        if getattr(config, f"{component}_presence") == "seen"
    ]


def targets_missing(config: RulesConfig, component: str, selector: str) -> str | None:
    """No target left: "required" since ever, "seen" of those scraped within the memory."""
    mode = getattr(config, f"{component}_presence")
    if mode == "off":
        return None
    if mode == "required":
        return f"absent({metric('up', selector)})"
    name = targets_record(component)
    return f"max_over_time({name}[{config.presence_memory}])\nunless on () {name}"


def presence_note(config: RulesConfig, component: str) -> str:
    mode = getattr(config, f"{component}_presence")
    if mode == "required":
        return "The site requires them (presence: required)."
    return f"Prometheus scraped some within {config.presence_memory} (presence: seen)."
