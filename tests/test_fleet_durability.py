"""An event the ledger acknowledged survives kill -9 at any moment."""

from __future__ import annotations

import http.client
import json
import os
import signal
import sys
import threading
import time
from pathlib import Path

import pytest

from gpufleet.devstack import ManagedProcess, free_port, http_get, http_json, wait_until

pytestmark = pytest.mark.integration


def start_ledger(db: Path, port: int, log: Path) -> ManagedProcess:
    process = ManagedProcess(
        [sys.executable, "-m", "gpufleet", "fleet", "--listen", f"127.0.0.1:{port}",
         "--db", str(db), "--log-level", "warning"],
        log,
    )  # fmt: skip
    process.start()
    wait_until(lambda: http_get(f"http://127.0.0.1:{port}/readyz"), 30, what="the ledger")
    return process


def post(connection: http.client.HTTPConnection, key: str, node: str) -> int:
    body = json.dumps({"node": node, "reason": "xid79", "source": "auto"})
    connection.request(
        "POST", "/v1/exclusions", body,
        {"Content-Type": "application/json", "Idempotency-Key": key},
    )  # fmt: skip
    response = connection.getresponse()
    response.read()
    return response.status


def test_every_acknowledged_exclusion_survives_kill_9_during_a_write_storm(tmp_path: Path) -> None:
    db, port = tmp_path / "fleet.db", free_port()
    ledger = start_ledger(db, port, tmp_path / "ledger-1.log")
    sent: set[str] = set()
    acknowledged: set[str] = set()
    lock = threading.Lock()
    stop = threading.Event()

    def storm(worker: int) -> None:
        connection = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
        number = 0
        while not stop.is_set():
            key = f"storm-{worker:02d}-{number:06d}"
            with lock:
                sent.add(key)
            try:
                status = post(connection, key, f"node-{worker}-{number}")
            except (OSError, http.client.HTTPException):
                return  # the ledger was killed mid-request: this one's fate is unknown
            if status == 201:
                with lock:
                    acknowledged.add(key)
            number += 1

    workers = [threading.Thread(target=storm, args=(n,)) for n in range(6)]
    for worker in workers:
        worker.start()
    wait_until(lambda: len(acknowledged) >= 200, 60, what="200 acknowledged writes")
    assert ledger.pid is not None
    os.kill(ledger.pid, signal.SIGKILL)  # no clean shutdown, writes in flight
    time.sleep(0.2)
    stop.set()
    for worker in workers:
        worker.join(10)

    ledger = start_ledger(db, port, tmp_path / "ledger-2.log")
    try:
        rows = http_json(f"http://127.0.0.1:{port}/v1/exclusions")
        stored = {row["idempotency_key"] for row in rows}
        assert acknowledged <= stored, f"lost {len(acknowledged - stored)} acknowledged writes"
        assert stored <= sent
        assert len(rows) == len(stored)  # nothing twice

        # Writers retry what they never heard back about: nothing is counted twice.
        unknown = sorted(sent - acknowledged)
        connection = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
        for key in unknown:
            worker, number = key.split("-")[1:]
            assert post(connection, key, f"node-{int(worker)}-{int(number)}") == 201
        after = http_json(f"http://127.0.0.1:{port}/v1/exclusions")
        assert len(after) == len(sent)
        metrics = http_get(f"http://127.0.0.1:{port}/metrics").decode()
        assert f"gpufleet_fleet_excluded_nodes {float(len(sent))}" in metrics
    finally:
        ledger.stop()
