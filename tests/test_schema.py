"""The metric schema is the one contract: rules and dashboards read only what it defines,
and every producer exports exactly what it defines."""

from __future__ import annotations

import json
import math
import re
import subprocess
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest
import yaml

from gpufleet.exposition import MetricKind
from gpufleet.gpu.fake import FakeNvml
from gpufleet.schema.external import DCGM_EXPORTER_ONLY
from gpufleet.schema.index import known_series, series_names

ROOT = Path(__file__).resolve().parents[1]

# -- reading series names out of PromQL ---------------------------------------------

_STRING = re.compile(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'|`[^`]*`')
_COMMENT = re.compile(r"#[^\n]*")
_GRAFANA_VARIABLE = re.compile(r"\$\{[^}]*\}|\$\w+")
_MATCHERS = re.compile(r"\{[^{}]*\}")
_RANGE = re.compile(r"\[[^\[\]]*\]")
_LABEL_LIST = re.compile(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^()]*\)")
# Grafana's label_values(metric, label) and label_names(): the label is no series.
_LABEL_VALUES = re.compile(r"\blabel_values\s*\(([^()]*?)(?:,\s*[a-zA-Z_]\w*)?\s*\)")
_TOKEN = re.compile(r"\d[\w.]*|[a-zA-Z_:][a-zA-Z0-9_:]*(\s*\()?")
_KEYWORDS = frozenset(
    {"by", "without", "on", "ignoring", "group_left", "group_right", "offset", "bool"}
    | {"and", "or", "unless", "atan2", "inf", "nan", "start", "end"}
)


def series_in(expr: str) -> set[str]:
    """The series names a PromQL expression (or a Grafana variable query) reads."""
    text = _STRING.sub('""', expr)
    text = _COMMENT.sub("", text)
    text = _GRAFANA_VARIABLE.sub("", text)
    text = _LABEL_VALUES.sub(r"\1", text)
    text = _MATCHERS.sub(" ", text)
    while _RANGE.search(text):  # subqueries nest: [5m:1m] inside nothing, but be safe
        text = _RANGE.sub(" ", text)
    text = _LABEL_LIST.sub(" ", text)
    names = set()
    for match in _TOKEN.finditer(text):
        token = match.group(0)
        if token[0].isdigit() or match.group(1):  # a number, a duration, or a function call
            continue
        if token.lower() in _KEYWORDS:
            continue
        names.add(token)
    return names


@pytest.mark.parametrize(
    ("expr", "names"),
    [
        ('rate(foo_total{a="b"}[5m])', {"foo_total"}),
        ("sum by (node, le) (rate(x_bucket[$__rate_interval])) > bool 0", {"x_bucket"}),
        ("a / on (xid) group_left (meaning) b:c:d", {"a", "b:c:d"}),
        ("max_over_time(up[1h:1m] offset 1d) or vector(0)", {"up"}),
        ('label_values(job:x:rate2m{cluster=~"$cluster"}, training_job)', {"job:x:rate2m"}),
        ("label_values(up, cluster)", {"up"}),
        ('count_values("v", y) unless z # a comment naming nothing_here', {"y", "z"}),
        ("histogram_quantile(0.9, q) * 1e3 + Inf - NaN", {"q"}),
        ('{__name__="n"}', set()),
    ],
)
def test_series_are_read_out_of_promql(expr: str, names: set[str]) -> None:
    assert series_in(expr) == names


# -- what the generated rules and dashboards read ------------------------------------


def rule_files() -> list[Path]:
    return sorted((ROOT / "alerts").glob("*.rules.yaml"))


def recorded_series() -> set[str]:
    recorded: set[str] = set()
    for path in rule_files():
        for group in yaml.safe_load(path.read_text())["groups"]:
            recorded.update(rule["record"] for rule in group["rules"] if "record" in rule)
    return recorded


def queries() -> Iterator[tuple[str, str]]:
    """(where, expression) for every rule expression and every dashboard query."""
    for path in rule_files():
        for group in yaml.safe_load(path.read_text())["groups"]:
            for rule in group["rules"]:
                name = rule.get("record") or rule.get("alert")
                yield f"{path.name}: {name}", rule["expr"]
    for path in sorted((ROOT / "dashboards").glob("*.json")):
        yield from _dashboard_queries(json.loads(path.read_text()), path.name)


