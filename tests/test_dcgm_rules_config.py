"""One documented place to change the rules' defaults: a site YAML of knobs, read by
``python -m gpufleet.rules --config`` and ``gpufleet mixin --config``; the defaults
select gpufleet's agent, dcgm-exporter from its chart and from the GPU Operator."""

from __future__ import annotations

import re
import subprocess
import sys
from dataclasses import fields, replace
from pathlib import Path

import pytest
import yaml

from gpufleet.cli import main as gpufleet_main
from gpufleet.rules.__main__ import write_rules
from gpufleet.rules.common import Record, not_from
from gpufleet.rules.config import ConfigError, RulesConfig, config_from_mapping, load_site_config
from gpufleet.rules.gpu import GpuSeries, gpu_recording


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
    write_rules(tmp_path / "b", load_site_config(site))
    assert rule_text(tmp_path / "a") == rule_text(tmp_path / "b")
    assert "GpuFleetAgentTargetsMissing" not in rule_text(tmp_path / "a")


def assert_mixin_refuses(tmp_path: Path, site_yaml: str) -> Path:
    """``gpufleet mixin`` exits 2 on this site file and writes nothing; the file's path."""
    site = tmp_path / "site.yaml"
    site.write_text(site_yaml)
    with pytest.raises(SystemExit) as exit_info:
        gpufleet_main(["mixin", "--config", str(site), "--out", str(tmp_path / "out")])
    assert exit_info.value.code == 2
    assert not (tmp_path / "out").exists()
    return site


def test_a_misspelled_knob_is_an_error_naming_it_and_the_fix(tmp_path: Path) -> None:
    with pytest.raises(
        ConfigError, match=r"unknown knob 'gpu_selectr'; did you mean 'gpu_selector'"
    ):
        config_from_mapping({"gpu_selectr": 'job="x"'})
    assert_mixin_refuses(tmp_path, "xid_windw: 5m\n")


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
    text = rule_text(Path(*write_rules(tmp_path, config)[:1]).parent)
    if mode == "off":
        assert "GpuFleetLedgerTargetMissing" not in text
        assert "GpuFleetAgentTargetsMissing" not in text
    elif mode == "required":
        assert 'absent(up{job="gpufleet-fleet"})' in text
    else:
        assert "max_over_time(fleet:gpufleet_ledger_targets:count[1d])" in text
        assert "absent(" not in text


# A raw GPU series (not a recorded one, whose names carry a colon) and its matchers.
GPU_SERIES = re.compile(
    r"(?<![:\w])(DCGM_FI_\w+|DCGM_EXP_\w+|gpufleet_gpu_\w+|gpufleet_gpus_\w+)\{([^}]*)\}"
)


def gpu_selections(out: Path) -> dict[str, list[str]]:
    """Per rule file, the matchers of every raw GPU series its expressions select."""
    found: dict[str, list[str]] = {}
    for path in sorted(out.glob("*.rules.yaml")):
        for group in yaml.safe_load(path.read_text())["groups"]:
            for rule in group["rules"]:
                for match in GPU_SERIES.finditer(rule["expr"]):
                    found.setdefault(path.name, []).append(match.group(2))
    return found


def test_a_site_job_name_is_the_selector_of_every_gpu_series_in_every_rule_file(
    tmp_path: Path,
) -> None:
    site = tmp_path / "site.yaml"
    site.write_text("gpu_selector: 'job=\"gpu-telemetry\"'\n")
    out = tmp_path / "rules"
    assert gpufleet_main(["mixin", "--config", str(site), "--out", str(out)]) == 0
    selections = gpu_selections(out)
    # GPU series are read by the GPU rules, the node rules (health signals, missing GPUs)
    # and the dashboards' support rules; each of those selects them in many rules.
    assert {"gpu.rules.yaml", "node.rules.yaml", "dashboards.rules.yaml"} <= set(selections)
    for name, matchers in selections.items():
        for matcher in matchers:
            assert matcher.startswith('job="gpu-telemetry"'), (name, matcher)
    # The same check on the defaults finds the default job, so it can tell them apart.
    defaults = gpu_selections(Path(*write_rules(tmp_path / "defaults")[:1]).parent)
    assert all(m.startswith("job=~") for ms in defaults.values() for m in ms)


RECORDED = re.compile(r"(?<![\w:])[a-z]+:[A-Za-z0-9_]+:[A-Za-z0-9_]+(?![\w:])")


