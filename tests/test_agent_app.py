"""The agent's HTTP surface, through its real ASGI app (lifespan included)."""

from __future__ import annotations

import gzip
import time
from collections.abc import Iterator

import pytest
from fastapi.testclient import TestClient
from prometheus_client.parser import text_string_to_metric_families

from gpufleet.agent.app import Agent, AgentSettings
from gpufleet.gpu.fake import FakeNvml


@pytest.fixture
def client(fake_nvml: FakeNvml) -> Iterator[tuple[TestClient, Agent]]:
    agent = Agent(AgentSettings(node="node-a", gpu_interval=60), nvml=fake_nvml)
    agent.open()
    with TestClient(agent.asgi()) as test_client:
        assert agent.sampler is not None and agent.sampler.wait_first(5)
        yield test_client, agent


def sample_names(text: str) -> set[str]:
    return {s.name for f in text_string_to_metric_families(text) for s in f.samples}


def test_metrics_is_prometheus_text_with_gpu_and_self_metrics(
    client: tuple[TestClient, Agent],
) -> None:
    test_client, _ = client
    response = test_client.get("/metrics", headers={"Accept-Encoding": "identity"})
    assert response.status_code == 200
    assert response.headers["content-type"] == "text/plain; version=0.0.4; charset=utf-8"
    names = sample_names(response.text)
    assert {"DCGM_FI_DEV_SM_CLOCK", "gpufleet_gpu_up", "gpufleet_agent_info"} <= names
    assert {"gpufleet_collector_up", "gpufleet_scrape_duration_seconds_count"} <= names


def test_metrics_gzip_when_asked(client: tuple[TestClient, Agent]) -> None:
    test_client, _ = client
    plain = test_client.get("/metrics", headers={"Accept-Encoding": "identity"})
    raw = test_client.get("/metrics", headers={"Accept-Encoding": "gzip"}, extensions={})
    # httpx decodes gzip transparently: check the header and the decoded body.
    assert raw.headers["content-encoding"] == "gzip"
    assert sample_names(raw.text) == sample_names(plain.text)
    assert int(raw.headers["content-length"]) < len(plain.content) / 4


def test_gzip_body_is_one_valid_member(client: tuple[TestClient, Agent]) -> None:
    _, agent = client
    body = agent.metrics_endpoint().body(gzip=True)
    text = gzip.decompress(body).decode()
    assert "DCGM_FI_DEV_POWER_USAGE" in text and "gpufleet_agent_info" in text


def test_metrics_rejects_writes(client: tuple[TestClient, Agent]) -> None:
    test_client, _ = client
    response = test_client.post("/metrics")
    assert response.status_code == 405
    assert response.headers["allow"] == "GET, HEAD"


def test_health_and_readiness(client: tuple[TestClient, Agent]) -> None:
    test_client, _ = client
    assert test_client.get("/healthz").json() == {"status": "ok"}
    assert test_client.get("/readyz").json() == {"status": "ready"}
    assert "gpufleet agent" in test_client.get("/").text


def test_not_ready_until_the_first_snapshot(fake_nvml: FakeNvml) -> None:
    hang = fake_nvml.hang("nvmlDeviceGetClockInfo")
    agent = Agent(AgentSettings(node="node-a"), nvml=fake_nvml)
    agent.open()
    try:
        with TestClient(agent.asgi()) as test_client:
            assert hang.entered.wait(5)
            response = test_client.get("/readyz")
            assert response.status_code == 503
            assert "first GPU snapshot" in response.json()["status"]
            assert test_client.get("/healthz").status_code == 200
            assert test_client.get("/metrics").status_code == 200
            fake_nvml.unhang("nvmlDeviceGetClockInfo")
    finally:
        fake_nvml.unhang("nvmlDeviceGetClockInfo")


def test_gpu_source_none_serves_only_the_agent_itself() -> None:
    agent = Agent(AgentSettings(node="ingest-only", gpu_source="none"))
    agent.open()
    with TestClient(agent.asgi()) as test_client:
        assert test_client.get("/readyz").status_code == 200
        names = sample_names(test_client.get("/metrics").text)
    assert "gpufleet_agent_info" in names
    assert not any(name.startswith(("DCGM_", "gpufleet_gpu")) for name in names)


def test_agent_info_names_node_and_source(client: tuple[TestClient, Agent]) -> None:
    test_client, _ = client
    for family in text_string_to_metric_families(test_client.get("/metrics").text):
        if family.name == "gpufleet_agent_info":
            labels = family.samples[0].labels
            assert labels["node"] == "node-a" and labels["gpu_source"] == "nvml"
            return
    pytest.fail("gpufleet_agent_info missing")


def test_agent_serves_when_it_started_so_rules_see_a_restart() -> None:
    """The XID rule reads it: a restarted agent's counters count from this time."""
    before = time.time()
    agent = Agent(AgentSettings(node="restarted", gpu_source="none"))
    agent.open()  # makes the XID ledger and the self-collector that reports its start
    after = time.time()
    with TestClient(agent.asgi()) as test_client:
        first = test_client.get("/metrics").text
        second = test_client.get("/metrics").text
    values = [
        sample.value
        for text in (first, second)
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == "gpufleet_agent_start_time_seconds"
    ]
    assert len(values) == 2 and values[0] == values[1]  # fixed, not the scrape's time
    assert before <= values[0] <= after
