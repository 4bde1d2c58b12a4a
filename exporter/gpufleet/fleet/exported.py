"""The tables /metrics reads, kept current by each write and read whole by a scrape.

Why a series is exported, and when its exposition epoch begins, is in ``counters.py``;
here are the SQL side of it (``exclusion_counts``, ``job_summaries``) and the caps.
Every method that takes ``db`` runs inside the caller's transaction: the writer's,
for the upkeep, or a reader's, for a scrape.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from gpufleet.fleet.counters import JobSummary, LedgerSnapshot, summarise_job
from gpufleet.fleet.models import SOURCES

# what the caps bound, as gpufleet_fleet_exposition_* label it
EXPOSITION_KINDS = ("exclusion_series", "excluded_node", "training_job")


@dataclass(frozen=True, slots=True)
class LedgerLimits:
    """What /metrics exports at most, and how long keys are kept. None of these refuses a
    write: the ledger stores every valid event and its API answers the whole history.

    A series is exported while it changed within ``export_retention_s`` (a job also while
    an attempt of it is running), the most recently changed first up to its cap; the rest
    are counted in ``gpufleet_fleet_exposition_left_out``. The retention must exceed the
    longest rule window (``reliability_window``, 30d by default) so a series leaves only
    once no window holds a change of it (see ``counters.py``)."""

    max_nodes: int = 10_000  # nodes in gpufleet_fleet_node_excluded (excluded now)
    max_training_jobs: int = 2_000  # jobs exported at once
    max_exclusion_series: int = 10_000  # (node, reason, source) series exported at once
    export_retention_s: float = 40 * 86400.0
    idempotency_window_s: float = 7 * 86400.0

    @property
    def worst_case_series(self) -> int:
        """The most series the ledger's own families can reach at these caps (self-metrics
        included), however long it runs and however many jobs and nodes it has seen."""
        # per job: attempts 3 triggers x 4 outcomes x 6 sources, each with its _created;
        # a downtime histogram per trigger (9 buckets, +Inf, sum, count); 3 chain outcomes
        # with their _created; 1 open-chain gauge
        per_job = 3 * 4 * len(SOURCES) * 2 + 3 * 12 + 3 * 2 + 1
        per_exclusion_series = 2  # the counter and its _created
        self_series = 1 + 3 * len(EXPOSITION_KINDS)  # excluded_nodes; entries, limit, left out
        return (
            per_exclusion_series * self.max_exclusion_series
            + self.max_nodes
            + per_job * self.max_training_jobs
            + self_series
        )

    def cap(self, kind: str) -> int:
        """The cap on one kind of exported entry (``EXPOSITION_KINDS``)."""
        return {
            "exclusion_series": self.max_exclusion_series,
            "excluded_node": self.max_nodes,
            "training_job": self.max_training_jobs,
        }[kind]


class ExportedSeries:
    """The exported rows under ``limits``, a job's chains judged with ``healthy_after``."""

    def __init__(self, limits: LedgerLimits, healthy_after: float) -> None:
        self.limits = limits
        self.healthy_after = healthy_after

    def _exported_until(self, now: float) -> float:
        """A series whose last change is older than this is no longer exported."""
        return now - self.limits.export_retention_s

    # -- kept current by the writes -------------------------------------------------------

    def count_exclusion(
        self, db: sqlite3.Connection, series: tuple[str, str, str], now: float
    ) -> None:
        """One more exclusion of a (node, reason, source) series."""
        counted = db.execute(
            "SELECT changed_at FROM exclusion_counts WHERE node = ? AND reason = ? AND source = ?",
            series,
        ).fetchone()
        if counted is not None and self._series_exported(db, counted[0], now):
            db.execute(
                "UPDATE exclusion_counts SET count = count + 1, changed_at = ? "
                "WHERE node = ? AND reason = ? AND source = ?",
                (now, *series),
            )
        else:  # a new series, or one back in the exposition: a new epoch
            db.execute(
                "INSERT OR REPLACE INTO exclusion_counts "
                "(node, reason, source, count, created_at, changed_at) "
                "VALUES (?, ?, ?, 1, ?, ?)",
                (*series, now, now),
            )

    def _series_exported(self, db: sqlite3.Connection, changed_at: float, now: float) -> bool:
        if changed_at < self._exported_until(now):
            return False
        newer: int = db.execute(
            "SELECT count(*) FROM exclusion_counts WHERE changed_at > ?", (changed_at,)
        ).fetchone()[0]
        return newer < self.limits.max_exclusion_series

    def touch_job(self, db: sqlite3.Connection, job: str, now: float) -> None:
        """A write changed this job: it is exported from now, in a new exposition epoch
        if it was not exported until now (see ``counters.py``), then recomputed."""
        row = db.execute(
            "SELECT created_at, changed_at, running FROM job_summaries WHERE training_job = ?",
            (job,),
        ).fetchone()
        if row is None or not self._job_exported(db, row["changed_at"], row["running"], now):
            db.execute(
                "INSERT OR REPLACE INTO job_summaries (training_job, summary, valid_until, "
                "created_at, changed_at, running) VALUES (?, '', NULL, ?, ?, 0)",
                (job, now, now),
            )
        else:
            db.execute("UPDATE job_summaries SET changed_at = ? WHERE training_job = ?", (now, job))
        self.refresh_job(db, job, now)

    def _job_exported(
        self, db: sqlite3.Connection, changed_at: float, running: int, now: float
    ) -> bool:
        cutoff = self._exported_until(now)
        if changed_at < cutoff and not running:
            return False
        newer: int = db.execute(
            "SELECT count(*) FROM job_summaries WHERE changed_at > ? "
            "AND (changed_at >= ? OR running)",
            (changed_at, cutoff),
        ).fetchone()[0]
        return newer < self.limits.max_training_jobs

    def refresh_job(self, db: sqlite3.Connection, job: str, now: float) -> None:
        """Recompute a job's exported summary over its current epoch's attempts."""
        row = db.execute(
            "SELECT created_at FROM job_summaries WHERE training_job = ?", (job,)
        ).fetchone()
        since = row[0] if row is not None else float("-inf")
        summary = summarise_job(_job_attempts(db, job, since), now, self.healthy_after)
        db.execute(
            "UPDATE job_summaries SET summary = ?, valid_until = ?, running = ? "
            "WHERE training_job = ?",
            (summary.to_json(), summary.valid_until, int(summary.running), job),
        )

    def backfill_job_summaries(self, db: sqlite3.Connection, clock: Callable[[], float]) -> None:
        """One summary per job, its whole history one exposition epoch (migration 6)."""
        db.execute(
            "INSERT OR REPLACE INTO job_summaries (training_job, summary, valid_until, "
            "created_at, changed_at, running) SELECT training_job, '', NULL, "
            "min(started_at), max(recorded_at), 0 FROM attempts GROUP BY training_job"
        )
        for row in db.execute("SELECT training_job FROM job_summaries").fetchall():
            self.refresh_job(db, row[0], clock())

    # -- read by a scrape -----------------------------------------------------------------

    def read(self, db: sqlite3.Connection, now: float) -> tuple[LedgerSnapshot, list[str]]:
        """What /metrics exports, read in one transaction: the series changed within the
        retention, most recent first up to each cap; O(exported series) rows, not the
        history (the open exclusions are read from their partial index). Also the jobs
        recomputed because an attempt turned healthy since their last write."""
        cutoff = self._exported_until(now)
        limits = self.limits
        snapshot = LedgerSnapshot()
        expired: list[str] = []
        db.execute("BEGIN")
        series = db.execute(
            "SELECT node, reason, source, count, created_at FROM exclusion_counts "
            "WHERE changed_at >= ? ORDER BY changed_at DESC, node, reason, source LIMIT ?",
            (cutoff, limits.max_exclusion_series),
        ).fetchall()
        recent: int = db.execute(
            "SELECT count(*) FROM exclusion_counts WHERE changed_at >= ?", (cutoff,)
        ).fetchone()[0]
        snapshot.exclusion_counts = sorted((r[0], r[1], r[2], r[3]) for r in series)
        snapshot.created = {(r[0], r[1], r[2]): r[4] for r in series}
        snapshot.left_out["exclusion_series"] = recent - len(series)
        excluded = db.execute(
            "SELECT node, excluded_at FROM exclusions WHERE released_at IS NULL"
        ).fetchall()
        newest = sorted(excluded, key=lambda r: (-r[1], r[0]))[: limits.max_nodes]
        snapshot.excluded = sorted(r[0] for r in newest)
        snapshot.excluded_total = len(excluded)
        snapshot.left_out["excluded_node"] = len(excluded) - len(newest)
        jobs = db.execute(
            "SELECT training_job, summary, valid_until, created_at FROM job_summaries "
            "WHERE changed_at >= ? OR running ORDER BY changed_at DESC, training_job LIMIT ?",
            (cutoff, limits.max_training_jobs),
        ).fetchall()
        active: int = db.execute(
            "SELECT count(*) FROM job_summaries WHERE changed_at >= ? OR running", (cutoff,)
        ).fetchone()[0]
        snapshot.left_out["training_job"] = active - len(jobs)
        for job, text, valid_until, created_at in sorted(jobs, key=lambda r: str(r[0])):
            snapshot.job_created[job] = created_at
            if valid_until is not None and now >= valid_until:
                # An attempt turned healthy since the last write: recompute this job.
                attempts = _job_attempts(db, job, created_at)
                snapshot.jobs[job] = summarise_job(attempts, now, self.healthy_after)
                expired.append(job)
            else:
                snapshot.jobs[job] = JobSummary.from_json(text, valid_until)
        db.execute("COMMIT")
        return snapshot, expired


def _job_attempts(db: sqlite3.Connection, job: str, since: float) -> list[dict[str, Any]]:
    """The attempts of a job's exposition epoch: those written since it began."""
    return [
        dict(row)
        for row in db.execute(
            "SELECT * FROM attempts WHERE training_job = ? AND recorded_at >= ?", (job, since)
        )
    ]