def _dashboard_queries(node: object, where: str) -> Iterator[tuple[str, str]]:
    if isinstance(node, dict):
        title = node.get("title")
        here = f"{where} / {title}" if isinstance(title, str) else where
        for key, value in node.items():
            if key == "expr" and isinstance(value, str):
                yield here, value
            elif key == "query" and isinstance(value, dict) and isinstance(value.get("query"), str):
                yield f"{here} (variable {node.get('name')})", value["query"]
            else:
                yield from _dashboard_queries(value, here)
    elif isinstance(node, list):
        for item in node:
            yield from _dashboard_queries(item, where)


def unknown_series(extra: Sequence[tuple[str, str]] = ()) -> list[str]:
    known = known_series() | series_names(DCGM_EXPORTER_ONLY) | recorded_series()
    return [
        f"{where}: {name}"
        for where, expr in [*queries(), *extra]
        for name in sorted(series_in(expr) - known)
    ]


def test_rules_and_dashboards_are_found() -> None:
    where = [w for w, _ in queries()]
    assert len(rule_files()) >= 5
    assert sum(".json" in w for w in where) >= 30
    assert sum(".rules.yaml" in w for w in where) >= 100


def test_every_rule_and_dashboard_reads_a_series_the_schema_defines() -> None:
    assert unknown_series() == []


@pytest.mark.parametrize(
    "expr",
    [
        "rate(gpufleet_training_stepz_total[5m])",  # a typo in a name the agent exports
        "node:gpufleet_never_recorded:rate5m > 1",  # a recorded series no rule records
        "DCGM_FI_DEV_MADE_UP",  # a GPU field neither the agent nor dcgm-exporter has
    ],
)
def test_a_series_nothing_produces_is_reported(expr: str) -> None:
    assert unknown_series([("made-up panel", expr)]) == [
        f"made-up panel: {next(iter(series_in(expr)))}"
    ]


# -- every producer exports exactly what the schema says -----------------------------


def check_against_schema(text: str) -> set[str]:
    """Each family in a /metrics text has its schema entry's type, help and labels."""
    from prometheus_client.parser import text_string_to_metric_families

    from gpufleet.schema.index import BY_NAME

    seen = set()
    for family in text_string_to_metric_families(text):
        entry = BY_NAME.get(f"{family.name}_total") or BY_NAME.get(family.name)
        assert entry is not None, f"{family.name} is exported but not in the schema"
        assert (family.type, family.documentation) == (entry.kind, entry.help), entry.name
        labels = {key for sample in family.samples for key in sample.labels}
        if family.samples:  # an empty family (no rejections yet) shows no labels
            found = labels - {"le", "quantile"}
            assert set(entry.labels) <= found, entry.name
            assert found <= set(entry.labels) | set(entry.optional_labels), entry.name
        names = {sample.name for sample in family.samples}
        if entry.kind == "counter" and not entry.name.endswith("_total"):
            # the parser names a bare DCGM counter's samples with _total; the text has none
            names = {name.removesuffix("_total") for name in names}
        assert names <= set(entry.series_names()), entry.name
        seen.add(entry.name)
    return seen


def test_the_agent_exports_what_the_schema_defines(fake_nvml: FakeNvml) -> None:
    from fastapi.testclient import TestClient

    from gpufleet.agent.app import Agent, AgentSettings
    from gpufleet.reporter.pod import NAMESPACE_HEADER, POD_HEADER

    settings = AgentSettings(node="node-a", gpu_interval=60, allow_unauthenticated_ingest=True)
    agent = Agent(settings, nvml=fake_nvml)
    agent.open()
    with TestClient(agent.asgi()) as client:
        assert agent.sampler is not None and agent.sampler.wait_first(5)
        steps = [
            {"training_job": "j", "rank": rank, "step": 1, "duration_s": 1.0} for rank in range(2)
        ]
        # the client in pod ml/trainer-0 names it (the downward API): its job's series
        # carry namespace and pod, which the schema declares optional
        pod = {NAMESPACE_HEADER: "ml", POD_HEADER: "trainer-0"}
        response = client.post("/v1/steps", json={"events": steps}, headers=pod)
        assert response.status_code == 202
        checkpoint = {"training_job": "j", "rank": 0, "op": "save", "event": "begin", "id": "a"}
        response = client.post("/v1/checkpoints", json={"events": [checkpoint]}, headers=pod)
        assert response.status_code == 202
        text = client.get("/metrics", headers={"Accept-Encoding": "identity"}).text
    assert 'namespace="ml",node="node-a",pod="trainer-0"' in text
    seen = check_against_schema(text)
    assert {"gpufleet_training_steps_total", "gpufleet_checkpoint_in_flight"} <= seen
    assert {"gpufleet_agent_info", "gpufleet_ingest_series", "DCGM_FI_DEV_SM_CLOCK"} <= seen


