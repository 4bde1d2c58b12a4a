"""NVML's NVLink fabric deciding the tensor-parallel check, end to end: four agents
(their NVML the fake, from fixtures: two hosts in one fabric clique, one host in another,
one without a fabric), each sent its ranks' layout over ``POST /v1/layout``, a real
Prometheus scraping them with ``alerts/layout.rules.yaml`` as shipped."""

from __future__ import annotations

import copy
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

from gpufleet.agent.app import Agent, AgentSettings
from gpufleet.gpu.fake import FakeNvml
from gpufleet.gpu.fixture import bundled_fixture
from gpufleet.lab.devstack import PrometheusServer, static_scrape_config
from gpufleet.lab.processes import free_port, http_get, wait_until

pytestmark = [pytest.mark.integration, pytest.mark.prometheus("2", "3")]

REPO = Path(__file__).resolve().parents[1]
CLUSTER = "5d0c7a3e-91b4-4f2a-8e6d-2b7f1c9a4e10"  # the B200 fixture's fabric
DOMAINS = "group:gpufleet_training_parallel_domains:count"

# job -> the nodes of its one tp group's two ranks
JOBS = {
    "one-rack": ("rack1-a", "rack1-b"),  # two hosts, one clique: tp is meant to run so
    "two-racks": ("rack1-a", "rack2-a"),  # two cliques
    "no-fabric": ("rack1-b", "hgx-h100"),  # a node without a fabric: nodes are counted
}


def nvml_of(node: str) -> FakeNvml:
    if node == "hgx-h100":
        return FakeNvml(bundled_fixture())  # NOT_SUPPORTED: no fabric
    fixture = copy.deepcopy(bundled_fixture("b200-8gpu"))
    clique = 32766 if node.startswith("rack1") else 7
    for device in fixture["devices"]:
        device["nvmlDeviceGetGpuFabricInfoV"]["cliqueId"] = clique
    return FakeNvml(fixture)


def layout(job: str, rank: int) -> dict[str, Any]:
    group = {"group": "tp", "size": 2, "group_rank": rank, "group_first_rank": 0}
    return {"training_job": job, "rank": rank, "attempt": 0, "groups": [group]}


def test_nvmls_cliques_decide_where_every_node_has_one(
    tmp_path: Path, prometheus_major: str, serve_agent: Callable[[Agent], Any]
) -> None:
    nodes = sorted({node for pair in JOBS.values() for node in pair})
    urls = {}
    for node in nodes:
        settings = AgentSettings(
            node=node,
            host="127.0.0.1",
            port=free_port(),
            gpu_interval=1,
            allow_unauthenticated_ingest=True,
        )
        agent = Agent(settings, nvml=nvml_of(node))
        agent.open()
        urls[node] = serve_agent(agent).url
        assert agent.sampler is not None and agent.sampler.wait_first(10)
    for job, pair in JOBS.items():
        for rank, node in enumerate(pair):
            answer = httpx.post(f"{urls[node]}/v1/layout", json={"events": [layout(job, rank)]})
            assert answer.status_code == 202, answer.text
    metrics = http_get(f"{urls['rack1-a']}/metrics").decode()
    assert f'cluster_uuid="{CLUSTER}",clique_id="32766",state="completed"' in metrics
    prometheus = PrometheusServer(
        tmp_path / "prometheus",
        scrape_configs=[
            static_scrape_config(
                "gpufleet-agent", [url.removeprefix("http://") for url in urls.values()]
            )
        ],
        rule_files=[str(REPO / "alerts" / "layout.rules.yaml")],
    )
    prometheus.start()
    try:
        prometheus.wait_for_targets_up(len(nodes))

        def domains() -> dict[str, float] | None:
            found = {
                series["metric"]["training_job"]: float(series["value"][1])
                for series in prometheus.query(f'{DOMAINS}{{group="tp"}}')
            }
            cliques = prometheus.query("node:gpufleet_gpu_fabric_domain:info")
            # until every node's series were scraped and evaluated (in a loaded make test
            # the no-fabric job first counted one node's domain, then both)
            complete = len(found) == len(JOBS) and len(cliques) == 3
            return found if complete and found == expected else None

        expected = {"one-rack": 1.0, "two-racks": 2.0, "no-fabric": 2.0}
        counted = wait_until(domains, 60, 0.5, what=f"tp domains {expected} and 3 cliques")
        assert counted == expected
        cliques = {
            series["metric"]["node"]: series["metric"]["nvlink_domain"]
            for series in prometheus.query("node:gpufleet_gpu_fabric_domain:info")
        }
        assert cliques == {
            "rack1-a": f"{CLUSTER}/32766",
            "rack1-b": f"{CLUSTER}/32766",
            "rack2-a": f"{CLUSTER}/7",
        }
        nodes_of = {
            series["metric"]["training_job"]: float(series["value"][1])
            for series in prometheus.query("group:gpufleet_training_parallel_nodes:count")
        }
        assert nodes_of["one-rack"] == 2.0  # two hosts all the same
    finally:
        prometheus.stop()
