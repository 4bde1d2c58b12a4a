"""The job layout panels (on the fail-slow dashboard, for its $training_job): its tensor-,
pipeline- and data-parallel sizes, the nodes and NVLink domains each group spans, the
stages on each node, the tensor-parallel check's verdict, and each node's NVLink bytes
beside its network bytes, which corroborate it: tp across nodes is network traffic all
through every step."""

from __future__ import annotations

from grafana_foundation_sdk.models import dashboard as dm

from gpufleet.dashboards import common
from gpufleet.dashboards.names import Recorded
from gpufleet.rules.config import RulesConfig
from gpufleet.rules.layout import LayoutSeries
from gpufleet.schema import external
from gpufleet.schema import gpu as cat
from gpufleet.schema.alerts import AlertName
from gpufleet.schema.training import PARALLEL_GROUP_SIZE

# DCGM's NVLink bandwidth unit is KiB/s / 1000 (field 449, as the agent computes it).
NVLINK_TO_BYTES = 1024 * 1000
# Network devices that carry no traffic between nodes (loopback, containers, bridges).
LOCAL_DEVICES = "lo|veth.*|docker.*|cali.*|flannel.*|cni.*|virbr.*|br-.*"
# node_exporter's node: its `node` label where the scrape sets one, else the host part
# of its instance (host:port).
INSTANCE_HOST = '"node", "$1", "instance", "([^:]+)(:[0-9]+)?"'


def _network(sent: str, received: str, extra: str = "") -> str:
    def rate(name: str) -> str:
        unnamed, named = (
            f"{name}{{{common.sel(*(m for m in (extra, node) if m))}}}"
            for node in ('node=""', 'node!=""')
        )
        return (
            f"sum by (node) (\n  label_replace(rate({unnamed}[$__rate_interval]), {INSTANCE_HOST})"
            f"\n  or rate({named}[$__rate_interval])\n)"
        )

    return f"({rate(sent)} + {rate(received)})"


def layout_panels(grid: common.Grid, config: RulesConfig) -> None:
    series = LayoutSeries.of(config)
    r = Recorded.of(config)
    job = common.sel(common.JOB)
    size = f"{PARALLEL_GROUP_SIZE.name}{{{job}}}"
    job_nodes = f"group by (node) ({size})"
    tp = common.sel(common.JOB, 'group="tp"')
    grid.stat(
        6,
        8,
        "Tensor parallel: NVLink domains per group",
        "The most nodes (NVLink domains, where NVML's fabric or the site names them) any "
        "tensor-parallel group of the job spans. 1: every tp group stays on NVLink. 2 or "
        "more: its collectives cross the network every layer of every step, and "
        f"{AlertName.TENSOR_PARALLEL_ACROSS_NODES} pages (the check's verdict). No value: the job's "
        "ranks report no tp group.",
        "none",
        common.targets((f"max({series.domains}{{{tp}}})", "")),
        steps=common.limit(2),
    )
    grid.table(
        18,
        8,
        "Parallel layout",
        "Each kind of parallel group the job's ranks report (tp, pp, dp, cp, ep or a "
        "DeviceMesh dimension's name): its size in ranks, how many such groups, and the "
        "most nodes and NVLink domains one of them spans. Tensor parallelism belongs "
        "inside one node (or NVLink domain); pipeline and data parallelism may cross nodes.",
        "none",
        [
            common.target(f"max by (group) ({size})", instant=True, ref="A"),
            common.target(f"count by (group) ({series.nodes}{{{job}}})", instant=True, ref="B"),
            common.target(f"max by (group) ({series.nodes}{{{job}}})", instant=True, ref="C"),
            common.target(f"max by (group) ({series.domains}{{{job}}})", instant=True, ref="D"),
        ],
        link_node=False,
        sort_by="ranks per group",
        columns=("ranks per group", "groups", "nodes per group (most)", "NVLink domains (most)"),
    )
    pp = common.sel(common.JOB, 'group="pp"')
    pipeline = f"{PARALLEL_GROUP_SIZE.name}{{{pp}}}"
    stages = common.table_panel(
        "Pipeline stages",
        "Each pipeline stage (a rank's index in its pp group): its ranks and the nodes they "
        f"are on. Stages of unequal size give {AlertName.PIPELINE_STAGES_UNEVEN} (info).",
        "none",
        [
            common.target(
                f"max by (group_rank) ({series.stage_ranks}{{{job}}})", instant=True, ref="A"
            ),
            common.target(
                f"count by (group_rank) (count by (group_rank, node) ({pipeline}))",
                instant=True,
                ref="B",
            ),
        ],
        link_node=False,
        columns=("ranks", "nodes"),
    )
    stage_column = [dm.DynamicConfigValue(id_val="displayName", value="stage")]
    grid.add(stages.override_by_name("group_rank", stage_column), 12, 8)
    grid.table(
        12,
        8,
        "Stages per node",
        "Each node of the job: how many pipeline stages its ranks belong to and how many "
        "ranks it runs. A node in one stage keeps its pipeline sends on the network to the "
        "next stage's nodes; more stages per node are fine while tp stays inside it.",
        "none",
        [
            common.target(
                f"count by (node) (count by (node, group_rank) ({pipeline}))", instant=True, ref="A"
            ),
            common.target(f"count by (node) ({pipeline})", instant=True, ref="B"),
        ],
        columns=("stages", "ranks"),
    )
    nvlink = (
        f"sum by (node) (\n  {cat.NVLINK_BANDWIDTH.name}{{{common.sel(config.gpu_selector)}}}\n"
        f"  * on (UUID) group_left (node) {r.support.gpu_node}{{{common.sel()}}}\n) * {NVLINK_TO_BYTES}"
    )
    infiniband = _network(
        external.NODE_INFINIBAND_TRANSMITTED.name,
        external.NODE_INFINIBAND_RECEIVED.name,
    )
    netdev = _network(
        external.NODE_NETWORK_TRANSMIT.name,
        external.NODE_NETWORK_RECEIVE.name,
        f'device!~"{LOCAL_DEVICES}"',
    )
    grid.timeseries(
        24,
        9,
        "NVLink vs network bytes per node",
        "Each of the job's nodes: NVLink bytes per second over all its GPUs' links (sent "
        "plus received, DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL) beside its network bytes per "
        "second (sent plus received: node_exporter's InfiniBand port data where it has "
        "them, else its network devices but local ones). Tensor parallelism inside the "
        "node is NVLink-heavy with network bursts at gradient all-reduces; across nodes "
        "the network carries sustained traffic through the whole step.",
        "Bps",
        common.targets(
            (f"({nvlink})\nand on (node) {job_nodes}", "{{node}} NVLink"),
            (f"({infiniband}\nor {netdev})\nand on (node) {job_nodes}", "{{node}} network"),
        ),
    )
