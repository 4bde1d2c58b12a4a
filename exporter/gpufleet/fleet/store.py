"""The ledger's storage: SQLite in WAL mode, versioned migrations, idempotent writes.

Every write runs in one ``BEGIN IMMEDIATE`` transaction together with its
idempotency record and the exported counters it changes (``counters.py``), and
is committed (``synchronous=FULL``) before the API answers 2xx, so an
acknowledged event survives the process being killed at any moment, and the
counters always equal what the history says. Replaying a key returns the first
answer without writing again; reusing a key for a different request is a
conflict. Keys are kept for ``idempotency_window_s`` (7 days by default): a
retry must come within that window.

One writer thread (``writer.py``) owns the only writing connection, so neither
a write nor its fsync ever runs on the event loop, and requests that queue up
meanwhile share one commit, each in its own savepoint (a refused request still
changes nothing). Reads use their own connections and, in WAL mode, run
concurrently with the writer and with each other.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import logging
import queue
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from gpufleet.fleet.chains import DEFAULT_HEALTHY_AFTER_S
from gpufleet.fleet.counters import JobSummary, LedgerSnapshot, summarise_job
from gpufleet.fleet.models import SOURCES, AttemptEventIn, ExclusionIn, ReleaseIn
from gpufleet.fleet.writer import SerialWriter, WriterUnavailableError

log = logging.getLogger(__name__)
T = TypeVar("T")

MIGRATIONS: tuple[str, ...] = (
    # 1: the first schema
    """
    CREATE TABLE idempotency (
        key TEXT PRIMARY KEY,
        request_hash TEXT NOT NULL,
        status INTEGER NOT NULL,
        response TEXT NOT NULL,
        created_at REAL NOT NULL
    );
    CREATE TABLE exclusions (
        id INTEGER PRIMARY KEY,
        node TEXT NOT NULL,
        reason TEXT NOT NULL,
        source TEXT NOT NULL CHECK (source IN ('auto', 'manual')),
        training_job TEXT,
        excluded_at REAL NOT NULL,
        released_at REAL,
        note TEXT NOT NULL DEFAULT '',
        idempotency_key TEXT NOT NULL
    );
    CREATE INDEX exclusions_node ON exclusions (node, excluded_at);
    CREATE INDEX exclusions_time ON exclusions (excluded_at);
    CREATE TABLE attempts (
        id INTEGER PRIMARY KEY,
        training_job TEXT NOT NULL,
        attempt INTEGER NOT NULL,
        trigger TEXT NOT NULL CHECK (trigger IN ('initial', 'auto', 'manual')),
        started_at REAL NOT NULL,
        first_step_at REAL,
        ended_at REAL,
        outcome TEXT CHECK (outcome IN ('success', 'failed', 'cancelled')),
        cause TEXT,
        UNIQUE (training_job, attempt)
    );
    """,
    # 2: releases keep their note, so the history says why a node came back
    """
    ALTER TABLE exclusions ADD COLUMN release_note TEXT NOT NULL DEFAULT '';
    """,
    # 3: what /metrics exports, kept up to date by each write (so a scrape reads O(series)
    # rows, not the history); the label values each writer has created, for the caps; and
    # an index to prune old idempotency keys by.
    """
    CREATE INDEX idempotency_created ON idempotency (created_at);
    CREATE INDEX exclusions_open ON exclusions (node) WHERE released_at IS NULL;
    CREATE TABLE exclusion_counts (
        node TEXT NOT NULL,
        reason TEXT NOT NULL,
        source TEXT NOT NULL,
        count INTEGER NOT NULL,
        PRIMARY KEY (node, reason, source)
    ) WITHOUT ROWID;
    INSERT INTO exclusion_counts (node, reason, source, count)
        SELECT node, reason, source, count(*) FROM exclusions GROUP BY node, reason, source;
    CREATE TABLE label_values (
        label TEXT NOT NULL,
        value TEXT NOT NULL,
        PRIMARY KEY (label, value)
    ) WITHOUT ROWID;
    INSERT OR IGNORE INTO label_values SELECT 'node', node FROM exclusions;
    INSERT OR IGNORE INTO label_values SELECT 'reason', reason FROM exclusions;
    INSERT OR IGNORE INTO label_values SELECT 'training_job', training_job FROM attempts;
    CREATE TABLE job_summaries (
        training_job TEXT PRIMARY KEY,
        summary TEXT NOT NULL,
        valid_until REAL
    ) WITHOUT ROWID;
    """,
    # 4: every event names the system that wrote it (models.SOURCES): exclusions lose the
    # auto/manual CHECK (SQLite changes a CHECK only by rebuilding the table), releases and
    # attempts gain the column; job summaries are recomputed (attempts gain a source label).
    """
    CREATE TABLE exclusions_v4 (
        id INTEGER PRIMARY KEY,
        node TEXT NOT NULL,
        reason TEXT NOT NULL,
        source TEXT NOT NULL,
        training_job TEXT,
        excluded_at REAL NOT NULL,
        released_at REAL,
        note TEXT NOT NULL DEFAULT '',
        idempotency_key TEXT NOT NULL,
        release_note TEXT NOT NULL DEFAULT '',
        release_source TEXT
    );
    INSERT INTO exclusions_v4 (id, node, reason, source, training_job, excluded_at,
        released_at, note, idempotency_key, release_note, release_source)
        SELECT id, node, reason, source, training_job, excluded_at, released_at, note,
            idempotency_key, release_note,
            CASE WHEN released_at IS NULL THEN NULL ELSE 'manual' END
        FROM exclusions;
    DROP TABLE exclusions;
    ALTER TABLE exclusions_v4 RENAME TO exclusions;
    CREATE INDEX exclusions_node ON exclusions (node, excluded_at);
    CREATE INDEX exclusions_time ON exclusions (excluded_at);
    CREATE INDEX exclusions_open ON exclusions (node) WHERE released_at IS NULL;
    ALTER TABLE attempts ADD COLUMN source TEXT NOT NULL DEFAULT 'manual';
    """,
    # 5: pages from Alertmanager (incidents.py): one row per alert, keyed by its fingerprint
    # and start however often it is re-sent, and the count per alert name /metrics exports.
    """
    CREATE TABLE incidents (
        id INTEGER PRIMARY KEY,
        fingerprint TEXT NOT NULL,
        started_at REAL NOT NULL,
        alertname TEXT NOT NULL,
        node TEXT NOT NULL,
        severity TEXT NOT NULL,
        training_job TEXT,
        summary TEXT NOT NULL DEFAULT '',
        resolved_at REAL,
        received_at REAL NOT NULL,
        last_received_at REAL NOT NULL,
        notifications INTEGER NOT NULL DEFAULT 1,
        UNIQUE (fingerprint, started_at)
    );
    CREATE INDEX incidents_node ON incidents (node, started_at);
    CREATE INDEX incidents_time ON incidents (started_at, id);
    CREATE TABLE incident_counts (
        alertname TEXT PRIMARY KEY,
        count INTEGER NOT NULL
    ) WITHOUT ROWID;
    """,
    # 6: every write is stored (no label caps); /metrics exports the series that changed
    # within the retention (counters.py): each row notes when it was last written
    # (recorded_at), each exported series when it last changed and when its exposition
    # epoch began (its counter's _created).
    """
    DROP TABLE label_values;
    ALTER TABLE exclusions ADD COLUMN recorded_at REAL;
    UPDATE exclusions SET recorded_at = excluded_at;
    ALTER TABLE attempts ADD COLUMN recorded_at REAL;
    UPDATE attempts SET recorded_at = max(started_at, coalesce(first_step_at, started_at),
        coalesce(ended_at, started_at));
    ALTER TABLE exclusion_counts ADD COLUMN created_at REAL NOT NULL DEFAULT 0;
    ALTER TABLE exclusion_counts ADD COLUMN changed_at REAL NOT NULL DEFAULT 0;
    UPDATE exclusion_counts SET
        created_at = (SELECT min(e.recorded_at) FROM exclusions e WHERE e.node =
            exclusion_counts.node AND e.reason = exclusion_counts.reason
            AND e.source = exclusion_counts.source),
        changed_at = (SELECT max(e.recorded_at) FROM exclusions e WHERE e.node =
            exclusion_counts.node AND e.reason = exclusion_counts.reason
            AND e.source = exclusion_counts.source);
    CREATE INDEX exclusion_counts_changed ON exclusion_counts (changed_at);
    ALTER TABLE job_summaries ADD COLUMN created_at REAL NOT NULL DEFAULT 0;
    ALTER TABLE job_summaries ADD COLUMN changed_at REAL NOT NULL DEFAULT 0;
    ALTER TABLE job_summaries ADD COLUMN running INTEGER NOT NULL DEFAULT 0;
    CREATE INDEX job_summaries_changed ON job_summaries (changed_at);
    """,
    # 7: an ended attempt says whether its launcher restarts the job no more (torchrun's
    # last allowed restart failed): its retry chain then closes as abandoned.
    """
    ALTER TABLE attempts ADD COLUMN restarts_exhausted INTEGER NOT NULL DEFAULT 0;
    """,
)


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


# what the caps bound, as gpufleet_fleet_exposition_* label it
EXPOSITION_KINDS = ("exclusion_series", "excluded_node", "training_job")


class LedgerConflictError(Exception):
    """The request contradicts what is stored (HTTP 409)."""


class LedgerCapError(Exception):
    """A write refused for a cap (HTTP 429); ``reason`` names the cap. Since schema 6 the
    ledger raises it for nothing: its caps bound /metrics, never what it stores."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


