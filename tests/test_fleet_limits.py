"""The ledger under a careless or hostile writer: caps on what /metrics exports (never on
what is stored), key retention, paged lists, and writes that never stall the event loop."""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from gpufleet.fleet.app import PAGE_DEFAULT, create_app
from gpufleet.fleet.errors import LedgerConflictError, LedgerUnavailableError
from gpufleet.fleet.exported import LedgerLimits
from gpufleet.fleet.ledger_client import LedgerClient, LedgerError
from gpufleet.fleet.models import ExclusionIn
from gpufleet.fleet.store import LedgerStore
from gpufleet.lab.processes import http_get, http_json

NOW = 1_800_000_000.0
DAY = 86400.0


class Clock:
    def __init__(self, now: float = NOW) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock() -> Clock:
    return Clock()


def open_ledger(path: Path, clock: Clock, **limits: Any) -> tuple[LedgerStore, TestClient]:
    store = LedgerStore(path, clock=clock, limits=LedgerLimits(**limits))
    client = TestClient(create_app(store, clock=clock), client=("127.0.0.1", 50000))
    return store, client


def post(client: TestClient, path: str, body: dict[str, Any], key: str) -> Any:
    return client.post(path, json=body, headers={"Idempotency-Key": key})


def sample(client: TestClient, line_start: str) -> float:
    for line in client.get("/metrics").text.splitlines():
        if line.startswith(line_start + " "):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"{line_start} not in /metrics")


def exported(client: TestClient, family: str) -> dict[frozenset[tuple[str, str]], float]:
    """The samples of one family in /metrics, by label set."""
    from prometheus_client.parser import text_string_to_metric_families

    return {
        frozenset(sample.labels.items()): sample.value
        for metric in text_string_to_metric_families(client.get("/metrics").text)
        for sample in metric.samples
        if sample.name == family
    }


def test_every_write_past_the_caps_is_stored_and_metrics_exports_the_newest(
    tmp_path: Path, clock: Clock
) -> None:
    """The caps bound /metrics, never the ledger: once a cap is full every new node, job
    and series is still stored (201) and answered by the API; /metrics exports the most
    recently changed up to the cap and says how many it left out."""
    store, client = open_ledger(
        tmp_path / "fleet.db", clock, max_nodes=2, max_training_jobs=1, max_exclusion_series=3
    )
    try:
        for index, node in enumerate(["n1", "n2", "n3", "n4"]):
            clock.now += 60
            body = {"node": node, "reason": f"xid{index}", "source": "auto"}
            assert post(client, "/v1/exclusions", body, f"key-exclusion-{node}").status_code == 201
        started = {"attempt": 1, "event": "started", "trigger": "initial"}
        for job in ("j1", "j2"):
            clock.now += 60
            body = {"training_job": job, **started}
            assert post(client, "/v1/attempts", body, f"key-attempt-{job}").status_code == 201

        assert [r["node"] for r in store.exclusions()] == ["n1", "n2", "n3", "n4"]
        assert [a["training_job"] for a in store.attempts()] == ["j1", "j2"]
        series = exported(client, "gpufleet_fleet_node_exclusions_total")
        assert sorted(dict(labels)["node"] for labels in series) == ["n2", "n3", "n4"]
        excluded = exported(client, "gpufleet_fleet_node_excluded")
        assert sorted(dict(labels)["node"] for labels in excluded) == ["n3", "n4"]
        assert sample(client, "gpufleet_fleet_excluded_nodes") == 4  # the count is not capped
        jobs = exported(client, "gpufleet_fleet_job_attempts_total")
        assert {dict(labels)["training_job"] for labels in jobs} == {"j2"}
        for kind, limit, entries, left_out in [
            ("exclusion_series", 3, 3, 1),
            ("excluded_node", 2, 2, 2),
            ("training_job", 1, 1, 1),
        ]:
            assert sample(client, f'gpufleet_fleet_exposition_entries{{kind="{kind}"}}') == entries
            assert sample(client, f'gpufleet_fleet_exposition_entries_limit{{kind="{kind}"}}') == (
                limit
            )
            assert sample(client, f'gpufleet_fleet_exposition_left_out{{kind="{kind}"}}') == (
                left_out
            )
        # n1's series is back with a write: the newest again, in a new exposition epoch
        post(client, "/v1/releases", {"node": "n1"}, "key-release-n1")
        clock.now += 60
        body = {"node": "n1", "reason": "xid0", "source": "auto"}
        assert post(client, "/v1/exclusions", body, "key-n1-again").status_code == 201
        series = exported(client, "gpufleet_fleet_node_exclusions_total")
        created = exported(client, "gpufleet_fleet_node_exclusions_created")
        n1 = frozenset({"node": "n1", "reason": "xid0", "source": "auto"}.items())
        assert series[n1] == 1 and created[n1] == clock.now  # counted from its return
        assert sorted(dict(labels)["node"] for labels in series) == ["n1", "n3", "n4"]
        assert len(store.exclusions(node="n1")) == 2  # the history keeps both
    finally:
        client.close()
        store.close()


