"""What Slurm says about its nodes and jobs, read from ``sinfo --json`` / ``squeue --json``.

Slurm 22.05 (Debian bookworm) answers ``--json`` from ``sinfo`` and ``squeue`` (OpenAPI
v0.0.38; its ``scontrol`` has no ``--json``). Later releases changed the shapes: a node's
``state`` became a list holding the flags, and numbers became ``{"set": .., "number": ..}``
objects. Both shapes are read here, so the watcher keeps working across an upgrade.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from gpufleet.sources.kube import xid_reason

# A node is out of service while its base state is DOWN or it carries one of these flags
# (DRAIN covers draining and drained; FAIL, failing and failed).
OUT_OF_SERVICE_STATES = frozenset({"DOWN", "ERROR"})
OUT_OF_SERVICE_FLAGS = frozenset({"DRAIN", "FAIL"})
# A job's attempt is over in these states; a requeued job is PENDING again.
ENDED_STATES: Mapping[str, str] = {
    "COMPLETED": "success",
    "CANCELLED": "cancelled",
    "FAILED": "failed",
    "TIMEOUT": "failed",
    "NODE_FAIL": "failed",
    "OUT_OF_MEMORY": "failed",
    "BOOT_FAIL": "failed",
    "DEADLINE": "failed",
    "PREEMPTED": "failed",
}
# Not COMPLETING: a requeued job completes its last run with the restart count already raised.
RUN_STATES = frozenset({"RUNNING", "SUSPENDED", "STOPPED", "SIGNALING", "RESIZING"})

_TOKEN = re.compile(r"[a-z0-9]+")
# Ticket numbers, dates, addresses: a new value for each event, and the ledger counts
# distinct reasons (its cap). They stay in the exclusion's note.
_NUMBERISH = re.compile(r"(?:\d+|0x[0-9a-f]+|[0-9a-f]{8,})")
_SET_BY = re.compile(r"\s*\[[^\]]*@[^\]]*\]\s*$")  # scontrol's "[root@2026-12-04T18:57:44]"


def normalise_reason(text: str, fallback: str) -> str:
    """The ledger reason for a Slurm node ``Reason``: an XID named in it as ``xid79``,
    else its words in lower case joined by ``_`` ("Kill task failed" ->
    ``kill_task_failed``, "NHC: GPU check failed" -> ``nhc_gpu_check_failed``), numbers
    dropped, at most 64 characters; ``fallback`` (the state) when no word is left."""
    text = _SET_BY.sub("", text)
    xid = xid_reason(text)
    if xid:
        return xid
    words = [word for word in _TOKEN.findall(text.lower()) if not _NUMBERISH.fullmatch(word)]
    reason = ""
    for word in words:
        joined = f"{reason}_{word}" if reason else word
        if len(joined) > 64:
            break
        reason = joined
    return reason or fallback


def _number(value: Any) -> float | None:
    """A Slurm number: plain, or 23.02+'s ``{"set": true, "number": n}``; None when unset."""
    if isinstance(value, Mapping):
        if not value.get("set", True) or value.get("infinite"):
            return None
        value = value.get("number")
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if value > 0 else None


def _words(*values: Any) -> frozenset[str]:
    found: set[str] = set()
    for value in values:
        items = value if isinstance(value, list) else [value]
        found.update(str(item).upper() for item in items if item)
    return frozenset(found)


@dataclass(frozen=True, slots=True)
class SlurmNode:
    name: str
    states: frozenset[str]  # the base state and its flags, upper case
    reason: str  # as the admin or slurmctld wrote it
    reason_changed_at: float | None

    @property
    def out_of_service(self) -> bool:
        return bool(self.states & OUT_OF_SERVICE_STATES or self.states & OUT_OF_SERVICE_FLAGS)

    @property
    def state_name(self) -> str:
        """What to call the episode when Slurm gives no reason: drain, fail or down."""
        for state in ("DRAIN", "FAIL", "DOWN"):
            if state in self.states:
                return state.lower()
        return "down"

    @property
    def ledger_reason(self) -> str:
        return normalise_reason(self.reason, self.state_name)

    @classmethod
    def from_json(cls, node: Mapping[str, Any]) -> SlurmNode:
        return cls(
            str(node.get("name") or node.get("hostname") or ""),
            _words(node.get("state"), node.get("state_flags")),
            str(node.get("reason") or ""),
            _number(node.get("reason_changed_at")),
        )


@dataclass(frozen=True, slots=True)
class SlurmJob:
    job_id: str
    state: str  # RUNNING, PENDING, COMPLETED...
    restarts: int  # Slurm's restart_cnt: how often it was requeued
    submitted_at: float | None  # a requeue sets it again: when the job was requeued
    started_at: float | None  # of the current run (the next one while pending on BeginTime)
    ended_at: float | None
    nodes: str  # Slurm's hostlist expression of the current or last run

    @property
    def running(self) -> bool:
        return self.state in RUN_STATES

    @property
    def outcome(self) -> str | None:
        return ENDED_STATES.get(self.state)

    @classmethod
    def from_json(cls, job: Mapping[str, Any]) -> SlurmJob:
        states = job.get("job_state")
        state = str((states[0] if states else "") if isinstance(states, list) else states or "")
        restarts = _number(job.get("restart_cnt"))
        return cls(
            str(job.get("job_id", "")),
            state.upper(),
            int(restarts or 0),
            _number(job.get("submit_time")),
            _number(job.get("start_time")),
            _number(job.get("end_time")),
            str(job.get("nodes") or ""),
        )


def parse_nodes(document: Mapping[str, Any]) -> list[SlurmNode]:
    """The nodes of ``sinfo --json`` (one entry per node, the first when listed twice)."""
    seen: dict[str, SlurmNode] = {}
    for item in document.get("nodes") or []:
        node = SlurmNode.from_json(item)
        if node.name and node.name not in seen:
            seen[node.name] = node
    return list(seen.values())


def parse_jobs(document: Mapping[str, Any]) -> list[SlurmJob]:
    """The jobs of ``squeue --json`` that have an id."""
    return [job for job in map(SlurmJob.from_json, document.get("jobs") or []) if job.job_id]


def expand_hostlist(expression: str) -> list[str]:
    """Slurm's compressed host list: ``gpu[01-03,07],login1`` -> gpu01, gpu02, gpu03,
    gpu07, login1 (one bracket per name, as Slurm writes them for one prefix)."""
    names: list[str] = []
    for part in re.findall(r"[^,\[]+(?:\[[^\]]*\])?[^,]*", expression):
        match = re.fullmatch(r"([^\[]*)\[([^\]]*)\](.*)", part)
        if not match:
            names.append(part)
            continue
        prefix, ranges, suffix = match.groups()
        for item in ranges.split(","):
            low, _, high = item.partition("-")
            if not high:
                names.append(f"{prefix}{low}{suffix}")
                continue
            width = len(low)
            names += [f"{prefix}{n:0{width}d}{suffix}" for n in range(int(low), int(high) + 1)]
    return names
