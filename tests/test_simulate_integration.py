"""The simulator with real Prometheus: live file_sd targets, and a backfilled history
whose metrics agree with its ground truth."""

from __future__ import annotations

import json
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from gpufleet.lab.devstack import PrometheusServer, file_sd_scrape_config
from gpufleet.lab.processes import backfill, wait_until
from gpufleet.simulate.cluster import Cluster
from gpufleet.simulate.config import load_scenario
from gpufleet.simulate.history import write_history
from gpufleet.simulate.serve import SimulatorServer

pytestmark = pytest.mark.integration


def value(result: list[dict[str, Any]]) -> float:
    assert len(result) == 1, result
    return float(result[0]["value"][1])


def test_prometheus_scrapes_64_virtual_nodes_and_sees_a_killed_one_down(
    tmp_path: Path,
    serve_asgi: Callable[..., Any],
    prometheus_factory: Callable[..., PrometheusServer],
) -> None:
    scenario = load_scenario("healthy").with_cluster(nodes=64)
    cluster = Cluster(scenario, 1, time.time(), 86400.0)
    simulator = SimulatorServer(cluster, tick_s=0.5)
    simulator.start()
    try:
        server = serve_asgi(simulator)
        targets = tmp_path / "targets.json"
        simulator.write_targets(targets, f"127.0.0.1:{server.port}")
        prometheus = prometheus_factory(
            scrape_configs=[file_sd_scrape_config("gpufleet-agent", targets)]
        )
        prometheus.wait_for_targets_up(64, timeout=90)
        assert value(prometheus.query("count(DCGM_FI_DEV_GPU_TEMP)")) == 512
        instances = {s["metric"]["instance"] for s in prometheus.query("up")}
        assert instances == set(cluster.node_names)
        hostnames = prometheus.query("count by (instance, Hostname) (gpufleet_gpu_up)")
        assert all(s["metric"]["instance"] == s["metric"]["Hostname"] for s in hostnames)
        prometheus.wait_for_series("gpufleet_training_steps_total", count=64)

        request = urllib.request.Request(f"{server.url}/control/nodes/node-017/down", method="POST")
        urllib.request.urlopen(request, timeout=5).read()
        wait_until(
            lambda: prometheus.query('up{instance="node-017"} == 0'), 30, what="node-017 down"
        )
        assert value(prometheus.query("count(up == 1)")) == 63
    finally:
        simulator.stop()


def test_history_backfills_and_agrees_with_its_ground_truth(
    tmp_path: Path, prometheus_factory: Callable[..., PrometheusServer]
) -> None:
    scenario_file = tmp_path / "two-faults.yaml"
    scenario_file.write_text(
        """
name: two-faults
cluster: {nodes: 16}
rates: {fail_stop_per_1000_node_days: 0, fail_slow_compute_per_node_day: 0,
        fail_slow_comm_per_node_day: 0}
confounders: {cluster_slowdowns_per_day: 0}
episodes:
  - {kind: fail_slow_compute, node: 5, gpu: 3, start: 20m, duration: 30m, magnitude: 1.25}
  - {kind: fail_stop, cause: gpu_fell_off_bus, node: 9, gpu: 2, start: 70m, duration: 4h}
"""
    )
    end = float(int(time.time()) // 60 * 60)
    history = tmp_path / "history"
    result = write_history(load_scenario(str(scenario_file)), 3, 2 / 24, history, end=end)
    tsdb = tmp_path / "tsdb"
    backfill(result.files, tsdb)
    server = prometheus_factory(storage_path=tsdb, extra_args=["--storage.tsdb.retention.time=30d"])

    truth = json.loads(result.ground_truth.read_text())
    off_bus = next(e for e in truth["episodes"] if e["kind"] == "fail_stop")
    slow = next(e for e in truth["episodes"] if e["kind"] == "fail_slow_compute")
    assert (off_bus["node"], off_bus["gpu"], off_bus["xid"]) == ("node-009", 2, 79)
    assert off_bus["expected_alerts"] == [
        "GpuFleetCriticalXid",
        "GpuFleetGpuLost",
        "GpuFleetGpuMissing",
    ]

    gpu = 'gpufleet_gpu_up{instance="node-009",gpu="2"}'
    assert value(server.api("query", query=gpu, time=str(off_bus["start"] - 60))["result"]) == 1
    assert value(server.api("query", query=gpu, time=str(off_bus["start"] + 90))["result"]) == 0
    xid = 'gpufleet_gpu_xid_errors_total{instance="node-009",gpu="2",xid="79"}'
    assert value(server.api("query", query=xid, time=str(off_bus["start"] + 90))["result"]) == 1
    seen = 'gpufleet_gpus_seen{instance="node-009"}'
    assert value(server.api("query", query=seen, time=str(off_bus["start"] + 90))["result"]) == 7

    during = str(slow["start"] + 15 * 60)
    ratio = server.api(
        "query",
        query=(
            "rate(gpufleet_training_slowest_rank_compute_seconds_total[5m])"
            " / rate(gpufleet_training_slowest_rank_steps_total[5m])"
        ),
        time=during,
    )["result"]
    by_node = {s["metric"]["node"]: float(s["value"][1]) for s in ratio}
    peers = sorted(v for node, v in by_node.items() if node != "node-005" and node < "node-008")
    assert by_node["node-005"] / peers[len(peers) // 2] == pytest.approx(1.25, abs=0.04)
    exclusions = [x for x in truth["exclusions"] if x["node"] == "node-009"]
    assert len(exclusions) == 1 and exclusions[0]["reason"] == "gpu_fell_off_bus"
    assert [a["trigger"] for a in truth["attempts"]] in (
        ["initial", "auto"],
        ["initial", "auto", "manual"],
    )


def test_simulate_command_writes_history_and_lists_scenarios(tmp_path: Path) -> None:
    listed = subprocess.run(
        [sys.executable, "-m", "gpufleet", "simulate", "--list-scenarios"],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    assert "single-straggler" in listed.stdout and "checkpoint-storm" in listed.stdout
    written = subprocess.run(
        [sys.executable, "-m", "gpufleet", "simulate", "--scenario", "healthy", "--nodes", "4",
         "--history", "0.05", "--out", str(tmp_path), "--end", "1800000000"],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    assert "samples of 4 nodes" in written.stdout
    assert (tmp_path / "ground_truth.json").exists() and (tmp_path / "history-00.om").exists()
    bad = subprocess.run(
        [sys.executable, "-m", "gpufleet", "simulate", "--scenario", "nope"],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert bad.returncode == 2 and "no scenario named 'nope'; bundled:" in bad.stderr
    assert "Traceback" not in bad.stderr