def test_a_series_leaves_metrics_after_the_retention_and_returns_counting_afresh(
    tmp_path: Path, clock: Clock
) -> None:
    """Within the retention a series keeps its epoch and counts on; after it (no change for
    export_retention_s) it is no longer exported, and a new write starts a new epoch."""
    store, client = open_ledger(tmp_path / "fleet.db", clock, export_retention_s=40 * DAY)
    labels = frozenset({"node": "n1", "reason": "xid79", "source": "slurm"}.items())
    job = frozenset(
        {"training_job": "j", "trigger": "initial", "outcome": "failed", "source": "manual"}.items()
    )
    try:

        def exclude_and_release(name: str) -> None:
            body = {"node": "n1", "reason": "xid79", "source": "slurm"}
            assert post(client, "/v1/exclusions", body, f"key-exclusion-{name}").status_code == 201
            release = post(client, "/v1/releases", {"node": "n1"}, f"key-release-{name}")
            assert release.status_code == 200

        exclude_and_release("day-0")
        start = {"training_job": "j", "attempt": 1, "event": "started", "trigger": "initial"}
        post(client, "/v1/attempts", start, "key-job-j-1")
        end = {"training_job": "j", "attempt": 1, "event": "ended", "outcome": "failed"}
        post(client, "/v1/attempts", end, "key-job-j-1-end")
        clock.now += 30 * DAY
        exclude_and_release("day-30")
        assert exported(client, "gpufleet_fleet_node_exclusions_total")[labels] == 2
        assert exported(client, "gpufleet_fleet_node_exclusions_created")[labels] == NOW
        clock.now += 39 * DAY  # day 69: 39 days since the last change, still exported
        assert exported(client, "gpufleet_fleet_node_exclusions_total")[labels] == 2
        assert job not in exported(client, "gpufleet_fleet_job_attempts_total")  # 69 d quiet
        clock.now += 2 * DAY  # day 71: 41 days since
        assert labels not in exported(client, "gpufleet_fleet_node_exclusions_total")
        clock.now += 20 * DAY
        exclude_and_release("day-91")
        assert exported(client, "gpufleet_fleet_node_exclusions_total")[labels] == 1
        assert exported(client, "gpufleet_fleet_node_exclusions_created")[labels] == clock.now
        start2 = {**start, "attempt": 2, "trigger": "manual"}
        post(client, "/v1/attempts", start2, "key-job-j-2")
        attempts = exported(client, "gpufleet_fleet_job_attempts_total")
        assert job not in attempts  # attempt 1 belongs to the job's earlier epoch
        assert exported(client, "gpufleet_fleet_job_attempts_created") == {
            labels: clock.now for labels in attempts
        }
        assert len(store.exclusions(node="n1")) == 3 and len(store.attempts("j")) == 2
    finally:
        client.close()
        store.close()


