"""The sharded layout of docs/SCALING.md as data: which rule files run on the shards
and which on the global ruler, how a shard keeps its nodes, and what a shard must
remote-write for the global ruler (the series the global files read, nothing else).

The chart renders these, the scale benchmark and the live test run them, and a test
holds the remote-write filter to what the generated global files actually read.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any

from gpufleet.rules.build import SHARD_LOCAL_FILES, rule_files
from gpufleet.rules.common import Alert
from gpufleet.rules.config import RulesConfig

# Kubernetes: the pod's node. A node's gpufleet agent and its dcgm-exporter must land on
# the same shard (the per-GPU rules join them), so the hash is over the node, not the
# address. Outside Kubernetes, any label that names the node (``instance`` when it is
# the node's host name, as in the simulator's targets).
NODE_SOURCE_LABEL = "__meta_kubernetes_pod_node_name"

# PromQL words that are not series names.
_KEYWORDS = frozenset(
    {"by", "without", "on", "ignoring", "group_left", "group_right", "bool", "and", "or",
     "unless", "offset", "inf", "nan", "atan2", "start", "end"}
)  # fmt: skip
_STRING = re.compile(r'"(?:[^"\\]|\\.)*"' + r"|'(?:[^'\\]|\\.)*'")
_MATCHERS = re.compile(r"\{[^{}]*\}")
_RANGE = re.compile(r"\[[^\]]*\]")
_LABEL_LIST = re.compile(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^()]*\)")
_NAME = re.compile(r"(?<![\w:.])([a-zA-Z_:][a-zA-Z0-9_:]*)\b(?!\s*\()")


def series_read(expr: str) -> set[str]:
    """The metric names a PromQL expression selects (function names, keywords, label
    names and strings left out)."""
    text = _STRING.sub('""', expr)
    text = _MATCHERS.sub("", text)
    text = _RANGE.sub("", text)
    text = _LABEL_LIST.sub("", text)
    names = set(_NAME.findall(text))
    return {name for name in names if name.lower() not in _KEYWORDS}


def is_shard_local(file_name: str) -> bool:
    """``gpu`` or ``gpu.rules.yaml``: does this rule file run on every shard?"""
    return file_name.split(".", maxsplit=1)[0] in SHARD_LOCAL_FILES


def global_inputs(config: RulesConfig | None = None) -> set[str]:
    """Every series the global rule files read that they do not record themselves:
    what the shards must send the global ruler. ``ALERTS`` is the global ruler's own."""
    read: set[str] = set()
    recorded: set[str] = set()
    for rule_file in rule_files(config):
        if is_shard_local(rule_file.name):
            continue
        for group in rule_file.groups:
            for rule in group.rules:
                document = (
                    rule.as_dict(config or RulesConfig())
                    if isinstance(rule, Alert)
                    else rule.as_dict()
                )
                read |= series_read(str(document["expr"]))
                if "record" in document:
                    recorded.add(str(document["record"]))
    return read - recorded - {"ALERTS", "ALERTS_FOR_STATE"}


def keep_regex(names: Iterable[str]) -> str:
    """One anchored alternation (Prometheus anchors relabel regexes) of ``names``,
    sorted so that the generated configuration is stable."""
    return "|".join(re.escape(name).replace("\\:", ":") for name in sorted(set(names)))


def remote_write_relabel_configs(config: RulesConfig | None = None) -> list[dict[str, Any]]:
    """A shard's ``write_relabel_configs``: only the series the global files read."""
    return [
        {"source_labels": ["__name__"], "regex": keep_regex(global_inputs(config)),
         "action": "keep"}
    ]  # fmt: skip


def shard_relabel_configs(
    index: int, shards: int, source_label: str = NODE_SOURCE_LABEL
) -> list[dict[str, Any]]:
    """A scrape job's ``relabel_configs`` keeping the targets of shard ``index`` of
    ``shards``: a hash of the node, so a node's exporters share a shard."""
    if not 0 <= index < shards:
        raise ValueError(f"shard {index} of {shards}: the index runs from 0 to {shards - 1}")
    return [
        {"source_labels": [source_label], "modulus": shards, "target_label": "__tmp_shard",
         "action": "hashmod"},
        {"source_labels": ["__tmp_shard"], "regex": str(index), "action": "keep"},
    ]  # fmt: skip
