"""One documented place to change the rules' defaults: a site YAML of knobs, read by
``python -m gpufleet.rules --config`` and ``gpufleet mixin --config``; the defaults
select gpufleet's agent, dcgm-exporter from its chart and from the GPU Operator."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from gpufleet.cli import main as gpufleet_main
from gpufleet.rules.__main__ import write_all
from gpufleet.rules.config import ConfigError, RulesConfig, config_from_mapping, load_site_config


def selector_regex(config: RulesConfig) -> re.Pattern[str]:
    match = re.fullmatch(r'job=~"(.*)"', config.gpu_selector)
    assert match
    return re.compile(match.group(1))


@pytest.mark.parametrize(
    "job",
    [
        "gpufleet-agent",
        "dcgm-exporter",  # the chart with a release named dcgm-exporter
        "gpu-metrics-dcgm-exporter",  # the chart's service <release>-dcgm-exporter
        "nvidia-dcgm-exporter",  # the GPU Operator
    ],
)
def test_the_default_gpu_selector_matches_every_common_deployment(job: str) -> None:
    assert selector_regex(RulesConfig()).fullmatch(job)


def test_the_default_gpu_selector_does_not_match_other_jobs() -> None:
    for job in ("node-exporter", "kube-state-metrics", "gpufleet-fleet"):
        assert not selector_regex(RulesConfig()).fullmatch(job)


def rule_text(out: Path) -> str:
    return "\n".join(path.read_text() for path in sorted(out.glob("*.rules.yaml")))


def test_a_site_config_changes_job_names_and_node_labels_in_every_rule(tmp_path: Path) -> None:
    site = tmp_path / "site.yaml"
    site.write_text(
        yaml.safe_dump(
            {
                "gpu_selector": 'job="gpu-telemetry"',
                "agent_selector": 'job="gpufleet"',
                "fleet_selector": 'job="ledger"',
                "node_labels": ["kubernetes_node"],
                "xid_window": "15m",
                "severities": {"GpuFleetPcieReplays": "info"},
            }
        )
    )
    out = tmp_path / "rules"
    result = subprocess.run(
        [sys.executable, "-m", "gpufleet.rules", "--config", str(site), "--out", str(out)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    text = rule_text(out)
    for default in ('"gpufleet-agent', ".*dcgm-exporter.*", '"gpufleet-fleet"', '"Hostname"'):
        assert default not in text, default
    assert 'job="gpu-telemetry"' in text and 'job="ledger"' in text
    assert '"node", "$1", "kubernetes_node", "(.+)"' in text
    assert "gpu:gpufleet_gpu_xid_errors:new15m" in text
    documents = [yaml.safe_load(path.read_text()) for path in out.glob("*.rules.yaml")]
    pcie = next(
        rule
        for document in documents
        for group in document["groups"]
        for rule in group["rules"]
        if rule.get("alert") == "GpuFleetPcieReplays"
    )
    assert pcie["labels"]["severity"] == "info"


def test_gpufleet_mixin_writes_the_same_rules(tmp_path: Path) -> None:
    site = tmp_path / "site.yaml"
    site.write_text("node_labels: [hostname]\nagent_presence: off\n")
    assert gpufleet_main(["mixin", "--config", str(site), "--out", str(tmp_path / "a")]) == 0
    write_all(tmp_path / "b", load_site_config(site))
    assert rule_text(tmp_path / "a") == rule_text(tmp_path / "b")
    assert "GpuFleetAgentTargetsMissing" not in rule_text(tmp_path / "a")


def test_a_misspelled_knob_is_an_error_naming_it_and_the_fix(tmp_path: Path) -> None:
    with pytest.raises(
        ConfigError, match=r"unknown knob 'gpu_selectr'; did you mean 'gpu_selector'"
    ):
        config_from_mapping({"gpu_selectr": 'job="x"'})
    site = tmp_path / "site.yaml"
    site.write_text("xid_windw: 5m\n")
    with pytest.raises(SystemExit) as exit_info:
        gpufleet_main(["mixin", "--config", str(site), "--out", str(tmp_path / "out")])
    assert exit_info.value.code == 2
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    ("knobs", "message"),
    [
        ({"xid_window": "ten minutes"}, "xid_window must be a Prometheus duration"),
        ({"straggler_ratio": "high"}, "straggler_ratio must be a number"),
        ({"remaps_climbing_min": 2.5}, "remaps_climbing_min must be a whole number"),
        ({"agent_presence": "maybe"}, "agent_presence must be one of seen, required, off"),
        ({"gpu_selector": '{job="x"}'}, "gpu_selector must be label matchers without braces"),
        ({"node_labels": "Hostname"}, "node_labels must be a list of label names"),
        ({"node_labels": ["host-name"]}, "'host-name' is not a label name"),
        ({"severities": {"GpuFleetGpuLost": "page"}}, "must be critical, warning or info"),
    ],
)
def test_ill_typed_knobs_are_errors_naming_the_knob(knobs: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(message)):
        config_from_mapping(knobs)


def test_a_site_file_that_is_not_a_mapping_is_refused(tmp_path: Path) -> None:
    site = tmp_path / "site.yaml"
    site.write_text("- gpu_selector\n")
    with pytest.raises(ConfigError, match="expected a mapping"):
        load_site_config(site)
    with pytest.raises(ConfigError, match="cannot read"):
        load_site_config(tmp_path / "missing.yaml")


@pytest.mark.parametrize("mode", ["seen", "required", "off"])
def test_presence_modes(tmp_path: Path, mode: str) -> None:
    config = config_from_mapping({"ledger_presence": mode, "agent_presence": mode})
    text = rule_text(Path(*write_all(tmp_path, config)[:1]).parent)
    if mode == "off":
        assert "GpuFleetLedgerTargetMissing" not in text
        assert "GpuFleetAgentTargetsMissing" not in text
    elif mode == "required":
        assert 'absent(up{job="gpufleet-fleet"})' in text
    else:
        assert "max_over_time(fleet:gpufleet_ledger_targets:count[1d])" in text
        assert "absent(" not in text