def test_idempotency_keys_are_kept_for_the_window_then_pruned(tmp_path: Path, clock: Clock) -> None:
    store, client = open_ledger(tmp_path / "fleet.db", clock, idempotency_window_s=7 * DAY)
    try:
        assert (
            post(client, "/v1/exclusions", {"node": "n1", "reason": "x"}, "key-day-0").status_code
            == 201
        )
        clock.now += 6 * DAY
        assert post(client, "/v1/releases", {"node": "n1"}, "key-day-6").status_code == 200
        replay = post(client, "/v1/exclusions", {"node": "n1", "reason": "x"}, "key-day-0")
        assert replay.headers["idempotent-replayed"] == "true"  # within the window
        assert store.idempotency_keys() == {"key-day-0", "key-day-6"}
        clock.now += 2 * DAY  # day 8: the first key is older than 7 days
        assert (
            post(client, "/v1/exclusions", {"node": "n2", "reason": "x"}, "key-day-8").status_code
            == 201
        )
        assert store.idempotency_keys() == {"key-day-6", "key-day-8"}
        assert store.prune_idempotency_keys() == 0  # nothing else is old enough
        clock.now += 30 * DAY
        store.prune_idempotency_keys()
        assert store.idempotency_keys() == set()
        # the events themselves are history and stay
        assert [r["node"] for r in store.exclusions()] == ["n1", "n2"]
    finally:
        client.close()
        store.close()