def test_the_simulator_exports_what_the_schema_defines() -> None:
    from gpufleet.simulate.cluster import Cluster
    from gpufleet.simulate.config import load_scenario
    from gpufleet.simulate.serve import node_exposition

    start = 1_800_000_000.0
    cluster = Cluster(load_scenario("realistic-week").with_cluster(nodes=2), 1, start, 3600.0)
    for tick in range(1, 40):
        cluster.advance(start + 30 * tick)
    seen = check_against_schema(node_exposition(cluster, 0).decode())
    assert {"gpufleet_training_step_duration_seconds", "gpufleet_gpu_up"} <= seen


def test_the_ledger_exports_what_the_schema_defines(tmp_path: Path) -> None:
    from prometheus_client import generate_latest
    from prometheus_client.registry import CollectorRegistry

    from gpufleet.fleet.metrics import LedgerCollector
    from gpufleet.fleet.models import AttemptEventIn, ExclusionIn
    from gpufleet.fleet.store import LedgerStore

    store = LedgerStore(tmp_path / "ledger.db", clock=lambda: 1_800_000_000.0)
    try:
        store.exclude("a", ExclusionIn(node="n1", reason="xid_79", source="auto"))
        store.attempt_event(
            "b", AttemptEventIn(training_job="j", attempt=1, event="started", trigger="initial")
        )
        registry = CollectorRegistry()
        registry.register(LedgerCollector(store))
        seen = check_against_schema(generate_latest(registry).decode())
    finally:
        store.close()
    assert {"gpufleet_fleet_node_exclusions_total", "gpufleet_fleet_job_attempts_total"} <= seen


def test_the_simulated_gpu_fields_are_catalogue_fields() -> None:
    from gpufleet.schema.gpu import GPU_FAMILIES
    from gpufleet.simulate.cluster import Cluster
    from gpufleet.simulate.config import load_scenario

    cluster = Cluster(load_scenario("realistic-week").with_cluster(nodes=1), 1, 0.0, 60.0)
    assert set(cluster.gpu_values(0, 0)) <= {metric.name for metric in GPU_FAMILIES}


# -- the one OpenMetrics writer ------------------------------------------------------


def test_openmetrics_escapes_label_values_and_writes_nan_and_infinities(tmp_path: Path) -> None:
    """What the history writer streams survives Prometheus's own OpenMetrics parser."""
    from prometheus_client.openmetrics.parser import text_string_to_metric_families

    from gpufleet.exposition import OpenMetricsWriter
    from gpufleet.schema.family import MetricDef

    awkward = 'say "hi"\\ then\nleave'
    metric = MetricDef("gpufleet_test_value", "gauge", 'A "quoted" help\\text.', ("note",))
    path = tmp_path / "history.om"
    with open(path, "w", encoding="utf-8") as handle:
        out = OpenMetricsWriter(handle)
        out.family(*metric.openmetrics(), metric.help)
        values = [1.5, math.nan, math.inf, -math.inf]
        stamps = ["1800000000", "1800000030", "1800000060", "1800000090"]
        out.series(metric.name, [("note", awkward)], values, stamps)
        out.close()
    text = path.read_text()
    assert "NaN 1800000030\n" in text and "+Inf 1800000060\n" in text
    (family,) = text_string_to_metric_families(text)
    assert family.documentation == metric.help
    assert [sample.labels["note"] for sample in family.samples] == [awkward] * 4
    parsed = [sample.value for sample in family.samples]
    assert parsed[0] == 1.5 and math.isnan(parsed[1]) and parsed[2:] == [math.inf, -math.inf]
    # promtool, which the history is made for, reads it into blocks too.
    blocks = subprocess.run(
        ["promtool", "tsdb", "create-blocks-from", "openmetrics", str(path), str(tmp_path / "db")],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert blocks.returncode == 0, blocks.stderr


@pytest.mark.parametrize(
    ("name", "kind", "expected"),
    [
        ("gpufleet_training_steps_total", "counter", ("gpufleet_training_steps", "counter")),
        (
            "DCGM_FI_DEV_PCIE_REPLAY_COUNTER",
            "counter",
            ("DCGM_FI_DEV_PCIE_REPLAY_COUNTER", "unknown"),
        ),
        ("gpufleet_gpu_up", "gauge", ("gpufleet_gpu_up", "gauge")),
        ("x", "untyped", ("x", "unknown")),
    ],
)
def test_openmetrics_names_counters_by_their_family(
    name: str, kind: MetricKind, expected: tuple[str, str]
) -> None:
    from gpufleet.schema.family import MetricDef

    assert MetricDef(name, kind, "help").openmetrics() == expected
