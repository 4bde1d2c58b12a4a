"""The rules: promtool checks and unit tests, generated files in sync, and conventions."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpufleet.lab.processes import find_binary
from gpufleet.rules.__main__ import write_rules
from gpufleet.rules.build import SHARD_LOCAL_FILES
from gpufleet.schema.alerts import AlertName

ALERTS_DIR = Path(__file__).resolve().parents[1] / "alerts"
RULE_FILES = sorted(ALERTS_DIR.glob("*.rules.yaml"))
TEST_FILES = sorted((ALERTS_DIR / "tests").glob("*.test.yaml"))


def rules() -> list[dict[str, Any]]:
    found = []
    for path in RULE_FILES:
        for group in yaml.safe_load(path.read_text())["groups"]:
            for rule in group["rules"]:
                found.append({**rule, "_group": group["name"], "_file": path.name})
    return found


def alerts() -> list[dict[str, Any]]:
    return [rule for rule in rules() if "alert" in rule]


@pytest.mark.prometheus("2", "3")
def test_promtool_checks_every_rule_file(prometheus_major: str) -> None:
    result = subprocess.run(
        [find_binary("promtool"), "check", "rules", *map(str, RULE_FILES)],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    assert len(RULE_FILES) == 7


def vmalert_dry_run(files: list[Path]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [find_binary("vmalert"), "-dryRun", *(f"-rule={path}" for path in files)],
        capture_output=True, text=True, check=False,
    )  # fmt: skip


@pytest.mark.prometheus("2", "3")
def test_vmalert_accepts_every_rule_file_unchanged(tmp_path: Path, prometheus_major: str) -> None:
    result = vmalert_dry_run(RULE_FILES)
    assert result.returncode == 0, result.stdout + result.stderr
    broken = tmp_path / "broken.rules.yaml"
    broken.write_text("groups:\n- name: x\n  rules:\n  - alert: Bad\n    expr: sum(rate(x[5m])\n")
    assert vmalert_dry_run([*RULE_FILES, broken]).returncode != 0


@pytest.mark.prometheus("2", "3")
@pytest.mark.parametrize("test_file", TEST_FILES, ids=lambda path: path.name)
def test_promtool_unit_tests(test_file: Path, prometheus_major: str) -> None:
    result = subprocess.run(
        [find_binary("promtool"), "test", "rules", test_file.name],
        capture_output=True, text=True, check=False, cwd=test_file.parent,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr


def test_committed_rule_files_are_what_the_code_generates(tmp_path: Path) -> None:
    for path in write_rules(tmp_path):
        committed = ALERTS_DIR / path.name
        assert committed.exists(), f"{path.name} is generated but not committed"
        assert committed.read_text() == path.read_text(), (
            f"run `make generate`: {path.name} differs"
        )


def test_alert_conventions() -> None:
    runbook = (ALERTS_DIR / "RUNBOOK.md").read_text()
    anchors = {heading.strip().lower() for heading in re.findall(r"^## (.+)$", runbook, re.M)}
    names = [alert["alert"] for alert in alerts()]
    assert len(names) == len(set(names)), "an alert name is used twice"
    for alert in alerts():
        name = alert["alert"]
        assert re.fullmatch(r"GpuFleet[A-Z][A-Za-z]+", name) and len(name) <= 40, name
        assert alert["labels"]["severity"] in {"critical", "warning", "info"}, name
        annotations = alert["annotations"]
        assert "{{" not in annotations["summary"] and annotations["summary"].endswith("."), name
        assert "{{" in annotations["description"], f"{name}: the description names nothing"
        anchor = annotations["runbook_url"].rsplit("#", 1)[1]
        assert anchor == name.lower() and anchor in anchors, f"{name}: no runbook section"


def test_recording_rule_names_and_group_sizes() -> None:
    for rule in rules():
        if "record" in rule:
            assert re.fullmatch(r"[a-z]+:[A-Za-z0-9_]+:[a-z0-9_]+", rule["record"]), rule["record"]
    for path in RULE_FILES:
        for group in yaml.safe_load(path.read_text())["groups"]:
            assert len(group["rules"]) <= 20, f"{group['name']} has {len(group['rules'])} rules"


def test_every_alert_has_a_firing_test_and_a_silent_test() -> None:
    fires: set[str] = set()
    silent: set[str] = set()
    for path in TEST_FILES:
        for group in yaml.safe_load(path.read_text())["tests"]:
            assert group.get("name"), f"{path.name}: every test group is named"
            for case in group.get("alert_rule_test", []):
                (fires if case.get("exp_alerts") else silent).add(case["alertname"])
    names = {alert["alert"] for alert in alerts()}
    assert names - fires == set(), "alerts never tested firing"
    assert names - silent == set(), "alerts never tested silent"


def test_the_rules_define_every_alert_name_and_no_other() -> None:
    names = {alert["alert"] for alert in alerts()}
    assert {str(alert) for alert in AlertName} == names


AGGREGATION = re.compile(
    r"\b(sum|min|max|avg|count|group|stddev|stdvar|quantile|topk|bottomk|count_values)\s*"
    r"(?:(by|without)\s*\(([^)]*)\))?\s*\("
)


def shard_placement_problems(rule_list: list[dict[str, Any]]) -> list[str]:
    """What stops the shard-local files from running on a shard that holds only some
    nodes: a recorded series from a global file, an aggregation that may cross nodes."""
    recorded_in = {
        rule["record"]: rule["_file"].split(".")[0] for rule in rule_list if "record" in rule
    }
    problems = []
    for rule in rule_list:
        if rule["_file"].split(".")[0] not in SHARD_LOCAL_FILES:
            continue
        name = rule.get("record") or rule["alert"]
        expr = re.sub(r'"(?:[^"\\]|\\.)*"', '""', rule["expr"])
        for used in re.findall(r"[a-zA-Z_:][a-zA-Z0-9_:]*", expr):
            if recorded_in.get(used, "gpu") not in SHARD_LOCAL_FILES:
                problems.append(f"{name} reads {used}, recorded in {recorded_in[used]}.rules.yaml")
        if re.search(r"\babsent\s*\(", expr):
            problems.append(f"{name}: absent() looks across every node")
        for operator, clause, labels in AGGREGATION.findall(expr):
            named = {label.strip() for label in labels.split(",")}
            # a GPU's UUID is unique and belongs to one node; `without` keeps every
            # label it does not name (ALERTS of a per-GPU alert: its UUID)
            within = {"node", "instance", "UUID"}
            per_node = (
                named & within if clause == "by" else clause == "without" and not named & within
            )
            if not per_node:
                problems.append(f"{name}: {operator} {clause} ({labels}) may combine nodes")
    return problems


def test_shard_local_rules_stay_within_a_node() -> None:
    assert shard_placement_problems(rules()) == []


def test_the_shard_placement_check_finds_a_job_level_aggregation() -> None:
    job_level = {
        "alert": "JobLevel",
        "expr": 'count by (training_job, xid) (gpu:gpufleet_gpu_xid_errors:new10m{x="a,b"})',
        "_file": "gpu.rules.yaml",
    }
    global_read = {
        "record": "gpu:bad:x",
        "expr": "max by (node) (node:gpufleet_training_compute_ratio:rate5m)",
        "_file": "gpu.rules.yaml",
    }
    problems = shard_placement_problems([*rules(), job_level, global_read])
    assert len(problems) == 2
    assert "JobLevel: count by (training_job, xid) may combine nodes" in problems[0]
    assert "training.rules.yaml" in problems[1]
