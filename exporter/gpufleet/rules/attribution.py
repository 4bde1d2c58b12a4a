"""Which pod, Slurm job and tenant a GPU page names: one attribution per GPU, recorded
from gpufleet's join series (``gpufleet_gpu_allocation_info``, ``gpufleet_gpu_job_info``)
or, on GPUs without them (dcgm-exporter), from the ``namespace`` / ``pod`` /
``container`` / ``hpc_job`` labels on the GPU's own series; and the wrapper that puts it
on an alert and keeps it there while the alert lasts.

Why a join and not the labels kept through each rule's aggregations: the alerts compare
a GPU with itself by UUID (a re-allocation starts new series; a time-sliced GPU has one
per pod), so their arithmetic stays per GPU and the labels come last, from a record
that holds one attribution per GPU; alerts/RUNBOOK.md ("Attribution") says what it
names when several pods share a GPU, and why an alert keeps the pod it started with.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from gpufleet.rules.common import GPU_WHO, Alert, Record, SeriesNames, metric, with_node
from gpufleet.rules.config import RulesConfig
from gpufleet.schema import gpu as cat
from gpufleet.schema.alerts import AlertName

# The labels an attribution adds to a GPU page: dcgm-exporter's names for the pod, its
# --hpc-job-mapping-dir's for the Slurm job, and the training job the agent's
# allocation series knows.
POD_LABELS = ("namespace", "pod", "container")
ATTRIBUTION_LABELS = (*POD_LABELS, "hpc_job", "training_job")
ATTRIBUTION = ", ".join(ATTRIBUTION_LABELS)
GPU_KEY = "node, gpu, UUID"
# dcgm-exporter's GPU instance label; a MIG instance is (UUID, GPU_I_ID)
MIG_INSTANCE = "GPU_I_ID"
INSTANCE_KEY = f"UUID, {MIG_INSTANCE}"
# a series whose pod Prometheus renamed: scraped without honor_labels beside target labels
EXPORTED_POD = 'exported_pod!=""'

# What a page's description says about the attribution, when there is one.
ATTRIBUTION_WHO = (
    "{{ with $labels.GPU_I_ID }} MIG instance {{ . }}{{ end }}"
    "{{ with $labels.pod }} (pod {{ $labels.namespace }}/{{ . }}){{ else }}"
    "{{ with $labels.namespace }} (namespace {{ . }}){{ end }}{{ end }}"
    "{{ with $labels.hpc_job }} (Slurm job {{ . }}){{ end }}"
)


@dataclass(frozen=True, slots=True)
class AttributionSeries(SeriesNames):
    """The attribution records, each named once here (rules and dashboards read them)."""

    # one series per GPU and pod holding it now (several on a time-sliced or MIG GPU)
    allocation: str = "gpu:gpufleet_gpu_allocation:current"
    # one per GPU: its pod, or only the namespace that every pod on it shares
    allocation_unique: str = "gpu:gpufleet_gpu_allocation:unique"
    # one per GPU: the Slurm job on it, when only one is
    job_unique: str = "gpu:gpufleet_gpu_job:unique"
    # one per GPU: the pod part and the Slurm part together
    attribution: str = "gpu:gpufleet_gpu_attribution:current"
    # the same, or the last one within attribution_memory where none is now: a pod
    # that an XID killed still gets its page
    held: str = "gpu:gpufleet_gpu_attribution:held"
    # the same per MIG instance (GPU_I_ID), from the series that name one: what an XID
    # NVML attributes to an instance names, not every tenant of its GPU
    instance_allocation: str = "mig:gpufleet_gpu_allocation:current"
    instance_allocation_unique: str = "mig:gpufleet_gpu_allocation:unique"
    instance_job_unique: str = "mig:gpufleet_gpu_job:unique"
    instance_attribution: str = "mig:gpufleet_gpu_attribution:current"
    instance_held: str = "mig:gpufleet_gpu_attribution:held"


def _unique(series: str, first: str, key: str = "UUID", group: str = GPU_KEY) -> str:
    """``series`` where a GPU (``key``) has one; where it has several, the ``first`` label
    alone (the namespace) where they all share it, else nothing."""
    several = f"count by ({key}) ({series}) > 1"
    return (
        f"({series} unless on ({key}) ({several}))\n"
        f"or (\n  max by ({group}, {first}) ({series})\n"
        f"  and on ({key}) ({several})\n"
        f"  unless on ({key}) (count by ({key}) (count by ({key}, {first}) ({series})) > 1)\n)"
    )


def attribution_records(config: RulesConfig) -> list[Record]:
    series = AttributionSeries.of(config)
    return [
        *_records(
            config,
            "UUID",
            GPU_KEY,
            "",
            (
                series.allocation,
                series.allocation_unique,
                series.job_unique,
                series.attribution,
                series.held,
            ),
        ),
        *_records(
            config,
            INSTANCE_KEY,
            f"{GPU_KEY}, {MIG_INSTANCE}",
            f'{MIG_INSTANCE}!=""',
            (
                series.instance_allocation,
                series.instance_allocation_unique,
                series.instance_job_unique,
                series.instance_attribution,
                series.instance_held,
            ),
        ),
    ]


def _records(
    config: RulesConfig, key: str, group: str, only: str, names: tuple[str, str, str, str, str]
) -> list[Record]:
    """The attribution of each GPU (``key`` UUID), or of each MIG instance (``key`` UUID,
    GPU_I_ID, from the series that name one: ``only``)."""
    sel = ", ".join(part for part in (config.gpu_selector, only) if part)
    node_labels = config.node_labels
    allocation, unique_pods, unique_jobs, attribution, held_name = names
    allocation_info = metric(cat.ALLOCATION_INFO.name, sel)
    job_info = metric(cat.JOB_INFO.name, sel)
    presence = config.gpu_presence_metric
    up = metric("up", config.gpu_selector)
    # dcgm-exporter (and an agent without the join series) labels every GPU series
    pods = metric(presence, sel, 'pod!=""')
    jobs = metric(presence, sel, 'hpc_job!=""')
    pod_labels = ", ".join(POD_LABELS)
    # A pod that is the scrape target itself (the exporter's, put on a series that has no
    # pod of its own by the Prometheus Operator's target labels) holds no GPU. Scraped
    # without honorLabels (dcgm-exporter's chart: serviceMonitor.honorLabels false), the
    # exporter's own namespace / pod / container are the target's and the GPU's pod is
    # in exported_namespace / exported_pod / exported_container: read from there.
    held = (
        f"({allocation_info} unless on (instance, job, namespace, pod) {up})\n"
        f"  or {_exported(metric(cat.ALLOCATION_INFO.name, sel, EXPORTED_POD))}"
    )
    labelled = (
        f"({pods} unless on (instance, job, namespace, pod) {up})\n"
        f"  or {_exported(metric(presence, sel, EXPORTED_POD))}"
    )
    memory = config.attribution_memory
    return [
        Record(
            allocation,
            f"group by ({group}, {pod_labels}, training_job) (\n"
            f"  {with_node(f'({held})', node_labels)}\n)\n"
            f"or group by ({group}, {pod_labels}) (\n"
            f"  {with_node(f'({labelled}) unless on ({key}) {allocation_info}', node_labels)}\n)",
        ),
        Record(unique_pods, _unique(allocation, "namespace", key, group)),
        Record(
            unique_jobs,
            _unique(
                f"(\n  group by ({group}, hpc_job) ({with_node(job_info, node_labels)})\n"
                f"  or group by ({group}, hpc_job) (\n"
                f"    {with_node(f'{jobs} unless on ({key}) {job_info}', node_labels)}\n  )\n)",
                "hpc_job",
                key,
                group,
            ),
        ),
        Record(
            attribution,
            f"({unique_pods} * on ({key}) group_left (hpc_job) {unique_jobs})\n"
            f"or ({unique_pods} unless on ({key}) {unique_jobs})\n"
            f"or ({unique_jobs} unless on ({key}) {unique_pods})",
        ),
        Record(
            held_name,
            f"{attribution}\nor (\n"
            f"  last_over_time({attribution}[{memory}])\n"
            f"  unless on ({key}) {attribution}\n"
            f"  unless on ({key}) (\n"
            f"    count by ({key}) (last_over_time({attribution}[{memory}])) > 1\n"
            f"  )\n)",
        ),
    ]


def attributed(config: RulesConfig, alert: str, expr: str) -> str:
    """``expr`` (a per-GPU alert's condition, UUID on every series) with the GPU's
    attribution as labels. An alert that fired in the last evaluation keeps the labels
    it fired with (read back from ALERTS) while its condition holds: a GPU handed to
    another pod mid-incident neither pages that pod's tenant nor resolves the first
    page. Otherwise it takes the GPU's attribution now (or just before, ``held``)."""
    held = held_any(config)
    firing = f'max without (alertname, alertstate, severity) (ALERTS{{alertname="{alert}"}})'
    return (
        f"(\n  ({expr})\n  * ignoring ({ATTRIBUTION}) group_left ({ATTRIBUTION})\n  {firing}\n)\n"
        f"or (\n  (({expr})\n  unless ignoring ({ATTRIBUTION}) {firing})\n"
        f"  * on ({INSTANCE_KEY}) group_left ({ATTRIBUTION}) {held}\n)\n"
        f"or (\n  ({expr})\n  unless ignoring ({ATTRIBUTION}) {firing}\n"
        f"  unless on ({INSTANCE_KEY}) {held}\n)"
    )


def _exported(series: str) -> str:
    """``series`` with the pod labels Prometheus renamed (``exported_``: the target's own
    took their names, honor_labels false) put back as namespace / pod / container."""
    for label in reversed(POD_LABELS):
        series = f'label_replace({series}, "{label}", "$1", "exported_{label}", "(.*)")'
    return series


def held_any(config: RulesConfig) -> str:
    """The held attribution of each GPU (no GPU_I_ID) and of each MIG instance (GPU_I_ID),
    joined ``on (UUID, GPU_I_ID)``: a series without GPU_I_ID takes its GPU's, one that
    names an instance (an XID NVML attributes to it) that instance's, never the GPU's."""
    series = AttributionSeries.of(config)
    return f"({series.held} or {series.instance_held})"


def with_attribution(config: RulesConfig, rule: Alert) -> list[Record | Alert]:
    """A per-GPU alert (one that names a GPU) with the pod, Slurm job and tenant on the
    GPU as labels and in its description; per-node alerts stay as they are.

    The condition is recorded first, in the same group (so at the same evaluation time),
    and the alert reads it: the attribution reads the condition three times, and a
    condition that scans every GPU (a lost GPU, a pending remap) would cost three scans.
    The record holds only the GPUs where the condition is true: a handful of series."""
    if not rule.description.startswith(GPU_WHO):
        return [rule]
    condition = alert_condition(rule.alert)
    return [
        Record(condition, rule.expr),
        replace(
            rule,
            expr=attributed(config, rule.alert, condition),
            description=GPU_WHO + ATTRIBUTION_WHO + rule.description.removeprefix(GPU_WHO),
        ),
    ]


def alert_condition(alert: AlertName) -> str:
    """The series that holds a per-GPU alert's condition, before its attribution."""
    return f"gpu:{alert}:condition"
