"""What each event the ledger takes checks and changes, inside the writer's transaction.

Each function returns the HTTP status and body of its answer, or raises
``LedgerConflictError`` when the event contradicts what is stored (the writer then
rolls it back alone). The idempotency record around it is the store's.
"""

from __future__ import annotations

import sqlite3
from typing import Any

from gpufleet.fleet.errors import LedgerConflictError
from gpufleet.fleet.exported import ExportedSeries
from gpufleet.fleet.models import AttemptEventIn, ExclusionIn, ReleaseIn

Answer = tuple[int, dict[str, Any]]


def apply_exclusion(
    db: sqlite3.Connection, now: float, key: str, event: ExclusionIn, exported: ExportedSeries
) -> Answer:
    at = event.at if event.at is not None else now
    open_row = db.execute(
        "SELECT id FROM exclusions WHERE node = ? AND released_at IS NULL", (event.node,)
    ).fetchone()
    if open_row is not None:
        raise LedgerConflictError(
            f"{event.node} is already excluded (exclusion {open_row['id']}); release it first"
        )
    cursor = db.execute(
        "INSERT INTO exclusions (node, reason, source, training_job, excluded_at, note, "
        "idempotency_key, recorded_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
        (event.node, event.reason, event.source, event.training_job, at, event.note, key, now),
    )
    exported.count_exclusion(db, (event.node, event.reason, event.source), now)
    return 201, {"id": cursor.lastrowid, "node": event.node, "excluded_at": at}


def apply_release(db: sqlite3.Connection, now: float, event: ReleaseIn) -> Answer:
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
        "UPDATE exclusions SET released_at = ?, release_note = ?, release_source = ? WHERE id = ?",
        (at, event.note, event.source, row["id"]),
    )
    return 200, {"id": row["id"], "node": event.node, "released_at": at}


def apply_attempt_event(
    db: sqlite3.Connection, now: float, event: AttemptEventIn, exported: ExportedSeries
) -> Answer:
    answer = _apply_attempt(db, now, event)
    exported.touch_job(db, event.training_job, now)
    return answer


def _apply_attempt(db: sqlite3.Connection, now: float, event: AttemptEventIn) -> Answer:
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