LedgerUnavailableError = WriterUnavailableError  # nothing was stored (HTTP 503)


class CursorError(ValueError):
    """A pagination cursor this ledger did not issue (HTTP 400)."""


@dataclass(frozen=True, slots=True)
class Stored:
    status: int
    body: dict[str, Any]
    replayed: bool = False


@dataclass(frozen=True, slots=True)
class Page:
    rows: list[dict[str, Any]]
    next_cursor: str | None  # None on the last page


def _every_row(fetch_page: Callable[[str | None], Page]) -> list[dict[str, Any]]:
    """The rows of every page, following the cursors from the first page to the last."""
    rows: list[dict[str, Any]] = []
    cursor: str | None = None
    while True:
        page = fetch_page(cursor)
        rows += page.rows
        if page.next_cursor is None:
            return rows
        cursor = page.next_cursor


def _encode_cursor(values: list[Any]) -> str:
    return base64.urlsafe_b64encode(json.dumps(values).encode()).decode().rstrip("=")


def _decode_cursor(cursor: str, types: tuple[type | tuple[type, ...], ...]) -> list[Any]:
    try:
        values = json.loads(base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)))
    except (ValueError, binascii.Error, UnicodeDecodeError):
        values = None
    if (
        not isinstance(values, list)
        or len(values) != len(types)
        or not all(
            isinstance(v, t) and not isinstance(v, bool) for v, t in zip(values, types, strict=True)
        )
    ):
        raise CursorError(
            f"cursor {cursor[:40]!r} is not one this ledger issued; pass the `cursor` of the "
            "previous page's Link header unchanged, or leave it out for the first page"
        )
    return values


