"""The counters the ledger keeps materialised always equal a recomputation from its history:
after any sequence of writes, after a migration of an old database, and as time alone
turns a running retry into a recovery. A scrape never reads the history."""

from __future__ import annotations

import sqlite3
import tempfile
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpufleet.fleet.counters import LedgerSnapshot, snapshot_from_history
from gpufleet.fleet.errors import LedgerConflictError
from gpufleet.fleet.migrations import MIGRATIONS
from gpufleet.fleet.models import AttemptEventIn, ExclusionIn, ReleaseIn
from gpufleet.fleet.store import LedgerStore

NOW = 1_800_000_000.0
HEALTHY_AFTER = 1800.0


class Clock:
    def __init__(self, now: float = NOW) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def comparable(snapshot: LedgerSnapshot) -> tuple[Any, ...]:
    """What is exported (a summary's ``valid_until`` is bookkeeping, not a value)."""
    jobs = {
        job: (s.attempts, s.downtime, s.chains, s.open_failed) for job, s in snapshot.jobs.items()
    }
    return snapshot.exclusion_counts, snapshot.excluded, jobs


def recomputed(store: LedgerStore, now: float) -> tuple[Any, ...]:
    return comparable(
        snapshot_from_history(store.exclusions(), store.attempts(), now, HEALTHY_AFTER)
    )


events = st.lists(
    st.one_of(
        st.tuples(
            st.just("exclude"),
            st.sampled_from(["n1", "n2", "n3"]),
            st.sampled_from(["xid79", "ecc"]),
            st.sampled_from(["auto", "manual"]),
        ),
        st.tuples(st.just("release"), st.sampled_from(["n1", "n2", "n3"])),
        st.tuples(
            st.just("attempt"),
            st.sampled_from(["j1", "j2"]),
            st.integers(1, 4),  # out of order and with gaps, as real writers may post them
            st.sampled_from(["started", "first_step", "ended"]),
            st.sampled_from(["initial", "auto", "manual"]),
            st.sampled_from(["success", "failed", "cancelled"]),
            st.booleans(),  # restarts_exhausted (ignored unless failed)
        ),
        st.tuples(st.just("wait"), st.sampled_from([60.0, 900.0, 1800.0, 7200.0])),
    ),
    max_size=30,
)


def apply(store: LedgerStore, clock: Clock, index: int, event: tuple[Any, ...]) -> None:
    key = f"event-key-{index:04d}"
    try:
        if event[0] == "exclude":
            store.exclude(key, ExclusionIn(node=event[1], reason=event[2], source=event[3]))
        elif event[0] == "release":
            store.release(key, ReleaseIn(node=event[1]))
        elif event[0] == "attempt":
            _, job, number, kind, trigger, outcome, exhausted = event
            store.attempt_event(
                key,
                AttemptEventIn(
                    training_job=job,
                    attempt=number,
                    event=kind,
                    trigger=trigger,
                    outcome=outcome,
                    restarts_exhausted=exhausted and kind == "ended" and outcome == "failed",
                ),
            )
        else:
            clock.now += event[1]
    except LedgerConflictError:
        pass  # refused: must change nothing, which the comparison below also checks


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(sequence=events)
def test_after_any_sequence_of_writes_the_counters_equal_the_history(
    sequence: list[tuple[Any, ...]],
) -> None:
    clock = Clock()
    with tempfile.TemporaryDirectory() as folder:
        store = LedgerStore(Path(folder) / "fleet.db", clock=clock, healthy_after=HEALTHY_AFTER)
        try:
            for index, event in enumerate(sequence):
                apply(store, clock, index, event)
                assert comparable(store.snapshot()) == recomputed(store, clock.now), event
        finally:
            store.close()


