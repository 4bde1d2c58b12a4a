"""Parallel layouts: the client's sources (sizes by hand, a DeviceMesh), what it sends
once per attempt, and what the agent accepts and exports."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from prometheus_client.parser import text_string_to_metric_families

from gpufleet.agent.app import Agent, AgentSettings
from gpufleet.agent.limits import IngestLimits
from gpufleet.client import Reporter
from gpufleet.lab.processes import wait_until
from gpufleet.reporter.layout import (
    ParallelGroup,
    from_sizes,
    group_name,
    sizes_from_environment,
)
from gpufleet.rules.build import as_document, rule_files
from gpufleet.rules.config import ConfigError, RulesConfig, config_from_mapping

SIZE = "gpufleet_training_parallel_group_size"


def groups(rank: int, world: int, **sizes: int) -> dict[str, tuple[int, int, int]]:
    layout = from_sizes(rank, world, sizes)
    assert layout is not None
    return {g.group: (g.size, g.group_rank, g.group_first_rank) for g in layout.groups}


def test_sizes_by_hand_order_ranks_as_megatron_does() -> None:
    # tp=2, pp=2 on 8 ranks: tp adjacent ranks, dp what is left (2), pp furthest apart
    assert groups(0, 8, tp=2, pp=2) == {"tp": (2, 0, 0), "dp": (2, 0, 0), "pp": (2, 0, 0)}
    assert groups(3, 8, tp=2, pp=2) == {"tp": (2, 1, 2), "dp": (2, 1, 1), "pp": (2, 0, 3)}
    assert groups(6, 8, tp=2, pp=2) == {"tp": (2, 0, 6), "dp": (2, 1, 4), "pp": (2, 1, 2)}
    assert groups(5, 8, tp=2, cp=2) == {"tp": (2, 1, 4), "cp": (2, 0, 5), "dp": (2, 1, 1)}


def test_sizes_that_do_not_make_the_world_report_nothing(caplog: pytest.LogCaptureFixture) -> None:
    assert from_sizes(0, 6, {"tp": 4}) is None
    assert from_sizes(0, 8, {"tp": 2, "dp": 2}) is None  # 2 x 2 is not 8
    assert "do not make a world of 8 ranks" in caplog.text
    assert from_sizes(0, 8, {}) is None


@pytest.mark.parametrize(
    ("name", "kind"),
    [
        ("tp", "tp"),
        ("tensor_parallel", "tp"),  # Lightning's ModelParallelStrategy
        ("data_parallel", "dp"),
        ("Pipeline-Parallel", "pp"),
        ("dp_shard", "dp_shard"),  # torchtitan's, kept as named
        ("a name far too long for a label", None),
        ("0", None),
    ],
)
def test_mesh_dimension_names_as_group_kinds(name: str, kind: str | None) -> None:
    assert group_name(name) == kind


def test_sizes_from_the_environment() -> None:
    environ = {"GPUFLEET_TP_SIZE": "8", "GPUFLEET_PP_SIZE": " 4 ", "GPUFLEET_DP_SIZE": "x"}
    assert sizes_from_environment(environ) == {"tp": 8, "pp": 4}


# -- the agent -----------------------------------------------------------------------


@pytest.fixture
def node() -> Iterator[TestClient]:
    agent = Agent(
        AgentSettings(node="node-a", gpu_source="none", limits=IngestLimits(max_ranks_per_stage=4))
    )
    agent.open()
    with TestClient(agent.asgi(), client=("127.0.0.1", 50000)) as client:
        yield client


def layout(rank: int, attempt: int = 0, **extra: Any) -> dict[str, Any]:
    event: dict[str, Any] = {
        "training_job": "llm",
        "rank": rank,
        "attempt": attempt,
        "groups": [
            {"group": "tp", "size": 2, "group_rank": rank % 2, "group_first_rank": rank - rank % 2},
            {"group": "dp", "size": 2, "group_rank": rank // 2, "group_first_rank": rank % 2},
        ],
    }
    event.update(extra)
    return event


def sizes(client: TestClient) -> dict[tuple[str, ...], float]:
    text = client.get("/metrics").text
    return {
        (s.labels["rank"], s.labels["attempt"], s.labels["group"], s.labels["group_first_rank"],
         s.labels["group_rank"], s.labels.get("nvlink_domain", "")): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name == SIZE and s.labels["node"] == "node-a"
    }  # fmt: skip


def test_the_agent_exports_one_series_per_rank_and_group(node: TestClient) -> None:
    answer = node.post("/v1/layout", json={"events": [layout(0), layout(1, nvlink_domain="nvl-a")]})
    assert answer.status_code == 202, answer.text
    assert sizes(node) == {
        ("0", "0", "tp", "0", "0", ""): 2,
        ("0", "0", "dp", "0", "0", ""): 2,
        ("1", "0", "tp", "0", "1", "nvl-a"): 2,
        ("1", "0", "dp", "1", "0", "nvl-a"): 2,
    }


def test_a_later_attempt_replaces_the_layout_and_a_late_earlier_one_is_ignored(
    node: TestClient,
) -> None:
    node.post("/v1/layout", json={"events": [layout(0), layout(1)]})
    node.post("/v1/layout", json={"events": [layout(2, attempt=1)]})
    node.post("/v1/layout", json={"events": [layout(0, attempt=0)]})  # late
    assert {key[:2] for key in sizes(node)} == {("2", "1")}
    # a rank's second report of one attempt replaces its first
    single = layout(2, attempt=1)
    single["groups"] = single["groups"][:1]
    node.post("/v1/layout", json={"events": [single]})
    assert list(sizes(node)) == [("2", "1", "tp", "2", "0", "")]


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"group": "TP"}, "groups.0.group"),
        ({"group_rank": 2}, "groups.0"),
        ({"size": 0}, "groups.0.size"),
    ],
)
def test_bad_groups_are_refused_naming_the_field(
    node: TestClient, change: dict[str, Any], field: str
) -> None:
    event = layout(0)
    event["groups"][0].update(change)
    answer = node.post("/v1/layout", json={"events": [event]})
    assert answer.status_code == 422
    assert f"events.0.{field}" in answer.text
    assert sizes(node) == {}


def test_a_later_attempt_on_other_ranks_fits_the_cap_the_earlier_one_filled(
    node: TestClient,
) -> None:
    earlier = [dict(layout(rank), groups=[]) for rank in range(4)]  # cap: 4
    assert node.post("/v1/layout", json={"events": earlier}).status_code == 202
    later = [dict(layout(rank + 4, attempt=1), groups=[]) for rank in range(4)]
    assert node.post("/v1/layout", json={"events": later}).status_code == 202, "refused"
    tp = [layout(4, attempt=1)]
    tp[0]["groups"][1]["group_rank"] = 0  # rank 4 in a dp group of 2 made of ranks 4, 6
    assert node.post("/v1/layout", json={"events": tp}).status_code == 202
    assert {key[:3] for key in sizes(node)} == {("4", "1", "tp"), ("4", "1", "dp")}


def test_a_kind_twice_and_ranks_beyond_the_cap_are_refused(node: TestClient) -> None:
    event = layout(0)
    event["groups"].append(dict(event["groups"][0]))
    assert node.post("/v1/layout", json={"events": [event]}).status_code == 422
    too_many = [dict(layout(0), rank=rank, groups=[]) for rank in range(5)]  # cap: 4
    answer = node.post("/v1/layout", json={"events": too_many})
    assert answer.status_code == 429 and "--max-ranks-per-stage" in answer.text
    assert sizes(node) == {}


# -- the client, to a real agent over HTTP ---------------------------------------------


def start_agent(serve_asgi: Callable[..., Any]) -> tuple[Agent, str]:
    agent = Agent(AgentSettings(node="node-b", gpu_source="none"))
    agent.open()
    return agent, serve_asgi(agent.asgi(), None).url


def exported(agent: Agent) -> list[dict[str, str]]:
    return [
        dict(sample.labels, value=str(int(sample.value)))
        for family in agent.training.collect()
        for sample in family.samples
        if sample.name == SIZE
    ]


def test_sizes_given_to_the_reporter_are_sent_once_after_the_first_step(
    serve_asgi: Callable[..., Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("WORLD_SIZE", "8")
    monkeypatch.setenv("GPUFLEET_NVLINK_DOMAIN", "cluster-1.clique 7")
    agent, url = start_agent(serve_asgi)
    reporter = Reporter(url, training_job="sized", rank=5, attempt=2, tp_size=4)
    try:
        assert reporter.flush(5)
        assert exported(agent) == []  # nothing before the first step
        for _ in range(3):
            with reporter.step():
                pass
        assert reporter.flush(5)
        found = exported(agent)
        common = {"training_job": "sized", "node": "node-b", "rank": "5", "attempt": "2"}
        domain = {"nvlink_domain": "cluster-1.clique_7"}
        assert found == [
            {**common, "group": "tp", "group_first_rank": "4", "group_rank": "1", **domain,
             "value": "4"},
            {**common, "group": "dp", "group_first_rank": "1", "group_rank": "1", **domain,
             "value": "2"},
        ]  # fmt: skip
        accepted = [
            s.value
            for family in agent.training.collect()
            for s in family.samples
            if s.name == "gpufleet_ingest_accepted_events_total" and s.labels["kind"] == "layout"
        ]
        assert accepted == [1]
    finally:
        reporter.close()


def test_describe_layout_sends_a_mesh_given_by_hand(
    serve_asgi: Callable[..., Any], tmp_path: Path
) -> None:
    pytest.importorskip("torch.distributed")
    from torch_ranks import run_ranks

    agent, url = start_agent(serve_asgi)
    # the mesh is made in a child process: a process group made in pytest's own
    # outlives the test (tests/torch_ranks.py)
    run_ranks(_describe_a_mesh, (url, str(tmp_path / "store")), 1)
    assert {(row["group"], row["value"]) for row in exported(agent)} == {("dp", "1"), ("tp", "1")}
    # The steps after it looked for nothing more: described already.
    assert len(exported(agent)) == 2


def _describe_a_mesh(rank: int, url: str, store: str) -> None:
    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    from torch_ranks import end_distributed

    dist.init_process_group("gloo", rank=rank, world_size=1, init_method=f"file://{store}")
    mesh = init_device_mesh("cpu", (1, 1), mesh_dim_names=("dp", "tp"))
    reporter = Reporter(url, training_job="meshed", rank=rank)
    assert reporter.describe_layout(mesh)
    assert reporter.flush(5)
    with reporter.step():
        torch.ones(1)
    assert reporter.flush(5)
    reporter.close()
    del mesh
    end_distributed()


def test_without_a_layout_nothing_is_sent(serve_asgi: Callable[..., Any]) -> None:
    agent, url = start_agent(serve_asgi)
    reporter = Reporter(url, training_job="alone", rank=0)
    try:
        with reporter.step():
            pass
        assert reporter.flush(5)
        wait_until(lambda: reporter.sent >= 1, 5, what="the step sent")
        assert exported(agent) == []
        assert not reporter._layout_discover and reporter._layout_outbox is None
    finally:
        reporter.close()


def test_the_group_record_names_its_fields_as_the_agent_does() -> None:
    from gpufleet.agent.training_events import ParallelGroup as AgentGroup

    assert list(ParallelGroup._fields) == list(AgentGroup.model_fields)


# -- the rules' knobs ------------------------------------------------------------------


def tp_alert(config: RulesConfig) -> dict[str, Any]:
    (layout_file,) = [f for f in rule_files(config) if f.name == "layout"]
    document = as_document(layout_file, config)
    return next(
        rule
        for group in document["groups"]
        for rule in group["rules"]
        if rule.get("alert") == "GpuFleetTensorParallelAcrossNodes"
    )


def test_the_site_config_sets_the_tp_alerts_severity_and_hold() -> None:
    assert tp_alert(RulesConfig())["labels"]["severity"] == "warning"
    site = config_from_mapping(
        {"tp_across_nodes_severity": "critical", "tp_across_nodes_for": "5m"}
    )
    alert = tp_alert(site)
    assert (alert["labels"]["severity"], alert["for"]) == ("critical", "5m")
    # a per-alert override still wins
    both = config_from_mapping(
        {"tp_across_nodes_severity": "critical",
         "severities": {"GpuFleetTensorParallelAcrossNodes": "info"}}
    )  # fmt: skip
    assert tp_alert(both)["labels"]["severity"] == "info"
    with pytest.raises(ConfigError, match="tp_across_nodes_severity must be critical, warning or"):
        config_from_mapping({"tp_across_nodes_severity": "page"}, "site.yaml")


# What docs/layout.md states as the worst case when layouts fill the series cap.
DOCUMENTED_MAX_LAYOUT_SCRAPE_BYTES = 2_600_000


def test_layouts_at_every_cap_stay_within_the_documented_series_and_bytes() -> None:
    agent = Agent(AgentSettings(node="n" * 63, gpu_source="none"))
    agent.open()
    limits = agent.settings.limits
    refused = 0
    with TestClient(agent.asgi(), client=("127.0.0.1", 50000)) as client:
        for job in range(limits.max_jobs + 1):
            name = f"{job:03d}" + "j" * 125
            for rank in range(limits.max_ranks_per_stage + 1):
                groups = [
                    {"group": f"g{kind}" + "x" * 14, "size": 1 << 20, "group_rank": (1 << 20) - 1,
                     "group_first_rank": 1 << 20}
                    for kind in range(8)
                ]  # fmt: skip
                event = {"training_job": name, "rank": (1 << 20) - rank, "attempt": 1_000_000,
                         "nvlink_domain": "d" * 128, "groups": groups}  # fmt: skip
                answer = client.post("/v1/layout", json={"events": [event]})
                assert answer.status_code in (202, 429), answer.text
                refused += answer.status_code == 429
        scrape = client.get("/metrics").content
    assert refused > 0  # the caps were reached
    assert agent.training.series <= limits.max_series
    training = [line for line in scrape.splitlines() if line.startswith(b"gpufleet_training")]
    assert len(training) <= limits.max_series
    assert len(scrape) <= DOCUMENTED_MAX_LAYOUT_SCRAPE_BYTES, len(scrape)
