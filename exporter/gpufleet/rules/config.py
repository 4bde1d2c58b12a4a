"""Every knob of gpufleet's rules in one place: selectors, thresholds, windows, ``for``
durations, severities. Each expression is built from these, so a threshold is tuned
in one line (then ``make generate``)."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class XidCode:
    code: int
    klass: str  # act_now (critical), maintenance (warning) or application (info, job level)
    meaning: str
    action: str


# After NVIDIA's XID catalogue (docs.nvidia.com/deploy/xid-errors).
XID_CATALOGUE: tuple[XidCode, ...] = (
    XidCode(48, "act_now", "double-bit ECC error",
            "drain the node, reset the GPU so the row is remapped; RMA if it repeats"),
    XidCode(62, "act_now", "internal micro-controller halt",
            "drain the node and reset the GPU or reboot; RMA if it repeats"),
    XidCode(64, "act_now", "row remapping failed",
            "drain the node and RMA the GPU: it has no spare rows left"),
    XidCode(74, "act_now", "NVLink error",
            "drain the node, check nvidia-smi nvlink -e, reset the GPU; RMA if it persists"),
    XidCode(79, "act_now", "GPU has fallen off the bus",
            "drain the node and reboot it; check PCIe seating and power; RMA if it recurs"),
    XidCode(95, "act_now", "uncontained ECC error",
            "drain the node and reset the GPU now: every process on it is affected"),
    XidCode(119, "act_now", "GSP RPC timeout",
            "drain the node and reset the GPU or reboot; update driver and firmware if it recurs"),
    XidCode(120, "act_now", "GSP error",
            "drain the node and reset the GPU or reboot; update driver and firmware if it recurs"),
    XidCode(140, "act_now", "unrecovered ECC error",
            "drain the node and reset the GPU; RMA if it repeats"),
    XidCode(154, "act_now", "GPU recovery action changed",
            "do what gpufleet_gpu_recovery_action asks: reset the GPU or reboot the node"),
    XidCode(61, "maintenance", "internal micro-controller warning",
            "watch for XID 62 on the same GPU; reset it at the next drain"),
    XidCode(63, "maintenance", "row remapping event recorded",
            "reset the GPU at the next drain so the remap takes effect"),
    XidCode(92, "maintenance", "high single-bit ECC error rate",
            "schedule a GPU reset; replace the GPU if the rate keeps rising"),
    XidCode(94, "maintenance", "contained ECC error",
            "the affected process was killed; reset the GPU at the next drain"),
    XidCode(13, "application", "graphics engine exception",
            "usually the application (illegal access, bad kernel): check the job's logs"),
    XidCode(31, "application", "GPU memory page fault",
            "usually the application (illegal address): check the job's logs"),
    XidCode(43, "application", "GPU stopped processing",
            "usually the application was killed or hung: check the job's logs"),
    XidCode(45, "application", "preemptive cleanup after previous errors",
            "look for the XID that preceded it on the same GPU"),
)  # fmt: skip


@dataclass(frozen=True, slots=True)
class RulesConfig:
    # -- selectors: which scrape jobs hold what --------------------------------------
    gpu_selector: str = 'job=~"gpufleet-agent|dcgm-exporter.*"'
    agent_selector: str = 'job="gpufleet-agent"'
    fleet_selector: str = 'job="gpufleet-fleet"'
    # dcgm-exporter-only nodes have no gpufleet_gpus_expected: assume this many GPUs (0: off)
    dcgm_expected_gpus: int = 8

    # -- alert routing -------------------------------------------------------------------------
    runbook_url: str = "https://github.com/gpufleet/gpufleet/blob/main/alerts/RUNBOOK.md#{anchor}"

    # -- GPU hardware: counters rising over 10 min to 6 h need no 15 s resolution, and this
    # group reads every GPU's series: evaluating it once a minute quarters its cost.
    gpu_recording_interval: str = "1m"
    # -- GPU hardware ---------------------------------------------------------------------
    xid_window: str = "10m"
    ecc_window: str = "10m"
    remap_pending_for: str = "5m"
    remaps_climbing_window: str = "6h"
    remaps_climbing_min: int = 3
    nvlink_window: str = "10m"
    nvlink_recovery_min: int = 1
    nvlink_replay_min: int = 20
    nvlink_crc_min: int = 100
    pcie_window: str = "1h"
    pcie_replays_min: int = 10
    hw_slowdown_for: str = "2m"
    gpu_lost_for: str = "1m"
    gpu_missing_for: str = "2m"

    # -- node health ---------------------------------------------------------------------------
    agent_down_for: str = "2m"
    targets_missing_for: str = "15m"
    telemetry_collapse_for: str = "2m"
    # an excluded node's agent being down is not news once the exclusion is this old
    excluded_quiet_after: str = "30m"
    health_signal_weight: float = 0.5
    health_threshold: float = 1.0  # two weak signals together
    health_for: str = "10m"

    # -- fail-slow -----------------------------------------------------------------------------
    rate_window: str = "5m"
    straggler_ratio: float = 1.10
    straggler_zscore: float = 3.5
    straggler_min_peers: int = 4  # nodes in the stage; below it, compare ranks
    straggler_min_rank_peers: int = 8
    straggler_for: str = "5m"
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
    job_slowdown_for: str = "3m"
    stage_imbalance_ratio: float = 1.20
    stage_imbalance_for: str = "30m"
    hang_step_multiple: float = 10.0
    hang_min_seconds: float = 300.0
    hang_memory: str = "2h"
    hang_for: str = "1m"
    data_wait_window: str = "15m"
    data_wait_share: float = 0.20
    data_wait_peer_multiple: float = 3.0
    data_wait_for: str = "15m"

    # -- checkpoints ---------------------------------------------------------------------------
    checkpoint_window: str = "30m"
    checkpoint_queue_share: float = 0.9
    checkpoint_min_writers: int = 8  # "under real load"
    checkpoint_queue_for: str = "5m"
    checkpoint_save_budget_s: float = 600.0
    checkpoint_restore_budget_s: float = 900.0

    # -- reliability ---------------------------------------------------------------------------
    repeat_offender_exclusions: int = 2
    repeat_offender_window: str = "7d"
    concentration_share: float = 0.5
    concentration_min_exclusions: int = 6
    retry_chain_failed_attempts: int = 3
    ledger_down_for: str = "5m"

    severities: dict[str, str] = field(default_factory=dict)  # alert -> severity overrides

    def severity(self, alert: str, default: str) -> str:
        return self.severities.get(alert, default)
