"""The job layout panels of the fail-slow dashboard against a real Prometheus: the
dashboards' simulated job (tp 8 inside each node, pp 2, dp 8) shows its layout and a
clean verdict, NVLink far above the network; a job whose tp groups straddle two nodes
shows the verdict 2 and sustained network traffic. Every query is the committed one."""

from __future__ import annotations

import json
import statistics
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gpufleet.lab.devstack import PrometheusServer
from gpufleet.lab.processes import backfill
from gpufleet.lab.stack import STEP_S, FedPrometheus, fed_prometheus
from gpufleet.rules.__main__ import write_rules
from gpufleet.rules.config import RulesConfig
from gpufleet.rules.inline import Inliner
from gpufleet.simulate.config import load_scenario
from gpufleet.simulate.history import write_history
from gpufleet.simulate.layout import NETWORK_BYTES_PER_S, TP_ACROSS_NODES_BYTES_PER_S

pytestmark = [pytest.mark.integration, pytest.mark.prometheus("2", "3")]

FAIL_SLOW = Path(__file__).resolve().parents[1] / "dashboards" / "fail-slow.json"


def panel(title: str) -> dict[str, Any]:
    board = json.loads(FAIL_SLOW.read_text())
    found: dict[str, Any] = next(p for p in board["panels"] if p["title"] == title)
    return found


def rows(fed: FedPrometheus, title: str, by: str) -> dict[str, dict[str, float]]:
    """An instant table's rows keyed by label ``by``: each target's value by refId."""
    table: dict[str, dict[str, float]] = {}
    for target in panel(title)["targets"]:
        for series in fed.run(target["expr"], instant=True):
            key = series["metric"].get(by, "")
            table.setdefault(key, {})[target["refId"]] = float(series["value"][1])
    return table


def medians(fed: FedPrometheus, title: str, ref: str) -> dict[str, float]:
    """A range target's median over the history per node: checkpoints and restarts pause
    training now and then, so a single point may fall in a pause."""
    target = next(t for t in panel(title)["targets"] if t["refId"] == ref)
    return {
        series["metric"].get("node", ""): statistics.median(
            float(value) for _, value in series["values"]
        )
        for series in fed.run(target["expr"], instant=False)
    }


def latest(fed: FedPrometheus, title: str, ref: str) -> dict[str, float]:
    """A range target's values at its last step (the present), keyed by node (or "")."""
    target = next(t for t in panel(title)["targets"] if t["refId"] == ref)
    result = fed.run(target["expr"], instant=False)
    last = max(float(series["values"][-1][0]) for series in result)
    return {
        series["metric"].get("node", ""): float(series["values"][-1][1])
        for series in result
        if float(series["values"][-1][0]) == last
    }


@pytest.fixture(scope="module")
def fed(tmp_path_factory: pytest.TempPathFactory, prometheus_major: str) -> Iterator[FedPrometheus]:
    with fed_prometheus(tmp_path_factory.mktemp("layout-dashboards")) as stack:
        yield stack


STRADDLING = """
name: straddling
cluster: {nodes: 4, layout: 2x1x16, parallel_layout: true}
rates: {fail_stop_per_1000_node_days: 0, fail_slow_compute_per_node_day: 0,
        fail_slow_comm_per_node_day: 0}
confounders: {cluster_slowdowns_per_day: 0, evals: false, checkpoints: false}
"""


@pytest.fixture(scope="module")
def straddling(
    tmp_path_factory: pytest.TempPathFactory, prometheus_major: str
) -> Iterator[FedPrometheus]:
    """Two-hour history of a job on 4 nodes of 8 GPUs with tp 16: each tp group on 2."""
    workdir = tmp_path_factory.mktemp("straddling")
    (workdir / "scenario.yaml").write_text(STRADDLING)
    end = float(int(time.time() // STEP_S * STEP_S))
    scenario = load_scenario(str(workdir / "scenario.yaml"))
    history = write_history(scenario, 1, 2 / 24, workdir / "history", end=end)
    backfill(history.files, workdir / "tsdb")
    rules = write_rules(workdir / "rules", RulesConfig())
    prometheus = PrometheusServer(
        workdir / "prometheus",
        storage_path=workdir / "tsdb",
        extra_args=["--storage.tsdb.retention.time=30d"],
    ).start()
    try:
        yield FedPrometheus(
            prometheus, "", history.start, history.end, scenario.cluster.job,
            Inliner.from_files(rules),
            {"cluster": ".*", "namespace": ".*", "training_job": scenario.cluster.job},
            hours=2.0,
        )  # fmt: skip
    finally:
        prometheus.stop()


def test_the_dashboards_job_shows_its_layout_and_a_clean_verdict(fed: FedPrometheus) -> None:
    # 16 nodes x 8 GPUs, 8x2x8 (dp x pp x tp): tp inside each node, pp and dp across. The
    # nodes waiting with an excluded node at the end report nothing (the job's own state),
    # so counts follow the reporting nodes.
    per_node = rows(fed, "Stages per node", "node")
    nodes = len(per_node)
    assert 12 <= nodes <= 16 and all(row == {"A": 1, "B": 8} for row in per_node.values())
    layout = rows(fed, "Parallel layout", "group")
    assert layout["tp"] == {"A": 8, "B": nodes, "C": 1, "D": 1}
    assert layout["pp"] == {"A": 2, "B": 4 * nodes, "C": 2, "D": 2}
    dp = layout["dp"]
    assert (dp["A"], dp["B"]) == (8, 16) and nodes / 2 <= dp["C"] == dp["D"] <= 8
    assert latest(fed, "Tensor parallel: NVLink domains per group", "A") == {"": 1.0}
    stages = rows(fed, "Pipeline stages", "group_rank")
    assert set(stages) == {"0", "1"} and sum(row["B"] for row in stages.values()) == nodes
    assert all(row["A"] == 8 * row["B"] for row in stages.values())
    nvlink = latest(fed, "NVLink vs network bytes per node", "A")
    network = latest(fed, "NVLink vs network bytes per node", "B")
    assert set(network) == set(nvlink) == set(per_node)
    nvlink, network = (medians(fed, "NVLink vs network bytes per node", ref) for ref in "AB")
    for node, sent in network.items():
        assert sent == pytest.approx(2 * NETWORK_BYTES_PER_S, rel=0.05), node
        assert nvlink[node] > 50 * sent, node


def test_tp_across_nodes_shows_in_the_verdict_and_the_network(straddling: FedPrometheus) -> None:
    layout = rows(straddling, "Parallel layout", "group")
    assert layout["tp"] == {"A": 16, "B": 2, "C": 2, "D": 2}
    verdict = latest(straddling, "Tensor parallel: NVLink domains per group", "A")
    assert verdict == {"": 2.0}
    threshold = panel("Tensor parallel: NVLink domains per group")["fieldConfig"]["defaults"]
    assert [step["value"] for step in threshold["thresholds"]["steps"]] == [None, 2]
    assert len(latest(straddling, "NVLink vs network bytes per node", "B")) == 4
    network = medians(straddling, "NVLink vs network bytes per node", "B")
    for node, sent in network.items():
        assert sent == pytest.approx(2 * TP_ACROSS_NODES_BYTES_PER_S, rel=0.05), node
