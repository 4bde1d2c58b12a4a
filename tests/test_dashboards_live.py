"""Every panel query of every dashboard, with its variables substituted, against a real
Prometheus holding a simulated cluster's backfilled history (a straggler, an XID and a
lost GPU, NVLink errors, a checkpoint storm, exclusions) and a real fleet ledger the
simulator reported to. A panel that returns nothing fails; nothing is skipped."""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gpufleet.dashboards.stack import (
    FAULTY_NODE,
    SLOW_FOR_S,
    SLOW_NODE,
    FedPrometheus,
    fed_prometheus,
    has_data,
)

pytestmark = pytest.mark.integration

DASHBOARDS = Path(__file__).resolve().parents[1] / "dashboards"


@pytest.fixture(scope="module")
def fed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[FedPrometheus]:
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