def fill_exclusions(path: Path, count: int, at: float = NOW, key: str = "k") -> None:
    """Rows written straight into the file (fast), as a long history would have left them."""
    database = sqlite3.connect(path)
    database.executemany(
        "INSERT INTO exclusions (node, reason, source, excluded_at, released_at, "
        "idempotency_key) VALUES (?, 'xid79', 'auto', ?, ?, ?)",
        [(f"n{i % 7}", at + i // 3, at + i // 3 + 1, f"{key}{i}") for i in range(count)],
    )
    database.commit()
    database.close()


def test_lists_are_paged_with_a_bounded_default_and_a_next_link(
    tmp_path: Path, clock: Clock
) -> None:
    store, client = open_ledger(tmp_path / "fleet.db", clock)
    fill_exclusions(tmp_path / "fleet.db", PAGE_DEFAULT + 5)
    try:
        first = client.get("/v1/exclusions")
        assert len(first.json()) == PAGE_DEFAULT
        assert first.headers["link"].endswith('>; rel="next"')
        expected = [r["id"] for r in store.exclusions(node="n3")]
        seen: list[int] = []
        following: str | None = "/v1/exclusions?limit=40&node=n3"
        while following:
            page = client.get(following)
            assert page.status_code == 200
            seen += [row["id"] for row in page.json()]
            link = page.headers.get("link")
            following = link[1 : link.index(">")] if link else None
            if len(seen) == 40:  # a write lands between two pages, earlier than the cursor
                fill_exclusions(tmp_path / "fleet.db", 7, at=NOW - 1000, key="late")
        assert seen == expected and len(seen) == len(set(seen)) > 100
        assert "link" not in client.get("/v1/exclusions", params={"limit": 5000}).headers
        bad = client.get("/v1/exclusions", params={"cursor": "not-a-cursor"})
        assert bad.status_code == 400 and "not one this ledger issued" in bad.json()["detail"]
        assert client.get("/v1/exclusions", params={"limit": 10_001}).status_code == 422
        assert client.get("/v1/exclusions", params={"limit": 0}).status_code == 422
    finally:
        client.close()
        store.close()


def test_attempts_are_paged_and_the_client_reads_every_page(
    tmp_path: Path, clock: Clock, serve_asgi: Callable[..., Any]
) -> None:
    store = LedgerStore(tmp_path / "fleet.db", clock=clock)
    server = serve_asgi(create_app(store, clock=clock))
    try:
        client = LedgerClient(server.url)
        for job in ("a", "b"):
            for number in range(1, 8):
                client.attempt(job, number, "started", trigger="auto", at=NOW + number)
        first = client.get("/v1/attempts", limit=3)
        assert [(a["training_job"], a["attempt"]) for a in first] == [("a", 1), ("a", 2), ("a", 3)]
        every = client.get_all("/v1/attempts", limit=3)
        assert [(a["training_job"], a["attempt"]) for a in every] == [
            (job, n) for job in ("a", "b") for n in range(1, 8)
        ]
        assert len(client.get_all("/v1/attempts", training_job="b", limit=2)) == 7
    finally:
        store.close()


@pytest.fixture
def held_writer(tmp_path: Path) -> Iterator[tuple[LedgerStore, threading.Event]]:
    """A store whose writer thread is busy until the test lets it go (a slow fsync)."""
    store = LedgerStore(tmp_path / "fleet.db")
    release = threading.Event()
    busy = threading.Event()

    def slow(_: sqlite3.Connection) -> None:
        busy.set()
        release.wait(60)

    store.submit(slow)
    assert busy.wait(30)
    yield store, release
    release.set()
    store.close()


def test_a_slow_write_stalls_neither_the_event_loop_nor_reads(
    held_writer: tuple[LedgerStore, threading.Event], serve_asgi: Callable[..., Any]
) -> None:
    store, release = held_writer
    server = serve_asgi(create_app(store))
    answers: list[Any] = []
    writer = threading.Thread(
        target=lambda: answers.append(
            LedgerClient(server.url, timeout=60).exclude("n1", "xid79", key="waits-for-writer")
        )
    )
    writer.start()
    # While the write waits for the writer thread, everything else answers at once.
    assert http_json(f"{server.url}/healthz", timeout=10) == {"status": "ok"}
    assert b"gpufleet_fleet_excluded_nodes 0.0" in http_get(f"{server.url}/metrics", timeout=10)
    assert http_json(f"{server.url}/v1/exclusions", timeout=10) == []
    assert writer.is_alive() and answers == []
    release.set()
    writer.join(30)
    assert answers and answers[0]["node"] == "n1"
    assert b"gpufleet_fleet_excluded_nodes 1.0" in http_get(f"{server.url}/metrics", timeout=10)


def test_writes_that_queue_up_commit_together_and_a_refused_one_costs_nothing_else(
    held_writer: tuple[LedgerStore, threading.Event],
) -> None:
    store, release = held_writer
    futures = [
        store.submit_exclusion(f"batch-key-{n:02d}", ExclusionIn(node=f"n{n}", reason="xid79"))
        for n in range(10)
    ]
    conflicting = store.submit_exclusion("batch-key-xx", ExclusionIn(node="n3", reason="ecc"))
    replayed = store.submit_exclusion("batch-key-00", ExclusionIn(node="n0", reason="xid79"))
    release.set()
    assert [f.result(30).status for f in futures] == [201] * 10
    with pytest.raises(LedgerConflictError, match="already excluded"):
        conflicting.result(30)
    assert replayed.result(30).replayed
    assert sorted(r["node"] for r in store.exclusions()) == sorted(f"n{n}" for n in range(10))
    assert store.exclusion_counts() == [
        {"node": f"n{n}", "reason": "xid79", "source": "manual", "count": 1} for n in range(10)
    ]


def test_the_client_reads_a_token_file_and_names_a_missing_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    secret = tmp_path / "token"
    secret.write_text("s3cret\n")
    monkeypatch.delenv("GPUFLEET_FLEET_TOKEN", raising=False)
    monkeypatch.setenv("GPUFLEET_FLEET_TOKEN_FILE", str(secret))
    assert LedgerClient("http://127.0.0.1:1").token == "s3cret"
    monkeypatch.setenv("GPUFLEET_FLEET_TOKEN_FILE", str(tmp_path / "missing"))
    with pytest.raises(LedgerError, match="token file: cannot read"):
        LedgerClient("http://127.0.0.1:1")


def test_a_write_the_database_cannot_take_is_a_503_that_stores_nothing(
    tmp_path: Path, clock: Clock
) -> None:
    store, client = open_ledger(tmp_path / "fleet.db", clock)
    try:
        # a full disk, seen by one request in the batch: the others are unaffected
        def full(db: sqlite3.Connection) -> None:
            raise sqlite3.OperationalError("database or disk is full")

        failed = store.submit(full)
        with pytest.raises(LedgerUnavailableError, match="disk is full"):
            failed.result(30)
        assert (
            post(client, "/v1/exclusions", {"node": "n1", "reason": "x"}, "key-after").status_code
            == 201
        )
        store.close()  # shutting down: nothing more can be stored
        refused = post(client, "/v1/exclusions", {"node": "n2", "reason": "x"}, "key-closing")
        assert refused.status_code == 503
        assert "retry with the same key" in refused.json()["detail"]
    finally:
        client.close()
        store.close()
