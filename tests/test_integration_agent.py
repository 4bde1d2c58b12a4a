"""A real Prometheus scrapes the agent and finds the DCGM series through its HTTP API."""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from gpufleet.agent.app import Agent, AgentSettings
from gpufleet.gpu.fake import FakeNvml
from gpufleet.lab.devstack import AlertmanagerServer, PrometheusServer, static_scrape_config
from gpufleet.lab.processes import ManagedProcess, free_port, http_json, wait_until

pytestmark = pytest.mark.integration


def by_gpu(result: list[dict[str, Any]]) -> dict[str, float]:
    return {series["metric"]["gpu"]: float(series["value"][1]) for series in result}


def test_prometheus_sees_dcgm_series_xids_and_a_lost_gpu(
    fake_nvml: FakeNvml,
    fixture_data: dict[str, Any],
    serve_asgi: Callable[..., Any],
    prometheus_factory: Callable[..., PrometheusServer],
) -> None:
    agent = Agent(AgentSettings(node="gpu-node-01", gpu_interval=0.5), nvml=fake_nvml)
    agent.open()
    server = serve_asgi(agent.asgi())
    target = f"127.0.0.1:{server.port}"
    prometheus = prometheus_factory(
        scrape_configs=[static_scrape_config("gpufleet-agent", [target])]
    )
    prometheus.wait_for_targets_up(1)

    temps = prometheus.wait_for_series("DCGM_FI_DEV_GPU_TEMP", count=8)
    labels = temps[0]["metric"]
    assert {"gpu", "UUID", "pci_bus_id", "device", "modelName", "Hostname"} <= set(labels)
    assert labels["Hostname"] == "gpu-node-01" and labels["job"] == "gpufleet-agent"
    uuids = {d["nvmlDeviceGetUUID"] for d in fixture_data["devices"]}
    assert {series["metric"]["UUID"] for series in temps} == uuids

    # Counters keep dcgm-exporter's bare names in Prometheus.
    energy = prometheus.query("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION")
    assert len(energy) == 8
    assert prometheus.query("DCGM_FI_DEV_RETIRED_SBE") == []  # unsupported on H100: absent

    fake_nvml.inject_xid(2, 79)
    xids = prometheus.wait_for_series('gpufleet_gpu_xid_errors_total{xid="79"}')
    assert xids[0]["metric"]["gpu"] == "2" and float(xids[0]["value"][1]) == 1

    fake_nvml.lose_gpu(2)
    wait_until(
        lambda: by_gpu(prometheus.query("gpufleet_gpu_up")).get("2") == 0,
        30,
        what="gpu 2 down in Prometheus",
    )
    up = by_gpu(prometheus.query("gpufleet_gpu_up"))
    assert sum(up.values()) == 7
    seen = prometheus.query("gpufleet_gpus_seen")
    assert float(seen[0]["value"][1]) == 7
    assert prometheus.query('gpufleet_collector_up{collector="gpu"}')[0]["value"][1] == "1"


def test_agent_command_configured_by_environment_is_scraped(
    tmp_path: Path, prometheus_factory: Callable[..., PrometheusServer]
) -> None:
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUFLEET_")}
    env.update(
        GPUFLEET_LISTEN=f"127.0.0.1:{port}",
        GPUFLEET_GPU_SOURCE="synthetic",
        GPUFLEET_GPU_INTERVAL="1",
        GPUFLEET_NODE="env-node",
    )
    process = ManagedProcess(
        [sys.executable, "-m", "gpufleet", "agent"], tmp_path / "agent.log", env
    )
    process.start()
    try:
        prometheus = prometheus_factory(
            scrape_configs=[static_scrape_config("gpufleet-agent", [f"127.0.0.1:{port}"])]
        )
        prometheus.wait_for_targets_up(1)
        power = prometheus.wait_for_series('DCGM_FI_DEV_POWER_USAGE{Hostname="env-node"}', count=8)
        assert all(50 < float(series["value"][1]) < 700 for series in power)
        info = prometheus.query("gpufleet_agent_info")
        assert info[0]["metric"]["gpu_source"] == "synthetic"
    finally:
        process.stop()
    # uvicorn shuts down gracefully on SIGTERM, then re-raises it as its exit status.
    assert process.process is not None and process.process.returncode in (0, -15)
    assert "Application shutdown complete" in process.log_tail()


def test_alertmanager_fixture_delivers_to_the_webhook_receiver(
    alertmanager_factory: Callable[..., AlertmanagerServer], webhook_receiver: Any
) -> None:
    manager = alertmanager_factory(webhook_url=webhook_receiver.url)
    http_json(
        f"{manager.url}/api/v2/alerts",
        [
            {"labels": {"alertname": "FixtureInfo", "node": "n2", "severity": "info"}},
            {"labels": {"alertname": "FixtureCheck", "node": "n1", "severity": "critical"}},
        ],
    )
    alerts = webhook_receiver.wait_for_alerts(lambda alerts: len(alerts) >= 1, timeout=30)
    assert [alert["labels"]["alertname"] for alert in alerts] == ["FixtureCheck"]
    assert {alert["labels"]["node"] for alert in manager.alerts()} == {"n1", "n2"}
    time.sleep(2)  # info alerts reach Alertmanager but never page
    assert [alert["labels"]["alertname"] for alert in webhook_receiver.alerts()] == ["FixtureCheck"]
