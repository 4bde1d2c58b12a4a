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


def test_the_report_counts_a_retry_recovered_exactly_when_its_chain_recovers(
    tmp_path: Path,
) -> None:
    pytest.importorskip("pandas")
    import matplotlib.pyplot as plt
    import pandas as pd

    from gpufleet.fleet.chains import histories
    from gpufleet.fleet.report import LedgerData, Report, _Context, _recovery_section
    from gpufleet.promapi import PrometheusApi

    hour, until, healthy_after = 3600.0, 10 * 3600.0, 1800.0

    def attempt(job: str, n: int, trigger: str, start: float, first: float | None,
                end: float | None, outcome: str | None) -> dict[str, Any]:  # fmt: skip
        return {"training_job": job, "attempt": n, "trigger": trigger, "started_at": start,
                "first_step_at": first, "ended_at": end, "outcome": outcome}  # fmt: skip

    attempts = [
        # still running at the report's end, past healthy_after by then: recovered
        attempt("a", 1, "initial", 0, 60, hour, "failed"),
        attempt("a", 2, "auto", hour + 60, hour + 120, None, None),
        # ran 80 s and failed, then one that never stepped, then a short success
        attempt("b", 1, "initial", 0, 60, hour, "failed"),
        attempt("b", 2, "auto", hour + 60, hour + 120, hour + 200, "failed"),
        attempt("b", 3, "auto", hour + 300, None, hour + 400, "failed"),
        attempt("b", 4, "auto", hour + 500, hour + 560, hour + 620, "success"),
        # started too close to the end to have run healthy_after: not (yet) recovered
        attempt("c", 1, "initial", 0, 60, until - 600, "failed"),
        attempt("c", 2, "auto", until - 500, until - 400, None, None),
    ]
    report = Report("t", 0, until)
    ctx = _Context(
        PrometheusApi("http://127.0.0.1:1"),  # the recovery section reads only the ledger
        LedgerData([], attempts),
        tmp_path, 0, until, healthy_after, report, pd, plt,
    )  # fmt: skip
    body = _recovery_section(ctx)
    row = next(line for line in body.splitlines() if line.startswith("| auto |"))
    tried, recovered = (int(cell) for cell in row.strip("|").split("|")[1:3])

    chains = [c for h in histories(attempts, until, healthy_after).values() for c in h.chains]
    assert tried == sum(len(chain.attempts) for chain in chains) == 5
    assert recovered == sum(chain.outcome == "recovered" for chain in chains) == 2
