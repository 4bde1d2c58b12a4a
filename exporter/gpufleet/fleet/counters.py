"""What the ledger exports, as data: kept up to date by every write, rendered by a scrape.

A scrape must cost O(series), not O(history), so the store keeps these values
materialised in tables that each write updates in its own transaction
(``exported.py``). Exclusion counts are plain increments. A job's attempt counts,
recovery downtime and retry chains come from ``chains.job_history`` over that
job's attempts, recomputed when one of its attempts changes: out-of-order
events (an attempt's end posted after the next attempt's start) then give the
same answer as a recomputation from the whole history.

Chains depend on time as well as on writes: an automatic attempt that has been
training for ``healthy_after`` seconds recovers its chain with no new event.
So each job summary says until when it holds (``valid_until``); a scrape after
that recomputes the job from its attempts.

What is exported, and why the rules stay right
----------------------------------------------
The ledger stores every valid event for ever; /metrics exports only what is
*live*: a (node, reason, source) exclusion series that a write changed within
``LedgerLimits.export_retention_s`` (40 d by default), a job written within it
or with an attempt running, the most recently changed first up to each cap
(``max_exclusion_series``, ``max_training_jobs``, ``max_nodes`` for the nodes
excluded now). ``gpufleet_fleet_exposition_left_out`` counts what a cap left
out. So however long the cluster runs, the exposition holds at most
``LedgerLimits.worst_case_series`` series, and typically what the last 40 days
wrote.

The rules read increases as ``x - (x offset W or x * 0)`` (W up to
``reliability_window``, 30 d), which counts a series Prometheus had no sample
of W ago in full. A series that left the exposition and came back at its old
cumulative value would be counted whole: a false repeat offender. So each
exported counter counts the events of its *exposition epoch*: a series enters
the exposition at a write (new, or back after it had left) with a new epoch,
counting from that event, and says when the epoch began as its counter's
``_created``. The rules compare ``x_created`` too (``rules/reliability.py``):
``x offset W`` is subtracted only when it belongs to the same epoch (or comes
from a ledger older than ``_created``), else the epoch's count is taken whole.
This is right for every window W and time t:

- the epoch began before t - W and the series was exported since (an epoch
  has no gap: leaving ends it): ``x(t) - x(t - W)``, the events within W;
- the epoch began within W: its whole count, all events within W; and the
  series' earlier epoch holds no event within W, because it left only after
  ``export_retention_s`` (> W) without a change;
- the series is not exported at t: its last change is older than the
  retention, so no event lies within W, and the rules see none.

Only a cap can end an epoch early; then the rules under-count the left-out
series' events (never over-count: no false page), and the left-out gauge says
so. ``alerts/tests/reliability.test.yaml`` holds the promtool cases: a node
back after 60 quiet days with one exclusion does not fire
``GpuFleetRepeatOffenderNode``; two within 7 days do.

A job's epoch holds the attempts written since it began (``recorded_at``);
the whole history stays in the API. ``snapshot_from_history`` recomputes one
epoch per series from all rows: the reference for a ledger whose series never
left the exposition.
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

    @property
    def running(self) -> bool:
        """An attempt of the job is running (no end, and no later attempt started)."""
        return any(outcome == "running" for _, outcome, _ in self.attempts)

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
    last_attempt = max((int(a["attempt"]) for a in rows), default=None)
    if chain is None and history.chains and history.chains[-1].exhausted_at == last_attempt:
        # the launcher gave up and nobody has started the job again: its failed retries
        # still stand (GpuFleetRetryChainFailing), though the chain is closed as abandoned
        chain = history.chains[-1]
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
    excluded_total: int = 0  # nodes excluded now, exported or not
    # when each exported counter's exposition epoch began: its _created
    created: dict[tuple[str, str, str], float] = field(default_factory=dict)
    job_created: dict[str, float] = field(default_factory=dict)
    left_out: dict[str, int] = field(default_factory=dict)  # by EXPOSITION_KINDS


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
