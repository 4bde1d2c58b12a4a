"""Every knob of gpufleet's rules in one place: selectors, thresholds, windows, ``for``
durations, severities. Each expression is built from these, so a threshold is tuned
in one line (then ``make generate``), or per site without touching the code: a YAML
file of knobs (``load_site_config``) read by ``python -m gpufleet.rules --config``
and ``gpufleet mixin --config``."""

from __future__ import annotations

import difflib
import math
import re
from dataclasses import MISSING, dataclass, field, fields, replace
from pathlib import Path
from typing import Any

import yaml

from gpufleet.gpu.xid_catalogue import CATALOGUE, XidEntry

# The XID catalogue the rules read: every code NVIDIA's catalogue documents (codes
# 1-172, as of 2025-10-29) with gpufleet's class, NVIDIA's description and what to do
# (gpu/xid_catalogue.py derives them from NVIDIA's resolution buckets).
XidCode = XidEntry
XID_CATALOGUE: tuple[XidEntry, ...] = CATALOGUE


# One label matcher, as selectors hold them: label, operator, quoted value (groups 1-3).
MATCHER = r'\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*(=~|!~|!=|=)\s*("(?:[^"\\]|\\.)*")\s*'


@dataclass(frozen=True, slots=True)
class RulesConfig:
    # -- selectors: which scrape jobs hold what --------------------------------------
    # GPU series: gpufleet's agent, dcgm-exporter from its chart (the job is the service,
    # `<release>-dcgm-exporter`) and from the GPU Operator (`nvidia-dcgm-exporter`).
    gpu_selector: str = 'job=~"gpufleet-agent|.*dcgm-exporter.*"'
    agent_selector: str = 'job="gpufleet-agent"'
    fleet_selector: str = 'job="gpufleet-fleet"'
    # Labels that name the node on GPU series, first match wins: released dcgm-exporter
    # and gpufleet's agent say `Hostname`, dcgm-exporter's main branch `hostname`. Empty:
    # the series already carry `node` (relabelled at scrape time).
    node_labels: tuple[str, ...] = ("Hostname", "hostname")
    # A GPU "answers" while this per-GPU series is scraped (every counters file has it).
    gpu_presence_metric: str = "DCGM_FI_DEV_GPU_TEMP"
    # GPUs a node should have, on nodes without gpufleet's agent: the most it showed
    # within this window (a 4-GPU node expects 4). A node that stops showing any GPU
    # within it is down. Longer remembers longer, and costs more.
    gpus_expected_memory: str = "1d"
    # Presence alerts per component: "seen" fires when targets that Prometheus scraped
    # within presence_memory are all gone; "required" also when there never were any;
    # "off" drops the alert (a cluster that does not run the component).
    gpu_presence: str = "seen"
    agent_presence: str = "seen"
    ledger_presence: str = "seen"
    presence_memory: str = "1d"

    # -- scraping -------------------------------------------------------------------------------
    # How often Prometheus scrapes gpufleet's agent and the GPU exporters. A site file that
    # sets it moves the short rate windows (SCRAPE_DERIVED_WINDOWS) to WINDOW_SCRAPES
    # intervals where their defaults are shorter, and refuses any window it sets shorter
    # than that (`check_scrape_windows`; the runbook's "Scrape interval" says why four).
    scrape_interval_seconds: int = 15

    # -- alert routing -------------------------------------------------------------------------
    runbook_url: str = "https://github.com/gpufleet/gpufleet/blob/main/alerts/RUNBOOK.md#{anchor}"

    # -- GPU hardware: counters rising over 10 min to 6 h need no 15 s resolution, and these
    # groups read every GPU's series: evaluated once a minute they cost a quarter. The
    # per-GPU alerts run at this interval too: most read these records, which change no
    # more often; a GPU page (lost GPU, XID, row remap) comes at most one interval later.
    gpu_recording_interval: str = "1m"
    # The counters over the health signals' windows (30 minutes to 6 hours: correctable
    # remaps, PCIe replays, SBE ECC, NVLink replays) and GpuFleetRemapsClimbing: a scan of
    # hours of every GPU's samples, which a few minutes more or less hardly move.
    gpu_long_window_interval: str = "3m"
    # -- Records over windows of 15 min to a day (a slow straggler, baselines, checkpoint
    # figures, the node health signals) and the XID catalogue:
    # a minute changes them little; evaluated once a minute they cost a quarter, and what
    # reads them every 15 s sees the last one.
    slow_recording_interval: str = "1m"
    # -- What only dashboards draw (gpufleet-dashboard-support: which node and tenant each
    # GPU is on, fleet utilisation and power, per-node phase and checkpoint rates): no
    # alert reads it, and a panel drawn from a series recorded every 2 minutes still has
    # a point within Prometheus's 5-minute lookback at every step.
    dashboard_interval: str = "2m"
    # -- The training records over windows of 1 to 5 minutes (peer comparison, step time,
    # hangs) and the training alerts: every 30 s, kube-prometheus-stack's own evaluation
    # interval. A 5-minute window moves a tenth in 30 s; at 15 s these groups were half of
    # one Prometheus's rule time at 512 nodes. A straggler or hang page can come up to
    # 15 s later than at 15 s (docs/SCALING.md has the cost of each).
    training_interval: str = "30s"
    # -- GPU hardware ---------------------------------------------------------------------
    # (alerts/RUNBOOK.md, "how it decides", says why each threshold is what it is)
    xid_window: str = "10m"
    ecc_window: str = "10m"
    remap_pending_for: str = "5m"
    remaps_climbing_window: str = "6h"
    remaps_climbing_min: int = 3  # gpufleet's heuristic: NVIDIA sets no threshold
    # NVLink, after DCGM's health check (MonitorNVLink): any replay or recovery error
    # fails a GPU; CRC errors only at 100 a second or more; on NVLink5 (Blackwell) any
    # rise of its recovery, symbol, effective or ECC error counters fails it.
    nvlink_window: str = "10m"
    nvlink_recovery_min: int = 1
    nvlink_replay_min: int = 1
    nvlink_crc_per_second: float = 100.0
    nvlink5_errors_min: int = 1
    # PCIe replays, after DCGM's health check (MonitorPcie): it warns above BER 1e-12 x
    # line rate x lanes a minute, 31 on a Gen5 x16 link; gpufleet has no link width or
    # generation per GPU, so it takes Gen5 x16's budget over the window: above 310 in 10m.
    pcie_window: str = "10m"
    pcie_replays_min: int = 311
    hw_slowdown_for: str = "2m"
    gpu_lost_for: str = "1m"
    gpu_missing_for: str = "2m"
    # A GPU page names the pod (or Slurm job) on the GPU, or the one that left it within
    # this window: the pod an XID killed is gone from the kubelet before the page is made.
    attribution_memory: str = "5m"
    exporter_down_for: str = "2m"

    # -- node health ---------------------------------------------------------------------------
    agent_down_for: str = "2m"
    targets_missing_for: str = "15m"
    telemetry_collapse_for: str = "2m"
    # an excluded node's agent being down is not news once the exclusion is this old
    excluded_quiet_after: str = "30m"
    health_signal_weight: float = 0.5
    health_threshold: float = 1.0  # two weak signals together
    health_for: str = "10m"
    # the weak signals: each a count within its window, or a share of time
    health_remaps_min: int = 1  # correctable remaps within remaps_climbing_window
    health_pcie_window: str = "1h"
    health_pcie_replays_min: int = 2  # within health_pcie_window
    health_nvlink_window: str = "30m"
    health_nvlink_replays_min: int = 1
    health_sbe_window: str = "1h"
    health_sbe_min: int = 100  # single-bit ECC errors
    health_throttle_window: str = "15m"
    # of the window in a software thermal slowdown; sw_power_cap is not a sign: a GPU
    # training at its power limit is capped by design
    health_throttle_share: float = 0.5
    health_slow_ratio: float = 1.05  # compute time against the stage median

    # -- fail-slow -----------------------------------------------------------------------------
    rate_window: str = "5m"
    # A node or job still steps while its steps rose within this window; the job's
    # step time is averaged over it before the steady quantile is taken.
    step_window: str = "2m"
    straggler_ratio: float = 1.10
    straggler_zscore: float = 3.5
    straggler_min_peers: int = 4  # nodes in the stage; below it, compare ranks
    # Ranks a stage of fewer nodes needs for a comparison: with fewer, nothing says which
    # of two is the slow one, and stage:gpufleet_straggler_detection:active says 0 (and why).
    straggler_min_rank_peers: int = 3
    # A rank must also be this many seconds per step slower than its reference: a job of
    # millisecond steps must not page for a millisecond of jitter.
    straggler_min_excess_seconds: float = 0.02
    straggler_for: str = "3m"
    # compute ratio at most this times the tokens ratio: the node's extra work, not its hardware
    straggler_token_match_ratio: float = 1.05
    # Coverage is reported (info) once a stage has been without a comparison this long.
    detection_inactive_for: str = "15m"
    # Subtle stragglers (5-10% slower): the node ratio over a longer window, and the node
    # slower than its own baseline too (relative to the job), so that a node that always
    # ran a little slower, or uneven work across data-parallel ranks, does not page.
    straggler_subtle_window: str = "15m"
    straggler_subtle_ratio: float = 1.04
    straggler_subtle_baseline_ratio: float = 1.03
    # ... and the node's least-clocked GPU at most this share of the job's median node's
    # SM clock over that window: a slower GPU, not a replica given more work (longer
    # sequences), which computes longer at the same clock.
    straggler_subtle_clock_ratio: float = 0.97
    # A data-parallel replica given more work (longer sequences) is one node in every
    # stage, each slower than its peers by about the same: while every stage of two or
    # more nodes has a node at least replica_lean_ratio of its peers, a node within
    # replica_match_ratio of the least of those (the replica's floor) is the replica's
    # work, not slow hardware, and does not page.
    replica_lean_ratio: float = 1.05
    replica_match_ratio: float = 1.05
    # peers that agree closely must not make a tiny difference look huge: MAD floor
    mad_floor: float = 0.005
    baseline_window: str = "2h"
    baseline_offset: str = "30m"
    baseline_ratio: float = 1.10
    baseline_for: str = "10m"
    job_slowdown_ratio: float = 1.10
    # The job's steady step time: this quantile of its 2-minute step times over the
    # window (and over the baseline). Stalls that cover less than (1 - q) of the
    # window do not move it; a slowdown that covers all of it does.
    job_slowdown_quantile: float = 0.25
    job_slowdown_window: str = "10m"
    # A job that times no data wait (step time only) has no stall figure to take off:
    # its steady step time is its fastest stretch of this length over
    # job_slowdown_untimed_window (with the alert's hold, over 10 minutes), and its
    # baseline this quantile of such stretches over the baseline window (about the
    # least of as many as the steady reading takes). One minute, not step_window's
    # two: stalls node after node can leave a minute or so clean between them and
    # never two (517: six stalls in 14 minutes, at most 1.9 minutes apart). A scrape
    # interval too long for two samples in the stretch falls back on step_window.
    job_slowdown_untimed_step_window: str = "1m"
    job_slowdown_untimed_window: str = "5m"
    job_slowdown_untimed_baseline_quantile: float = 0.05
    # The steady baseline needs this many stepped minutes in its window: a job's first
    # minutes (warming up, or counters just started) are no pace to hold it to. Not
    # many more: a job back from a long outage has few in its window (30 left one
    # blind to a 1.22x slow link for half an hour on 516).
    job_slowdown_baseline_min_minutes: int = 20
    job_slowdown_for: str = "3m"
    # The steady step time must stay above the ratio this long before the `for` starts:
    # it is the slowest of every GPU each step, and grazes the ratio now and then.
    job_slowdown_hold_window: str = "5m"
    # Every node's collective wait per step rose over its own baseline by at least this
    # share of the job's step time: a slow network (the least rise of any node, so
    # waiting for one slow or stalled peer does not count).
    job_comm_step_share: float = 0.04
    # Another node's data-loader stall raises every node's wait but its own; stalls on
    # several nodes in one step_window raise every node's. Each node's wait has the
    # other nodes' stalls taken off: a node's data wait per step above the job's least
    # node's, where it exceeds this share of the job's step time (below it, a loader's
    # jitter, which summed over a big job's nodes would hide a slow network).
    job_comm_stall_floor: float = 0.01
    # Each node's collective baseline: this quantile of its step_window waits (one each
    # resolution) over the window ending baseline_offset ago; the mean would carry an
    # earlier slow spell. A longer window than the compute baselines': a slow link that
    # lasts two hours must keep paging, and so must the next one after it.
    job_comm_baseline_quantile: float = 0.1
    job_comm_baseline_window: str = "4h"
    job_comm_baseline_resolution: str = "4m"
    stage_imbalance_ratio: float = 1.20
    stage_imbalance_for: str = "30m"
    hang_step_multiple: float = 10.0
    hang_min_seconds: float = 120.0
    hang_memory: str = "2h"
    hang_step_window: str = "1h"  # the step time a hang is measured against
    hang_for: str = "30s"
    data_wait_window: str = "15m"
    data_wait_share: float = 0.20
    data_wait_peer_multiple: float = 3.0
    data_wait_for: str = "15m"

    # -- parallel layout (rules/layout.py) ------------------------------------------------------
    # A tensor-parallel group across nodes (NVLink domains where the site names them) costs
    # every step; how loudly it pages is the site's (a mistake, not an outage: warning).
    tp_across_nodes_severity: str = "warning"
    tp_across_nodes_for: str = "1m"
    # Pipeline stages holding different numbers of ranks (info): held this long.
    pipeline_uneven_for: str = "10m"

    # -- checkpoints ---------------------------------------------------------------------------
    checkpoint_window: str = "30m"
    checkpoint_queue_share: float = 0.9
    checkpoint_min_writers: int = 8  # "under real load"
    checkpoint_queue_for: str = "5m"
    checkpoint_save_budget_s: float = 600.0
    checkpoint_restore_budget_s: float = 900.0
    # seconds per save or restore, and between saves, averaged over this window
    checkpoint_op_window: str = "1h"
    # the save time that sets Young/Daly's checkpoint interval
    checkpoint_daly_window: str = "1d"

    # -- reliability ---------------------------------------------------------------------------
    repeat_offender_exclusions: int = 2
    repeat_offender_window: str = "7d"
    # exclusions per node and reason, MTBF and Young/Daly's interval look back this far
    reliability_window: str = "30d"
    concentration_top_nodes: int = 3
    concentration_share: float = 0.5  # of the window's exclusions on the top nodes
    concentration_min_exclusions: int = 6
    retry_chain_failed_attempts: int = 3
    ledger_down_for: str = "5m"

    severities: dict[str, str] = field(default_factory=dict)  # alert -> severity overrides

    def __post_init__(self) -> None:
        # Every knob is checked however the config is made (a site file, replace(), code):
        # no rule is ever built from a malformed window or selector.
        for item in fields(self):
            default = item.default
            if item.default_factory is not MISSING:
                default = item.default_factory()
            value = _check_value(item.name, getattr(self, item.name), default, "RulesConfig")
            object.__setattr__(self, item.name, value)

    def severity(self, alert: str, default: str) -> str:
        return self.severities.get(alert, default)


