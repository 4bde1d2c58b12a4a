"""What on a Node counts as out of service (``gpufleet kube-watch``'s rules), and why.

A node is *out of service* while any of these holds: it is cordoned
(``spec.unschedulable``), it carries a ``NoSchedule`` / ``NoExecute`` taint whose key
matches ``--taints`` (and not ``--ignore-taints``), or a node condition whose type
matches ``--conditions`` is ``True``. Its reason comes from the condition or taint (an
XID named in it is kept as ``xid79``), else ``cordoned``.
"""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from gpufleet.sources.reasons import reason_from_key, xid_reason

# NVSentinel's fault-quarantine taints live under nvidia.com/ (its docs/INTEGRATIONS.md:
# nvidia.com/gpu-xid-error, nvidia.com/syslog-xid-error, ...). nvidia.com/gpu itself is
# the taint that reserves a GPU node pool for GPU pods (GKE puts nvidia.com/gpu=present:
# NoSchedule on every GPU node): it says what a node is for, not that it is out.
DEFAULT_TAINTS = ("nvidia.com/*",)
DEFAULT_IGNORED_TAINTS = ("nvidia.com/gpu",)
# NVSentinel's conditions (set True only for fatal health events, same document): the
# GPU health monitor's Gpu*Watch and the syslog monitor's XID / SXID / fallen-off-bus
# checks, NVSwitch failures; and XidCriticalError, a condition some node problem
# detector setups report an XID under.
DEFAULT_CONDITIONS = (
    "Gpu*",
    "SysLogsXIDError",
    "SysLogsSXIDError",
    "SysLogsGPUFallenOff",
    "NVSwitchFatalError",
    "NVSwitchDown",
    "XidCriticalError",
)
EXCLUDING_EFFECTS = frozenset({"NoSchedule", "NoExecute"})


def _rfc3339(value: Any) -> float | None:
    if not isinstance(value, str):
        return None
    try:
        return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


@dataclass(frozen=True, slots=True)
class Signal:
    """One thing on a Node that takes it out of service."""

    kind: str  # condition, taint or cordon
    name: str  # the condition type, the taint as key=value:effect, or "unschedulable"
    reason: str
    since: float | None = None  # when it began, where the object says (a condition)

    @property
    def names_xid(self) -> bool:
        return self.reason.startswith("xid")


@dataclass(frozen=True, slots=True)
class NodeRules:
    """What on a Node counts as out of service (``gpufleet kube-watch`` flags)."""

    taints: tuple[str, ...] = DEFAULT_TAINTS
    ignored_taints: tuple[str, ...] = DEFAULT_IGNORED_TAINTS
    conditions: tuple[str, ...] = DEFAULT_CONDITIONS
    cordon: bool = True

    def signals(self, node: Mapping[str, Any]) -> tuple[Signal, ...]:
        """The node's signals, conditions first, then taints, then the cordon."""
        spec, status = node.get("spec") or {}, node.get("status") or {}
        found: list[Signal] = []
        for condition in status.get("conditions") or []:
            kind = str(condition.get("type", ""))
            if condition.get("status") != "True" or not _matches(kind, self.conditions):
                continue
            reason = (
                xid_reason(str(condition.get("message", "")), codes_are_xids=_names_xid(kind))
                or xid_reason(str(condition.get("reason", "")))
                or reason_from_key(kind)
            )
            found.append(Signal("condition", kind, reason, _rfc3339(condition.get(
                "lastTransitionTime"))))  # fmt: skip
        for taint in spec.get("taints") or []:
            key, value = str(taint.get("key", "")), str(taint.get("value", ""))
            if taint.get("effect") not in EXCLUDING_EFFECTS:
                continue
            if not _matches(key, self.taints) or _matches(key, self.ignored_taints):
                continue
            reason = (
                xid_reason(f"{key} {value}")
                or xid_reason(value, codes_are_xids=_names_xid(key))
                or reason_from_key(key)
            )
            shown = f"{key}={value}:{taint.get('effect')}" if value else f"{key}:{taint['effect']}"
            found.append(Signal("taint", shown, reason, _rfc3339(taint.get("timeAdded"))))
        if self.cordon and spec.get("unschedulable") is True:
            found.append(Signal("cordon", "unschedulable", "cordoned"))
        return tuple(found)


def _names_xid(name: str) -> bool:
    """Whether a condition type or taint key is about XIDs (SysLogsXIDError, gpu-xid-error;
    not SysLogsSXIDError), so that a bare code in its message or value is an XID."""
    return "xid" in re.split(r"[^a-z0-9]+", reason_from_key(name))


def _matches(name: str, patterns: Sequence[str]) -> bool:
    return any(fnmatch.fnmatchcase(name, pattern) for pattern in patterns)


def episode_reason(signals: Sequence[Signal]) -> str:
    """The reason an exclusion is recorded with: an XID if a signal names one, else the
    first signal's (a condition says why more precisely than a taint, a taint than a cordon)."""
    return next((s.reason for s in signals if s.names_xid), signals[0].reason)
