"""gpu.rules.yaml's groups: each per-GPU alert in the group that records what it reads,
right after those records, so that it sees them in the same evaluation.

Every group here scans every GPU, so each runs once a minute (gpu_recording_interval):
the counters' windows are 10 minutes to 6 hours, and an alert in the same group as its
records pages as soon as they show the fault, as it would at 15 s after a record made
once a minute. The counters over 30 minutes to 6 hours (the health signals, climbing
remaps) run every 3 minutes (gpu_long_window_interval); a lost GPU, whose alert holds
a minute, at Prometheus's own interval. A group holds at most 20 rules; what crosses
groups (the attribution, the GPUs a node without the agent showed) may lag by up to
one interval."""

from __future__ import annotations

from gpufleet.rules.attribution import attribution_records, with_attribution
from gpufleet.rules.common import Alert, Record, RuleGroup
from gpufleet.rules.config import RulesConfig
from gpufleet.rules.gpu import (
    NVLINK5_COUNTERS,
    NVLINK_COUNTERS,
    gpu_alerts,
    gpu_counters,
    gpu_recording,
    xid_catalogue_group,
)
from gpufleet.schema.alerts import AlertName

# The counters read by the NVLink and PCIe alerts (links); every other one of RISEN
# (memory errors, and the health signals' longer windows) goes with the memory alerts.
LINKS = frozenset(
    {(f"DCGM_FI_DEV_NVLINK_{name}_ERROR_COUNT_TOTAL", "nvlink_window") for name in NVLINK_COUNTERS}
    | {(name, "nvlink_window") for name in NVLINK5_COUNTERS}
    | {("DCGM_FI_DEV_PCIE_REPLAY_COUNTER", "pcie_window")}
)
# The counters over the health signals' windows (30 minutes to 6 hours): a scan of
# every GPU's samples over hours, evaluated every gpu_long_window_interval (3 minutes),
# a twentieth to a hundred-and-twentieth of their windows. Warm (a Prometheus with hours
# of history), these four were half of the once-a-minute counter group's time.
LONG_WINDOWS = frozenset(
    {"remaps_climbing_window", "health_pcie_window", "health_sbe_window", "health_nvlink_window"}
)
# Alerts by the group of the records they read.
RECORDED_ALERTS = (
    AlertName.CRITICAL_XID,
    AlertName.MAINTENANCE_XID,
    AlertName.UNCLASSIFIED_XID,
    AlertName.GPU_RECOVERY_ACTION,
    AlertName.GPU_RECOVERY_WARNING,
    AlertName.HW_SLOWDOWN,
)
LINK_ALERTS = (AlertName.NVLINK_ERRORS, AlertName.PCIE_REPLAYS)
LONG_WINDOW_ALERTS = (AlertName.REMAPS_CLIMBING,)
# ... and those of raw series with no `for` or one of minutes (a failed or pending
# remap, missing GPUs): a page at most one interval after its sample, as an XID's
MEMORY_ALERTS = (
    AlertName.ECC_UNCORRECTABLE,
    AlertName.ROW_REMAP_FAILURE,
    AlertName.ROW_REMAP_PENDING,
    AlertName.GPU_MISSING,
)
# A lost GPU at Prometheus's own interval (15 s), not a minute: once a minute its
# `for: 1m` spans two evaluations a minute apart, and it paged up to 45 s later (the
# demo's lost GPU came at 10:01, not by 9:10).
DEVICE_ALERTS = (AlertName.GPU_LOST,)


def gpu_groups(config: RulesConfig) -> list[RuleGroup]:
    every = config.gpu_recording_interval
    alerts = {rule.alert: rule for rule in gpu_alerts(config)}
    counters = gpu_counters(config)
    placed = {*RECORDED_ALERTS, *LINK_ALERTS, *LONG_WINDOW_ALERTS, *MEMORY_ALERTS, *DEVICE_ALERTS}
    if placed != set(alerts):
        raise ValueError(f"GPU alerts in no group: {sorted(set(alerts) - placed)}")

    def group(
        name: str, records: list[Record], names: tuple[AlertName, ...], interval: str | None = every
    ) -> RuleGroup:
        rules: list[Record | Alert] = [*records]
        for alert in names:
            rules.extend(with_attribution(config, alerts[alert]))
        return RuleGroup(name, rules, interval)

    links = [record for key, record in counters.items() if key in LINKS]
    long_windows = [record for key, record in counters.items() if key[1] in LONG_WINDOWS]
    memory = [
        record
        for key, record in counters.items()
        if key not in LINKS and key[1] not in LONG_WINDOWS
    ]
    return [
        xid_catalogue_group(config),
        RuleGroup("gpufleet-gpu-attribution", attribution_records(config), every),
        group("gpufleet-gpu-recording", gpu_recording(config), RECORDED_ALERTS),
        group("gpufleet-gpu-links", links, LINK_ALERTS),
        group("gpufleet-gpu-counters", memory, MEMORY_ALERTS),
        group(
            "gpufleet-gpu-long-windows",
            long_windows,
            LONG_WINDOW_ALERTS,
            config.gpu_long_window_interval,
        ),
        group("gpufleet-gpu-device-alerts", [], DEVICE_ALERTS, None),
    ]
