"""Retry chains and recovery downtime, derived from a job's attempts.

A *recovery* is the gap from a failed attempt's end to the next attempt's first
step: the time the job produced nothing. A *chain* starts when an attempt
fails and collects the automatic attempts that follow. It ends

- ``recovered``: an automatic attempt reached its first step and then ran for
  at least ``healthy_after`` seconds (or finished successfully);
- ``manual``: the next attempt was started by a person;
- ``abandoned``: the job was cancelled, an attempt finished without recovering, or the
  launcher gave up (an attempt failed with ``restarts_exhausted``: torchrun's last
  restart). A chain the launcher gave up on keeps ``exhausted``; until the job's next
  attempt, its failed attempts are still what the on-call must act on (counters.py).

A chain still open has ``failed_attempts`` automatic attempts that failed so
far: the number an on-call engineer wants to see before the fourth try.

An attempt that never sent ``ended`` (killed by SIGKILL, its node lost) is not
running for ever: once a later attempt of the same job has started, it is read
as failed at that attempt's start, cause ``superseded`` (``settle_superseded``).
The stored row keeps what was sent, so an ``ended`` that arrives late still
wins; every reader (the counters, their recomputation, the report) settles the
rows the same way, through ``job_history`` or ``settle_superseded``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

DEFAULT_HEALTHY_AFTER_S = 1800.0
SUPERSEDED = "superseded"  # the cause of an attempt read as failed because a later one started


@dataclass(frozen=True, slots=True)
class Recovery:
    training_job: str
    failed_attempt: int
    next_attempt: int
    trigger: str  # of the next attempt: auto or manual
    downtime_s: float


@dataclass(slots=True)
class Chain:
    training_job: str
    started_at: float  # when the attempt that opened it failed
    attempts: list[int] = field(default_factory=list)  # automatic attempts in the chain
    failed_attempts: int = 0
    outcome: str | None = None  # None while open
    ended_at: float | None = None
    exhausted_at: int | None = None  # the attempt whose failure ended the launcher's retries


@dataclass(slots=True)
class JobHistory:
    recoveries: list[Recovery] = field(default_factory=list)
    chains: list[Chain] = field(default_factory=list)

    @property
    def open_chain(self) -> Chain | None:
        if self.chains and self.chains[-1].outcome is None:
            return self.chains[-1]
        return None


def settle_superseded(attempts: Iterable[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """One job's attempts in number order, each one with no end that a later attempt
    followed read as failed at the next attempt's start (never before its own start),
    cause ``superseded``. The rows given are not changed; settled ones are copies."""
    ordered = sorted(attempts, key=lambda a: int(a["attempt"]))
    settled: list[Mapping[str, Any]] = []
    for attempt, following in zip(ordered, [*ordered[1:], None], strict=True):
        if following is not None and attempt.get("ended_at") is None:
            end = max(float(following["started_at"]), float(attempt["started_at"]))
            settled.append({**attempt, "ended_at": end, "outcome": "failed", "cause": SUPERSEDED})
        else:
            settled.append(attempt)
    return settled


def attempt_recovered(attempt: Mapping[str, Any], now: float, healthy_after: float) -> bool:
    """Did this attempt recover the job: it reached its first step, then finished
    successfully or ran for ``healthy_after`` seconds (by its end, or by ``now``)?
    The one definition: chains close on it and the report counts successes with it."""
    first = attempt.get("first_step_at")
    if first is None:
        return False
    if attempt.get("outcome") == "success":
        return True
    end = attempt.get("ended_at")
    ran = (end if end is not None else now) - first
    return bool(ran >= healthy_after)


def job_history(
    attempts: Iterable[Mapping[str, Any]],
    now: float,
    healthy_after: float = DEFAULT_HEALTHY_AFTER_S,
) -> JobHistory:
    """Recoveries and chains of one job, from its attempts (settled: see above)."""
    ordered = settle_superseded(attempts)
    history = JobHistory()
    previous: Mapping[str, Any] | None = None
    for attempt in ordered:
        job = str(attempt["training_job"])
        if (
            previous is not None
            and previous.get("outcome") == "failed"
            and previous.get("ended_at") is not None
            and attempt.get("first_step_at") is not None
        ):
            history.recoveries.append(
                Recovery(
                    job,
                    int(previous["attempt"]),
                    int(attempt["attempt"]),
                    str(attempt["trigger"]),
                    float(attempt["first_step_at"]) - float(previous["ended_at"]),
                )
            )
        chain = history.open_chain
        if chain is not None:
            if attempt["trigger"] == "manual":
                chain.outcome, chain.ended_at = "manual", float(attempt["started_at"])
            else:
                chain.attempts.append(int(attempt["attempt"]))
                if attempt_recovered(attempt, now, healthy_after):
                    chain.outcome = "recovered"
                    chain.ended_at = float(attempt["first_step_at"])
                elif attempt.get("outcome") == "failed":
                    chain.failed_attempts += 1
                elif attempt.get("outcome") in ("cancelled", "success"):
                    chain.outcome, chain.ended_at = "abandoned", attempt.get("ended_at")
        if attempt.get("outcome") == "failed" and history.open_chain is None:
            history.chains.append(Chain(job, float(attempt["ended_at"])))
        elif attempt.get("outcome") == "cancelled" and history.open_chain is not None:
            open_chain = history.open_chain
            open_chain.outcome, open_chain.ended_at = "abandoned", attempt.get("ended_at")
        if attempt.get("outcome") == "failed" and attempt.get("restarts_exhausted"):
            given_up = history.open_chain
            if given_up is not None:  # no automatic attempt follows
                given_up.outcome, given_up.ended_at = "abandoned", attempt.get("ended_at")
                given_up.exhausted_at = int(attempt["attempt"])
        previous = attempt
    return history


def histories(
    attempts: Iterable[Mapping[str, Any]],
    now: float,
    healthy_after: float = DEFAULT_HEALTHY_AFTER_S,
) -> dict[str, JobHistory]:
    by_job: dict[str, list[Mapping[str, Any]]] = {}
    for attempt in attempts:
        by_job.setdefault(str(attempt["training_job"]), []).append(attempt)
    return {job: job_history(rows, now, healthy_after) for job, rows in by_job.items()}
