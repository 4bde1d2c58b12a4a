"""The live simulator reports its exclusions and job attempts to a fleet ledger."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from gpufleet.fleet.app import create_app
from gpufleet.fleet.ledger_client import LedgerClient
from gpufleet.fleet.store import LedgerStore
from gpufleet.lab.processes import http_json, wait_until
from gpufleet.simulate.cluster import Cluster
from gpufleet.simulate.config import load_scenario
from gpufleet.simulate.ledger_feed import LedgerFeed, ledger_events
from gpufleet.simulate.serve import SimulatorServer

pytestmark = pytest.mark.integration


def test_a_failure_in_the_live_simulator_reaches_the_ledger(
    tmp_path: Path, serve_asgi: Callable[..., Any]
) -> None:
    scenario_file = tmp_path / "quick.yaml"
    scenario_file.write_text(
        """
cluster: {nodes: 8}
rates: {fail_stop_per_1000_node_days: 0, fail_slow_compute_per_node_day: 0,
        fail_slow_comm_per_node_day: 0}
episodes:
  - {kind: fail_stop, cause: hbm, node: 3, gpu: 1, xid: 48, start: 3s, duration: 4h}
"""
    )
    store = LedgerStore(tmp_path / "fleet.db")
    ledger = serve_asgi(create_app(store))
    cluster = Cluster(load_scenario(str(scenario_file)), 0, time.time(), 86400.0)
    events = ledger_events(cluster.timeline, cluster.node_names, "sim-llm", 0)
    feed = LedgerFeed(LedgerClient(ledger.url), events)
    simulator = SimulatorServer(cluster, tick_s=0.5, feed=feed)
    simulator.start()
    try:
        rows = wait_until(
            lambda: http_json(f"{ledger.url}/v1/exclusions"), 30, what="the exclusion"
        )
        assert [(r["node"], r["reason"], r["source"], r["training_job"]) for r in rows] == [
            ("node-003", "hbm", "auto", "sim-llm")
        ]
        attempts = http_json(f"{ledger.url}/v1/attempts")
        assert attempts[0]["trigger"] == "initial" and attempts[0]["outcome"] == "failed"
        assert attempts[0]["cause"] == "hbm"
        # a restarted feed posts the same events again: the ledger counts them once
        again = LedgerFeed(LedgerClient(ledger.url), events)
        again.post_until(cluster.now)
        assert len(http_json(f"{ledger.url}/v1/exclusions")) == 1
        assert again.failed == 0
    finally:
        simulator.stop()
        store.close()
