"""Every panel query of every dashboard, with its variables substituted, against a real
Prometheus holding a simulated cluster's backfilled history (a straggler, an XID and a
lost GPU, NVLink errors, a checkpoint storm, exclusions) and a real fleet ledger the
simulator reported to. A panel that returns nothing fails; nothing is skipped."""

from __future__ import annotations

import json
import math
import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gpufleet.dashboards.fail_slow import reason_texts
from gpufleet.lab.devstack import PrometheusServer
from gpufleet.lab.processes import backfill, wait_until
from gpufleet.lab.stack import (
    FAULTY_NODE,
    SLOW_FOR_S,
    SLOW_NODE,
    STEP_S,
    FedPrometheus,
    fed_prometheus,
    has_data,
)
from gpufleet.rules.__main__ import write_rules
from gpufleet.rules.config import RulesConfig
from gpufleet.rules.inline import Inliner
from gpufleet.simulate.config import load_scenario
from gpufleet.simulate.history import write_history

# Cheap (a backfilled history, seconds): on both majors, each test's id says which.
pytestmark = [pytest.mark.integration, pytest.mark.prometheus("2", "3")]

DASHBOARDS = Path(__file__).resolve().parents[1] / "dashboards"


@pytest.fixture(scope="module")
def fed(tmp_path_factory: pytest.TempPathFactory, prometheus_major: str) -> Iterator[FedPrometheus]:
    with fed_prometheus(tmp_path_factory.mktemp("dashboards")) as stack:
        yield stack


def board(stem: str) -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads((DASHBOARDS / f"{stem}.json").read_text())
    return loaded


def panel(stem: str, title: str) -> dict[str, Any]:
    return next(p for p in board(stem)["panels"] if p["title"] == title)


@pytest.mark.parametrize("stem", sorted(path.stem for path in DASHBOARDS.glob("*.json")))
def test_every_panel_query_returns_data(fed: FedPrometheus, stem: str) -> None:
    empty = []
    checked = 0
    for item in board(stem)["panels"]:
        for target in item["targets"]:
            checked += 1
            if not has_data(fed.run(target["expr"], bool(target.get("instant")))):
                empty.append(f"panel {item['id']} {item['title']!r} target {target['refId']}")
    for annotation in board(stem).get("annotations", {}).get("list", []):
        if annotation.get("expr"):
            checked += 1
            if not has_data(fed.run(annotation["expr"], instant=False)):
                empty.append(f"annotation {annotation['name']!r}")
    assert checked and empty == []


def test_the_heatmap_ranks_the_slow_node_first(fed: FedPrometheus) -> None:
    heatmap = panel("fail-slow", "Compute ratio heatmap (node x time)")
    result = fed.run(heatmap["targets"][0]["expr"], instant=False)
    episode_start = fed.end - SLOW_FOR_S + 600  # once the 5-minute rates have caught up
    means = {}
    for series in result:
        values = [float(v) for t, v in series["values"] if float(t) >= episode_start]
        finite = [v for v in values if math.isfinite(v)]
        means[series["metric"]["node"]] = sum(finite) / len(finite)
    ranked = sorted(means, key=means.__getitem__, reverse=True)
    assert ranked[0] == SLOW_NODE, ranked[:3]
    assert means[SLOW_NODE] > 1.2 > means[ranked[1]]


def test_tables_name_the_injected_faults(fed: FedPrometheus) -> None:
    straggler = panel("overview", "Straggler candidates")["targets"][0]["expr"]
    ranked = sorted(fed.run(straggler, instant=True), key=lambda s: -float(s["value"][1]))
    assert ranked[0]["metric"]["node"] == SLOW_NODE
    leaderboard = panel("reliability", "Exclusion leaderboard (30 d)")["targets"][0]["expr"]
    counts = {s["metric"]["node"]: float(s["value"][1]) for s in fed.run(leaderboard, True)}
    assert counts == {"node-012": 2.0, FAULTY_NODE: 1.0}
    excluded = panel("overview", "Excluded nodes")["targets"][0]["expr"]
    assert float(fed.run(excluded, instant=False)[0]["values"][-1][1]) == 1.0
    lost = panel("node", "GPU answering (gpufleet_gpu_up)")["targets"][0]["expr"]
    assert any(float(v) == 0 for s in fed.run(lost, instant=False) for _, v in s["values"])


