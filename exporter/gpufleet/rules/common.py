"""What every rule module shares: the rule objects, selectors and expression helpers.

The rules are built by area (``gpu``, ``node``, ``health``, ``training``,
``checkpoint``, ``reliability``, ``dashboard_support``) and assembled in ``build``.

Conventions (after the monitoring mixins): alerts are ``GpuFleet...`` CamelCase,
``severity`` is critical (page now), warning (page or ticket within hours) or
info (dashboards only); every alert has a static ``summary``, a templated
``description`` naming node, GPU, job and value, and a ``runbook_url`` into
``alerts/RUNBOOK.md``. Recording rules are ``level:metric:operation``. GPU series
may come from gpufleet's agent or from dcgm-exporter, which labels the node
``Hostname`` (released) or ``hostname`` (main branch); both become ``node``
(``RulesConfig.node_labels``). dcgm-exporter series may also carry ``pod`` /
``namespace`` / ``container`` labels that change with the workload: every GPU rule
compares a GPU with itself by ``UUID``, never by whole label sets.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field, fields
from typing import Any, ClassVar, Self

from gpufleet.rules.config import MATCHER, RulesConfig
from gpufleet.schema.alerts import AlertName


@dataclass(frozen=True, slots=True)
class Record:
    """A recording rule; ``record`` comes from its area's series object (``GpuSeries``...)."""

    record: str
    expr: str
    labels: dict[str, str] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        rule: dict[str, Any] = {"record": self.record, "expr": self.expr}
        if self.labels:
            rule["labels"] = dict(self.labels)
        return rule


@dataclass(frozen=True, slots=True)
class Alert:
    """An alerting rule, named by its ``AlertName``."""

    alert: AlertName
    expr: str
    severity: str
    summary: str
    description: str
    for_: str = "0m"

    def as_dict(self, config: RulesConfig) -> dict[str, Any]:
        rule: dict[str, Any] = {"alert": str(self.alert), "expr": self.expr}
        if self.for_ != "0m":
            rule["for"] = self.for_
        rule["labels"] = {"severity": config.severity(self.alert, self.severity)}
        rule["annotations"] = {
            "summary": self.summary,
            "description": self.description,
            "runbook_url": config.runbook_url.format(anchor=self.alert.lower()),
        }
        return rule


@dataclass(slots=True)
class RuleGroup:
    name: str
    rules: Sequence[Record | Alert]
    interval: str | None = None


@dataclass(frozen=True, slots=True)
class RuleFile:
    name: str  # file stem, e.g. "gpu" -> alerts/gpu.rules.yaml
    groups: list[RuleGroup]


class SeriesNames:
    """Base of each area's recorded-series object (``GpuSeries``, ``TrainingSeries``...):
    every field's default is the series' name with ``{knob}`` where a knob goes, and
    ``of(config)`` fills them in, so each name is written once, beside what records it."""

    __dataclass_fields__: ClassVar[dict[str, Any]]

    @classmethod
    def derived(cls, config: RulesConfig) -> dict[str, object]:
        """Values a name needs that are not knobs as they stand."""
        return {}

    @classmethod
    def of(cls, config: RulesConfig) -> Self:
        knobs = {item.name: getattr(config, item.name) for item in fields(config)}
        values = knobs | cls.derived(config)
        return cls(**{item.name: str(item.default).format(**values) for item in fields(cls)})


# The labels that identify a GPU, a pipeline stage and a node's part of it, in `by` and
# `on` clauses.
GPU = "node, gpu, UUID"
STAGE = "training_job, pp_stage"
NODE_STAGE = "training_job, node, pp_stage"


def metric(name: str, selector: str, extra: str = "") -> str:
    inner = ", ".join(part for part in (selector, extra) if part)
    return f"{name}{{{inner}}}"


NODE_LABELS = ("Hostname", "hostname")

NEGATED = {"=": "!=", "!=": "=", "=~": "!~", "!~": "=~"}


def not_from(selector: str) -> str:
    """A matcher that drops the series ``selector`` picks, where it is one matcher (the
    agent's `job="gpufleet-agent"`): PromQL may hold several matchers on one label, so
    `job=~"a|b", job!="a"` selects b's series alone. Empty where it is several matchers
    (their negation is not one) or none: the caller then selects as before."""
    found = re.fullmatch(MATCHER, selector)
    if not found:
        return ""
    label, op, value = found.groups()
    return f"{label}{NEGATED[op]}{value}"


def with_node(expr: str, labels: Sequence[str] = NODE_LABELS) -> str:
    """Add ``node`` from the label that names it (``Hostname``, ``hostname``; the last
    listed that is set wins, so list the preferred one last: they hold the same name)."""
    for label in labels:
        expr = f'label_replace({expr}, "node", "$1", "{label}", "(.+)")'
    return expr


def per_gpu(expr: str, labels: Sequence[str] = NODE_LABELS) -> str:
    return f"max by ({GPU}) (\n  {with_node(expr, labels)}\n)"


def risen(series: str, window: str) -> str:
    """How much a counter rose within ``window``, a drop taken as a reset as increase()
    does (the value after it counts from zero). Floored: increase() extrapolates to the
    window's edges, never below the samples' own rise, so the floor is at least that."""
    return f"floor(increase({series}[{window}]))"


def new_in(
    series: str, window: str, restarted: str | None = None, identity: str | None = None
) -> str:
    """Events of a counter within ``window``: all of a series that appeared in it (its
    first event: no sample in the window before), else its rise, resets included (an
    agent restarted in the window). A series back after a gap in its scrapes shorter than
    the window is not new. ``restarted`` selects the targets whose counters started within
    the window (their agent restarted): all of such a counter is new, also where it came
    back at the value it had before with no lower sample between (no reset increase() sees).
    ``identity`` (labels, e.g. ``UUID, xid``) says what a series is new for: a series whose
    other labels changed (a GPU handed to another pod) is not new where one of the same
    identity was there before."""
    on = f"on ({identity}) " if identity else ""
    new = (
        f"({series} > 0 unless {on}max_over_time({series}[{window}] offset {window}))\n"
        f"  or ({risen(series, window)} > 0)"
    )
    if restarted is None:
        return new
    return f"{new}\n  or ({series} > 0 and on (instance, job) ({restarted}))"


# Reused templates.
GPU_WHO = "{{ $labels.node }} GPU {{ $labels.gpu }} ({{ $labels.UUID }})"
JOB_NODE = (
    "{{ $labels.node }} in job {{ $labels.training_job }} (pipeline stage {{ $labels.pp_stage }})"
)


def agent_node(config: RulesConfig, expr: str) -> str:
    """Self-metrics carry no Hostname: take the node from gpufleet_agent_info by target."""
    info = metric("gpufleet_agent_info", config.agent_selector)
    return (
        f"({expr})\n  * on (instance, job) group_left (node) max by (instance, job, node) ({info})"
    )