def test_time_alone_recovers_a_chain_and_the_scrape_sees_it(tmp_path: Path) -> None:
    clock = Clock()
    store = LedgerStore(tmp_path / "fleet.db", clock=clock, healthy_after=HEALTHY_AFTER)
    try:
        for key, event, at in [
            ("a1-start", {"attempt": 1, "event": "started", "trigger": "initial"}, NOW),
            ("a1-first", {"attempt": 1, "event": "first_step"}, NOW + 60),
            ("a1-end", {"attempt": 1, "event": "ended", "outcome": "failed"}, NOW + 600),
            ("a2-start", {"attempt": 2, "event": "started", "trigger": "auto"}, NOW + 700),
            ("a2-first", {"attempt": 2, "event": "first_step"}, NOW + 800),
        ]:
            store.attempt_event(key, AttemptEventIn(training_job="j", at=at, **event))
        clock.now = NOW + 800 + HEALTHY_AFTER - 1
        before = store.snapshot().jobs["j"]
        assert before.chains["recovered"] == 0 and before.valid_until is not None
        clock.now = NOW + 800 + HEALTHY_AFTER  # attempt 2 has trained for healthy_after
        after = store.snapshot().jobs["j"]
        assert after.chains["recovered"] == 1
        assert comparable(store.snapshot()) == recomputed(store, clock.now)
        # the scrape handed the recomputation to the writer: the stored summary is final now
        store.submit(lambda db: None).result(30)
        assert store.snapshot().jobs["j"].valid_until is None
    finally:
        store.close()


def version_2_database(path: Path) -> None:
    database = sqlite3.connect(path)
    for script in MIGRATIONS[:2]:
        for statement in filter(str.strip, script.split(";")):
            database.execute(statement)
    database.execute("PRAGMA user_version = 2")
    database.executemany(
        "INSERT INTO exclusions (node, reason, source, excluded_at, released_at, "
        "idempotency_key) VALUES (?, ?, 'auto', ?, ?, ?)",
        [
            (
                f"n{i % 5}",
                ["xid79", "ecc"][i % 2],
                NOW + i,
                None if i >= 95 else NOW + i + 1,
                f"k{i}",
            )
            for i in range(100)
        ],
    )
    rows = []
    for job in ("llm", "vision"):
        t = NOW
        for number in range(1, 9):
            trigger = "initial" if number == 1 else ("manual" if number == 5 else "auto")
            ended = None if number == 8 else t + 5000
            outcome = None if number == 8 else "failed"
            rows.append((job, number, trigger, t, t + 300, ended, outcome))
            t += 5400
    database.executemany(
        "INSERT INTO attempts (training_job, attempt, trigger, started_at, first_step_at, "
        "ended_at, outcome) VALUES (?, ?, ?, ?, ?, ?, ?)",
        rows,
    )
    database.commit()
    database.close()


def test_the_migration_backfills_the_counters_from_existing_history(tmp_path: Path) -> None:
    path = tmp_path / "old.db"
    version_2_database(path)
    clock = Clock(NOW + 100_000)
    store = LedgerStore(path, clock=clock, healthy_after=HEALTHY_AFTER)
    try:
        assert store.schema_version == len(MIGRATIONS)
        snapshot = store.snapshot()
        assert comparable(snapshot) == recomputed(store, clock.now)
        assert sum(n for *_, n in snapshot.exclusion_counts) == 100
        assert snapshot.excluded == ["n0", "n1", "n2", "n3", "n4"]
        assert snapshot.jobs["llm"].attempts[("auto", "failed", "manual")] == 5
        # the history before the upgrade is one exposition epoch per series, from its start
        assert snapshot.created[("n0", "xid79", "auto")] == NOW
        assert snapshot.job_created == {"llm": NOW, "vision": NOW}
        assert snapshot.left_out == {"exclusion_series": 0, "excluded_node": 0, "training_job": 0}
    finally:
        store.close()


