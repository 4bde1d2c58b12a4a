"""End to end: simulated nodes -> real Prometheus evaluating gpufleet's rules -> real
Alertmanager -> webhook. A straggler and an XID 79 page for the right nodes; nothing else.

The rules are generated from the same code as alerts/*.rules.yaml with shorter windows
and ``for`` durations (seconds instead of minutes), so the test takes two minutes.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from gpufleet.devstack import (
    AlertmanagerServer,
    PrometheusServer,
    VictoriaMetricsServer,
    VmalertServer,
    wait_until,
)
from gpufleet.rules.__main__ import write_all
from gpufleet.rules.config import RulesConfig
from gpufleet.rules.inline import inlined_alerts
from gpufleet.simulate.cluster import Cluster
from gpufleet.simulate.config import load_scenario
from gpufleet.simulate.serve import SimulatorServer

pytestmark = pytest.mark.integration

SCENARIO = """
name: straggler-and-xid79
cluster: {nodes: 16}
rates: {fail_stop_per_1000_node_days: 0, fail_slow_compute_per_node_day: 0,
        fail_slow_comm_per_node_day: 0}
confounders: {cluster_slowdowns_per_day: 0, checkpoints: false, evals: false}
episodes:
  - {kind: fail_slow_compute, node: 5, gpu: 3, start: 0s, duration: 30m, magnitude: 1.3}
  - {kind: fail_stop, cause: gpu_fell_off_bus, node: 9, gpu: 2, start: 75s, duration: 4h}
"""
FAST = RulesConfig(
    gpu_recording_interval="1s",
    rate_window="20s",
    straggler_for="10s",
    gpu_lost_for="5s",
    gpu_missing_for="10s",
    xid_window="2m",
)
EXPECTED = {
    ("GpuFleetStragglerNode", "node-005"),
    ("GpuFleetCriticalXid", "node-009"),
    ("GpuFleetGpuLost", "node-009"),
}


def start_simulated_cluster(
    tmp_path: Path, serve_asgi: Callable[..., Any]
) -> tuple[SimulatorServer, Path]:
    scenario = tmp_path / "scenario.yaml"
    scenario.write_text(SCENARIO)
    cluster = Cluster(load_scenario(str(scenario)), 0, time.time(), 86400.0)
    simulator = SimulatorServer(cluster, tick_s=0.5)
    simulator.start()
    server = serve_asgi(simulator)
    targets = tmp_path / "targets.json"
    simulator.write_targets(targets, f"127.0.0.1:{server.port}")
    return simulator, targets


def alert_key(alert: dict[str, Any]) -> tuple[str, str]:
    labels = alert["labels"]
    return labels["alertname"], labels.get("node", "-")


def by_name(alerts: list[dict[str, Any]], name: str) -> dict[str, Any]:
    return next(alert for alert in alerts if alert["labels"]["alertname"] == name)


def test_a_straggler_and_an_xid_79_page_for_the_right_nodes_and_nothing_else(
    tmp_path: Path,
    serve_asgi: Callable[..., Any],
    prometheus_factory: Callable[..., PrometheusServer],
    alertmanager_factory: Callable[..., AlertmanagerServer],
    webhook_receiver: Any,
) -> None:
    """Also the scale-out path: Prometheus remote-writes into VictoriaMetrics, where
    vmalert evaluates the very same rule files; both must fire the same alerts."""
    rules = [str(path) for path in write_all(tmp_path / "rules", FAST)]
    simulator, targets = start_simulated_cluster(tmp_path, serve_asgi)
    victoria = VictoriaMetricsServer(tmp_path / "vm").start()
    vmalert: VmalertServer | None = None
    try:
        manager = alertmanager_factory(webhook_url=webhook_receiver.url)
        silent_manager = alertmanager_factory()  # vmalert's notifications are compared, not paged
        prometheus = prometheus_factory(
            scrape_configs=[
                {
                    "job_name": "gpufleet-agent",
                    "file_sd_configs": [{"files": [str(targets)], "refresh_interval": "1s"}],
                }
            ],
            rule_files=rules,
            alertmanager_urls=[manager.url],
            remote_write_urls=[f"{victoria.url}/api/v1/write"],
        )
        vmalert = VmalertServer(
            tmp_path / "vmalert", rules, victoria.url, silent_manager.url
        ).start()
        prometheus.wait_for_targets_up(16, timeout=60)

        seen: dict[str, set[tuple[str, str]]] = {"prometheus": set(), "vmalert": set()}

        def both_fired() -> bool:
            seen["prometheus"] |= {alert_key(a) for a in prometheus.firing_alerts()}
            assert vmalert is not None
            seen["vmalert"] |= {alert_key(a) for a in vmalert.firing_alerts()}
            return seen["prometheus"] >= EXPECTED and seen["vmalert"] >= EXPECTED

        def paged() -> set[tuple[str, str]]:
            return {alert_key(alert) for alert in webhook_receiver.alerts()}

        wait_until(both_fired, 180, interval=1.0, what=f"{EXPECTED} in both engines")
        webhook_receiver.wait_for_alerts(lambda _: paged() >= EXPECTED, timeout=30)
        time.sleep(10)  # anything else about to page has had the time to
        both_fired()
        assert paged() == EXPECTED
        assert seen["prometheus"] == seen["vmalert"] == EXPECTED

        alerts = webhook_receiver.alerts()
        for alert in alerts:
            assert alert["labels"]["severity"] in ("critical", "warning")
            runbook = alert["annotations"]["runbook_url"]
            assert runbook.endswith(alert["labels"]["alertname"].lower())
        straggler = by_name(alerts, "GpuFleetStragglerNode")
        assert (straggler["labels"]["pp_stage"], straggler["labels"]["training_job"]) == (
            "1",
            "sim-llm",
        )
        xid = by_name(alerts, "GpuFleetCriticalXid")
        assert (xid["labels"]["xid"], xid["labels"]["gpu"]) == ("79", "2")
        # one notification per node: the XID and the lost GPU of node-009 arrive together
        groups = {note["groupLabels"].get("node") for note in webhook_receiver.notifications}
        assert groups == {"node-005", "node-009"}

        # The same alerts with every recording rule inlined, over the raw series only
        # (how the detection benchmark evaluates a backfilled history), find the same nodes.
        inlined = {alert.name: alert for alert in inlined_alerts([Path(p) for p in rules])}
        now = time.time()
        for name, node in EXPECTED:
            found = prometheus.query_range(inlined[name].expr, now - 150, now, 1.0)
            assert node in {series["metric"].get("node") for series in found}, name
    finally:
        if vmalert is not None:
            vmalert.stop()
        victoria.stop()
        simulator.stop()