PRESENCE_MODES = ("seen", "required", "off")
_DURATION = re.compile(r"(\d+(ms|s|m|h|d|w|y))+")
_UNIT_SECONDS = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800, "y": 31536000}

# Scrape intervals every range window spans at least: rate() needs two samples, a
# window on Prometheus 3 holds window / interval of them (left-open: one fewer than a
# closed 2.x window whose edge falls on a sample), and a missed or late scrape takes
# one more. Four leave two samples after two losses (Grafana's $__rate_interval takes
# four intervals too).
WINDOW_SCRAPES = 4
# The windows short enough for a scrape interval to reach (the others are 5 minutes or
# more; attribution_memory, 5 minutes, is how long a pod gone from a GPU is still seen
# to hold it): a site file that sets scrape_interval_seconds and not these gets them at
# WINDOW_SCRAPES intervals where their default is shorter.
SCRAPE_DERIVED_WINDOWS = ("step_window", "job_slowdown_untimed_step_window", "attribution_memory")


# Prometheus's default lookback (--query.lookback-delta): a recorded series is read for
# this long after its last evaluation, so a group must run more often than this.
LOOKBACK_SECONDS = 300


def duration_seconds(text: str) -> float:
    """Seconds in a Prometheus duration such as ``1h30m``."""
    return sum(
        int(number) * _UNIT_SECONDS[unit]
        for number, unit in re.findall(r"(\d+)(ms|s|m|h|d|w|y)", text)
    )


