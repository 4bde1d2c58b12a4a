"""The sharded layout of docs/SCALING.md in the chart and in deploy/sharding/: with
monitoring.sharding on, every ServiceMonitor once per shard keeping that shard's nodes,
each PrometheusRule labelled by where its file runs; a shard's remote-write filter
keeping every series the global rule files read and nothing only the shards need.
Rendered with helm template and validated as tests/test_helm_chart.py does."""

from __future__ import annotations

import copy
import json
import re
from collections import defaultdict
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

from deploy_tools import CHART, REPO
from gpufleet.rules.build import rule_files
from gpufleet.rules.sharding import (
    global_inputs,
    is_shard_local,
    remote_write_relabel_configs,
    series_read,
    shard_relabel_configs,
)
from test_helm_chart import (
    OPERATOR_KINDS,
    crd_validator,
    objects,
    render,
    render_error,
    values_file,
)

SHARDING = CHART / "ci" / "sharding-values.yaml"
SHARDS = yaml.safe_load(SHARDING.read_text())["monitoring"]["sharding"]["shards"]
# Both sources, the ledger with its second endpoint (kube-watch's metrics).
MONITORS = ("-f", str(SHARDING), "--set", "fleet.kubeWatch.enabled=true")
UNSHARDED = (*MONITORS, "--set", "monitoring.sharding.enabled=false")
DEFAULTS = yaml.safe_load((CHART / "values.yaml").read_text())["monitoring"]["sharding"]
SHARDING_DIR = REPO / "deploy" / "sharding"
# The Prometheus Operator's RelabelConfig keys for Prometheus's relabel_config keys.
OPERATOR_KEYS = {"source_labels": "sourceLabels", "target_label": "targetLabel",
                 "modulus": "modulus", "regex": "regex", "action": "action"}  # fmt: skip
# A raw per-GPU counter gpu.rules.yaml reads and no global file does.
SHARD_ONLY_SERIES = "DCGM_FI_DEV_XID_ERRORS"


def operator_form(configs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{OPERATOR_KEYS[key]: value for key, value in item.items()} for item in configs]


