"""What Slurm says about its nodes and jobs: ``sinfo --json`` / ``squeue --json`` run and read.

Slurm 22.05 (Debian bookworm) answers ``--json`` from ``sinfo`` and ``squeue`` (OpenAPI
v0.0.38; its ``scontrol`` has no ``--json``). Later releases changed the shapes: a node's
``state`` became a list holding the flags, and numbers became ``{"set": .., "number": ..}``
objects. Both shapes are read here, so the watcher keeps working across an upgrade.
"""

from __future__ import annotations

import json
import re
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from gpufleet.sources.reasons import reason_from_text

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
        return reason_from_text(self.reason, self.state_name)

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


class SlurmError(RuntimeError):
    """A Slurm command failed or answered what could not be read."""

    def __init__(self, command: str, message: str) -> None:
        super().__init__(f"{command}: {message}")
        self.command = command


@dataclass(frozen=True)
class SlurmCommands:
    """The Slurm client commands (on PATH, reading $SLURM_CONF like any Slurm client)."""

    sinfo: str = "sinfo"
    squeue: str = "squeue"
    scontrol: str = "scontrol"
    timeout_s: float = 30.0

    def _run(self, name: str, argv: list[str]) -> str:
        try:
            done = subprocess.run(
                argv, capture_output=True, text=True, timeout=self.timeout_s, check=False
            )
        except (OSError, subprocess.TimeoutExpired) as error:
            raise SlurmError(name, str(error)) from None
        if done.returncode != 0:
            raise SlurmError(name, f"exit {done.returncode}: {done.stderr.strip()[:300]}")
        return done.stdout

    def _json(self, name: str, argv: list[str]) -> Mapping[str, Any]:
        text = self._run(name, argv)
        try:
            document = json.loads(text)
        except ValueError as error:
            why = f"not JSON ({error}); Slurm 21.08 or later answers --json"
            raise SlurmError(name, why) from None
        if not isinstance(document, Mapping):
            raise SlurmError(name, "the JSON answer is not an object")
        return document

    def nodes(self) -> list[SlurmNode]:
        return parse_nodes(self._json("sinfo", [self.sinfo, "--json", "--all"]))

    def jobs(self) -> list[SlurmJob]:
        return parse_jobs(self._json("squeue", [self.squeue, "--json", "--all"]))

    def cluster_name(self) -> str:
        """slurm.conf's ClusterName, as ``scontrol show config`` reports it."""
        text = self._run("scontrol", [self.scontrol, "show", "config"])
        found = re.search(r"^ClusterName\s*=\s*(\S+)", text, re.MULTILINE)
        if not found:
            raise SlurmError("scontrol", "show config names no ClusterName")
        return found.group(1)
