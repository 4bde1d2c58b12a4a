"""The ledger under a careless or hostile writer: label caps, key retention, paged lists,
and writes that never stall the event loop."""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from gpufleet.devstack import http_get, http_json
from gpufleet.fleet.app import PAGE_DEFAULT, create_app
from gpufleet.fleet.ledger_client import LedgerClient, LedgerError
from gpufleet.fleet.models import ExclusionIn
from gpufleet.fleet.store import (
    LedgerConflictError,
    LedgerLimits,
    LedgerStore,
    LedgerUnavailableError,
)

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


def test_new_label_values_beyond_their_caps_get_429_are_counted_and_store_nothing(
    tmp_path: Path, clock: Clock
) -> None:
    store, client = open_ledger(
        tmp_path / "fleet.db", clock, max_nodes=2, max_training_jobs=1, max_reasons=2
    )
    try:
        for index, node in enumerate(["n1", "n2"]):
            ok = post(
                client, "/v1/exclusions", {"node": node, "reason": "xid79"}, f"key-ok-{index}"
            )
            assert ok.status_code == 201
        third = post(client, "/v1/exclusions", {"node": "n3", "reason": "xid79"}, "key-node-3")
        assert third.status_code == 429
        assert "2 distinct node values" in third.json()["detail"]
        assert "--max-nodes" in third.json()["detail"]
        # a known node is never refused
        post(client, "/v1/releases", {"node": "n1"}, "key-release-1")
        again = post(client, "/v1/exclusions", {"node": "n1", "reason": "ecc"}, "key-n1-again")
        assert again.status_code == 201
        post(client, "/v1/releases", {"node": "n1"}, "key-release-2")
        reasons = post(client, "/v1/exclusions", {"node": "n1", "reason": "slow"}, "key-reason-3")
        assert reasons.status_code == 429 and "--max-reasons" in reasons.json()["detail"]

        started = {"attempt": 1, "event": "started", "trigger": "initial"}
        ok = post(client, "/v1/attempts", {"training_job": "j1", **started}, "key-job-1")
        assert ok.status_code == 201
        refused = post(client, "/v1/attempts", {"training_job": "j2", **started}, "key-job-2")
        assert refused.status_code == 429
        assert "--max-training-jobs" in refused.json()["detail"]

        # a refused write stored nothing, not even its idempotency key: a retry is refused again
        assert [r["node"] for r in store.exclusions()] == ["n1", "n2", "n1"]
        assert [a["training_job"] for a in store.attempts()] == ["j1"]
        assert "key-node-3" not in store.idempotency_keys()
        assert post(client, "/v1/exclusions", {"node": "n3", "reason": "xid79"}, "key-node-3")
        rejected = 'gpufleet_fleet_writes_rejected_total{reason="%s"}'
        assert sample(client, rejected % "node_cap") == 2
        assert sample(client, rejected % "reason_cap") == 1
        assert sample(client, rejected % "training_job_cap") == 1
        assert sample(client, 'gpufleet_fleet_label_values{label="node"}') == 2
        assert sample(client, 'gpufleet_fleet_label_values_limit{label="node"}') == 2
        assert 'node="n3"' not in client.get("/metrics").text
    finally:
        client.close()
        store.close()


def test_known_labels_cannot_be_combined_into_series_beyond_the_series_cap(
    tmp_path: Path, clock: Clock
) -> None:
    store, client = open_ledger(tmp_path / "fleet.db", clock, max_exclusion_series=3)
    try:
        combinations = [("n1", "xid79"), ("n1", "ecc"), ("n2", "xid79"), ("n2", "ecc")]
        answers = []
        for index, (node, reason) in enumerate(combinations):
            body = {"node": node, "reason": reason, "source": "auto"}
            answers.append(post(client, "/v1/exclusions", body, f"key-series-{index}").status_code)
            post(client, "/v1/releases", {"node": node}, f"key-series-release-{index}")
        assert answers == [201, 201, 201, 429]
        again = post(client, "/v1/exclusions", {"node": "n1", "reason": "ecc", "source": "auto"},
                     "key-series-again")  # fmt: skip
        assert again.status_code == 201  # an existing series keeps counting
        text = client.get("/metrics").text
        assert text.count("gpufleet_fleet_node_exclusions_total{") == 3
        rejected = 'gpufleet_fleet_writes_rejected_total{reason="exclusion_series_cap"}'
        assert sample(client, rejected) == 1
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