def test_other_windows_rename_each_recorded_series_where_it_is_recorded_and_read(
    tmp_path: Path,
) -> None:
    """Each recorded series is named once: with every window and naming knob changed, every
    series an expression reads is still one that a rule records, and promtool accepts it."""
    config = config_from_mapping(
        {
            "rate_window": "3m",
            "step_window": "90s",
            "xid_window": "15m",
            "ecc_window": "20m",
            "pcie_window": "2h",
            "nvlink_window": "20m",
            "remaps_climbing_window": "12h",
            "health_nvlink_window": "45m",
            "health_sbe_window": "2h",
            "hang_memory": "3h",
            "hang_step_window": "2h",
            "baseline_window": "3h",
            "data_wait_window": "20m",
            "job_slowdown_quantile": 0.3,
            "job_slowdown_window": "15m",
            "checkpoint_window": "1h",
            "checkpoint_op_window": "2h",
            "checkpoint_daly_window": "2d",
            "reliability_window": "28d",
            "repeat_offender_window": "14d",
            "concentration_top_nodes": 5,
            "gpus_expected_memory": "2d",
        }
    )
    paths = write_rules(tmp_path, config)
    documents = [yaml.safe_load(path.read_text()) for path in paths]
    rules = [rule for doc in documents for group in doc["groups"] for rule in group["rules"]]
    recorded = {rule["record"] for rule in rules if "record" in rule}
    read = {name for rule in rules for name in RECORDED.findall(rule["expr"])}
    assert len(read) > 40  # the check sees the reads
    assert read - recorded == set()
    for default_window in ("rate5m", "rate2m", "new10m", "avg1h", "increase30d", "top3_share"):
        assert not any(default_window in name for name in recorded | read), default_window
    assert "fleet:gpufleet_fleet_exclusions:top5_share28d" in recorded
    # 28 days are 672 hours: the MTBF series count hours of the same window
    assert any("* 672\n" in rule["expr"] for rule in rules if "record" in rule)
    check = subprocess.run(
        ["promtool", "check", "rules", *map(str, paths)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert check.returncode == 0, check.stdout + check.stderr


def test_every_string_and_number_knob_is_validated() -> None:
    defaults = RulesConfig()
    for item in fields(RulesConfig):
        value = getattr(defaults, item.name)
        if isinstance(value, str):
            bad: object = "not valid!"
        elif isinstance(value, int | float) and not isinstance(value, bool):
            bad = -1
        else:
            continue
        with pytest.raises(ConfigError, match=re.escape(item.name)):
            config_from_mapping({item.name: bad})


@pytest.mark.parametrize(
    ("knobs", "message"),
    [
        ({"health_nvlink_window": "30 min"}, "health_nvlink_window must be a Prometheus duration"),
        ({"reliability_window": "month"}, "reliability_window must be a Prometheus duration"),
        ({"data_wait_share": 1.5}, "data_wait_share is a fraction"),
        ({"job_slowdown_quantile": 25}, "job_slowdown_quantile is a fraction"),
        ({"mad_floor": -0.1}, "mad_floor must be a finite number, not negative"),
        ({"runbook_url": "https://example.com/runbook"}, "runbook_url must hold {anchor}"),
        ({"gpu_presence_metric": "GPU TEMP"}, "gpu_presence_metric must be a metric name"),
    ],
)
def test_malformed_knobs_are_refused_naming_the_knob(
    knobs: dict[str, object], message: str
) -> None:
    with pytest.raises(ConfigError, match=re.escape(message)):
        config_from_mapping(knobs)


def test_a_config_made_in_code_is_validated_too() -> None:
    with pytest.raises(ConfigError, match="RulesConfig: xid_window must be a Prometheus duration"):
        replace(RulesConfig(), xid_window="ten minutes")


def test_a_severity_for_an_alert_that_does_not_exist_is_refused(tmp_path: Path) -> None:
    site = assert_mixin_refuses(tmp_path, "severities:\n  GpuFleetPcieReplay: info\n")
    with pytest.raises(ConfigError, match="did you mean 'GpuFleetPcieReplays'"):
        write_rules(tmp_path / "out", load_site_config(site))
    # An alert the site turned off may still be given a severity (it is a real alert).
    config = config_from_mapping(
        {"ledger_presence": "off", "severities": {"GpuFleetLedgerTargetMissing": "info"}}
    )
    assert write_rules(tmp_path / "off", config)


@pytest.mark.parametrize(
    ("interval", "step", "untimed"),
    [(15, "2m", "1m"), (30, "2m", "2m"), (60, "4m", "4m")],
)
def test_the_short_windows_follow_the_scrape_interval(
    interval: int, step: str, untimed: str
) -> None:
    """At four scrapes a window, a site that scrapes every 60 s gets 4-minute step windows
    (on Prometheus 3 a 2-minute one holds two samples, one after a missed scrape)."""
    config = config_from_mapping({"scrape_interval_seconds": interval})
    assert (config.step_window, config.job_slowdown_untimed_step_window) == (step, untimed)
    assert config_from_mapping({}) == RulesConfig()


def test_at_60_s_the_two_step_windows_are_one_recorded_series(tmp_path: Path) -> None:
    paths = write_rules(tmp_path, config_from_mapping({"scrape_interval_seconds": 60}))
    training = (tmp_path / "training.rules.yaml").read_text()
    records = re.findall(r"record: (\S+)", training)
    assert len(records) == len(set(records))
    assert "job:gpufleet_training_step_seconds:rate4m" in records
    assert not re.search(r"rate[12]m\b", training)
    check = subprocess.run(
        ["promtool", "check", "rules", *map(str, paths)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert check.returncode == 0, check.stdout + check.stderr


@pytest.mark.parametrize(
    ("knobs", "message"),
    [
        (
            {"scrape_interval_seconds": 60, "step_window": "2m"},
            "scrape_interval_seconds is 60: step_window (2m) would hold fewer than 4 scrapes; "
            "set it to 4m or more",
        ),
        (
            {"scrape_interval_seconds": 120},
            "rate_window (5m), job_slowdown_untimed_window (5m), job_slowdown_hold_window (5m) "
            "would hold fewer than 4 scrapes; set each to 8m or more",
        ),
        ({"xid_window": "30s"}, "scrape_interval_seconds is 15: xid_window (30s)"),
        ({"scrape_interval_seconds": 0}, "scrape_interval_seconds must be 1 or more"),
        ({"scrape_interval_seconds": "15s"}, "scrape_interval_seconds must be a number"),
        ({"dashboard_interval": "5m"}, "dashboard_interval (5m) must be shorter than"),
        ({"gpu_recording_interval": "10m"}, "gpu_recording_interval (10m) must be shorter than"),
    ],
)
def test_a_window_shorter_than_four_scrapes_or_an_interval_past_the_lookback_is_refused(
    knobs: dict[str, object], message: str
) -> None:
    with pytest.raises(ConfigError, match=re.escape(message)):
        config_from_mapping(knobs)


def test_a_slow_scrape_with_its_windows_set_is_accepted() -> None:
    windows = dict.fromkeys(
        ("rate_window", "job_slowdown_untimed_window", "job_slowdown_hold_window"), "8m"
    )
    config = config_from_mapping({"scrape_interval_seconds": 120, **windows})
    assert (config.step_window, config.job_slowdown_untimed_step_window) == ("8m", "8m")


@pytest.mark.parametrize(
    ("selector", "negated"),
    [
        ('job="gpufleet-agent"', 'job!="gpufleet-agent"'),
        (' job =~ "agent-.*" ', 'job!~"agent-.*"'),
        ('job!="x"', 'job="x"'),
        ('job!~"x|y"', 'job=~"x|y"'),
        ('job="a", cluster="b"', ""),  # not(a and b) is no single matcher
        ("", ""),
    ],
)
def test_not_from_negates_a_single_matcher_only(selector: str, negated: str) -> None:
    assert not_from(selector) == negated


def test_the_dcgm_exporter_fallbacks_skip_the_agents_own_series() -> None:
    """dcgm-exporter's XID, clock-event and presence fallbacks select the GPU jobs other
    than the agent's (the agent exports the same DCGM names for every GPU it has); with
    an agent selector of several matchers they select every GPU job, as before."""
    names = "|".join(
        re.escape(name)
        for name in ("DCGM_FI_DEV_XID_ERRORS", "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS",
                     "DCGM_FI_DEV_GPU_TEMP", "DCGM_EXP_XID_ERRORS_COUNT")
    )  # fmt: skip

    def selections(config: RulesConfig) -> set[str]:
        series = GpuSeries.of(config)
        fallbacks = (series.xid_changed, series.xid_new, series.dcgm_reasons, series.dcgm_gpus)
        text = "\n".join(
            rule.expr
            for rule in gpu_recording(config)
            if isinstance(rule, Record) and rule.record in fallbacks
        )
        return {found.group(1) for found in re.finditer(rf"(?:{names})\{{([^}}]*)\}}", text)}

    gpus = 'job=~"gpufleet-agent|.*dcgm-exporter.*"'
    assert selections(RulesConfig()) == {
        f'{gpus}, job!="gpufleet-agent"',
        f'{gpus}, job!="gpufleet-agent", xid!=""',
    }
    several = RulesConfig(agent_selector='job="gpufleet-agent", cluster="a"')
    assert selections(several) == {gpus, f'{gpus}, xid!=""'}
