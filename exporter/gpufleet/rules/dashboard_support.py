"""Recorded only for dashboards/ (exporter/gpufleet/dashboards/): what a panel would
otherwise compute over every GPU or every node on each refresh. No alert reads them."""

from __future__ import annotations

from dataclasses import dataclass

from gpufleet.rules.attribution import AttributionSeries
from gpufleet.rules.common import (
    NODE_STAGE,
    Alert,
    Record,
    RuleGroup,
    SeriesNames,
    metric,
    not_from,
    with_node,
)
from gpufleet.rules.config import RulesConfig


@dataclass(frozen=True, slots=True)
class DashboardSeries(SeriesNames):
    """What dashboards.rules.yaml records, each named once here for the dashboards."""

    # which node each GPU is on; GPUs reporting per node; fleet utilisation and power
    gpu_node: str = "gpu:gpufleet_gpu_node:info"
    node_gpus: str = "node:gpufleet_gpus_reporting:count"
    # every GPU, with the namespace (tenant) of each pod holding it (none: unallocated);
    # every training job, with the namespace its ranks report from (none: not on Kubernetes)
    gpu_tenant: str = "gpu:gpufleet_gpu_tenant:info"
    job_tenant: str = "job:gpufleet_training_tenant:info"
    fleet_util: str = "fleet:DCGM_FI_DEV_GPU_UTIL:avg"
    fleet_power: str = "fleet:DCGM_FI_DEV_POWER_USAGE:sum"
    # per node-stage and phase
    phase_per_step: str = "node:gpufleet_training_phase_seconds_per_step:rate{rate_window}"
    exclusions_reason: str = "reason:gpufleet_fleet_exclusions:increase{reliability_window}"
    # per node and op: seconds per checkpoint operation, bytes/s; per job: seconds between saves
    node_seconds_per_op: str = "node:gpufleet_checkpoint_seconds_per_op:rate{rate_window}"
    node_checkpoint_bytes: str = "node:gpufleet_checkpoint_bytes:rate{rate_window}"
    checkpoint_interval: str = "job:gpufleet_checkpoint_interval_seconds:rate{checkpoint_op_window}"