class LedgerStore:
    def __init__(
        self,
        path: Path | str,
        clock: Callable[[], float] = time.time,
        limits: LedgerLimits | None = None,
        healthy_after: float = DEFAULT_HEALTHY_AFTER_S,
    ) -> None:
        self.path = str(path)
        self._clock = clock
        self.limits = limits or LedgerLimits()
        self.healthy_after = healthy_after
        self._db = self._connect()
        self._db.execute("PRAGMA journal_mode=WAL")
        self.migrate()
        self._readers: queue.LifoQueue[sqlite3.Connection] = queue.LifoQueue()
        self._refreshing: set[str] = set()
        self._refreshing_lock = threading.Lock()
        self._pruned_at = float("-inf")
        self._writer = SerialWriter(self._db, self._prune_if_due, "gpufleet-ledger-writer")

    def _connect(self) -> sqlite3.Connection:
        db = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
        db.row_factory = sqlite3.Row
        db.execute("PRAGMA synchronous=FULL")
        db.execute("PRAGMA foreign_keys=ON")
        db.execute("PRAGMA busy_timeout=5000")
        return db

    def close(self) -> None:
        """Commit what is queued, stop the writer, close every connection."""
        if not self._writer.closed:
            self._writer.close()
            self._db.close()
        while True:
            try:
                self._readers.get_nowait().close()
            except queue.Empty:
                break

    @property
    def schema_version(self) -> int:
        with self._reader() as db:
            version: int = db.execute("PRAGMA user_version").fetchone()[0]
        return version

    def migrate(self) -> None:
        current: int = self._db.execute("PRAGMA user_version").fetchone()[0]
        for version, script in enumerate(MIGRATIONS[current:], start=current + 1):
            self._db.execute("BEGIN IMMEDIATE")
            try:
                for statement in filter(str.strip, script.split(";")):
                    self._db.execute(statement)
                if version == 6:  # the summaries' final shape (3 and 4 changed them before)
                    self._backfill_job_summaries(self._db)
                self._db.execute(f"PRAGMA user_version = {version}")
                self._db.execute("COMMIT")
            except BaseException:
                self._db.execute("ROLLBACK")
                raise

    def _backfill_job_summaries(self, db: sqlite3.Connection) -> None:
        """One summary per job, its whole history one exposition epoch."""
        db.execute(
            "INSERT OR REPLACE INTO job_summaries (training_job, summary, valid_until, "
            "created_at, changed_at, running) SELECT training_job, '', NULL, "
            "min(started_at), max(recorded_at), 0 FROM attempts GROUP BY training_job"
        )
        for row in db.execute("SELECT training_job FROM job_summaries").fetchall():
            self._refresh_job(db, row[0], self._clock())

    # -- the writer ---------------------------------------------------------------------------

    def submit(self, work: Callable[[sqlite3.Connection], T]) -> Future[T]:
        """Run ``work`` in the writer's next transaction; the future resolves after COMMIT."""
        return self._writer.submit(work)

    def _prune_if_due(self) -> None:
        now = self._clock()
        window = self.limits.idempotency_window_s
        if now - self._pruned_at < min(3600.0, window / 10):
            return
        self._pruned_at = now
        try:
            self._prune(now - window)
        except sqlite3.Error as error:
            log.warning("pruning old idempotency keys failed (will retry): %s", error)

    def _prune(self, before: float) -> int:
        deleted = 0
        while True:  # in chunks, so a years-old backlog never holds the writer for long
            self._db.execute("BEGIN IMMEDIATE")
            try:
                cursor = self._db.execute(
                    "DELETE FROM idempotency WHERE rowid IN "
                    "(SELECT rowid FROM idempotency WHERE created_at < ? LIMIT 5000)",
                    (before,),
                )
                self._db.execute("COMMIT")
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
            deleted += cursor.rowcount
            if cursor.rowcount < 5000:
                return deleted

    def prune_idempotency_keys(self) -> int:
        """Delete the keys older than the window now; returns how many went."""
        return self.submit(
            lambda db: (
                db.execute(
                    "DELETE FROM idempotency WHERE created_at < ?",
                    (self._clock() - self.limits.idempotency_window_s,),
                ).rowcount
            )
        ).result()

    # -- idempotent writes ----------------------------------------------------------------

    def _once(
        self,
        key: str,
        request: dict[str, Any],
        apply: Callable[[sqlite3.Connection, float], tuple[int, dict[str, Any]]],
    ) -> Future[Stored]:
        if request.get("kind") in ("release", "attempt") and request.get("source") == "manual":
            # as before `source` existed, so a retry across the upgrade is still a replay
            request = {k: v for k, v in request.items() if k != "source"}
        if request.get("kind") == "attempt" and not request.get("restarts_exhausted"):
            # as before it existed, so a retry across the upgrade is still a replay
            request = {k: v for k, v in request.items() if k != "restarts_exhausted"}
        digest = hashlib.sha256(json.dumps(request, sort_keys=True).encode()).hexdigest()

        def work(db: sqlite3.Connection) -> Stored:
            row = db.execute(
                "SELECT request_hash, status, response FROM idempotency WHERE key = ?", (key,)
            ).fetchone()
            if row is not None:
                if row["request_hash"] != digest:
                    raise LedgerConflictError(
                        f"Idempotency-Key {key!r} was already used for a different request"
                    )
                return Stored(row["status"], json.loads(row["response"]), replayed=True)
            now = self._clock()
            status, body = apply(db, now)
            db.execute(
                "INSERT INTO idempotency (key, request_hash, status, response, created_at) "
                "VALUES (?, ?, ?, ?, ?)",
                (key, digest, status, json.dumps(body), now),
            )
            return Stored(status, body)

        return self.submit(work)

    def _exported_until(self, now: float) -> float:
        """A series whose last change is older than this is no longer exported."""
        return now - self.limits.export_retention_s

    def _job_attempts(self, db: sqlite3.Connection, job: str, since: float) -> list[dict[str, Any]]:
        """The attempts of a job's exposition epoch: those written since it began."""
        return [
            dict(row)
            for row in db.execute(
                "SELECT * FROM attempts WHERE training_job = ? AND recorded_at >= ?", (job, since)
            )
        ]

    def _refresh_job(self, db: sqlite3.Connection, job: str, now: float) -> None:
        """Recompute a job's exported summary over its current epoch's attempts."""
        row = db.execute(
            "SELECT created_at FROM job_summaries WHERE training_job = ?", (job,)
        ).fetchone()
        since = row[0] if row is not None else float("-inf")
        summary = summarise_job(self._job_attempts(db, job, since), now, self.healthy_after)
        db.execute(
            "UPDATE job_summaries SET summary = ?, valid_until = ?, running = ? "
            "WHERE training_job = ?",
            (summary.to_json(), summary.valid_until, int(summary.running), job),
        )

    def _touch_job(self, db: sqlite3.Connection, job: str, now: float) -> None:
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
        self._refresh_job(db, job, now)

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

    def _series_exported(self, db: sqlite3.Connection, changed_at: float, now: float) -> bool:
        if changed_at < self._exported_until(now):
            return False
        newer: int = db.execute(
            "SELECT count(*) FROM exclusion_counts WHERE changed_at > ?", (changed_at,)
        ).fetchone()[0]
        return newer < self.limits.max_exclusion_series

    def submit_exclusion(self, key: str, event: ExclusionIn) -> Future[Stored]:
        def apply(db: sqlite3.Connection, now: float) -> tuple[int, dict[str, Any]]:
            at = event.at if event.at is not None else now
            open_row = db.execute(
                "SELECT id FROM exclusions WHERE node = ? AND released_at IS NULL", (event.node,)
            ).fetchone()
            if open_row is not None:
                raise LedgerConflictError(
                    f"{event.node} is already excluded (exclusion {open_row['id']}); "
                    "release it first"
                )
            cursor = db.execute(
                "INSERT INTO exclusions (node, reason, source, training_job, excluded_at, note, "
                "idempotency_key, recorded_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                (
                    event.node,
                    event.reason,
                    event.source,
                    event.training_job,
                    at,
                    event.note,
                    key,
                    now,
                ),
            )
            series = (event.node, event.reason, event.source)
            counted = db.execute(
                "SELECT changed_at FROM exclusion_counts "
                "WHERE node = ? AND reason = ? AND source = ?",
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
            return 201, {"id": cursor.lastrowid, "node": event.node, "excluded_at": at}

        return self._once(key, {"kind": "exclude", **event.model_dump()}, apply)

    def submit_release(self, key: str, event: ReleaseIn) -> Future[Stored]:
        def apply(db: sqlite3.Connection, now: float) -> tuple[int, dict[str, Any]]:
            at = event.at if event.at is not None else now
            row = db.execute(
                "SELECT id, excluded_at FROM exclusions WHERE node = ? AND released_at IS NULL",
                (event.node,),
            ).fetchone()
            if row is None:
                raise LedgerConflictError(f"{event.node} is not excluded")
            if at < row["excluded_at"]:
                raise LedgerConflictError(
                    f"release time {at} is before the exclusion at {row['excluded_at']}"
                )
            db.execute(
                "UPDATE exclusions SET released_at = ?, release_note = ?, release_source = ? "
                "WHERE id = ?",
                (at, event.note, event.source, row["id"]),
            )
            return 200, {"id": row["id"], "node": event.node, "released_at": at}

        return self._once(key, {"kind": "release", **event.model_dump()}, apply)

    def submit_attempt_event(self, key: str, event: AttemptEventIn) -> Future[Stored]:
        def apply(db: sqlite3.Connection, now: float) -> tuple[int, dict[str, Any]]:
            status, body = self._apply_attempt(db, event, now)
            self._touch_job(db, event.training_job, now)
            return status, body

        return self._once(key, {"kind": "attempt", **event.model_dump()}, apply)

    def _apply_attempt(
        self, db: sqlite3.Connection, event: AttemptEventIn, now: float
    ) -> tuple[int, dict[str, Any]]:
        at = event.at if event.at is not None else now
        job, number = event.training_job, event.attempt
        row = db.execute(
            "SELECT * FROM attempts WHERE training_job = ? AND attempt = ?", (job, number)
        ).fetchone()
        where = f"attempt {number} of {job}"
        if event.event == "started":
            if event.trigger is None:
                raise LedgerConflictError("a started event needs a trigger")
            if row is not None:
                raise LedgerConflictError(f"{where} has already started")
            db.execute(
                "INSERT INTO attempts (training_job, attempt, trigger, started_at, source, "
                "recorded_at) VALUES (?, ?, ?, ?, ?, ?)",
                (job, number, event.trigger, at, event.source, now),
            )
            return 201, {"training_job": job, "attempt": number, "started_at": at}
        if row is None:
            raise LedgerConflictError(f"{where} was never started")
        if at < row["started_at"]:
            raise LedgerConflictError(f"{where}: {event.event} is before its start")
        if event.event == "first_step":
            if row["first_step_at"] is not None:
                raise LedgerConflictError(f"{where} already reached its first step")
            db.execute(
                "UPDATE attempts SET first_step_at = ?, recorded_at = ? WHERE id = ?",
                (at, now, row["id"]),
            )
            return 200, {"training_job": job, "attempt": number, "first_step_at": at}
        if event.outcome is None:
            raise LedgerConflictError("an ended event needs an outcome")
        if row["ended_at"] is not None:
            raise LedgerConflictError(f"{where} has already ended")
        db.execute(
            "UPDATE attempts SET ended_at = ?, outcome = ?, cause = ?, restarts_exhausted = ?, "
            "recorded_at = ? WHERE id = ?",
            (at, event.outcome, event.cause, int(event.restarts_exhausted), now, row["id"]),
        )
        return 200, {"training_job": job, "attempt": number, "ended_at": at}

    # Blocking forms, for scripts and tests; the API awaits the futures instead.
    def exclude(self, key: str, event: ExclusionIn) -> Stored:
        return self.submit_exclusion(key, event).result()

    def release(self, key: str, event: ReleaseIn) -> Stored:
        return self.submit_release(key, event).result()

    def attempt_event(self, key: str, event: AttemptEventIn) -> Stored:
        return self.submit_attempt_event(key, event).result()

    # -- queries ----------------------------------------------------------------------------

    @contextmanager
    def _reader(self) -> Iterator[sqlite3.Connection]:
        """A read connection of its own (WAL: never waits for the writer), returned after."""
        try:
            db = self._readers.get_nowait()
        except queue.Empty:
            db = self._connect()
            db.execute("PRAGMA query_only=ON")
        try:
            yield db
        finally:
            if db.in_transaction:
                db.execute("ROLLBACK")
            if self._writer.closed:
                db.close()
            else:
                self._readers.put(db)

    def _rows(self, sql: str, parameters: tuple[Any, ...] = ()) -> list[dict[str, Any]]:
        with self._reader() as db:
            return [dict(row) for row in db.execute(sql, parameters).fetchall()]

    def _page(
        self,
        table: str,
        key: tuple[str, str],
        key_types: tuple[type | tuple[type, ...], ...],
        filters: list[tuple[str, Any]],
        *,
        limit: int,
        cursor: str | None,
    ) -> Page:
        """One page of ``table`` in ``key`` order: keyset pagination, the cursor holding
        the last row's key, so a page costs the same however deep it is."""
        clauses = [clause for clause, _ in filters]
        parameters = [value for _, value in filters]
        if cursor is not None:
            clauses.append(f"({key[0]}, {key[1]}) > (?, ?)")
            parameters += _decode_cursor(cursor, key_types)
        where = f"WHERE {' AND '.join(clauses)}" if clauses else ""
        rows = self._rows(
            f"SELECT * FROM {table} {where} ORDER BY {key[0]}, {key[1]} LIMIT ?",  # noqa: S608 - fixed tables, columns and clauses
            (*parameters, limit + 1),
        )
        more = len(rows) > limit
        rows = rows[:limit]
        last = rows[-1] if rows else None
        return Page(rows, _encode_cursor([last[key[0]], last[key[1]]]) if more and last else None)

    def exclusions(
        self, node: str | None = None, since: float | None = None, until: float | None = None
    ) -> list[dict[str, Any]]:
        """Every matching exclusion in time order (scripts and reports; the API pages)."""
        return _every_row(lambda cursor: self.exclusions_page(node, since, until, 10_000, cursor))

    def exclusions_page(
        self,
        node: str | None = None,
        since: float | None = None,
        until: float | None = None,
        limit: int = 1000,
        cursor: str | None = None,
    ) -> Page:
        filters: list[tuple[str, Any]] = []
        if node:
            filters.append(("node = ?", node))
        if since is not None:
            filters.append(("excluded_at >= ?", since))
        if until is not None:
            filters.append(("excluded_at < ?", until))
        key_types = ((int, float), int)
        return self._page(
            "exclusions", ("excluded_at", "id"), key_types, filters, limit=limit, cursor=cursor
        )

    def exclusions_by_node(self, since: float) -> list[tuple[str, int]]:
        """Exclusions per node since ``since``, most first (ties by node name)."""
        return [
            (row["node"], row["count"])
            for row in self._rows(
                "SELECT node, count(*) AS count FROM exclusions WHERE excluded_at >= ? "
                "GROUP BY node ORDER BY count DESC, node",
                (since,),
            )
        ]

    def excluded_now(self) -> list[dict[str, Any]]:
        return self._rows("SELECT * FROM exclusions WHERE released_at IS NULL ORDER BY node")

    def attempts(self, training_job: str | None = None) -> list[dict[str, Any]]:
        """Every attempt, by job and number (scripts and reports; the API pages)."""
        return _every_row(lambda cursor: self.attempts_page(training_job, 10_000, cursor))

    def attempts_page(
        self, training_job: str | None = None, limit: int = 1000, cursor: str | None = None
    ) -> Page:
        filters = [("training_job = ?", training_job)] if training_job else []
        key = ("training_job", "attempt")
        return self._page("attempts", key, (str, int), filters, limit=limit, cursor=cursor)

    def snapshot(self) -> LedgerSnapshot:
        """What /metrics exports, read in one transaction: the series changed within the
        retention, most recent first up to each cap; O(exported series) rows, not the
        history (the open exclusions are read from their partial index)."""
        now = self._clock()
        cutoff = self._exported_until(now)
        limits = self.limits
        snapshot = LedgerSnapshot()
        expired: list[str] = []
        with self._reader() as db:
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
                    attempts = self._job_attempts(db, job, created_at)
                    snapshot.jobs[job] = summarise_job(attempts, now, self.healthy_after)
                    expired.append(job)
                else:
                    snapshot.jobs[job] = JobSummary.from_json(text, valid_until)
            db.execute("COMMIT")
        for job in expired:
            self._refresh_later(job)
        return snapshot

    def _refresh_later(self, job: str) -> None:
        """Store a job's recomputed summary, so the next scrape reads it instead."""
        with self._refreshing_lock:
            if job in self._refreshing:
                return
            self._refreshing.add(job)

        def work(db: sqlite3.Connection) -> None:
            with self._refreshing_lock:
                self._refreshing.discard(job)
            self._refresh_job(db, job, self._clock())

        self.submit(work)

    def exclusion_counts(self) -> list[dict[str, Any]]:
        return self._rows(
            "SELECT node, reason, source, count FROM exclusion_counts ORDER BY node, reason, source"
        )

    def idempotency_keys(self) -> set[str]:
        return {row["key"] for row in self._rows("SELECT key FROM idempotency")}
