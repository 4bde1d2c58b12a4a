"""The fleet ledger's API: events, idempotency, conflicts, queries, metrics across restarts."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from prometheus_client.parser import text_string_to_metric_families

from gpufleet.fleet.app import create_app
from gpufleet.fleet.migrations import MIGRATIONS
from gpufleet.fleet.store import LedgerStore

NOW = 1_800_000_000.0


LOOPBACK = ("127.0.0.1", 50000)  # where the test client's requests come from


class Ledger:
    def __init__(self, path: Path, token: str | None = None, **options: Any) -> None:
        self.path = path
        self.store = LedgerStore(path, clock=lambda: NOW)
        self.client = TestClient(
            create_app(self.store, token, clock=lambda: NOW, **options), client=LOOPBACK
        )
        self._keys = 0

    def post(self, path: str, body: dict[str, Any], key: str | None = None, **headers: str) -> Any:
        self._keys += 1
        key = key or f"test-key-{self._keys:04d}"
        return self.client.post(path, json=body, headers={"Idempotency-Key": key, **headers})

    def metrics(self) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
        text = self.client.get("/metrics").text
        return {
            (s.name, frozenset(s.labels.items())): s.value
            for family in text_string_to_metric_families(text)
            for s in family.samples
        }

    def close(self) -> None:
        self.client.close()
        self.store.close()


@pytest.fixture
def ledger(tmp_path: Path) -> Iterator[Ledger]:
    opened = Ledger(tmp_path / "fleet.db")
    yield opened
    opened.close()


def exclusion(
    node: str, reason: str = "xid79", at: float = NOW - 3600, **extra: Any
) -> dict[str, Any]:
    return {
        "node": node,
        "reason": reason,
        "source": "auto",
        "training_job": "llm",
        "at": at,
        **extra,
    }


def test_exclusions_and_releases_are_recorded_and_queried(ledger: Ledger) -> None:
    created = ledger.post("/v1/exclusions", exclusion("node-007"))
    assert created.status_code == 201
    assert created.json() == {"id": 1, "node": "node-007", "excluded_at": NOW - 3600}
    assert ledger.client.get("/v1/excluded").json()[0]["node"] == "node-007"
    released = ledger.post("/v1/releases", {"node": "node-007", "at": NOW - 600, "note": "RMA"})
    assert released.status_code == 200
    assert ledger.client.get("/v1/excluded").json() == []
    ledger.post("/v1/exclusions", exclusion("node-007", "ecc", at=NOW - 300))
    ledger.post("/v1/exclusions", exclusion("node-002", "slow", at=NOW - 200, source="manual"))
    rows = ledger.client.get("/v1/exclusions", params={"node": "node-007"}).json()
    assert [(r["reason"], r["released_at"], r["release_note"]) for r in rows] == [
        ("xid79", NOW - 600, "RMA"),
        ("ecc", None, ""),
    ]
    recent = ledger.client.get("/v1/exclusions", params={"since": NOW - 250}).json()
    assert [r["node"] for r in recent] == ["node-002"]


def test_a_retried_post_never_counts_twice(ledger: Ledger) -> None:
    first = ledger.post("/v1/exclusions", exclusion("node-001"), key="retry-me-0001")
    again = ledger.post("/v1/exclusions", exclusion("node-001"), key="retry-me-0001")
    assert first.status_code == again.status_code == 201
    assert again.json() == first.json()
    assert again.headers["idempotent-replayed"] == "true"
    assert len(ledger.client.get("/v1/exclusions").json()) == 1
    reused = ledger.post("/v1/exclusions", exclusion("node-009"), key="retry-me-0001")
    assert reused.status_code == 409
    assert "already used for a different request" in reused.json()["detail"]


@pytest.mark.parametrize(
    ("headers", "status", "message"),
    [
        ({}, 400, "Idempotency-Key header"),
        ({"Idempotency-Key": "short"}, 400, "Idempotency-Key header"),
        ({"Idempotency-Key": "has spaces in it"}, 400, "Idempotency-Key header"),
    ],
)
def test_writes_need_an_idempotency_key(
    ledger: Ledger, headers: dict[str, str], status: int, message: str
) -> None:
    response = ledger.client.post("/v1/exclusions", json=exclusion("node-1"), headers=headers)
    assert response.status_code == status
    assert message in response.json()["detail"]
    assert ledger.client.get("/v1/exclusions").json() == []


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"reason": "x"}, "node"),
        (exclusion("bad node name"), "node"),
        (exclusion("n1", source="robot"), "source"),
        (exclusion("n1", at=1_800_000_000_000), "at"),  # milliseconds
        (exclusion("n1", reason=""), "reason"),
        ({**exclusion("n1"), "severity": "high"}, "severity"),
    ],
)
def test_bad_input_gets_422_naming_the_field_and_stores_nothing(
    ledger: Ledger, body: dict[str, Any], field: str
) -> None:
    response = ledger.post("/v1/exclusions", body)
    assert response.status_code == 422
    assert response.json()["detail"][0]["field"] == field
    assert ledger.client.get("/v1/exclusions").json() == []


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (b"", "the body is empty"),
        (b"{not json", "not valid JSON"),
        (b'{"node": "n1", "node": "n2", "reason": "xid79"}', "'node' appears twice"),
        (b"[" * 10_000, "nested too deeply"),
    ],
)
def test_a_body_that_is_not_one_json_document_gets_422_naming_why(
    ledger: Ledger, body: bytes, message: str
) -> None:
    # the agent's parser: a key given twice is refused, not silently resolved to the last one
    response = ledger.client.post(
        "/v1/exclusions",
        content=body,
        headers={"Idempotency-Key": "bad-body-0001", "Content-Type": "application/json"},
    )
    assert response.status_code == 422
    (problem,) = response.json()["detail"]
    assert problem["field"] == "body"
    assert message in problem["message"]
    assert ledger.client.get("/v1/exclusions").json() == []


def test_an_oversized_body_is_refused_by_its_declared_length(ledger: Ledger) -> None:
    response = ledger.client.post(
        "/v1/exclusions",
        content=b"{}",
        headers={"Idempotency-Key": "too-large-0001", "Content-Length": str(10**9)},
    )
    assert response.status_code == 413
    assert "exceeds 65536 bytes" in response.json()["detail"]
    counted = ledger.metrics()
    key = ("gpufleet_fleet_writes_rejected_total", frozenset({("reason", "too_large")}))
    assert counted[key] == 1


def test_contradictions_are_conflicts(ledger: Ledger) -> None:
    ledger.post("/v1/exclusions", exclusion("node-3"))
    again = ledger.post("/v1/exclusions", exclusion("node-3", at=NOW - 10))
    assert again.status_code == 409 and "already excluded" in again.json()["detail"]
    assert ledger.post("/v1/releases", {"node": "node-4"}).status_code == 409
    early = ledger.post("/v1/releases", {"node": "node-3", "at": NOW - 7200})
    assert early.status_code == 409 and "before the exclusion" in early.json()["detail"]
    attempt = {"training_job": "llm", "attempt": 2}
    never = ledger.post("/v1/attempts", {**attempt, "event": "ended", "outcome": "failed"})
    assert never.status_code == 409 and "never started" in never.json()["detail"]
    no_trigger = ledger.post("/v1/attempts", {**attempt, "event": "started"})
    assert no_trigger.status_code == 409 and "needs a trigger" in no_trigger.json()["detail"]


def test_writes_and_reads_require_the_token_when_one_is_set(tmp_path: Path) -> None:
    guarded = Ledger(tmp_path / "guarded.db", token="s3cret", read_token="look-only")
    try:
        refused = guarded.post("/v1/exclusions", exclusion("n1"))
        assert refused.status_code == 401 and refused.headers["www-authenticate"] == "Bearer"
        wrong = guarded.post("/v1/exclusions", exclusion("n1"), Authorization="Bearer look-only")
        assert wrong.status_code == 401  # the read token cannot write
        accepted = guarded.post("/v1/exclusions", exclusion("n1"), Authorization="Bearer s3cret")
        assert accepted.status_code == 201
        for path in ("/v1/exclusions", "/v1/exclusions/top", "/v1/excluded", "/v1/attempts",
                     "/v1/chains"):  # fmt: skip
            anonymous = guarded.client.get(path)
            assert anonymous.status_code == 401, path
            assert "for reads" in anonymous.json()["detail"]
            for token in ("s3cret", "look-only"):
                answer = guarded.client.get(path, headers={"Authorization": f"Bearer {token}"})
                assert answer.status_code == 200, (path, token)
        for open_path in ("/metrics", "/healthz", "/readyz"):  # Prometheus and the kubelet
            assert guarded.client.get(open_path).status_code == 200
        metrics = guarded.metrics()
        assert (
            metrics[
                ("gpufleet_fleet_writes_rejected_total", frozenset({("reason", "unauthorized")}))
            ]
            == 2
        )
    finally:
        guarded.close()


def test_without_a_token_only_loopback_may_write_unless_allowed(tmp_path: Path) -> None:
    local = Ledger(tmp_path / "local.db")
    try:
        remote = TestClient(local.client.app, client=("10.1.2.3", 40000))
        refused = remote.post(
            "/v1/exclusions", json=exclusion("n1"), headers={"Idempotency-Key": "remote-0001"}
        )
        assert refused.status_code == 403
        assert "--allow-unauthenticated-writes" in refused.json()["detail"]
        assert "came from 10.1.2.3" in refused.json()["detail"]
        assert remote.get("/v1/exclusions").json() == []  # nothing stored; reads stay open
        mapped = TestClient(local.client.app, client=("::ffff:127.0.0.1", 40000))
        assert (
            mapped.post(
                "/v1/exclusions", json=exclusion("n1"), headers={"Idempotency-Key": "mapped-0001"}
            ).status_code
            == 201
        )
        counted = local.metrics()
        assert (
            counted[
                ("gpufleet_fleet_writes_rejected_total", frozenset({("reason", "not_loopback")}))
            ]
            == 1
        )
    finally:
        local.close()
    opened = Ledger(tmp_path / "open.db", allow_unauthenticated_writes=True)
    try:
        remote = TestClient(opened.client.app, client=("10.1.2.3", 40000))
        accepted = remote.post(
            "/v1/exclusions", json=exclusion("n1"), headers={"Idempotency-Key": "remote-0001"}
        )
        assert accepted.status_code == 201
    finally:
        opened.close()


def test_top_nodes_with_shares(ledger: Ledger) -> None:
    for index, node in enumerate(["a1", "a1", "a1", "b2", "b2", "c3", "d4", "e5"]):
        at = NOW - 86400 + index * 100
        ledger.post("/v1/exclusions", exclusion(node, at=at))
        ledger.post("/v1/releases", {"node": node, "at": at + 50})
    ledger.post("/v1/exclusions", exclusion("old", at=NOW - 40 * 86400))
    top = ledger.client.get("/v1/exclusions/top", params={"days": 30}).json()
    assert top["total"] == 8 and top["nodes"] == 5
    assert top["top3_share"] == pytest.approx(6 / 8)
    assert [(r["node"], r["exclusions"]) for r in top["leaderboard"][:2]] == [("a1", 3), ("b2", 2)]
    assert top["leaderboard"][0]["share"] == pytest.approx(3 / 8)


def attempts(
    ledger: Ledger, rows: list[tuple[int, str, float, float | None, float | None, str | None]]
) -> None:
    for number, trigger, start, first, end, outcome in rows:
        base = {"training_job": "llm", "attempt": number}
        ledger.post("/v1/attempts", {**base, "event": "started", "trigger": trigger, "at": start})
        if first is not None:
            ledger.post("/v1/attempts", {**base, "event": "first_step", "at": first})
        if end is not None:
            ended = {**base, "event": "ended", "outcome": outcome, "cause": "xid79", "at": end}
            assert ledger.post("/v1/attempts", ended).status_code == 200


def test_attempt_metrics_downtime_and_chains_survive_a_restart(
    ledger: Ledger, tmp_path: Path
) -> None:
    t = NOW - 100_000
    attempts(
        ledger,
        [
            (1, "initial", t, t + 300, t + 20_000, "failed"),
            (2, "auto", t + 20_300, t + 20_600, t + 20_700, "failed"),  # dies at once
            (3, "auto", t + 20_900, None, t + 21_000, "failed"),  # never trains
            (4, "manual", t + 30_000, t + 30_400, t + 60_000, "failed"),
            (5, "auto", t + 60_200, t + 60_500, None, None),  # healthy and running
        ],
    )
    ledger.post("/v1/exclusions", exclusion("node-5"))
    before = ledger.metrics()
    job = {"training_job": "llm"}

    def get(name: str, **labels: str) -> float:
        return before[(name, frozenset({**job, **labels}.items()))]

    assert (
        get("gpufleet_fleet_job_attempts_total", trigger="auto", outcome="failed", source="manual")
        == 2
    )
    assert (
        get("gpufleet_fleet_job_attempts_total", trigger="auto", outcome="running", source="manual")
        == 1
    )
    # downtime: failed end -> next first step (2: 600 s, 4: 10400 s, 5: 500 s)
    assert get("gpufleet_fleet_recovery_downtime_seconds_count", trigger="auto") == 2
    assert get("gpufleet_fleet_recovery_downtime_seconds_sum", trigger="auto") == 600 + 500
    assert get("gpufleet_fleet_recovery_downtime_seconds_sum", trigger="manual") == 30_400 - 21_000
    assert get("gpufleet_fleet_retry_chains_total", outcome="manual") == 1
    assert get("gpufleet_fleet_retry_chains_total", outcome="recovered") == 1
    assert get("gpufleet_fleet_retry_chain_failed_attempts") == 0
    assert before[("gpufleet_fleet_excluded_nodes", frozenset())] == 1

    ledger.close()
    reopened = Ledger(tmp_path / "fleet.db")
    try:
        assert reopened.metrics() == before
    finally:
        reopened.close()


def test_a_version_1_database_is_migrated_without_losing_rows(tmp_path: Path) -> None:
    path = tmp_path / "old.db"
    database = sqlite3.connect(path)
    for statement in filter(str.strip, MIGRATIONS[0].split(";")):
        database.execute(statement)
    database.execute(
        "INSERT INTO exclusions (node, reason, source, excluded_at, idempotency_key) "
        "VALUES ('n1', 'xid79', 'auto', 1800000000, 'k1')"
    )
    database.execute("PRAGMA user_version = 1")
    database.commit()
    database.close()
    store = LedgerStore(path)
    try:
        assert store.schema_version == len(MIGRATIONS)
        rows = store.exclusions()
        assert [(r["node"], r["release_note"]) for r in rows] == [("n1", "")]
        assert store._db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    finally:
        store.close()


def test_every_event_keeps_its_source_and_exports_it_as_a_label(ledger: Ledger) -> None:
    assert ledger.post("/v1/exclusions", exclusion("n1", source="slurm")).status_code == 201
    released = ledger.post("/v1/releases", {"node": "n1", "at": NOW - 60, "source": "slurm"})
    assert released.status_code == 200
    assert ledger.post("/v1/exclusions", exclusion("n2", source="kubernetes")).status_code == 201
    job = {"training_job": "run-7", "attempt": 1, "at": NOW - 500}
    started = {**job, "event": "started", "trigger": "initial", "source": "torchrun"}
    assert ledger.post("/v1/attempts", started).status_code == 201
    # a later event of the attempt names who sent it, the attempt keeps its start's source
    ended = {**job, "event": "ended", "outcome": "failed", "source": "slurm"}
    assert ledger.post("/v1/attempts", ended).status_code == 200
    manual = {"training_job": "run-7", "attempt": 2, "event": "started", "trigger": "manual"}
    assert ledger.post("/v1/attempts", manual).status_code == 201

    rows = {r["node"]: r for r in ledger.client.get("/v1/exclusions").json()}
    assert (rows["n1"]["source"], rows["n1"]["release_source"]) == ("slurm", "slurm")
    assert (rows["n2"]["source"], rows["n2"]["release_source"]) == ("kubernetes", None)
    attempts = ledger.client.get("/v1/attempts").json()
    assert [a["source"] for a in attempts] == ["torchrun", "manual"]
    metrics = ledger.metrics()
    exclusions = "gpufleet_fleet_node_exclusions_total"
    assert (
        metrics[
            (exclusions, frozenset({"node": "n1", "reason": "xid79", "source": "slurm"}.items()))
        ]
        == 1
    )
    attempts_total = "gpufleet_fleet_job_attempts_total"
    labels = {
        "training_job": "run-7",
        "trigger": "initial",
        "outcome": "failed",
        "source": "torchrun",
    }
    assert metrics[(attempts_total, frozenset(labels.items()))] == 1
    refused = ledger.post("/v1/attempts", {**started, "attempt": 3, "source": "cron"})
    assert refused.status_code == 422 and "source" in refused.text


def test_a_version_3_database_keeps_its_exclusions_and_sources_after_migrating(
    tmp_path: Path,
) -> None:
    path = tmp_path / "v3.db"
    database = sqlite3.connect(path)
    for script in MIGRATIONS[:3]:
        for statement in filter(str.strip, script.split(";")):
            database.execute(statement)
    database.execute(
        "INSERT INTO exclusions (node, reason, source, excluded_at, released_at, "
        "idempotency_key) VALUES ('n1', 'xid79', 'auto', 1800000000, 1800000100, 'k1')"
    )
    database.execute(
        "INSERT INTO attempts (training_job, attempt, trigger, started_at) "
        "VALUES ('j', 1, 'initial', 1800000000)"
    )
    database.execute("PRAGMA user_version = 3")
    database.commit()
    database.close()
    store = LedgerStore(path)
    try:
        assert store.schema_version == len(MIGRATIONS)
        [row] = store.exclusions()
        assert (row["node"], row["source"], row["release_source"]) == ("n1", "auto", "manual")
        assert [a["source"] for a in store.attempts()] == ["manual"]
        assert store.snapshot().jobs["j"].attempts == {("initial", "running", "manual"): 1}
    finally:
        store.close()
