"""What the ledger exports, as data: kept up to date by every write, rendered by a scrape.

A scrape must cost O(series), not O(history), so the store keeps these values
materialised in tables that each write updates in its own transaction
(``store.py``). Exclusion counts are plain increments. A job's attempt counts,
recovery downtime and retry chains come from ``chains.job_history`` over that
job's attempts, recomputed when one of its attempts changes: out-of-order
events (an attempt's end posted after the next attempt's start) then give the
same answer as a recomputation from the whole history.

Chains depend on time as well as on writes: an automatic attempt that has been
training for ``healthy_after`` seconds recovers its chain with no new event.
So each job summary says until when it holds (``valid_until``); a scrape after
that recomputes the job from its attempts.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from gpufleet.fleet.chains import DEFAULT_HEALTHY_AFTER_S, job_history, settle_superseded

DOWNTIME_BUCKETS = (60.0, 300.0, 600.0, 1800.0, 3600.0, 7200.0, 14400.0, 43200.0, 86400.0)
CHAIN_OUTCOMES = ("recovered", "manual", "abandoned")
# A summary is recomputed this long before the exact moment an attempt turns healthy,
# so float rounding in ``now - first_step >= healthy_after`` can never serve a stale value.
_EARLY_S = 1e-3


@dataclass(frozen=True, slots=True)
class Downtime:
    """One (job, trigger) histogram: cumulative counts per ``DOWNTIME_BUCKETS`` bound, then +Inf."""

    buckets: tuple[int, ...]
    sum: float


@dataclass(frozen=True, slots=True)
class JobSummary:
    """Everything the ledger exports about one training job."""

    attempts: dict[tuple[str, str, str], int]  # (trigger, outcome or "running", source) -> n
    downtime: dict[str, Downtime]  # by the next attempt's trigger
    chains: dict[str, int]  # closed chains by outcome
    open_failed: int  # failed automatic attempts in the open chain
    valid_until: float | None  # None: only a write can change it

    def to_json(self) -> str:
        return json.dumps(
            {
                "attempts": [[t, o, n, src] for (t, o, src), n in sorted(self.attempts.items())],
                "downtime": {t: [list(d.buckets), d.sum] for t, d in sorted(self.downtime.items())},
                "chains": self.chains,
                "open_failed": self.open_failed,
            }
        )

    @classmethod
    def from_json(cls, text: str, valid_until: float | None) -> JobSummary:
        data = json.loads(text)
        return cls(
            attempts={(t, o, (rest or ["manual"])[0]): n for t, o, n, *rest in data["attempts"]},
            downtime={t: Downtime(tuple(b), s) for t, (b, s) in data["downtime"].items()},
            chains=data["chains"],
            open_failed=data["open_failed"],
            valid_until=valid_until,
        )


def summarise_job(
    attempts: Iterable[Mapping[str, Any]],
    now: float,
    healthy_after: float = DEFAULT_HEALTHY_AFTER_S,
) -> JobSummary:
    """One job's exported values from its attempts (all of them, any order); an attempt
    a later one superseded counts as failed (``chains.settle_superseded``)."""
    rows = settle_superseded(attempts)
    counts: Counter[tuple[str, str, str]] = Counter(
        (str(a["trigger"]), str(a["outcome"] or "running"), str(a.get("source") or "manual"))
        for a in rows
    )
    history = job_history(rows, now, healthy_after)
    by_trigger: dict[str, list[float]] = {}
    for recovery in history.recoveries:
        by_trigger.setdefault(recovery.trigger, []).append(recovery.downtime_s)
    downtime = {
        trigger: Downtime(
            (*(sum(1 for v in values if v <= bound) for bound in DOWNTIME_BUCKETS), len(values)),
            sum(values),
        )
        for trigger, values in by_trigger.items()
    }
    closed = Counter(chain.outcome for chain in history.chains if chain.outcome)
    chain = history.open_chain
    # The moments at which an attempt still running becomes healthy (chains.py's rule).
    turns_healthy = [
        float(a["first_step_at"]) + healthy_after - _EARLY_S
        for a in rows
        if a["first_step_at"] is not None
        and a["ended_at"] is None
        and a["outcome"] != "success"
        and float(a["first_step_at"]) + healthy_after - _EARLY_S > now
    ]
    return JobSummary(
        attempts=dict(counts),
        downtime=downtime,
        chains={outcome: closed.get(outcome, 0) for outcome in CHAIN_OUTCOMES},
        open_failed=chain.failed_attempts if chain else 0,
        valid_until=min(turns_healthy) if turns_healthy else None,
    )


@dataclass(slots=True)
class LedgerSnapshot:
    """The values of one scrape, read in one transaction."""

    exclusion_counts: list[tuple[str, str, str, int]] = field(default_factory=list)
    excluded: list[str] = field(default_factory=list)  # nodes excluded now, sorted
    jobs: dict[str, JobSummary] = field(default_factory=dict)
    label_values: dict[str, int] = field(default_factory=dict)


def snapshot_from_history(
    exclusions: Iterable[Mapping[str, Any]],
    attempts: Iterable[Mapping[str, Any]],
    now: float,
    healthy_after: float = DEFAULT_HEALTHY_AFTER_S,
) -> LedgerSnapshot:
    """The same values recomputed from every stored row: the reference the tests hold
    the materialised counters to (and what every scrape cost before they existed)."""
    rows = list(exclusions)
    counts = Counter((str(r["node"]), str(r["reason"]), str(r["source"])) for r in rows)
    by_job: dict[str, list[Mapping[str, Any]]] = {}
    for attempt in attempts:
        by_job.setdefault(str(attempt["training_job"]), []).append(attempt)
    return LedgerSnapshot(
        exclusion_counts=[(*key, n) for key, n in sorted(counts.items())],
        excluded=sorted(str(r["node"]) for r in rows if r["released_at"] is None),
        jobs={job: summarise_job(a, now, healthy_after) for job, a in sorted(by_job.items())},
    )
