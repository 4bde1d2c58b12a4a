"""End to end: simulated nodes -> real Prometheus evaluating gpufleet's rules -> real
Alertmanager -> webhook. A straggler and an XID 79 (with the lost GPU) page for the right
nodes; nothing else.

Beside it, the sharded path of docs/SCALING.md: two Prometheus shards, each scraping
half of the nodes and evaluating the per-GPU rules (gpu.rules.yaml), remote-write into
VictoriaMetrics, where vmalert evaluates every rule that must see a whole job. The
shards and vmalert together must fire exactly what the single Prometheus fires.

The rules are generated from the same code as alerts/*.rules.yaml with shorter windows
and ``for`` durations (seconds instead of minutes), so the test takes two minutes.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from gpufleet.lab.devstack import (
    AlertmanagerServer,
    PrometheusServer,
    VictoriaMetricsServer,
    VmalertServer,
    file_sd_scrape_config,
)
from gpufleet.lab.processes import wait_until
from gpufleet.rules.config import RulesConfig
from gpufleet.rules.inline import inlined_alerts
from gpufleet.rules.sharding import (
    is_shard_local,
    remote_write_relabel_configs,
    shard_relabel_configs,
)
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
    gpu_long_window_interval="1s",
    slow_recording_interval="1s",
    dashboard_interval="1s",
    training_interval="1s",
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
    paged_alertmanager: AlertmanagerServer,
    rule_files: Callable[[RulesConfig], list[str]],
    webhook_receiver: Any,
) -> None:
    rules = rule_files(FAST)
    shard_rules = [p for p in rules if is_shard_local(Path(p).name)]
    global_rules = [p for p in rules if p not in shard_rules]
    assert shard_rules and global_rules
    simulator, targets = start_simulated_cluster(tmp_path, serve_asgi)
    victoria = VictoriaMetricsServer(tmp_path / "vm").start()
    vmalert: VmalertServer | None = None
    shards: list[PrometheusServer] = []
    try:
        manager = paged_alertmanager
        silent_manager = alertmanager_factory()  # the sharded path is compared, not paged
        scrape = file_sd_scrape_config("gpufleet-agent", targets)
        prometheus = prometheus_factory(
            scrape_configs=[scrape], rule_files=rules, alertmanager_urls=[manager.url]
        )
        shards += [
            prometheus_factory(
                scrape_configs=[
                    {**scrape, "relabel_configs": shard_relabel_configs(index, 2, "instance")}
                ],
                rule_files=shard_rules,
                alertmanager_urls=[silent_manager.url],
                remote_write_urls=[f"{victoria.url}/api/v1/write"],
                remote_write_relabel=remote_write_relabel_configs(FAST),
            )
            for index in range(2)
        ]
        vmalert = VmalertServer(
            tmp_path / "vmalert", global_rules, victoria.url, silent_manager.url
        ).start()
        prometheus.wait_for_targets_up(16, timeout=60)

        def shards_split_the_nodes() -> bool:
            up = [[t for t in shard.active_targets() if t["health"] == "up"] for shard in shards]
            return sum(map(len, up)) == 16 and min(map(len, up)) > 0

        wait_until(shards_split_the_nodes, 60, interval=0.5, what="16 nodes over 2 shards")

        seen: dict[str, set[tuple[str, str]]] = {"prometheus": set(), "sharded": set()}

        def both_fired() -> bool:
            seen["prometheus"] |= {alert_key(a) for a in prometheus.firing_alerts()}
            assert vmalert is not None
            engines: list[PrometheusServer | VmalertServer] = [*shards, vmalert]
            for engine in engines:
                seen["sharded"] |= {alert_key(a) for a in engine.firing_alerts()}
            return seen["prometheus"] >= EXPECTED and seen["sharded"] >= EXPECTED

        def paged() -> set[tuple[str, str]]:
            return {alert_key(alert) for alert in webhook_receiver.alerts()}

        wait_until(both_fired, 180, interval=1.0, what=f"{EXPECTED} in both engines")
        webhook_receiver.wait_for_alerts(lambda _: paged() >= EXPECTED, timeout=30)
        time.sleep(10)  # anything else about to page has had the time to
        both_fired()
        assert paged() == EXPECTED
        assert seen["prometheus"] == seen["sharded"] == EXPECTED

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
        # The shards before their remote-write target: a shard whose VictoriaMetrics is
        # gone waits out its stop timeout flushing the queue (10 s each on Prometheus 3).
        for shard in shards:
            shard.stop()
        victoria.stop()
        simulator.stop()