def format_duration(seconds: int) -> str:
    """A whole number of seconds as the shortest Prometheus duration: 240 -> 4m."""
    for unit in ("d", "h", "m"):
        if seconds % _UNIT_SECONDS[unit] == 0:
            return f"{seconds // int(_UNIT_SECONDS[unit])}{unit}"
    return f"{seconds}s"


def range_windows(config: RulesConfig) -> dict[str, str]:
    """Every knob the rules use as a range window, by name (``_window``, ``_memory``)."""
    return {
        item.name: getattr(config, item.name)
        for item in fields(config)
        if item.name.endswith(("_window", "_memory"))
    }


def check_scrape_windows(config: RulesConfig, source: str = "RulesConfig") -> None:
    """Refuse a config whose range windows are shorter than WINDOW_SCRAPES scrape
    intervals, naming each such window and the least it may be."""
    least = WINDOW_SCRAPES * config.scrape_interval_seconds
    short = [
        f"{name} ({value})"
        for name, value in range_windows(config).items()
        if duration_seconds(value) < least
    ]
    if short:
        raise ConfigError(
            f"{source}: scrape_interval_seconds is {config.scrape_interval_seconds}: "
            f"{', '.join(short)} would hold fewer than {WINDOW_SCRAPES} scrapes; set "
            f"{'each' if len(short) > 1 else 'it'} to {format_duration(least)} or more"
        )


