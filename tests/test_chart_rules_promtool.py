"""The chart's PrometheusRules as the Prometheus Operator hands them to Prometheus: each
object's ``spec`` (its rule groups) becomes one rule file, and ``promtool check rules``
of Prometheus 2 and 3 must accept every one (issue 41: kube-prometheus-stack ships
Prometheus 3 since its v67). The chart renders with helm, as tests/test_helm_chart.py
does; that file proves the specs equal alerts/, this one that both Prometheus majors
load them.
"""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from deploy_tools import CHART, helm
from gpufleet.lab.processes import find_binary

MONITORING_VALUES = CHART / "ci" / "monitoring-values.yaml"


def rendered_rules() -> list[dict[str, Any]]:
    result = subprocess.run(
        [str(helm()), "template", "gpufleet", str(CHART), "--namespace", "gpufleet",
         "-f", str(MONITORING_VALUES)],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    docs = [doc for doc in yaml.safe_load_all(result.stdout) if doc]
    return [doc for doc in docs if doc["kind"] == "PrometheusRule"]


def spec_files(directory: Path, rules: list[dict[str, Any]]) -> list[Path]:
    """Each PrometheusRule's spec as a rule file, named after the object."""
    directory.mkdir(parents=True, exist_ok=True)
    files = []
    for rule in rules:
        path = directory / f"{rule['metadata']['name']}.rules.yaml"
        path.write_text(yaml.safe_dump(rule["spec"], sort_keys=False))
        files.append(path)
    return files


def check_rules(files: list[Path]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [find_binary("promtool"), "check", "rules", *map(str, files)],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip


@pytest.fixture(scope="module")
def chart_rules() -> list[dict[str, Any]]:
    rules = rendered_rules()
    # One PrometheusRule per rule file the chart carries, every one with groups.
    shipped = sorted((CHART / "files" / "rules").glob("*.rules.yaml"))
    assert shipped and len(rules) == len(shipped)
    assert all(rule["spec"]["groups"] for rule in rules)
    return rules


@pytest.mark.prometheus("2", "3")
def test_promtool_accepts_every_prometheus_rule_of_the_chart(
    tmp_path: Path, chart_rules: list[dict[str, Any]], prometheus_major: str
) -> None:
    version = subprocess.run(
        [find_binary("promtool"), "--version"], capture_output=True, text=True, check=False
    ).stdout
    assert f"version {prometheus_major}." in version, version
    files = spec_files(tmp_path, chart_rules)
    result = check_rules(files)
    assert result.returncode == 0, result.stdout + result.stderr
    rule_count = sum(
        len(group["rules"]) for rule in chart_rules for group in rule["spec"]["groups"]
    )
    checked = sum(
        int(line.split("SUCCESS: ")[1].split()[0])
        for line in result.stdout.splitlines()
        if "SUCCESS: " in line
    )
    assert checked == rule_count, result.stdout


@pytest.mark.prometheus("2", "3")
def test_promtool_refuses_a_broken_prometheus_rule(
    tmp_path: Path, chart_rules: list[dict[str, Any]], prometheus_major: str
) -> None:
    broken = yaml.safe_load(yaml.safe_dump(chart_rules[0]))
    broken["spec"]["groups"][0]["rules"][0]["expr"] = "rate(up[5m]"
    result = check_rules(spec_files(tmp_path, [broken]))
    assert result.returncode != 0
    assert "FAILED" in result.stdout + result.stderr