def test_a_scrape_reads_the_counters_not_the_history(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "old.db"
    version_2_database(path)
    store = LedgerStore(path, clock=Clock(NOW + 100_000), healthy_after=HEALTHY_AFTER)
    statements: list[str] = []
    connect = LedgerStore._connect

    def traced(self: LedgerStore) -> sqlite3.Connection:
        db = connect(self)
        db.set_trace_callback(statements.append)
        return db

    monkeypatch.setattr(LedgerStore, "_connect", traced)
    try:
        store.snapshot()
        reads = [s for s in statements if s.lstrip().upper().startswith("SELECT")]
        assert reads and not [s for s in reads if "FROM attempts" in s], reads
        history = [s for s in reads if "FROM exclusions" in s]
        assert len(history) == 1 and "released_at IS NULL" in history[0]
        with sqlite3.connect(path) as database:  # the open exclusions come from their index
            plan = database.execute(f"EXPLAIN QUERY PLAN {history[0]}").fetchall()
        assert "exclusions_open" in str(plan), plan
    finally:
        store.close()


def test_a_chain_torchrun_gave_up_on_keeps_its_failures_until_the_job_starts_again(
    tmp_path: Path,
) -> None:
    clock = Clock(NOW + 10_000)
    store = LedgerStore(tmp_path / "fleet.db", clock=clock, healthy_after=HEALTHY_AFTER)
    try:
        steps: list[tuple[int, dict[str, Any], float]] = []
        for number in (1, 2, 3):
            start = NOW + 1000 * number
            steps.append(
                (
                    number,
                    {"event": "started", "trigger": "initial" if number == 1 else "auto"},
                    start,
                )
            )
            ended = {"event": "ended", "outcome": "failed", "restarts_exhausted": number == 3}
            steps.append((number, ended, start + 100))
        for index, (number, event, at) in enumerate(steps):
            store.attempt_event(
                f"k{index}", AttemptEventIn(training_job="j", attempt=number, at=at, **event)
            )
        job = store.snapshot().jobs["j"]
        assert job.chains["abandoned"] == 1
        assert job.open_failed == 2  # attempts 2 and 3: still paging, nobody restarted it
        assert comparable(store.snapshot()) == recomputed(store, clock.now)
        store.attempt_event(
            "k-manual",
            AttemptEventIn(
                training_job="j", attempt=4, event="started", trigger="manual", at=NOW + 5000
            ),
        )
        job = store.snapshot().jobs["j"]
        assert (job.chains["abandoned"], job.open_failed) == (1, 0)
        assert comparable(store.snapshot()) == recomputed(store, clock.now)
    finally:
        store.close()


def test_an_attempt_that_never_ended_is_failed_once_a_later_one_starts(tmp_path: Path) -> None:
    """SIGKILL, a lost node: attempt 1 sends no `ended`. Attempt 2's start ends it, failed
    (cause superseded), in the exported counters as in their recomputation, and a late
    `ended` for attempt 1 is still accepted and then wins."""
    clock = Clock(NOW + 10_000)
    store = LedgerStore(tmp_path / "fleet.db", clock=clock, healthy_after=HEALTHY_AFTER)
    try:
        for key, event, at in [
            ("a1-start", {"attempt": 1, "event": "started", "trigger": "initial"}, NOW),
            ("a1-first", {"attempt": 1, "event": "first_step"}, NOW + 60),
            ("a2-start", {"attempt": 2, "event": "started", "trigger": "auto"}, NOW + 700),
        ]:
            store.attempt_event(
                key, AttemptEventIn(training_job="j", at=at, source="torchrun", **event)
            )
        job = store.snapshot().jobs["j"]
        assert job.attempts == {
            ("initial", "failed", "torchrun"): 1,
            ("auto", "running", "torchrun"): 1,
        }
        assert job.open_failed == 0  # the chain attempt 1 opened holds attempt 2, running
        assert comparable(store.snapshot()) == recomputed(store, clock.now)
        store.attempt_event(
            "a1-end-late",
            AttemptEventIn(
                training_job="j", attempt=1, event="ended", outcome="cancelled", at=NOW + 650
            ),
        )
        job = store.snapshot().jobs["j"]
        assert job.attempts[("initial", "cancelled", "torchrun")] == 1
        assert comparable(store.snapshot()) == recomputed(store, clock.now)
    finally:
        store.close()