class ConfigError(ValueError):
    """A site configuration that cannot be used; the message names the knob."""


def _check_value(name: str, value: Any, default: Any, source: str) -> Any:
    where = f"{source}: {name}"
    if isinstance(default, bool):
        if not isinstance(value, bool):
            raise ConfigError(f"{where} must be true or false, got {value!r}")
        return value
    if isinstance(default, int | float) and not isinstance(default, bool):
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ConfigError(f"{where} must be a number, got {value!r}")
        if isinstance(default, int) and not isinstance(value, int):
            raise ConfigError(f"{where} must be a whole number, got {value!r}")
        if not math.isfinite(value) or value < 0:
            raise ConfigError(f"{where} must be a finite number, not negative, got {value!r}")
        if name == "scrape_interval_seconds" and value == 0:
            raise ConfigError(f"{where} must be 1 or more, got {value!r}")
        if name.endswith(("_share", "_quantile")) and value > 1:
            raise ConfigError(f"{where} is a fraction: it must be between 0 and 1, got {value!r}")
        return value
    if isinstance(default, tuple):
        if not isinstance(value, list | tuple) or not all(isinstance(item, str) for item in value):
            raise ConfigError(f"{where} must be a list of label names, got {value!r}")
        for item in value:
            if not re.fullmatch(r"[a-zA-Z_][a-zA-Z0-9_]*", item):
                raise ConfigError(f"{where}: {item!r} is not a label name")
        return tuple(value)
    if isinstance(default, dict):
        if not isinstance(value, dict):
            raise ConfigError(f"{where} must be a mapping (alert: severity), got {value!r}")
        for alert, severity in value.items():
            if severity not in ("critical", "warning", "info"):
                raise ConfigError(
                    f"{where}.{alert} must be critical, warning or info, got {severity!r}"
                )
        return dict(value)
    if name.endswith("_presence") and value is False:
        return "off"  # YAML reads an unquoted off as false
    if not isinstance(value, str):
        raise ConfigError(f"{where} must be a string, got {value!r}")
    durations = ("_window", "_for", "_memory", "_offset", "_after", "_interval", "_resolution")
    if name.endswith(durations) and not _DURATION.fullmatch(value):
        raise ConfigError(f"{where} must be a Prometheus duration such as 5m or 1h, got {value!r}")
    if name.endswith("_interval") and duration_seconds(value) >= LOOKBACK_SECONDS:
        raise ConfigError(
            f"{where} ({value}) must be shorter than Prometheus's 5m lookback: a series its "
            "groups record would vanish between evaluations for the rules and panels that read it"
        )
    if name == "runbook_url" and (
        "{anchor}" not in value or re.sub(r"\{anchor\}", "", value).count("{")
    ):
        raise ConfigError(
            f"{where} must hold {{anchor}} (the alert's section) and no other braces, got {value!r}"
        )
    if name.endswith("_severity") and value not in ("critical", "warning", "info"):
        raise ConfigError(f"{where} must be critical, warning or info, got {value!r}")
    if name.endswith("_metric") and not re.fullmatch(r"[a-zA-Z_:][a-zA-Z0-9_:]*", value):
        raise ConfigError(f"{where} must be a metric name, got {value!r}")
    if name.endswith("_presence") and value not in PRESENCE_MODES:
        raise ConfigError(f"{where} must be one of {', '.join(PRESENCE_MODES)}, got {value!r}")
    if name.endswith("_selector") and value and not re.fullmatch(rf"{MATCHER}(,{MATCHER})*", value):
        raise ConfigError(
            f'{where} must be label matchers without braces, such as job="dcgm-exporter", '
            f"got {value!r}"
        )
    return value