# A shared cluster whose jobs span the coverage reasons: 4 nodes per stage (node peers),
# 2 nodes per stage reporting every rank (rank peers), 1 node per stage reporting only
# tensor-parallel rank 0 (one rank per stage: too few peers), and 2 nodes per stage
# reporting every rank but step time only (no split: its compute is its step time).
COVERAGE_SCENARIO = """
name: coverage
rates: {fail_stop_per_1000_node_days: 0, fail_slow_compute_per_node_day: 0,
        fail_slow_comm_per_node_day: 0}
confounders: {cluster_slowdowns_per_day: 0, evals: false, checkpoints: false}
jobs:
  - {job: wide, nodes: 16, layout: 4x4x8}
  - {job: pairs, nodes: 8, layout: 2x4x8}
  - {job: tp0-only, nodes: 4, layout: 1x4x8, report_ranks: tp0}
  - {job: step-only, nodes: 4, layout: 2x2x8, step_only: true}
"""


@pytest.fixture(scope="module")
def coverage(
    tmp_path_factory: pytest.TempPathFactory, prometheus_major: str
) -> Iterator[FedPrometheus]:
    workdir = tmp_path_factory.mktemp("coverage")
    (workdir / "scenario.yaml").write_text(COVERAGE_SCENARIO)
    end = float(int(time.time() // STEP_S * STEP_S))
    history = write_history(
        load_scenario(str(workdir / "scenario.yaml")), 1, 1 / 24, workdir / "history", end=end
    )
    backfill(history.files, workdir / "tsdb")
    rules = write_rules(workdir / "rules", RulesConfig())
    prometheus = PrometheusServer(
        workdir / "prometheus",
        storage_path=workdir / "tsdb",
        extra_args=["--storage.tsdb.retention.time=30d"],
    ).start()
    try:
        yield FedPrometheus(
            prometheus, "", history.start, history.end, "", Inliner.from_files(rules),
            {"cluster": ".*", "namespace": ".*"},
        )  # fmt: skip
    finally:
        prometheus.stop()


def test_the_coverage_panels_name_the_uncovered_stages_first(coverage: FedPrometheus) -> None:
    table = panel("fail-slow", "Straggler detection coverage by job and stage")
    rows = coverage.run(table["targets"][0]["expr"], instant=True)
    seen = [
        (r["metric"]["training_job"], r["metric"]["reason"], float(r["value"][1])) for r in rows
    ]
    # sort(): the uncovered stages come first, whatever the table's own sort does.
    assert sorted(seen[:6]) == (
        [("step-only", "no_compute_split", 0.0)] * 2 + [("tp0-only", "too_few_peers", 0.0)] * 4
    ), seen
    stages = sorted((r["metric"]["training_job"], r["metric"]["pp_stage"]) for r in rows[:6])
    assert stages == [("step-only", "0"), ("step-only", "1")] + [
        ("tp0-only", stage) for stage in "0123"
    ]
    assert sorted(seen[6:]) == (
        [("pairs", "rank_peers", 1.0)] * 4 + [("wide", "node_peers", 1.0)] * 4
    ), seen
    # Every reason shown reads in plain words: the table maps it.
    mapped = next(
        prop["value"][0]["options"]
        for override in table["fieldConfig"]["overrides"]
        if override["matcher"]["options"] == "reason"
        for prop in override["properties"]
        if prop["id"] == "mappings"
    )
    assert {reason for _, reason, _ in seen} <= set(mapped)
    for reason in ("too_few_peers", "no_compute_split"):
        assert mapped[reason]["text"] == reason_texts(RulesConfig())[reason]
    counts = panel("fail-slow", "Straggler detection coverage (all jobs)")["targets"]
    latest = {
        target["legendFormat"]: coverage.run(target["expr"], instant=False)[0]["values"][-1][1]
        for target in counts
    }
    assert latest == {"stages covered": "8", "stages not covered": "6"}


# Tenants: two jobs whose pods run in namespaces team-a (4 nodes) and team-b (2 nodes), a
# job without pods (2 nodes) and a spare node: 24 GPUs unallocated. A GPU of each tenant
# falls off the bus five minutes before the end (XID 79, a lost GPU).
TENANTS_SCENARIO = """
name: tenants
rates: {fail_stop_per_1000_node_days: 0, fail_slow_compute_per_node_day: 0,
        fail_slow_comm_per_node_day: 0}
confounders: {cluster_slowdowns_per_day: 0, evals: false, checkpoints: false}
spare_nodes: 1
jobs:
  - {job: llm-a, nodes: 4, layout: 2x2x8, namespace: team-a}
  - {job: llm-b, nodes: 2, layout: 1x2x8, namespace: team-b}
  - {job: batch, nodes: 2, layout: 1x2x8}
episodes:
  - {kind: fail_stop, cause: gpu_fell_off_bus, job: llm-a, node: 1, gpu: 2,
     start: 25m, duration: 1h}
  - {kind: fail_stop, cause: gpu_fell_off_bus, job: llm-b, node: 0, gpu: 5,
     start: 25m, duration: 1h}
"""


@pytest.fixture(scope="module")
def tenants(
    tmp_path_factory: pytest.TempPathFactory, prometheus_major: str
) -> Iterator[FedPrometheus]:
    """The tenants' cluster backfilled, with the rules evaluated live: the tenant records
    exist at the present, so the queries below run as Grafana sends them (not inlined)."""
    workdir = tmp_path_factory.mktemp("tenants")
    (workdir / "scenario.yaml").write_text(TENANTS_SCENARIO)
    end = float(int(time.time() // STEP_S * STEP_S))
    history = write_history(
        load_scenario(str(workdir / "scenario.yaml")), 1, 0.5 / 24, workdir / "history",
        end=end, step=STEP_S, shards=1,
    )  # fmt: skip
    backfill(history.files, workdir / "tsdb")
    rules = write_rules(
        workdir / "rules",
        RulesConfig(
            gpu_recording_interval="2s",
            gpu_long_window_interval="2s",
            slow_recording_interval="2s",
            dashboard_interval="2s",
            training_interval="2s",
        ),
    )
    prometheus = PrometheusServer(
        workdir / "prometheus",
        storage_path=workdir / "tsdb",
        rule_files=[str(path) for path in rules],
        evaluation_interval="2s",
        extra_args=["--storage.tsdb.retention.time=30d"],
    ).start()
    try:
        wait_until(
            lambda: (
                len(prometheus.query("gpu:gpufleet_gpu_tenant:info")) == 72
                and len(prometheus.query('ALERTS{alertname="GpuFleetCriticalXid"}')) == 2
            ),
            120,
            what="the tenant records and both tenants' XID pages",
        )
        yield FedPrometheus(
            prometheus, "", history.start, history.end, "", Inliner.from_files(rules),
            {"cluster": ".*", "namespace": ".*", "training_job": ".*"},
        )  # fmt: skip
    finally:
        prometheus.stop()


def tenant_query(fed: FedPrometheus, expr: str, namespace: str) -> list[dict[str, Any]]:
    """An instant query at the present with the namespace variable set, as Grafana sends it."""
    fed.variables["namespace"] = namespace
    return fed.prometheus.query(fed.substitute(expr, time.time(), inline=False))


def variable_values(fed: FedPrometheus, stem: str, name: str, namespace: str) -> set[str]:
    """What Grafana's label_values(selector, label) lists for a dashboard's variable."""
    variable = next(v for v in board(stem)["templating"]["list"] if v["name"] == name)
    found = re.fullmatch(r"label_values\((.*), (\w+)\)", variable["query"]["query"], re.S)
    assert found, variable["query"]
    selector, label = found.groups()
    rows = tenant_query(fed, f"group by ({label}) ({selector})", namespace)
    return {row["metric"][label] for row in rows if label in row["metric"]}


def test_a_namespace_shows_only_its_tenants_gpus_and_jobs(tenants: FedPrometheus) -> None:
    allocations = tenants.prometheus.query("gpufleet_gpu_allocation_info")
    team_a = {
        row["metric"]["UUID"] for row in allocations if row["metric"]["namespace"] == "team-a"
    }
    nodes_a = {
        row["metric"]["Hostname"] for row in allocations if row["metric"]["namespace"] == "team-a"
    }
    assert len(team_a) == 32 and len(nodes_a) == 4

    # The variables: team-a's jobs and nodes only; under All every job and node.
    assert variable_values(tenants, "overview", "training_job", "team-a") == {"llm-a"}
    assert variable_values(tenants, "overview", "training_job", ".*") == {"llm-a", "llm-b", "batch"}
    assert variable_values(tenants, "overview", "namespace", ".*") == {"team-a", "team-b"}
    assert variable_values(tenants, "node", "node", "team-a") == nodes_a
    assert len(variable_values(tenants, "node", "node", ".*")) == 9
    node_a = sorted(nodes_a)[0]
    tenants.variables["node"] = node_a
    uuids = variable_values(tenants, "node", "uuid", "team-a")
    assert len(uuids) == 8 and uuids <= team_a
    assert variable_values(tenants, "node", "uuid", "team-b") == set()

    # GPUs by tenant: team-a's row alone; under All each tenant's and the unallocated GPUs.
    by_tenant = panel("overview", "GPUs by tenant")["targets"]

    def rows(namespace: str) -> dict[str, list[float]]:
        table: dict[str, list[float]] = {}
        for target in by_tenant:
            for row in tenant_query(tenants, target["expr"], namespace):
                key = row["metric"].get("namespace", "")
                table.setdefault(key, []).append(float(row["value"][1]))
        return table

    # (no MIG here: no instances; tests/test_mig.py counts a MIG GPU's tenants)
    assert rows("team-a") == {"team-a": [32.0, 1.0, 0.0, 0.0]}
    assert rows(".*") == {
        "team-a": [32.0, 1.0, 0.0, 0.0],
        "team-b": [16.0, 1.0, 0.0, 0.0],
        "": [24.0, 0.0, 0.0, 0.0],
    }

    # Every per-GPU panel of the overview and of a team-a node's dashboard: team-a's GPUs.
    xids = panel("overview", "XID events by code")["targets"][0]["expr"]
    assert [row["value"][1] for row in tenant_query(tenants, xids, "team-a")] == ["1"]
    assert [row["value"][1] for row in tenant_query(tenants, xids, ".*")] == ["2"]
    answering = panel("overview", "GPUs expected vs seen")["targets"][2]["expr"]
    assert tenant_query(tenants, answering, "team-a")[0]["value"][1] == "31"  # one lost
    assert tenant_query(tenants, answering, ".*")[0]["value"][1] == "70"
    tenants.variables.update({"node": node_a, "gpu": ".*", "uuid": "|".join(sorted(uuids))})
    checked = 0
    for item in board("node")["panels"]:
        for target in item["targets"]:
            if "$uuid" not in target["expr"]:
                continue
            for row in tenant_query(tenants, target["expr"], "team-a"):
                checked += 1
                assert row["metric"].get("node", node_a) == node_a, item["title"]
                assert row["metric"].get("UUID", next(iter(uuids))) in uuids, item["title"]
    assert checked >= 8

    # Firing alerts by severity: team-a's XID page only (the other tenant's is not counted).
    firing = panel("overview", "Firing alerts by severity")["targets"][0]["expr"]
    pages = tenant_query(tenants, firing, "team-a")
    assert {row["metric"]["severity"]: row["value"][1] for row in pages} == {"critical": "1"}
