"""The ledger's storage: SQLite in WAL mode, versioned migrations, idempotent writes.

Every write runs in one ``BEGIN IMMEDIATE`` transaction together with its
idempotency record and the exported counters it changes (``writes.py`` says what
each event changes, ``exported.py`` keeps the counters), and is committed
(``synchronous=FULL``) before the API answers 2xx, so an acknowledged event
survives the process being killed at any moment, and the counters always equal
what the history says. Replaying a key returns the first answer without writing
again; reusing a key for a different request is a conflict. Keys are kept for
``idempotency_window_s`` (7 days by default): a retry must come within that window.

One writer thread (``writer.py``) owns the only writing connection, so neither
a write nor its fsync ever runs on the event loop, and requests that queue up
meanwhile share one commit, each in its own savepoint (a refused request still
changes nothing). Reads use their own connections and, in WAL mode, run
concurrently with the writer and with each other. The schema is ``migrations.py``.
"""

from __future__ import annotations

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
from gpufleet.fleet.counters import LedgerSnapshot
from gpufleet.fleet.errors import LedgerConflictError
from gpufleet.fleet.exported import ExportedSeries, LedgerLimits
from gpufleet.fleet.migrations import MIGRATIONS
from gpufleet.fleet.models import AttemptEventIn, ExclusionIn, ReleaseIn
from gpufleet.fleet.paging import Page, decode_cursor, every_row, page_of
from gpufleet.fleet.writer import SerialWriter
from gpufleet.fleet.writes import Answer, apply_attempt_event, apply_exclusion, apply_release

log = logging.getLogger(__name__)
T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class Stored:
    status: int
    body: dict[str, Any]
    replayed: bool = False


class LedgerStore:
    def __init__(
        self,
        path: Path | str,
        clock: Callable[[], float] = time.time,
        limits: LedgerLimits | None = None,
        healthy_after: float = DEFAULT_HEALTHY_AFTER_S,
    ) -> None:
        self.path = str(path)
        self.clock = clock
        self.limits = limits or LedgerLimits()
        self.healthy_after = healthy_after
        self._exported = ExportedSeries(self.limits, healthy_after)
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
        with self.reader() as db:
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
                    self._exported.backfill_job_summaries(self._db, self.clock)
                self._db.execute(f"PRAGMA user_version = {version}")
                self._db.execute("COMMIT")
            except BaseException:
                self._db.execute("ROLLBACK")
                raise

    # -- the writer ---------------------------------------------------------------------------

    def submit(self, work: Callable[[sqlite3.Connection], T]) -> Future[T]:
        """Run ``work`` in the writer's next transaction; the future resolves after COMMIT."""
        return self._writer.submit(work)

    def _prune_if_due(self) -> None:
        now = self.clock()
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
                    (self.clock() - self.limits.idempotency_window_s,),
                ).rowcount
            )
        ).result()

    # -- idempotent writes ----------------------------------------------------------------

    def _once(
        self,
        key: str,
        request: dict[str, Any],
        apply: Callable[[sqlite3.Connection, float], Answer],
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
            now = self.clock()
            status, body = apply(db, now)
            db.execute(
                "INSERT INTO idempotency (key, request_hash, status, response, created_at) "
                "VALUES (?, ?, ?, ?, ?)",
                (key, digest, status, json.dumps(body), now),
            )
            return Stored(status, body)

        return self.submit(work)

    def submit_exclusion(self, key: str, event: ExclusionIn) -> Future[Stored]:
        def apply(db: sqlite3.Connection, now: float) -> Answer:
            return apply_exclusion(db, now, key, event, self._exported)

        return self._once(key, {"kind": "exclude", **event.model_dump()}, apply)

    def submit_release(self, key: str, event: ReleaseIn) -> Future[Stored]:
        def apply(db: sqlite3.Connection, now: float) -> Answer:
            return apply_release(db, now, event)

        return self._once(key, {"kind": "release", **event.model_dump()}, apply)

    def submit_attempt_event(self, key: str, event: AttemptEventIn) -> Future[Stored]:
        def apply(db: sqlite3.Connection, now: float) -> Answer:
            return apply_attempt_event(db, now, event, self._exported)

        return self._once(key, {"kind": "attempt", **event.model_dump()}, apply)

    # Blocking forms, for scripts and tests; the API awaits the futures instead.
    def exclude(self, key: str, event: ExclusionIn) -> Stored:
        return self.submit_exclusion(key, event).result()

    def release(self, key: str, event: ReleaseIn) -> Stored:
        return self.submit_release(key, event).result()

    def attempt_event(self, key: str, event: AttemptEventIn) -> Stored:
        return self.submit_attempt_event(key, event).result()

    # -- queries ----------------------------------------------------------------------------

    @contextmanager
    def reader(self) -> Iterator[sqlite3.Connection]:
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
        with self.reader() as db:
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
            parameters += decode_cursor(cursor, key_types)
        where = f"WHERE {' AND '.join(clauses)}" if clauses else ""
        rows = self._rows(
            f"SELECT * FROM {table} {where} ORDER BY {key[0]}, {key[1]} LIMIT ?",  # noqa: S608 - fixed tables, columns and clauses
            (*parameters, limit + 1),
        )
        return page_of(rows, limit, key)

    def exclusions(
        self, node: str | None = None, since: float | None = None, until: float | None = None
    ) -> list[dict[str, Any]]:
        """Every matching exclusion in time order (scripts and reports; the API pages)."""
        return every_row(lambda cursor: self.exclusions_page(node, since, until, 10_000, cursor))

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
        return every_row(lambda cursor: self.attempts_page(training_job, 10_000, cursor))

    def attempts_page(
        self, training_job: str | None = None, limit: int = 1000, cursor: str | None = None
    ) -> Page:
        filters = [("training_job = ?", training_job)] if training_job else []
        key = ("training_job", "attempt")
        return self._page("attempts", key, (str, int), filters, limit=limit, cursor=cursor)

    def snapshot(self) -> LedgerSnapshot:
        """What /metrics exports (``ExportedSeries.read``), in one read transaction."""
        now = self.clock()
        with self.reader() as db:
            snapshot, expired = self._exported.read(db, now)
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
            self._exported.refresh_job(db, job, self.clock())

        self.submit(work)

    def exclusion_counts(self) -> list[dict[str, Any]]:
        return self._rows(
            "SELECT node, reason, source, count FROM exclusion_counts ORDER BY node, reason, source"
        )

    def idempotency_keys(self) -> set[str]:
        return {row["key"] for row in self._rows("SELECT key FROM idempotency")}
