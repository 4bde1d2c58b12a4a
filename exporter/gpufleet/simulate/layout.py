"""A simulated job's parallel layout and its traffic, for the job layout panels.

With ``parallel_layout`` on in the cluster section, each node's agent exports the
layout its ranks report (``gpufleet_training_parallel_group_size``: one series per rank
and group, tp / pp / dp, as the client sends them once per attempt), its GPUs' NVLink
bandwidth (``DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL``) and the node's node_exporter its
InfiniBand bytes. Ranks are numbered node by node; a pipeline stage holds DP x TP
consecutive ranks and a TP group TP consecutive ones (as ``ClusterSpec.dp_rank``).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from gpufleet.schema import gpu as cat
from gpufleet.schema.external import NODE_INFINIBAND_RECEIVED, NODE_INFINIBAND_TRANSMITTED
from gpufleet.schema.training import PARALLEL_GROUP_SIZE
from gpufleet.simulate.config import Layout

NODE_EXPORTER_JOB = "node-exporter"
NODE_EXPORTER_PORT = 9100
IB_DEVICE = ("mlx5_0", "1")  # (device, port)
# A job's network traffic per node while it trains, each way (bytes/s; an NDR port
# carries 50 GB/s): data-parallel gradient all-reduces and pipeline sends; with tensor
# parallelism across nodes, also every layer's tp collectives, all through the step.
NETWORK_BYTES_PER_S = 12e9
TP_ACROSS_NODES_BYTES_PER_S = 45e9


@dataclass(frozen=True, slots=True)
class RankGroup:
    """One rank's place in one parallel group, as the client reports it."""

    group: str
    first_rank: int
    group_rank: int
    size: int


def rank_groups(layout: Layout, rank: int) -> tuple[RankGroup, ...]:
    """The tp, pp and dp groups of ``rank`` (each named by its lowest rank)."""
    stage_ranks = layout.dp * layout.tp
    stage, in_stage = divmod(rank, stage_ranks)
    replica, tp_index = divmod(in_stage, layout.tp)
    return (
        RankGroup("tp", rank - tp_index, tp_index, layout.tp),
        RankGroup("pp", in_stage, stage, layout.pp),
        RankGroup("dp", stage * stage_ranks + tp_index, replica, layout.dp),
    )


def layout_labels(job: str, node: str, rank: int, placed: RankGroup) -> list[tuple[str, str]]:
    return [
        ("training_job", job),
        ("node", node),
        ("rank", str(rank)),
        ("attempt", "0"),
        ("group", placed.group),
        ("group_first_rank", str(placed.first_rank)),
        ("group_rank", str(placed.group_rank)),
    ]


def network_rate(layout: Layout, gpus_per_node: int) -> float:
    """Bytes per second each way while training: more where tp groups span nodes."""
    return TP_ACROSS_NODES_BYTES_PER_S if layout.tp > gpus_per_node else NETWORK_BYTES_PER_S


def network_counter(training: np.ndarray, times: np.ndarray, rate: float) -> np.ndarray:
    """Bytes sent (or received) since boot at each tick: ``rate`` per second while the
    node trains (``training`` 1), nothing otherwise; NaN where the node is down."""
    steps = np.diff(times, prepend=times[0] if len(times) else 0.0)
    sent = np.cumsum(np.where(training == 1, rate * steps, 0.0))
    return np.where(np.isnan(training), np.nan, 1e12 + sent)


NVLINK = cat.NVLINK_BANDWIDTH
LAYOUT = PARALLEL_GROUP_SIZE
IB_FAMILIES = (NODE_INFINIBAND_TRANSMITTED, NODE_INFINIBAND_RECEIVED)