def config_from_mapping(knobs: dict[str, Any], source: str = "site config") -> RulesConfig:
    """A RulesConfig with ``knobs`` overriding the defaults; unknown or ill-typed knobs raise
    ConfigError naming the knob (and the closest known name for a typo). With
    ``scrape_interval_seconds`` the short windows it does not set follow the interval, and
    a window shorter than WINDOW_SCRAPES intervals raises ConfigError naming it."""
    defaults = RulesConfig()
    known = {item.name: getattr(defaults, item.name) for item in fields(RulesConfig)}
    changes: dict[str, Any] = {}
    for name, value in knobs.items():
        if name not in known:
            close = difflib.get_close_matches(str(name), known, n=1)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            raise ConfigError(f"{source}: unknown knob {name!r}{hint}")
        changes[name] = _check_value(name, value, known[name], source)
    if "scrape_interval_seconds" in changes:
        least = WINDOW_SCRAPES * changes["scrape_interval_seconds"]
        for name in SCRAPE_DERIVED_WINDOWS:
            if name not in changes and duration_seconds(known[name]) < least:
                changes[name] = format_duration(least)
    config = replace(defaults, **changes)
    check_scrape_windows(config, source)
    return config


def load_site_config(path: str | Path) -> RulesConfig:
    """Read a site YAML file of knobs (see ``RulesConfig``) over the defaults."""
    path = Path(path)
    try:
        document = yaml.safe_load(path.read_text(encoding="utf-8"))
    except OSError as error:
        raise ConfigError(f"{path}: cannot read: {error.strerror}") from error
    except yaml.YAMLError as error:
        raise ConfigError(f"{path}: not valid YAML: {error}") from error
    if document is None:
        return RulesConfig()
    if not isinstance(document, dict):
        raise ConfigError(
            f"{path}: expected a mapping of knob: value, got {type(document).__name__}"
        )
    return config_from_mapping(document, str(path))
