"""Node health: weak warning signs per node, each worth a weight, summed into a score."""

from __future__ import annotations

from gpufleet.rules.common import Alert, Record, RuleGroup, metric, with_node
from gpufleet.rules.config import RulesConfig
from gpufleet.rules.gpu import XID_INFO, GpuSeries, risen_series
from gpufleet.rules.presence import presence_records
from gpufleet.rules.training import TrainingSeries

# The weak signals summed per node; the node alert and the Node dashboard read it.
HEALTH_SCORE = "node:gpufleet_health:score"
# Each signal is recorded as this prefix and its name (remaps, pcie, ..., xid).
HEALTH_SIGNAL = "node:gpufleet_health_signal:"


def health_recording(config: RulesConfig) -> RuleGroup:
    sel = config.gpu_selector
    weight = config.health_signal_weight
    # sw_power_cap is not counted: a GPU training at its power limit is capped by design
    throttle = metric("gpufleet_gpu_clock_throttle_active", sel, 'reason="sw_thermal_slowdown"')
    signals = {
        "remaps": f"{risen_series(config, 'DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS', 'remaps_climbing_window')} >= {config.health_remaps_min}",
        "pcie": f"{risen_series(config, 'DCGM_FI_DEV_PCIE_REPLAY_COUNTER', 'health_pcie_window')} >= {config.health_pcie_replays_min}",
        "nvlink": f"{risen_series(config, 'DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL', 'health_nvlink_window')} >= {config.health_nvlink_replays_min}",
        "sbe": f"{risen_series(config, 'DCGM_FI_DEV_ECC_SBE_VOL_TOTAL', 'health_sbe_window')} >= {config.health_sbe_min}",
    }
    rules: list[Record | Alert] = [
        Record(f"{HEALTH_SIGNAL}{name}", f"max by (node) ({expr}) * 0 + {weight}")
        for name, expr in signals.items()
    ]
    # The agent exports a reason's flag only while it is in effect: the share of the
    # window's scrapes that carried it, out of the GPU's own (gpufleet_gpu_up, every scrape).
    w = config.health_throttle_window
    scrapes = f"max by (UUID) (count_over_time({metric('gpufleet_gpu_up', sel)}[{w}]))"
    rules.append(
        Record(
            f"{HEALTH_SIGNAL}sw_throttle",
            f"max by (node) (\n  {with_node(f'count_over_time({throttle}[{w}])', config.node_labels)}\n"
            f"  / on (UUID) group_left () {scrapes}\n  >= {config.health_throttle_share}\n) * 0 + {weight}",
        )
    )
    rules.append(
        Record(
            f"{HEALTH_SIGNAL}slow",
            f"max by (node) ({TrainingSeries.of(config).compute_ratio} >= {config.health_slow_ratio}) * 0 + {weight}",
        )
    )
    rules.append(
        Record(
            f"{HEALTH_SIGNAL}xid",
            f"max by (node) ({GpuSeries.of(config).xid_new} * on (xid) group_left "
            f'{XID_INFO}{{class="maintenance"}}) * 0 + ' + str(weight),
        )
    )
    # Each signal tagged with its name so that `or` keeps them all, then summed per node.
    tagged = "\n  or ".join(
        f'label_replace({rule.record}, "signal", "{rule.record.rsplit(":", 1)[1]}", "", "")'
        for rule in rules
        if isinstance(rule, Record)
    )
    rules.append(Record(HEALTH_SCORE, f"sum by (node) (\n  {tagged}\n)"))
    rules.extend(presence_records(config))
    # Once a minute: the signals look back 15 minutes to 6 hours and the alert that reads
    # the score holds for 10 minutes; at 15 s every GPU's throttle flags cost 4x as much.
    return RuleGroup("gpufleet-node-health", rules, config.slow_recording_interval)