def without_secret_values(docs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each render draws fresh random tokens; everything else must be equal."""
    docs = copy.deepcopy(docs)
    for doc in objects(docs, "Secret"):
        doc["data"] = sorted(doc.get("data", {}))
    return docs


def rule_documents() -> dict[str, dict[str, Any]]:
    paths = sorted((REPO / "alerts").glob("*.rules.yaml"))
    assert paths
    return {path.name: yaml.safe_load(path.read_text()) for path in paths}


def test_every_service_monitor_is_rendered_once_per_shard_keeping_its_nodes() -> None:
    sharded = objects(render(*MONITORS), "ServiceMonitor")
    unsharded = {
        monitor["metadata"]["labels"]["app.kubernetes.io/component"]: monitor
        for monitor in objects(render(*UNSHARDED), "ServiceMonitor")
    }
    assert set(unsharded) == {"agent", "fleet"}
    label = DEFAULTS["shardLabel"]
    shards_of: dict[str, list[str]] = defaultdict(list)
    for monitor in sharded:
        labels = monitor["metadata"]["labels"]
        component, shard = labels["app.kubernetes.io/component"], labels[label]
        shards_of[component].append(shard)
        index = int(shard)
        assert monitor["metadata"]["name"].endswith(f"-shard-{index}")
        keep = operator_form(shard_relabel_configs(index, SHARDS))
        assert keep[0]["sourceLabels"] == ["__meta_kubernetes_pod_node_name"]
        for endpoint in monitor["spec"]["endpoints"]:
            assert endpoint["relabelings"][-len(keep) :] == keep
        # Apart from its name, its shard label and the keep, the unsharded monitor.
        plain = copy.deepcopy(monitor)
        plain["metadata"]["name"] = plain["metadata"]["name"].removesuffix(f"-shard-{index}")
        del plain["metadata"]["labels"][label]
        for endpoint in plain["spec"]["endpoints"]:
            del endpoint["relabelings"][-len(keep) :]
        assert plain == unsharded[component]
    assert dict(shards_of) == {
        component: [str(index) for index in range(SHARDS)] for component in unsharded
    }
    assert len({monitor["metadata"]["name"] for monitor in sharded}) == len(sharded)


def test_a_shard_s_name_keeps_its_component_and_index_within_63_characters() -> None:
    docs = render(*MONITORS, "--set", f"fullnameOverride={'g' * 70}")
    names = [monitor["metadata"]["name"] for monitor in objects(docs, "ServiceMonitor")]
    assert len(set(names)) == 2 * SHARDS
    for name in names:
        assert len(name) <= 63 and re.search(r"g-(agent|fleet)-shard-[0-9]+$", name), name


def test_every_prometheus_rule_is_labelled_where_its_file_runs() -> None:
    rules = objects(render(*MONITORS), "PrometheusRule")
    unsharded = {
        rule["metadata"]["name"]: rule for rule in objects(render(*UNSHARDED), "PrometheusRule")
    }
    assert len(rules) == len(rule_documents()) == len(unsharded)
    shard_labels, global_labels = DEFAULTS["shardRuleLabels"], DEFAULTS["globalRuleLabels"]
    assert shard_labels != global_labels
    placed = set()
    for rule in rules:
        source = Path(rule["metadata"]["annotations"]["gpufleet.io/source"]).name
        expected = shard_labels if is_shard_local(source) else global_labels
        placed.add(is_shard_local(source))
        labels = dict(rule["metadata"]["labels"])
        assert {key: labels.pop(key) for key in expected} == expected, source
        assert labels == unsharded[rule["metadata"]["name"]]["metadata"]["labels"], source
        assert rule["spec"] == unsharded[rule["metadata"]["name"]]["spec"]
    assert placed == {True, False}, "both a shard file and a global file"


def test_rule_labels_come_from_the_values() -> None:
    # helm merges a map with the default's: null drops the default's key
    shard = json.dumps({"gpufleet.io/rules": None, "tier": "shard"})
    global_ = json.dumps({"gpufleet.io/rules": None, "tier": "thanos-ruler"})
    docs = render(
        *MONITORS,
        "--set-json", f"monitoring.sharding.shardRuleLabels={shard}",
        "--set-json", f"monitoring.sharding.globalRuleLabels={global_}",
    )  # fmt: skip
    for rule in objects(docs, "PrometheusRule"):
        labels = rule["metadata"]["labels"]
        source = Path(rule["metadata"]["annotations"]["gpufleet.io/source"]).name
        assert "gpufleet.io/rules" not in labels
        assert labels["tier"] == ("shard" if is_shard_local(source) else "thanos-ruler")


def test_the_chart_s_rule_split_is_the_rules_code() -> None:
    # The chart reads files/sharding/rule-files.yaml: a link to the generated copy.
    link = CHART / "files" / "sharding"
    assert link.is_symlink() and link.resolve() == SHARDING_DIR.resolve()
    split = yaml.safe_load((SHARDING_DIR / "rule-files.yaml").read_text())
    names = [f"{rule_file.name}.rules.yaml" for rule_file in rule_files()]
    assert split == {
        "shard": sorted(name for name in names if is_shard_local(name)),
        "global": sorted(name for name in names if not is_shard_local(name)),
    }
    assert sorted(split["shard"] + split["global"]) == sorted(rule_documents())


def test_sharded_objects_validate_against_the_crd_schemas() -> None:
    docs = render(*MONITORS)
    assert {doc["kind"] for doc in docs} >= {"ServiceMonitor", "PrometheusRule"}
    for doc in docs:
        if doc["kind"] in OPERATOR_KINDS:
            try:
                crd_validator(doc["kind"]).validate(doc)
            except jsonschema.ValidationError as error:
                pytest.fail(f"{doc['kind']} {doc['metadata']['name']}: {error.message}")


@pytest.mark.parametrize("values", ["default", "monitoring"])
def test_sharding_off_renders_what_the_chart_renders_without_it(values: str) -> None:
    plain = render(*values_file(values))
    switched_off = render(
        *values_file(values),
        "--set", "monitoring.sharding.enabled=false",
        "--set", "monitoring.sharding.shards=7",
        "--set", "monitoring.sharding.shardLabel=example.com/shard",
    )  # fmt: skip
    assert without_secret_values(switched_off) == without_secret_values(plain)
    assert DEFAULTS["enabled"] is False
    text = yaml.safe_dump(plain)
    assert "__tmp_shard" not in text and DEFAULTS["shardLabel"] not in text


def test_bad_sharding_values_are_refused_with_the_value_named() -> None:
    error = render_error("--set", "monitoring.sharding.shards=0")
    assert "monitoring.sharding.shards: Must be greater than or equal to 1" in error
    assert "monitoring.sharding.shards" in render_error("--set", "monitoring.sharding.shards=1.5")
    assert "shardLabel" in render_error("--set", "monitoring.sharding.shardLabel=not a label")
    assert "Additional property shard is not allowed" in render_error(
        "--set", "monitoring.sharding.shard=2"
    )
    same = render_error(
        "-f", str(SHARDING),
        "--set", "monitoring.sharding.globalRuleLabels.gpufleet\\.io/rules=shard",
    )  # fmt: skip
    assert "shardRuleLabels and monitoring.sharding.globalRuleLabels must differ" in same


def committed_filter() -> dict[str, Any]:
    document: dict[str, Any] = yaml.safe_load(
        (SHARDING_DIR / "remote-write-relabel.yaml").read_text()
    )
    return document


def test_the_committed_remote_write_filter_is_the_code_s_in_both_forms() -> None:
    document = committed_filter()
    assert document["write_relabel_configs"] == remote_write_relabel_configs()
    assert document["writeRelabelConfigs"] == operator_form(remote_write_relabel_configs())


def keep_regex() -> str:
    (keep,) = committed_filter()["write_relabel_configs"]
    assert keep["source_labels"] == ["__name__"] and keep["action"] == "keep"
    regex: str = keep["regex"]
    return regex


def test_the_remote_write_filter_keeps_every_series_the_global_rules_read() -> None:
    regex = keep_regex()
    documents = rule_documents()
    global_rules = [
        rule
        for name, document in documents.items()
        if not is_shard_local(name)
        for group in document["groups"]
        for rule in group["rules"]
    ]
    assert global_rules
    recorded = {rule["record"] for rule in global_rules if "record" in rule}
    # ALERTS and ALERTS_FOR_STATE are the global ruler's own.
    own = recorded | {"ALERTS", "ALERTS_FOR_STATE"}
    missing = {
        name
        for rule in global_rules
        for name in series_read(rule["expr"])
        if name not in own and not re.fullmatch(regex, name)
    }
    assert not missing, f"the global rules read series the shards do not send: {missing}"


def test_the_remote_write_filter_drops_what_only_the_shards_read() -> None:
    regex = keep_regex()
    gpu_reads = {
        name
        for name, document in rule_documents().items()
        if is_shard_local(name)
        for group in document["groups"]
        for rule in group["rules"]
        for name in series_read(rule["expr"])
    }
    assert SHARD_ONLY_SERIES in gpu_reads
    assert SHARD_ONLY_SERIES not in global_inputs()
    assert not re.fullmatch(regex, SHARD_ONLY_SERIES)
    # Anchored: a name that merely contains a kept one is dropped.
    assert re.fullmatch(regex, "up") and not re.fullmatch(regex, "up_total")


@pytest.mark.parametrize(
    ("expr", "series"),
    [
        # label lists, matchers, ranges and offsets
        ('sum by (node, gpu) (rate(DCGM_FI_DEV_XID_ERRORS{job="a", node=~"b|c"}[5m] offset 1h))',
         {"DCGM_FI_DEV_XID_ERRORS"}),
        # keywords, on / ignoring / group_left lists, subqueries, recorded names with colons
        ("max_over_time(up[10m:1m]) > bool 0 and on (instance) gpufleet_gpu_up"
         " unless ignoring (gpu) group_left (job) node:gpufleet_dcgm_gpus:count",
         {"up", "gpufleet_gpu_up", "node:gpufleet_dcgm_gpus:count"}),
        # strings, in either quote, that look like series names
        ('label_replace(gpu:x:y, "dst", "$1 up", "src", "(.*)") or sum(x{a=\'up\'})',
         {"gpu:x:y", "x"}),
        # functions, numbers, Inf and NaN, @ start()
        ("histogram_quantile(0.9, sum without (pod) (rate(a_bucket[5m]))) * 1e3 + Inf - NaN",
         {"a_bucket"}),
        ('count_values("value", foo) or topk(3, bar @ start()) or foo offset -5m', {"foo", "bar"}),
        ("time() - last_step_timestamp_seconds > 3600", {"last_step_timestamp_seconds"}),
        ("vector(1)", set()),
    ],
)  # fmt: skip
def test_series_read_names_only_the_series(expr: str, series: set[str]) -> None:
    assert series_read(expr) == series
