"""The postmortem report, built against a real Prometheus fed by the simulator's history
and a ledger the simulator reported its exclusions and attempts to."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from gpufleet.devstack import PrometheusServer, backfill
from gpufleet.fleet.app import create_app
from gpufleet.fleet.store import LedgerStore

pytestmark = pytest.mark.integration

SCENARIO = """
name: busy-day
cluster: {nodes: 16, checkpoint_interval_s: 1800}
rates: {fail_stop_per_1000_node_days: 400, bad_node_multiplier: 30}
"""


def test_report_from_simulated_history_and_ledger(
    tmp_path: Path,
    serve_asgi: Callable[..., Any],
    prometheus_factory: Callable[..., PrometheusServer],
) -> None:
    store = LedgerStore(tmp_path / "fleet.db")
    ledger = serve_asgi(create_app(store))
    scenario = tmp_path / "busy-day.yaml"
    scenario.write_text(SCENARIO)
    end = float(int(time.time()) // 60 * 60)
    history = tmp_path / "history"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "gpufleet",
            "simulate",
            "--scenario",
            str(scenario),
            "--seed",
            "4",
            "--history",
            "1",
            "--out",
            str(history),
            "--end",
            str(end),
            "--fleet-url",
            ledger.url,
        ],
        check=True,
        capture_output=True,
        timeout=300,
    )
    tsdb = tmp_path / "tsdb"
    backfill(sorted(history.glob("history-*.om")), tsdb)
    prometheus = prometheus_factory(
        storage_path=tsdb, extra_args=["--storage.tsdb.retention.time=30d"]
    )

    out = tmp_path / "report"
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "gpufleet",
            "report",
            "--prometheus",
            prometheus.url,
            "--fleet-url",
            ledger.url,
            "--since",
            "1d",
            "--until",
            str(end),
            "--out",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert "[########################] 6/6" in result.stderr  # the progress bar
    text = (out / "report.md").read_text()
    for heading in (
        "Exclusion leaderboard and concentration",
        "Incidents by cause",
        "Fail-slow episodes per node",
        "Checkpoint queue wait",
        "Automatic vs manual recovery",
        "Fleet MTBF and the checkpoint interval",
    ):
        assert f"## {heading}" in text
    assert (out / "exclusions_by_node.png").stat().st_size > 5000
    assert (out / "checkpoint_queue_share.png").stat().st_size > 5000

    truth = json.loads((history / "ground_truth.json").read_text())
    figures = json.loads((out / "figures.json").read_text())
    excluded = [x for x in truth["exclusions"] if truth["start"] <= x["start"] < end]
    assert figures["exclusions"] == len(excluded) > 0
    per_node: dict[str, int] = {}
    for exclusion in excluded:
        per_node[exclusion["node"]] = per_node.get(exclusion["node"], 0) + 1
    top3 = sum(sorted(per_node.values(), reverse=True)[:3]) / len(excluded)
    assert figures["top3_share"] == pytest.approx(top3)
    xids = sum(1 for e in truth["episodes"] if e["kind"] == "fail_stop" and e["xid"] is not None)
    assert 0 < figures["xid_events"] <= xids  # a node rebooted after repair restarts its counters
    assert figures["nodes"] == 16
    assert figures["checkpoint_queue_share"] > 0.5  # 16 writers x 16 requests > 64 slots
    assert figures["young_daly_s"] > 0
    failed = sum(1 for a in truth["attempts"] if a["outcome"] == "failed")
    assert f"({failed} failures)" in text
    store.close()
