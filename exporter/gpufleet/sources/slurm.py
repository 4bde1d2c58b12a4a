"""Node exclusions and job attempts from Slurm: ``gpufleet slurm-watch``.

One watcher per cluster, beside slurmctld, polls ``sinfo --json`` and ``squeue --json``
(``slurmstate``) every ``--interval`` seconds and writes what changed to the ledger:

- a node drained, draining, failed or down becomes one exclusion, its ``Reason``
  normalised (an XID in it kept as ``xid79``), at the time Slurm set the reason; the
  node back in service releases it (only exclusions this watcher opened, never one an
  operator or another source did);
- a job requeued (its restart count rose) ends its attempt as failed at the requeue and
  starts the next one when it runs again, trigger ``auto`` when a node of its last run
  was out of service at the requeue (Slurm requeued it after a node failure), else
  ``manual`` (``scontrol requeue``: Slurm records no difference between the two, and a
  requeue for ``RequeueExit`` or a preemption reads as manual too).

Every write's Idempotency-Key comes from Slurm's own data (``slurm:<cluster>:<node>:
exclude:<reason time>``, the release keyed on the same drain, ``slurm:<cluster>:<job>:
<restart count>:started``), so a duplicate poll, a replay or a restarted watcher is
answered with the first answer and never counted twice. The ledger keeps keys for 7
days; beyond that only the watcher's state file (``--state-file``: the writes still
queued and the keys already answered, written after every poll) knows what was sent.
A change older than ``--max-event-age`` (6 days) that the state does not know is
skipped and counted, never sent: its key may have expired, so it could count twice.
"""

from __future__ import annotations

import collections
import hashlib
import json
import logging
import os
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from gpufleet.fleet.ledger_client import LedgerClient, LedgerError
from gpufleet.sources.slurmstate import (
    SlurmCommands,
    SlurmError,
    SlurmJob,
    SlurmNode,
    expand_hostlist,
)

log = logging.getLogger(__name__)

SOURCE = "slurm"
DEFAULT_MAX_EVENT_AGE_S = 6 * 86400.0  # a day inside the ledger's 7-day key window
STATE_VERSION = 1
ACTIONS = ("exclude", "release", "started", "ended")
OUTCOMES = ("stored", "replayed", "conflict", "refused", "failed")
PATHS = {
    "exclude": "/v1/exclusions",
    "release": "/v1/releases",
    "started": "/v1/attempts",
    "ended": "/v1/attempts",
}


def event_key(cluster: str, subject: str, *rest: object) -> str:
    """``slurm:<cluster>:<node or job>:...``; hashed when longer than the ledger's 128."""
    key = ":".join([SOURCE, cluster, subject, *map(str, rest)])
    if len(key) <= 128:
        return key
    digest = hashlib.sha256(f"{cluster}\0{subject}".encode()).hexdigest()[:32]
    return ":".join([SOURCE, digest, *map(str, rest)])


@dataclass(frozen=True, slots=True)
class SlurmWrite:
    action: str  # exclude, release, started, ended
    key: str
    payload: dict[str, Any]
    event_at: float  # when it happened in Slurm (the age rule and the state's pruning)

    @property
    def path(self) -> str:
        return PATHS[self.action]


@dataclass(slots=True)
class JobMemory:
    """A job as last seen: its restart count and its current run, if it ran."""

    restarts: int
    trigger: str  # of the attempt restarts + 1
    started_at: float | None = None
    nodes: str = ""


@dataclass
class SlurmWatchStats:
    polls: int = 0
    poll_errors: collections.Counter[str] = field(default_factory=collections.Counter)
    changes: collections.Counter[str] = field(default_factory=collections.Counter)
    skipped: collections.Counter[str] = field(default_factory=collections.Counter)
    writes: collections.Counter[tuple[str, str]] = field(default_factory=collections.Counter)
    pending: int = 0
    nodes: int = 0
    out_of_service: int = 0
    up: bool = False
    last_poll: float = 0.0


