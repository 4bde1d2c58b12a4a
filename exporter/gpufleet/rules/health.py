"""Node health: weak warning signs per node, each worth a weight, summed into a score."""

from __future__ import annotations

from gpufleet.rules.common import Alert, Group, Record, metric, with_node
from gpufleet.rules.config import RulesConfig
from gpufleet.rules.gpu import risen_record
from gpufleet.rules.node import presence_records


def health_recording(config: RulesConfig) -> Group:
    sel = config.gpu_selector
    weight = config.health_signal_weight
    throttle = metric(
        "gpufleet_gpu_clock_throttle_active", sel, 'reason=~"sw_thermal_slowdown|sw_power_cap"'
    )
    signals = {
        "remaps": f"{risen_record('DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS', config.remaps_climbing_window)} >= 1",
        "pcie": f"{risen_record('DCGM_FI_DEV_PCIE_REPLAY_COUNTER', config.pcie_window)} >= 2",
        "nvlink": f"{risen_record('DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL', '30m')} >= 1",
        "sbe": f"{risen_record('DCGM_FI_DEV_ECC_SBE_VOL_TOTAL', '1h')} >= 100",
    }
    rules: list[Record | Alert] = [
        Record(f"node:gpufleet_health_signal:{name}", f"max by (node) ({expr}) * 0 + {weight}")
        for name, expr in signals.items()
    ]
    rules.append(
        Record(
            "node:gpufleet_health_signal:sw_throttle",
            f"max by (node) ({with_node(f'avg_over_time({throttle}[15m]) >= 0.5', config.node_labels)}) * 0 + {weight}",
        )
    )
    rules.append(
        Record(
            "node:gpufleet_health_signal:slow",
            f"max by (node) (node:gpufleet_training_compute_ratio:rate{config.rate_window} >= 1.05) * 0 + {weight}",
        )
    )
    rules.append(
        Record(
            "node:gpufleet_health_signal:xid",
            f"max by (node) (gpu:gpufleet_gpu_xid_errors:new{config.xid_window} * on (xid) group_left "
            'gpufleet:xid_catalogue:info{class="maintenance"}) * 0 + ' + str(weight),
        )
    )
    # Each signal tagged with its name so that `or` keeps them all, then summed per node.
    tagged = "\n  or ".join(
        f'label_replace({rule.record}, "signal", "{rule.record.rsplit(":", 1)[1]}", "", "")'
        for rule in rules
        if isinstance(rule, Record)
    )
    rules.append(Record("node:gpufleet_health:score", f"sum by (node) (\n  {tagged}\n)"))
    rules.extend(presence_records(config))
    return Group("gpufleet-node-health", rules)
