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

from gpufleet.fleet.app import create_app
from gpufleet.fleet.store import LedgerStore
from gpufleet.lab.devstack import PrometheusServer
from gpufleet.lab.processes import backfill

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
    assert "[########################] 7/7" in result.stderr  # the progress bar
    text = (out / "report.md").read_text()
    for heading in (
        "Exclusion leaderboard and concentration",
        "Incidents by cause",
        "Pages and the exclusions they led to",
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
    from gpufleet.fleet.report_context import LedgerData, Report, SectionContext
    from gpufleet.fleet.report_sections import _recovery_section
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
    ctx = SectionContext(
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


def test_the_report_computes_the_seed_figures_from_a_ledger_filled_through_its_api(
    tmp_path: Path,
    serve_asgi: Callable[..., Any],
    prometheus_factory: Callable[..., PrometheusServer],
) -> None:
    """Chain success rate, median retry interval, median downtime auto vs manual, top-3
    share, and which exclusions a page led to: from writes as the sources make them."""
    from gpufleet.fleet.ledger_client import LedgerClient

    store = LedgerStore(tmp_path / "fleet.db")
    ledger = serve_asgi(create_app(store))
    client = LedgerClient(ledger.url, token="")
    end = float(int(time.time()) // 60 * 60)
    t0 = end - 20 * 3600

    def attempts(job: str, source: str, *rows: tuple[str, float, float | None, float, str]) -> None:
        for number, (trigger, start, first, stop, outcome) in enumerate(rows, start=1):
            client.attempt(job, number, "started", trigger=trigger, at=start, source=source)
            if first is not None:
                client.attempt(job, number, "first_step", at=first, source=source)
            client.attempt(job, number, "ended", outcome=outcome, at=stop, source=source)

    h = 3600.0
    # a: fails, retried 600 s later, steps 900 s after the failure, recovers (a chain recovered)
    attempts("llm-a", "torchrun", ("initial", t0, t0 + 60, t0 + h, "failed"),
             ("auto", t0 + h + 600, t0 + h + 900, t0 + 4 * h, "success"))  # fmt: skip
    # b: retried after 1200 s (steps 1500 s after), fails again, retried after 300 s and
    # never steps, then a person restarts it 3000 s later (steps 3600 s after): chain manual
    b1 = t0 + h
    b2 = b1 + 1500 + 100
    b3 = b2 + 300 + 50
    attempts("llm-b", "slurm", ("initial", t0, t0 + 60, b1, "failed"),
             ("auto", b1 + 1200, b1 + 1500, b2, "failed"),
             ("auto", b2 + 300, None, b3, "failed"),
             ("manual", b3 + 3000, b3 + 3600, b3 + 4 * h, "success"))  # fmt: skip
    # c: retried after 60 s, steps 120 s after the failure, recovers
    attempts("llm-c", "torchrun", ("initial", t0, t0 + 60, t0 + 2 * h, "failed"),
             ("auto", t0 + 2 * h + 60, t0 + 2 * h + 120, t0 + 6 * h, "success"))  # fmt: skip

    def page(node: str, alertname: str, at: float, fingerprint: str) -> None:
        labels = {"alertname": alertname, "severity": "critical", "node": node}
        starts = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(at))
        alert = {"status": "firing", "fingerprint": fingerprint, "startsAt": starts,
                 "labels": labels}  # fmt: skip
        note = {"version": "4", "status": "firing", "receiver": "ledger", "alerts": [alert]}
        for _ in range(2):  # Alertmanager re-sends: still one page
            client._request("POST", "/v1/alertmanager", note)

    p = t0 + 8 * h
    page("node-a", "GpuFleetCriticalXid", p, "000000000000000a")
    client.exclude("node-a", "xid79", at=p + 600, source="kubernetes")
    client.release("node-a", at=p + 700)
    client.exclude("node-a", "xid79", at=p + 800, source="manual")  # the page led to the first
    page("node-c", "GpuFleetEccUncorrectable", p + h, "000000000000000c")
    client.exclude("node-c", "ecc", at=p + h + 1800, source="slurm")
    page("node-e", "GpuFleetGpuLost", p + 2 * h, "000000000000000e")  # no exclusion followed
    client.exclude("node-b", "slow", at=p + 3 * h, source="slurm")
    client.exclude("node-d", "maintenance", at=p + 4 * h, source="manual")

    prometheus = prometheus_factory()
    out = tmp_path / "report"
    result = subprocess.run(
        [sys.executable, "-m", "gpufleet", "report", "--prometheus", prometheus.url,
         "--fleet-url", ledger.url, "--since", "1d", "--until", str(end), "--out", str(out)],
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    figures = json.loads((out / "figures.json").read_text())
    text = (out / "report.md").read_text()
    print(text)
    assert figures["chains_closed"] == 3
    assert figures["chain_success_rate"] == pytest.approx(2 / 3)
    assert figures["median_retry_interval_s"] == pytest.approx(450)  # of 60, 300, 600, 1200
    assert figures["median_downtime_auto_s"] == pytest.approx(900)  # of 120, 900, 1500
    assert figures["median_downtime_manual_s"] == pytest.approx(3600)
    assert figures["top3_share"] == pytest.approx(4 / 5)
    assert figures["pages"] == 3
    assert figures["pages_led_to_exclusion"] == 2
    assert figures["median_page_to_exclusion_s"] == pytest.approx(1200)  # of 600 and 1800
    assert figures["exclusions_unpaged"] == 3
    assert figures["unpaged_share"] == pytest.approx(3 / 5)
    assert "**retry chain success rate: 67%** (2 of 3 closed chains recovered" in text
    assert "median retry interval: 7.5 min" in text
    assert "median downtime: automatic 15.0 min, manual 60.0 min" in text
    assert "**2 led to an exclusion of their node**, a median 20.0 min after" in text
    assert "**3 of 5 exclusions (60%) had no page before them**" in text
    assert "| node-a | 2 | 40.0% | 40.0% | kubernetes 1, manual 1 |" in text
    assert "| slurm | 2 | 40% |" in text  # exclusions by source
    assert "| torchrun | 2 | 0 |" in text  # restarts by source: 2 auto, no manual
    store.close()


def test_the_report_reads_pages_and_their_links_from_the_database_file(tmp_path: Path) -> None:
    from gpufleet.fleet.incidents import Incident, IncidentStore
    from gpufleet.fleet.models import ExclusionIn
    from gpufleet.fleet.report import read_ledger

    store = LedgerStore(tmp_path / "fleet.db")
    t0 = 1_800_000_000.0
    IncidentStore(store).record(
        [Incident("00000000000000aa", t0, "GpuFleetGpuLost", "n1", "critical")]
    )
    excluded = store.exclude("key-0001", ExclusionIn(node="n1", reason="gpu_lost", at=t0 + 90))
    store.close()
    [incident] = read_ledger(str(tmp_path / "fleet.db"), None).incidents
    assert (incident["exclusion_id"], incident["exclusion_delay_s"]) == (excluded.body["id"], 90)