class SlurmWatcher:
    """Turns what Slurm says into the ledger's exclusions, releases and attempts."""

    def __init__(
        self,
        slurm: SlurmCommands,
        ledger: LedgerClient,
        cluster: str,
        *,
        state_file: Path | None = None,
        attempts: str = "requeued",  # requeued, all or off
        max_event_age_s: float = DEFAULT_MAX_EVENT_AGE_S,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.slurm, self.ledger, self.cluster = slurm, ledger, cluster
        self.state_file = state_file
        self.attempts = attempts
        self.max_event_age_s = max_event_age_s
        self.clock = clock
        self.stats = SlurmWatchStats()
        self.pending: list[SlurmWrite] = []
        self.answered: dict[str, float] = {}  # key -> event time, of writes the ledger answered
        self.skipped: set[str] = set()
        self.jobs: dict[str, JobMemory] = {}
        self.open: dict[str, tuple[str, float]] = {}  # node -> (exclusion key, excluded at)
        self.reasons: dict[str, str] = {}  # out-of-service node -> its ledger reason
        self._lock = threading.Lock()
        self._load_state()

    # -- one poll --------------------------------------------------------------------

    def poll(self) -> bool:
        """Read Slurm once, queue what changed, deliver the queue; False if Slurm failed."""
        try:
            nodes = self.slurm.nodes()
            jobs = self.slurm.jobs() if self.attempts != "off" else []
        except SlurmError as error:
            log.warning("polling Slurm failed: %s", error)
            with self._lock:
                self.stats.poll_errors[error.command] += 1
                self.stats.up = False
            return False
        if not self.pending:
            self._refresh_open_exclusions()
        now = self.clock()
        with self._lock:
            self.stats.polls += 1
            troubled = {node.name: node.ledger_reason for node in nodes if node.out_of_service}
            # A node that came back between two polls still explains a requeue seen now.
            blamed = {**self.reasons, **troubled}
            self.reasons = troubled
            for node in nodes:
                self._node(node, now)
            for job in jobs:
                self._job(job, blamed, now)
            listed = {job.job_id for job in jobs}
            self.jobs = {job_id: m for job_id, m in self.jobs.items() if job_id in listed}
            self.stats.nodes, self.stats.out_of_service = len(nodes), len(troubled)
            self.stats.up, self.stats.last_poll = True, now
        self.deliver()
        self._save_state()
        return True

    def _refresh_open_exclusions(self) -> None:
        """What the ledger holds open now (an operator may have released a node)."""
        try:
            rows = self.ledger.get("/v1/excluded")
        except LedgerError as error:
            log.warning("cannot read the ledger's open exclusions: %s", error)
            with self._lock:
                self.stats.writes[("read", "failed")] += 1
            return
        with self._lock:
            self.open = {
                str(row["node"]): (str(row.get("idempotency_key") or ""), float(row["excluded_at"]))
                for row in rows
            }

    def _node(self, node: SlurmNode, now: float) -> None:
        opened = self.open.get(node.name)
        if node.out_of_service:
            if opened is not None:
                return  # already excluded in the ledger, by this watcher or anyone else
            at = min(node.reason_changed_at or now, now)
            key = event_key(self.cluster, node.name, "exclude", int(at))
            note = f"slurm: {'+'.join(sorted(node.states))}: {node.reason}"[:500]
            payload = {"node": node.name, "reason": node.ledger_reason, "source": SOURCE,
                       "at": at, "note": note}  # fmt: skip
            if self._queue(SlurmWrite("exclude", key, payload, at), now):
                self.open[node.name] = (key, at)
        elif opened is not None:
            key, excluded_at = opened
            mine = event_key(self.cluster, node.name, "exclude", "")
            if not key.startswith(mine):
                return  # an operator's or another source's: theirs to release
            at = max(now, excluded_at)
            release = SlurmWrite("release", key.replace(":exclude:", ":release:"),
                            {"node": node.name, "source": SOURCE, "at": at,
                             "note": "slurm: back in service"}, at)  # fmt: skip
            self._queue(release, now)
            del self.open[node.name]

    def _job(self, job: SlurmJob, blamed: Mapping[str, str], now: float) -> None:
        memory = self.jobs.get(job.job_id)
        if memory is not None and job.restarts > memory.restarts and job.state == "COMPLETING":
            return  # the requeued run is still ending; its submit time is not yet the requeue's
        if memory is not None and job.restarts > memory.restarts:
            # Requeued since the last poll: the run seen before ended at the requeue.
            nodes = expand_hostlist(memory.nodes)
            cause = next((blamed[n] for n in nodes if n in blamed), None)
            if memory.started_at is not None and self._tracked(job.restarts):
                attempt = memory.restarts + 1
                self._started(job.job_id, attempt, memory.trigger, memory.started_at, now)
                ended = max(job.submitted_at or now, memory.started_at)
                self._ended(job.job_id, attempt, "failed", cause or "requeued", ended, now)
            memory = JobMemory(job.restarts, "auto" if cause else "manual")
        if memory is None:
            # First sight: a requeue not seen happening is read as Slurm's own (auto).
            memory = JobMemory(job.restarts, "initial" if job.restarts == 0 else "auto")
        self.jobs[job.job_id] = memory
        ran = job.running or (job.outcome is not None and job.ended_at is not None)
        if ran and job.started_at is not None:
            memory.started_at, memory.nodes = job.started_at, job.nodes
        if memory.started_at is None or not self._tracked(job.restarts):
            return
        attempt = job.restarts + 1
        self._started(job.job_id, attempt, memory.trigger, memory.started_at, now)
        if job.outcome is not None:
            ended = max(job.ended_at or now, memory.started_at)
            self._ended(job.job_id, attempt, job.outcome, None, ended, now)

    def _tracked(self, restarts: int) -> bool:
        return self.attempts == "all" or (self.attempts == "requeued" and restarts > 0)

    def _started(self, job_id: str, attempt: int, trigger: str, at: float, now: float) -> None:
        payload = {"training_job": job_id, "attempt": attempt, "event": "started",
                   "trigger": trigger, "at": at, "source": SOURCE}  # fmt: skip
        key = event_key(self.cluster, job_id, attempt - 1, "started")
        self._queue(SlurmWrite("started", key, payload, at), now)

    def _ended(  # noqa: PLR0917 - the attempt's fields, as _started takes them
        self, job_id: str, attempt: int, outcome: str, cause: str | None, at: float, now: float
    ) -> None:
        payload: dict[str, Any] = {"training_job": job_id, "attempt": attempt, "event": "ended",
                                   "outcome": outcome, "at": at, "source": SOURCE}  # fmt: skip
        if cause:
            payload["cause"] = cause
        key = event_key(self.cluster, job_id, attempt - 1, "ended")
        self._queue(SlurmWrite("ended", key, payload, at), now)

    def _queue(self, write: SlurmWrite, now: float) -> bool:
        """Queue a write not yet answered nor queued (under the lock); True if queued."""
        if write.key in self.answered or any(w.key == write.key for w in self.pending):
            return False
        if write.event_at < now - self.max_event_age_s:
            if write.key not in self.skipped:
                self.skipped.add(write.key)
                self.stats.skipped[write.action] += 1
                log.info("%s %s is older than the ledger keeps keys; not sent", write.action,
                         write.key)  # fmt: skip
            return False
        self.pending.append(write)
        self.stats.changes[write.action] += 1
        self.stats.pending = len(self.pending)
        return True

    # -- the ledger side ---------------------------------------------------------------

    def deliver(self) -> int:
        """Send the queue in order until one does not arrive; how many are left."""
        while True:
            with self._lock:
                if not self.pending:
                    self.stats.pending = 0
                    return 0
                write = self.pending[0]
            outcome = self._send(write)
            with self._lock:
                self.stats.writes[(write.action, outcome)] += 1
                if outcome == "failed":
                    self.stats.pending = len(self.pending)
                    return len(self.pending)
                self.pending.pop(0)
                self.answered[write.key] = write.event_at
                node = str(write.payload.get("node"))
                if write.action == "exclude" and outcome == "conflict" and node in self.open:
                    # Someone else's exclusion is open: the next read of the ledger says whose.
                    del self.open[node]

    def _send(self, write: SlurmWrite) -> str:
        try:
            replayed = self.ledger.post_once(write.path, write.payload, write.key)
        except LedgerError as error:
            if error.status is None or error.status >= 500:
                log.warning("%s %s not delivered (will retry): %s", write.action, write.key, error)
                return "failed"
            outcome = "conflict" if error.status == 409 else "refused"
            level = logging.INFO if outcome == "conflict" else logging.ERROR
            log.log(level, "%s %s: %s", write.action, write.key, error)
            return outcome
        return "replayed" if replayed else "stored"

    # -- the state file ------------------------------------------------------------------

    def _load_state(self) -> None:
        if self.state_file is None or not self.state_file.exists():
            return
        try:
            state = json.loads(self.state_file.read_text())
            if state.get("version") != STATE_VERSION or state.get("cluster") != self.cluster:
                log.warning("%s is not this watcher's state (version or cluster); starting "
                            "without it", self.state_file)  # fmt: skip
                return
            self.pending = [SlurmWrite(**w) for w in state["pending"]]
            self.answered = {str(k): float(v) for k, v in state["answered"].items()}
            self.jobs = {str(k): JobMemory(**v) for k, v in state["jobs"].items()}
        except (OSError, ValueError, KeyError, TypeError) as error:
            log.warning("cannot read the state file %s (%s); starting without it",
                        self.state_file, error)  # fmt: skip
        self.stats.pending = len(self.pending)

    def _save_state(self) -> None:
        if self.state_file is None:
            return
        with self._lock:
            # A key answered longer ago than 4 event ages is skipped by the age rule anyway.
            oldest = self.clock() - 4 * self.max_event_age_s
            self.answered = {k: at for k, at in self.answered.items() if at >= oldest}
            state = {
                "version": STATE_VERSION,
                "cluster": self.cluster,
                "pending": [asdict(w) for w in self.pending],
                "answered": self.answered,
                "jobs": {k: asdict(m) for k, m in self.jobs.items()},
            }
        partial = self.state_file.with_name(self.state_file.name + ".tmp")
        try:
            partial.write_text(json.dumps(state, sort_keys=True))
            os.replace(partial, self.state_file)
        except OSError as error:
            log.error("cannot write the state file %s: %s", self.state_file, error)

    def snapshot(self) -> SlurmWatchStats:
        with self._lock:
            return SlurmWatchStats(
                polls=self.stats.polls,
                poll_errors=collections.Counter(self.stats.poll_errors),
                changes=collections.Counter(self.stats.changes),
                skipped=collections.Counter(self.stats.skipped),
                writes=collections.Counter(self.stats.writes),
                pending=len(self.pending),
                nodes=self.stats.nodes,
                out_of_service=self.stats.out_of_service,
                up=self.stats.up,
                last_poll=self.stats.last_poll,
            )