def dashboard_support_group(config: RulesConfig) -> RuleGroup:
    gpus, agent, fleet = config.gpu_selector, config.agent_selector, config.fleet_selector
    # dcgm-exporter's GPUs: not the agent's series of the same names
    dcgm = ", ".join(part for part in (gpus, not_from(agent)) if part)
    w = config.rate_window
    month = config.reliability_window
    series = DashboardSeries.of(config)
    ckpt_by = "training_job, node, op"
    exclusions = metric("gpufleet_fleet_node_exclusions_total", fleet)
    steps = metric("gpufleet_training_steps_total", agent)
    own = metric("up", agent)
    reported = f"group by (training_job, namespace) ({steps} unless on (instance, job, namespace, pod) {own})"
    saves = metric("gpufleet_checkpoint_operations_total", agent, 'op="save"')
    phases = "\n  or ".join(
        f"label_replace(rate({metric(f'gpufleet_training_{name}_seconds_total', agent)}[{w}]), "
        f'"phase", "{phase}", "", "")'
        for phase, name in (
            ("compute", "compute"),
            ("collective_wait", "collective_wait"),
            ("data_wait", "data_wait"),
        )
    )
    rules: list[Record | Alert] = [
        # Which node each GPU is on, whichever exporter and label spelling: the node
        # dashboard selects a node's GPUs by UUID through it. gpufleet_gpu_up keeps a
        # lost GPU (no more readings) on its node; the agent serves it for every GPU, so
        # the temperature is read only from the other exporters (half the scan).
        Record(
            series.gpu_node,
            f"group by (node, gpu, UUID) (\n  {with_node(metric('gpufleet_gpu_up', gpus) + ' or ' + metric('DCGM_FI_DEV_GPU_TEMP', dcgm), config.node_labels)}\n)",
        ),
        # The dashboards' namespace variable filters GPU panels through it: "All" (.*)
        # matches the unallocated GPUs too, which have no namespace label.
        Record(
            series.gpu_tenant,
            f"group by (node, gpu, UUID, namespace) ({AttributionSeries.of(config).allocation})\n"
            f"or ({series.gpu_node} unless on (UUID) {AttributionSeries.of(config).allocation})",
        ),
        # A job's namespace as its ranks report it; the agent's own (a target label where
        # the ranks send none) is none, and such a job is listed without one.
        Record(
            series.job_tenant,
            f"{reported}\nor (group by (training_job) ({steps}) unless on (training_job) {reported})",
        ),
        Record(
            series.node_gpus,
            f"count by (node) (\n  {with_node(metric('DCGM_FI_DEV_GPU_TEMP', gpus), config.node_labels)}\n)",
        ),
        Record(series.fleet_util, _fleet_util(gpus)),
        Record(series.fleet_power, f"sum({metric('DCGM_FI_DEV_POWER_USAGE', gpus)})"),
        Record(
            series.phase_per_step,
            f"sum by ({NODE_STAGE}, phase) (\n  {phases}\n)\n"
            f"/ on ({NODE_STAGE}) group_left ()\n"
            f"sum by ({NODE_STAGE}) (rate({metric('gpufleet_training_steps_total', agent)}[{w}]))",
        ),
        Record(
            series.exclusions_reason,
            f"sum by (reason) ({exclusions} - ({exclusions} offset {month} or {exclusions} * 0))",
        ),
        # Per node: seconds per checkpoint operation (queued + served) and bytes/s; what
        # the checkpoint dashboard draws for every node of a job.
        Record(
            series.node_seconds_per_op,
            f"(\n  sum by ({ckpt_by}) (rate({metric('gpufleet_checkpoint_queue_wait_seconds_total', agent)}[{w}]))\n"
            f"  + sum by ({ckpt_by}) (rate({metric('gpufleet_checkpoint_service_seconds_total', agent)}[{w}]))\n)\n"
            f"/ sum by ({ckpt_by}) (rate({metric('gpufleet_checkpoint_operations_total', agent)}[{w}]))",
        ),
        Record(
            series.node_checkpoint_bytes,
            f"sum by ({ckpt_by}) (rate({metric('gpufleet_checkpoint_bytes_total', agent)}[{w}]))",
        ),
        # Seconds between a node's saves, averaged over the job's saving nodes. Each rank
        # that writes its shard counts one operation, so saves are per rank of the node.
        Record(
            series.checkpoint_interval,
            f"1 / avg by (training_job) (\n  sum by (training_job, node) (rate({saves}[{config.checkpoint_op_window}]))\n"
            f"  / max by (training_job, node) ({metric('gpufleet_training_ranks', agent)}) > 0\n)",
        ),
    ]
    return RuleGroup("gpufleet-dashboard-support", rules, config.dashboard_interval)


# Compute slices of a GPU split into MIG instances: 7 on A100, H100, H200 and B200 (an
# A30 has 4, and reads low here); a profile "<n>g.<memory>" holds n of them (NVIDIA's
# MIG User Guide).
MIG_SLICES = 7


def _fleet_util(gpus: str) -> str:
    """The fleet's mean GPU utilisation (percent). A GPU in MIG mode has no
    DCGM_FI_DEV_GPU_UTIL (NVML refuses it there): its utilisation is its instances'
    graphics engine activity (DCGM_FI_PROF_GR_ENGINE_ACTIVE, each a ratio of its own
    instance) weighted by their compute slices, out of the GPU's; slices no instance
    holds count as idle. A GPU with both (none should have) counts once, by its
    instances: their few series are read twice, every GPU's utilisation once."""
    util = metric("DCGM_FI_DEV_GPU_UTIL", gpus)
    active = metric("DCGM_FI_PROF_GR_ENGINE_ACTIVE", gpus, 'GPU_I_ID!=""')
    slices = " or ".join(
        f'label_replace(vector({n}), "slices", "{n}", "", "")' for n in range(1, MIG_SLICES + 1)
    )
    mig = (
        f"100 * sum by (UUID) (\n"
        f'    label_replace({active}, "slices", "$1", "GPU_I_PROFILE", "([0-9]+)g[.].*")\n'
        f"    * on (slices) group_left () ({slices})\n"
        f"  ) / {MIG_SLICES}"
    )
    return f"avg(\n  {mig}\n  or ({util} unless on (UUID) {mig})\n)"
