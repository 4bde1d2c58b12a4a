"""Parallel-layout rules: a tensor-parallel group across nodes, pipeline stages of unequal
size.

Each rank reports its groups once per attempt (``gpufleet.reporter.layout``); its agent
exports one ``gpufleet_training_parallel_group_size`` series per rank and group, with
the agent's ``node`` and, where the site names it, the node's ``nvlink_domain``. A group
is (training_job, attempt, group, group_first_rank): the nodes and NVLink domains it
spans are counted here, across every agent, with no collective in the job.

Which NVLink domain a rank is in: where every rank of a group is on a node whose GPUs
NVML places in one NVLink fabric clique (``gpufleet_gpu_fabric_info``: the same cluster
UUID and clique id, as NCCL compares them before it uses multi-node NVLink), the group's
domains are those cliques, so tp across two hosts of one NVL72-class rack is inside one
domain. Otherwise the site's ``nvlink_domain`` (GPUFLEET_NVLINK_DOMAIN) where set, and a
rank whose node names none counts as a domain of its own node.
"""

from __future__ import annotations

from dataclasses import dataclass

from gpufleet.rules.common import Alert, Record, RuleGroup, SeriesNames, metric, with_node
from gpufleet.rules.config import RulesConfig
from gpufleet.schema.alerts import AlertName
from gpufleet.schema.gpu import GPU_FABRIC_INFO
from gpufleet.schema.training import PARALLEL_GROUP_SIZE

# One parallel group of one attempt of a job.
PARALLEL_GROUP = "training_job, attempt, group, group_first_rank"


@dataclass(frozen=True, slots=True)
class LayoutSeries(SeriesNames):
    """What layout.rules.yaml records, each named once here."""

    # per node whose GPUs share one completed NVLink fabric clique: it, as nvlink_domain
    # ("<cluster_uuid>/<clique_id>")
    fabric_domain: str = "node:gpufleet_gpu_fabric_domain:info"
    # per group: nodes and NVLink domains (a node without one: its own) its ranks are on
    nodes: str = "group:gpufleet_training_parallel_nodes:count"
    domains: str = "group:gpufleet_training_parallel_domains:count"
    # per pipeline stage (group_rank in the pp group) of a job's attempt: its ranks
    stage_ranks: str = "stage:gpufleet_training_pipeline_ranks:count"


def layout_groups(config: RulesConfig) -> list[RuleGroup]:
    sel = config.agent_selector
    series = LayoutSeries.of(config)
    size = PARALLEL_GROUP_SIZE.name

    def named(extra: str) -> str:
        return metric(size, sel, extra)

    unnamed, named_domain, pipeline = (
        named('nvlink_domain=""'),
        named('nvlink_domain!=""'),
        named('group="pp"'),
    )
    # A rank whose node names no NVLink domain is in its node's own.
    domain = (
        f'label_replace({unnamed}, "nvlink_domain", "node:$1", "node", "(.+)")\n  or {named_domain}'
    )
    fabric = with_node(
        metric(GPU_FABRIC_INFO.name, config.gpu_selector, 'state="completed", cluster_uuid!=""'),
        config.node_labels,
    )
    node_cliques = (
        "group by (node, nvlink_domain) (\n"
        f'  label_join({fabric}, "nvlink_domain", "/", "cluster_uuid", "clique_id")\n)'
    )
    # each rank of a node with one clique, in it (the site's nvlink_domain overwritten)
    in_clique = f"{named('')} * on (node) group_left (nvlink_domain) {series.fabric_domain}"
    by_clique = (
        f"count by ({PARALLEL_GROUP}) (\n"
        f"  count by ({PARALLEL_GROUP}, nvlink_domain) ({in_clique})\n)\n"
        f"and on ({PARALLEL_GROUP}) (\n"
        f"  count by ({PARALLEL_GROUP}) ({in_clique})\n"
        f"  == count by ({PARALLEL_GROUP}) ({named('')})\n)"
    )
    records: list[Record | Alert] = [
        Record(
            series.fabric_domain,
            f"{node_cliques}\nand on (node) (\n  count by (node) ({node_cliques}) == 1\n)",
        ),
        Record(
            series.nodes,
            f"count by ({PARALLEL_GROUP}) (\n  count by ({PARALLEL_GROUP}, node) ({named('')})\n)",
        ),
        # the cliques where every rank's node has one, else the site's domains or nodes
        Record(
            series.domains,
            f"{by_clique}\nor\ncount by ({PARALLEL_GROUP}) (\n"
            f"  count by ({PARALLEL_GROUP}, nvlink_domain) (\n    {domain}\n  )\n)",
        ),
        Record(
            series.stage_ranks,
            f"count by (training_job, attempt, group_rank) ({pipeline})",
        ),
    ]
    stages = "training_job, attempt"
    alerts: list[Record | Alert] = [
        Alert(
            AlertName.TENSOR_PARALLEL_ACROSS_NODES,
            f'max by (training_job, group) ({series.domains}{{group="tp"}}) > 1',
            config.tp_across_nodes_severity,
            "A tensor-parallel group spans more than one node.",
            "Tensor-parallel (tp) groups of job {{ $labels.training_job }} span up to "
            "{{ $value }} nodes (NVLink domains where NVML or the site names them): every layer's "
            "collectives cross the network instead of NVLink, every step. Keep tp within a "
            "node: tp size at most the GPUs per node, tp the innermost mesh dimension.",
            config.tp_across_nodes_for,
        ),
        Alert(
            AlertName.PIPELINE_STAGES_UNEVEN,
            f"max by ({stages}) ({series.stage_ranks})\n"
            f"> on ({stages}) min by ({stages}) ({series.stage_ranks})",
            "info",
            "Pipeline stages of a job hold different numbers of ranks.",
            "Pipeline stages of job {{ $labels.training_job }} hold different numbers of "
            "ranks (the largest {{ $value }}): the smaller stages' ranks carry more of the "
            "model each, or some ranks of a stage do not report.",
            config.pipeline_uneven_for,
        ),
    ]
    return [
        RuleGroup("gpufleet-layout-recording", records),
        RuleGroup("gpufleet-layout-alerts", alerts),
    ]
