"""The sampler thread: /metrics never waits on NVML, and a hung call becomes visible."""

from __future__ import annotations

import time

from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families

from gpufleet.agent.app import Agent, AgentSettings
from gpufleet.gpu.fake import FakeNvml
from gpufleet.lab.processes import wait_until


def values(agent: Agent, name: str) -> dict[str, float]:
    body = agent.metrics_endpoint().body(gzip=False).decode()
    found = {}
    for family in text_string_to_metric_families(body):
        for sample in family.samples:
            if sample.name == name:
                found[sample.labels.get("gpu", sample.labels.get("call", ""))] = sample.value
    return found


def make_agent(nvml: FakeNvml, **settings: float) -> Agent:
    agent = Agent(
        AgentSettings(node="node-a", gpu_source="nvml", **settings),  # type: ignore[arg-type]
        nvml=nvml,
    )
    agent.open()
    return agent


def test_scrapes_never_call_nvml(fake_nvml: FakeNvml) -> None:
    agent = make_agent(fake_nvml, gpu_interval=60)
    agent.start()
    try:
        assert agent.sampler is not None and agent.sampler.wait_first(5)
        endpoint = agent.metrics_endpoint()
        before = sum(fake_nvml.calls.values())
        for _ in range(50):
            assert b"DCGM_FI_DEV_GPU_TEMP" in endpoint.body(gzip=False)
        assert sum(fake_nvml.calls.values()) == before
    finally:
        agent.stop()


def test_hung_nvml_call_is_counted_once_then_values_go_stale_then_recover(
    fake_nvml: FakeNvml,
) -> None:
    agent = make_agent(fake_nvml, gpu_interval=0.2, nvml_call_timeout=0.5, stale_after=1.5)
    agent.start()
    try:
        assert agent.sampler is not None and agent.sampler.wait_first(5)
        assert values(agent, "gpufleet_collector_up") == {"": 1.0}
        hang = fake_nvml.hang("nvmlDeviceGetPowerUsage")
        assert hang.entered.wait(5)

        # While NVML hangs, a scrape still answers at once from the last snapshot.
        started = time.monotonic()
        assert len(values(agent, "DCGM_FI_DEV_GPU_TEMP")) == 8
        assert time.monotonic() - started < 1.0

        wait_until(
            lambda: values(agent, "gpufleet_collector_hung") == {"": 1.0}, 5, what="hang flagged"
        )
        wait_until(
            lambda: values(agent, "gpufleet_collector_up") == {"": 0.0}, 5, what="snapshot stale"
        )
        assert values(agent, "DCGM_FI_DEV_GPU_TEMP") == {}
        assert set(values(agent, "gpufleet_gpu_up").values()) == {0.0}
        errors = values(agent, "gpufleet_collector_errors_total")
        assert errors == {"nvmlDeviceGetPowerUsage": 1.0}  # once per hang, not per tick

        fake_nvml.unhang("nvmlDeviceGetPowerUsage")
        wait_until(lambda: values(agent, "gpufleet_collector_up") == {"": 1.0}, 5, what="recovery")
        assert len(values(agent, "DCGM_FI_DEV_GPU_TEMP")) == 8
        assert values(agent, "gpufleet_collector_hung") == {"": 0.0}
    finally:
        fake_nvml.unhang("nvmlDeviceGetPowerUsage")
        agent.stop()


def test_renders_once_per_snapshot_not_per_scrape(fake_nvml: FakeNvml) -> None:
    agent = make_agent(fake_nvml, gpu_interval=60)
    agent.start()
    try:
        assert agent.sampler is not None and agent.sampler.wait_first(5)
        endpoint = agent.metrics_endpoint()
        for _ in range(20):
            endpoint.body(gzip=True)
        assert agent._cache is not None and agent._cache.renders == 1
        assert agent.xids is not None
        agent.xids.record(agent.reader.handles[0][1].uuid, 31, time.time())  # type: ignore[union-attr]
        endpoint.body(gzip=False)
        assert agent._cache.renders == 2
    finally:
        agent.stop()


def test_isolated_registry_per_agent(fake_nvml: FakeNvml) -> None:
    agent = make_agent(fake_nvml)
    assert isinstance(agent.registry, CollectorRegistry)
    from prometheus_client import REGISTRY

    assert agent.registry is not REGISTRY


def test_remap_series_return_to_metrics_when_mig_ends_without_an_agent_restart(
    fake_nvml: FakeNvml,
) -> None:
    fake_nvml.set_mig_mode(5, True)  # NVML refuses the remapped-rows query under MIG
    agent = make_agent(fake_nvml, gpu_interval=0.2)
    agent.start()
    try:
        assert agent.sampler is not None and agent.sampler.wait_first(5)
        # a bare DCGM counter's samples, as prometheus-client's parser names them
        remaps = "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS_total"
        assert "5" not in values(agent, remaps)  # omitted, never 0
        assert len(values(agent, remaps)) == 7
        fake_nvml.set_mig_mode(5, False)
        wait_until(lambda: "5" in values(agent, remaps), 10, what="GPU 5's remaps back")
        assert values(agent, remaps)["5"] == 2  # the fixture's two remapped rows
    finally:
        agent.stop()
