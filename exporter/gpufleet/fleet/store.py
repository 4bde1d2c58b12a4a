"""The ledger's storage: SQLite in WAL mode, versioned migrations, idempotent writes.

Every write runs in one ``BEGIN IMMEDIATE`` transaction together with its
idempotency record, and is committed (``synchronous=FULL``) before the API
answers 2xx, so an acknowledged event survives the process being killed at
any moment. Replaying a key returns the first answer without writing again;
reusing a key for a different request is a conflict.
"""

from __future__ import annotations

import hashlib
import json
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpufleet.fleet.models import AttemptEventIn, ExclusionIn, ReleaseIn

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
)


class LedgerConflictError(Exception):
    """The request contradicts what is stored (HTTP 409)."""


@dataclass(frozen=True, slots=True)
class Stored:
    status: int
    body: dict[str, Any]
    replayed: bool = False


class LedgerStore:
    def __init__(self, path: Path | str, clock: Callable[[], float] = time.time) -> None:
        self.path = str(path)
        self._clock = clock
        self._lock = threading.Lock()
        self._db = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
        self._db.row_factory = sqlite3.Row
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=FULL")
        self._db.execute("PRAGMA foreign_keys=ON")
        self._db.execute("PRAGMA busy_timeout=5000")
        self.migrate()

    def close(self) -> None:
        with self._lock:
            self._db.close()

    @property
    def schema_version(self) -> int:
        version: int = self._db.execute("PRAGMA user_version").fetchone()[0]
        return version

    def migrate(self) -> None:
        with self._lock:
            current = self.schema_version
            for version, script in enumerate(MIGRATIONS[current:], start=current + 1):
                self._db.execute("BEGIN IMMEDIATE")
                try:
                    for statement in filter(str.strip, script.split(";")):
                        self._db.execute(statement)
                    self._db.execute(f"PRAGMA user_version = {version}")
                    self._db.execute("COMMIT")
                except BaseException:
                    self._db.execute("ROLLBACK")
                    raise

    @contextmanager
    def _write(self) -> Iterator[sqlite3.Connection]:
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                yield self._db
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
            else:
                self._db.execute("COMMIT")

    # -- idempotent writes ----------------------------------------------------------------

    def _once(
        self,
        key: str,
        request: dict[str, Any],
        apply: Callable[[sqlite3.Connection, float], tuple[int, dict[str, Any]]],
    ) -> Stored:
        digest = hashlib.sha256(json.dumps(request, sort_keys=True).encode()).hexdigest()
        with self._write() as db:
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

    def exclude(self, key: str, event: ExclusionIn) -> Stored:
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
                "idempotency_key) VALUES (?, ?, ?, ?, ?, ?, ?)",
                (event.node, event.reason, event.source, event.training_job, at, event.note, key),
            )
            return 201, {"id": cursor.lastrowid, "node": event.node, "excluded_at": at}

        return self._once(key, {"kind": "exclude", **event.model_dump()}, apply)

    def release(self, key: str, event: ReleaseIn) -> Stored:
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
                "UPDATE exclusions SET released_at = ?, release_note = ? WHERE id = ?",
                (at, event.note, row["id"]),
            )
            return 200, {"id": row["id"], "node": event.node, "released_at": at}

        return self._once(key, {"kind": "release", **event.model_dump()}, apply)

    def attempt_event(self, key: str, event: AttemptEventIn) -> Stored:
        def apply(db: sqlite3.Connection, now: float) -> tuple[int, dict[str, Any]]:
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
                    "INSERT INTO attempts (training_job, attempt, trigger, started_at) "
                    "VALUES (?, ?, ?, ?)",
                    (job, number, event.trigger, at),
                )
                return 201, {"training_job": job, "attempt": number, "started_at": at}
            if row is None:
                raise LedgerConflictError(f"{where} was never started")
            if at < row["started_at"]:
                raise LedgerConflictError(f"{where}: {event.event} is before its start")
            if event.event == "first_step":
                if row["first_step_at"] is not None:
                    raise LedgerConflictError(f"{where} already reached its first step")
                db.execute("UPDATE attempts SET first_step_at = ? WHERE id = ?", (at, row["id"]))
                return 200, {"training_job": job, "attempt": number, "first_step_at": at}
            if event.outcome is None:
                raise LedgerConflictError("an ended event needs an outcome")
            if row["ended_at"] is not None:
                raise LedgerConflictError(f"{where} has already ended")
            db.execute(
                "UPDATE attempts SET ended_at = ?, outcome = ?, cause = ? WHERE id = ?",
                (at, event.outcome, event.cause, row["id"]),
            )
            return 200, {"training_job": job, "attempt": number, "ended_at": at}

        return self._once(key, {"kind": "attempt", **event.model_dump()}, apply)

    # -- queries ----------------------------------------------------------------------------

    def _rows(self, sql: str, parameters: tuple[Any, ...] = ()) -> list[dict[str, Any]]:
        with self._lock:
            return [dict(row) for row in self._db.execute(sql, parameters).fetchall()]

    def exclusions(
        self, node: str | None = None, since: float | None = None, until: float | None = None
    ) -> list[dict[str, Any]]:
        clauses: list[str] = []
        parameters: list[Any] = []
        if node:
            clauses.append("node = ?")
            parameters.append(node)
        if since is not None:
            clauses.append("excluded_at >= ?")
            parameters.append(since)
        if until is not None:
            clauses.append("excluded_at < ?")
            parameters.append(until)
        where = f"WHERE {' AND '.join(clauses)}" if clauses else ""
        return self._rows(
            f"SELECT * FROM exclusions {where} ORDER BY excluded_at, id",  # noqa: S608 - fixed clauses
            tuple(parameters),
        )

    def excluded_now(self) -> list[dict[str, Any]]:
        return self._rows("SELECT * FROM exclusions WHERE released_at IS NULL ORDER BY node")

    def attempts(self, training_job: str | None = None) -> list[dict[str, Any]]:
        if training_job:
            return self._rows(
                "SELECT * FROM attempts WHERE training_job = ? ORDER BY attempt", (training_job,)
            )
        return self._rows("SELECT * FROM attempts ORDER BY training_job, attempt")

    def exclusion_counts(self) -> list[dict[str, Any]]:
        return self._rows(
            "SELECT node, reason, source, count(*) AS count FROM exclusions "
            "GROUP BY node, reason, source ORDER BY node, reason, source"
        )

    def idempotency_keys(self) -> set[str]:
        return {row["key"] for row in self._rows("SELECT key FROM idempotency")}
