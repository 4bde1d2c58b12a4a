"""An event the ledger acknowledged survives kill -9 at any moment, and the counters it
keeps materialised still equal a recomputation from the stored history afterwards."""

from __future__ import annotations

import http.client
import os
import signal
import sqlite3
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.metrics_core import Metric
from prometheus_client.parser import text_string_to_metric_families

from gpufleet.fleet.counters import snapshot_from_history
from gpufleet.fleet.ledger_client import LedgerClient
from gpufleet.fleet.metrics import ledger_families
from gpufleet.lab.processes import ManagedProcess, free_port, http_get, ledger_post, wait_until

pytestmark = pytest.mark.integration
LEDGER_FAMILIES = (
    "gpufleet_fleet_node_exclusions",
    "gpufleet_fleet_node_excluded",
    "gpufleet_fleet_excluded_nodes",
    "gpufleet_fleet_job_attempts",
    "gpufleet_fleet_recovery_downtime_seconds",
    "gpufleet_fleet_retry_chains",
    "gpufleet_fleet_retry_chain_failed_attempts",
)


def start_ledger(db: Path, port: int, log: Path) -> ManagedProcess:
    process = ManagedProcess(
        [sys.executable, "-m", "gpufleet", "fleet", "--listen", f"127.0.0.1:{port}",
         "--db", str(db), "--log-level", "warning"],
        log,
    )  # fmt: skip
    process.start()
    wait_until(lambda: http_get(f"http://127.0.0.1:{port}/readyz"), 30, what="the ledger")
    return process


def exclusion_requests(worker: int) -> Iterator[tuple[str, dict[str, Any]]]:
    number = 0
    while True:
        yield "/v1/exclusions", {"node": f"node-{worker}-{number}", "reason": "xid79",
                                 "source": "auto"}  # fmt: skip
        number += 1


def attempt_requests(worker: int) -> Iterator[tuple[str, dict[str, Any]]]:
    """A job whose attempts start, train and fail, one after another (retry chains)."""
    number = 1
    while True:
        base = {"training_job": f"storm-job-{worker}", "attempt": number}
        trigger = "initial" if number == 1 else ("manual" if number % 5 == 0 else "auto")
        yield "/v1/attempts", {**base, "event": "started", "trigger": trigger}
        yield "/v1/attempts", {**base, "event": "first_step"}
        if number % 7 != 6:  # some attempts are still running when the next one starts
            yield "/v1/attempts", {**base, "event": "ended", "outcome": "failed",
                                   "cause": "xid79"}  # fmt: skip
        number += 1


def ledger_samples(text: str) -> set[tuple[str, frozenset[tuple[str, str]], float]]:
    return {
        (sample.name, frozenset(sample.labels.items()), sample.value)
        for family in text_string_to_metric_families(text)
        if family.name in LEDGER_FAMILIES
        for sample in family.samples
    }


def recomputed_from_history(db: Path) -> str:
    """The ledger's families computed from every stored row, as the ledger once did per scrape."""
    database = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    database.row_factory = sqlite3.Row
    exclusions = [dict(row) for row in database.execute("SELECT * FROM exclusions")]
    attempts = [dict(row) for row in database.execute("SELECT * FROM attempts")]
    database.close()
    snapshot = snapshot_from_history(exclusions, attempts, time.time())

    class Recomputed:
        def collect(self) -> Iterator[Metric]:
            return ledger_families(snapshot)

    registry = CollectorRegistry(auto_describe=False)
    registry.register(Recomputed())  # type: ignore[arg-type]
    return generate_latest(registry).decode()


def test_every_acknowledged_write_survives_kill_9_and_counters_match_the_history(
    tmp_path: Path,
) -> None:
    db, port = tmp_path / "fleet.db", free_port()
    ledger = start_ledger(db, port, tmp_path / "ledger-1.log")
    sent: dict[str, tuple[str, dict[str, Any]]] = {}
    acknowledged: set[str] = set()
    lock = threading.Lock()
    stop = threading.Event()

    def storm(worker: int, requests: Iterator[tuple[str, dict[str, Any]]]) -> None:
        connection = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
        for number, (path, body) in enumerate(requests):
            if stop.is_set():
                return
            key = f"storm-{worker:02d}-{number:06d}"
            with lock:
                sent[key] = (path, body)
            try:
                status = ledger_post(connection, path, body, key)
            except (OSError, http.client.HTTPException):
                return  # the ledger was killed mid-request: this one's fate is unknown
            assert status in (200, 201), (key, status)
            with lock:
                acknowledged.add(key)

    workers = [threading.Thread(target=storm, args=(n, exclusion_requests(n))) for n in range(4)]
    workers += [threading.Thread(target=storm, args=(n, attempt_requests(n))) for n in (4, 5, 6)]
    for worker in workers:
        worker.start()
    wait_until(lambda: len(acknowledged) >= 300, 60, what="300 acknowledged writes")
    assert ledger.pid is not None
    os.kill(ledger.pid, signal.SIGKILL)  # no clean shutdown, writes in flight
    time.sleep(0.2)
    stop.set()
    for worker in workers:
        worker.join(10)

    ledger = start_ledger(db, port, tmp_path / "ledger-2.log")
    try:
        client = LedgerClient(f"http://127.0.0.1:{port}")
        rows = client.get_all("/v1/exclusions", limit=50)  # many pages
        stored = {row["idempotency_key"] for row in rows}
        acknowledged_exclusions = {k for k in acknowledged if sent[k][0] == "/v1/exclusions"}
        assert acknowledged_exclusions <= stored, f"lost {len(acknowledged_exclusions - stored)}"
        assert stored <= set(sent)
        assert len(rows) == len(stored)  # nothing twice
        # Right after the restart, before anything new is written: the counters equal the
        # history, so neither the crash nor the restart moved them.
        assert ledger_samples(http_get(f"http://127.0.0.1:{port}/metrics").decode()) == (
            ledger_samples(recomputed_from_history(db))
        )

        # Writers retry what they never heard back about: nothing is counted twice.
        connection = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
        for key in sorted(set(sent) - acknowledged):
            assert ledger_post(connection, *sent[key], key) in (200, 201), key
        after = client.get_all("/v1/exclusions")
        exclusions_sent = sum(1 for path, _ in sent.values() if path == "/v1/exclusions")
        assert len(after) == exclusions_sent
        metrics = http_get(f"http://127.0.0.1:{port}/metrics").decode()
        assert f"gpufleet_fleet_excluded_nodes {float(exclusions_sent)}" in metrics
        assert ledger_samples(metrics) == ledger_samples(recomputed_from_history(db))
        attempts = client.get_all("/v1/attempts")
        started = {
            (body["training_job"], body["attempt"])
            for path, body in sent.values()
            if path == "/v1/attempts" and body["event"] == "started"
        }
        assert len(started) >= 3
        assert {(a["training_job"], a["attempt"]) for a in attempts} == started
    finally:
        ledger.stop()
