"""Stragglers: each node's compute per step against its pipeline stage's peers (the
median node; in a stage of few nodes, rank against rank) and against its own baseline,
and what excuses a slower node (a replica's or its tokens' extra work)."""

from __future__ import annotations

from gpufleet.rules.common import JOB_NODE, NODE_STAGE, STAGE, Alert, Record, metric, with_node
from gpufleet.rules.config import RulesConfig
from gpufleet.rules.training.series import TrainingSeries, rate_sum, robust_scale
from gpufleet.schema import gpu as cat
from gpufleet.schema import training as ts
from gpufleet.schema.alerts import AlertName


def peer_ratio_expr(series: TrainingSeries) -> str:
    """Each node against its stage peers as the straggler condition measures it: its
    slowest rank against the fastest node's median rank in a stage of few nodes, else
    its slowest rank against the stage's median node."""
    return f"({series.rank_ratio} or {series.compute_ratio})"


def straggler_expr(config: RulesConfig, series: TrainingSeries) -> str:
    """A node slower than its stage peers, valued by how much: node level where the stage
    has straggler_min_peers nodes, else rank level (its slowest rank against the fastest
    node's median rank) where it has straggler_min_rank_peers ranks; or subtly slower
    over straggler_subtle_window (than the stage's median node, in a small stage than its
    fastest; or its slowest rank against the fastest node's median rank), slower than the
    node itself was, on a GPU that clocks lower than the job's.

    Never in a stage that times no compute split: every rank there counts its step time
    as compute, so what differs between nodes is not compute (a node's first steps after
    it joined the job, steps held for the others)."""
    nodes, ranks = series.stage_nodes, series.stage_ranks

    def rank_level(ratio: float) -> str:
        """A small stage's node whose slowest rank is ``ratio`` times the fastest node's
        median rank, by a z-score and a least excess a step."""
        return (
            f"{series.rank_ratio} > {ratio}\n"
            f"  and {series.rank_zscore} > {config.straggler_zscore}\n"
            f"  and {series.rank_excess} > {config.straggler_min_excess_seconds}\n"
            f"  and on ({STAGE}) ({ranks} >= {config.straggler_min_rank_peers})"
        )

    return (
        f"(\n  (\n  {series.compute_ratio} > {config.straggler_ratio}\n"
        f"  and {series.compute_zscore} > {config.straggler_zscore}\n"
        f"  and on ({STAGE}) ({nodes} >= {config.straggler_min_peers})\n  )\n  or (\n"
        f"  {rank_level(config.straggler_ratio)}\n  )\n  or (\n"
        # a subtle slowdown, over a longer window: against the stage's median node, or in a
        # stage of few nodes against its fastest node (no spread to measure a z-score by) ...
        f"  (\n  {series.compute_ratio_long} > {config.straggler_subtle_ratio}\n"
        f"  and {series.compute_zscore_long} > {config.straggler_zscore}\n"
        f"  and on ({STAGE}) ({nodes} >= {config.straggler_min_peers})\n"
        f"  or {series.fastest_ratio_long} > {config.straggler_subtle_ratio}\n"
        f"  and on ({STAGE}) ({ranks} >= {config.straggler_min_rank_peers})\n"
        # ... or, where a stage has few nodes, one GPU slower than the others of its node
        # (a stage left with one node has no other node to compare: its ranks are peers)
        f"  or {rank_level(config.straggler_subtle_ratio)}\n  )\n"
        # ... and slower than the node was itself (a node always a little slower, or a stage
        # of uneven work, never pages), on a GPU that runs slower: a replica given more work
        # (longer sequences) computes longer on GPUs clocked like everyone else's
        f"  and on ({NODE_STAGE}) {series.baseline_ratio}"
        f" > {config.straggler_subtle_baseline_ratio}\n"
        f"  and on ({NODE_STAGE}) {series.clock_ratio} < {config.straggler_subtle_clock_ratio}\n  )\n)\n"
        f"and on ({NODE_STAGE}) {series.stepping}\n"
        f"unless on ({STAGE}) {series.detection_active} == 0"
    )


def replica_floor_expr(series: TrainingSeries) -> str:
    """The least over a job's stages of two or more nodes of each stage's slowest node
    against its peers, for jobs of two such stages or more."""
    peers = f"on ({STAGE}) ({series.stage_nodes} >= 2)"
    return (
        f"min by (training_job) (\n  max by ({STAGE}) ({peer_ratio_expr(series)} and {peers})\n)\n"
        f"and on (training_job) count by (training_job) ({series.stage_nodes} >= 2) >= 2"
    )


def replica_imbalance_expr(config: RulesConfig, series: TrainingSeries) -> str:
    """Jobs with a node in every stage slower than its peers at once, valued by the
    least of them: the signature of a data-parallel replica given more work."""
    return f"{series.replica_floor} >= {config.replica_lean_ratio}"


def replica_work_expr(config: RulesConfig, series: TrainingSeries) -> str:
    """Nodes no slower than the replica's floor allows, while a replica is imbalanced:
    its work, not slow hardware. Not a node whose GPU clocks lower than the job's median
    node: more work runs at full clock, a slow GPU does not."""
    return (
        f"{peer_ratio_expr(series)}\n<= on (training_job) group_left ()\n"
        f"({replica_imbalance_expr(config, series)}) * {config.replica_match_ratio}\n"
        f"unless on ({NODE_STAGE}) {series.clock_ratio} < {config.straggler_subtle_clock_ratio}"
    )


def token_work_expr(config: RulesConfig, series: TrainingSeries) -> str:
    """Nodes whose compute against their stage peers is at most their tokens per step
    against the stage's median node (times straggler_token_match_ratio): their work,
    not slow hardware. Only where the stage reports tokens; not a node whose GPU clocks
    lower than the job's median node (as for a replica's work)."""
    return (
        f"{peer_ratio_expr(series)}\n"
        f"<= on ({NODE_STAGE}) {series.tokens_ratio} * {config.straggler_token_match_ratio}\n"
        f"unless on ({NODE_STAGE}) {series.clock_ratio} < {config.straggler_subtle_clock_ratio}"
    )


def peer_records(config: RulesConfig, series: TrainingSeries) -> list[Record]:
    """Each node's and rank's compute per step, its stage's median, fastest, spread and
    size, and each node against them."""
    slow, median, mad = series.slowest, series.stage_median, series.stage_mad
    ranks = series.stage_ranks
    node_compute = (
        f"{rate_sum(config, ts.SLOWEST_RANK_COMPUTE_SECONDS, NODE_STAGE)}\n"
        f"/ {rate_sum(config, ts.SLOWEST_RANK_STEPS, NODE_STAGE)}"
    )
    rank_by = NODE_STAGE + ", rank"
    return [
        Record(slow, node_compute),
        Record(median, f"quantile by ({STAGE}) (0.5, {slow})"),
        Record(series.stage_fastest, f"min by ({STAGE}) ({slow})"),
        Record(mad, f"quantile by ({STAGE}) (0.5, abs({slow} - on ({STAGE}) group_left {median}))"),
        Record(series.stage_nodes, f"count by ({STAGE}) ({slow})"),
        Record(series.compute_ratio, f"{slow} / on ({STAGE}) group_left {median}"),
        Record(
            series.compute_zscore,
            f"({slow} - on ({STAGE}) group_left {median})\n"
            f"/ on ({STAGE}) group_left () {robust_scale(config, mad, median)}",
        ),
        # Only the ranks of stages too small for the node comparison read them: the
        # rank-level records below then scan those ranks, not every rank of the fleet.
        Record(
            series.rank,
            f"(\n  {rate_sum(config, ts.RANK_COMPUTE_SECONDS, rank_by)}\n"
            f"  / {rate_sum(config, ts.RANK_STEPS, rank_by)}\n)\n"
            f"and on ({STAGE}) ({series.stage_nodes} < {config.straggler_min_peers})",
        ),
        Record(ranks, f"count by ({STAGE}) ({series.rank})"),
        # Tokens per rank-step (steps count one per rank per step); > 0 drops a stage whose
        # ranks report no tokens (0 and 0/0): no median and no ratio there.
        Record(
            series.tokens,
            f"{rate_sum(config, ts.TOKENS, NODE_STAGE)}\n/ {rate_sum(config, ts.STEPS, NODE_STAGE)}\n> 0",
        ),
        Record(series.stage_tokens, f"quantile by ({STAGE}) (0.5, {series.tokens})"),
        Record(
            series.tokens_ratio,
            f"{series.tokens} / on ({STAGE}) group_left {series.stage_tokens}",
        ),
    ]


def rank_level_records(config: RulesConfig, series: TrainingSeries) -> list[Record]:
    """In stages of fewer than straggler_min_peers nodes: each node's median, spread and
    slowest rank; the stage's reference (the fastest node's median rank) and spread (the
    least within-node MAD); each node's slowest rank against them."""
    rank = series.rank  # recorded in those stages only
    node_rank_median, node_rank_max = series.node_rank_median, series.node_rank_max
    reference, spread = series.rank_reference, series.rank_spread
    return [
        Record(node_rank_median, f"quantile by ({NODE_STAGE}) (0.5, {rank})"),
        Record(
            series.node_rank_mad,
            f"quantile by ({NODE_STAGE}) (0.5, abs({rank} - on ({NODE_STAGE}) group_left {node_rank_median}))",
        ),
        Record(node_rank_max, f"max by ({NODE_STAGE}) ({rank})"),
        Record(reference, f"min by ({STAGE}) ({node_rank_median})"),
        Record(spread, f"min by ({STAGE}) ({series.node_rank_mad})"),
        Record(series.rank_ratio, f"{node_rank_max} / on ({STAGE}) group_left {reference}"),
        Record(
            series.rank_zscore,
            f"({node_rank_max} - on ({STAGE}) group_left {reference})\n"
            f"/ on ({STAGE}) group_left () {robust_scale(config, spread, reference)}",
        ),
        Record(series.rank_excess, f"{node_rank_max} - on ({STAGE}) group_left {reference}"),
    ]


def coverage_records(config: RulesConfig, series: TrainingSeries) -> list[Record]:
    """The rank-level comparison, the straggler condition, the replica floor and which
    stages a peer comparison covers."""
    nodes, ranks = series.stage_nodes, series.stage_ranks
    return [
        *rank_level_records(config, series),
        # The straggler condition without its `for`: the alert reads it, and stage
        # imbalance is silent for a stage that holds one.
        Record(series.straggler, straggler_expr(config, series)),
        Record(series.replica_floor, replica_floor_expr(series)),
        # 1 where a peer comparison covers the stage, 0 where none does, label reason
        # saying which; a stepping stage none of whose ranks timed a split is
        # no_compute_split whatever its peers.
        Record(
            series.detection_active,
            f"label_replace(\n  {rate_sum(config, ts.SPLIT_STEPS, STAGE)} == 0\n"
            f'  and on ({STAGE}) {series.node_step},\n  "reason", "no_compute_split", "", ""\n)\n'
            f"or on ({STAGE})\n"
            f'label_replace(({nodes} >= {config.straggler_min_peers}) * 0 + 1, "reason", "node_peers", "", "")\n'
            f"or on ({STAGE})\n"
            f'label_replace(({ranks} >= {config.straggler_min_rank_peers}) * 0 + 1, "reason", "rank_peers", "", "")\n'
            f"or on ({STAGE})\n"
            f'label_replace({nodes} * 0, "reason", "too_few_peers", "", "")\n'
            f"or on ({STAGE})\n"
            f'label_replace(count by ({STAGE}) ({series.node_step}) * 0, "reason", "no_compute_split", "", "")',
        ),
    ]


def node_trend_records(config: RulesConfig, series: TrainingSeries) -> list[Record]:
    """Which node-stages step now, and each node against its own baseline, relative to
    the job's median node (a cluster-wide slowdown cancels out)."""
    step_w = config.step_window
    return [
        Record(
            series.stepping,
            rate_sum(config, ts.SLOWEST_RANK_STEPS, NODE_STAGE, step_w) + " > 0",
        ),
        Record(
            series.node_step,
            rate_sum(config, ts.STEP_SECONDS, NODE_STAGE, step_w) + " > 0",
        ),
        Record(series.own_trend, f"{series.slowest} / {series.node_baseline}"),
        Record(
            series.baseline_ratio,
            f"{series.own_trend}\n/ on (training_job) group_left ()\n"
            f"quantile by (training_job) (0.5, {series.own_trend})",
        ),
    ]


def long_window_records(config: RulesConfig, series: TrainingSeries) -> list[Record]:
    """The peer comparison over straggler_subtle_window, each node's least-clocked GPU
    against the job's median node, and each node's own baseline."""
    long_w, nodes = config.straggler_subtle_window, series.stage_nodes
    slow_long, median_long, mad_long = (
        series.slowest_long,
        series.stage_median_long,
        series.stage_mad_long,
    )
    base_w, base_o = config.baseline_window, config.baseline_offset
    node_clock = with_node(
        f"avg_over_time({metric(cat.SM_CLOCK.name, config.gpu_selector)}[{long_w}])",
        config.node_labels,
    )
    clocked = f"{slow_long} * 0 + on (node) group_left () {series.gpu_clock}"
    return [
        Record(
            slow_long,
            f"{rate_sum(config, ts.SLOWEST_RANK_COMPUTE_SECONDS, NODE_STAGE, long_w)}\n"
            f"/ {rate_sum(config, ts.SLOWEST_RANK_STEPS, NODE_STAGE, long_w)}",
        ),
        Record(median_long, f"quantile by ({STAGE}) (0.5, {slow_long})"),
        Record(
            mad_long,
            f"quantile by ({STAGE}) (0.5, abs({slow_long} - on ({STAGE}) group_left {median_long}))",
        ),
        Record(series.compute_ratio_long, f"{slow_long} / on ({STAGE}) group_left {median_long}"),
        Record(
            series.compute_zscore_long,
            f"({slow_long} - on ({STAGE}) group_left {median_long})\n"
            f"/ on ({STAGE}) group_left () {robust_scale(config, mad_long, median_long)}",
        ),
        Record(
            series.fastest_ratio_long,
            f"(\n  {slow_long}\n  and on ({STAGE}) ({nodes} < {config.straggler_min_peers})\n)\n"
            f"/ on ({STAGE}) group_left () min by ({STAGE}) ({slow_long})",
        ),
        # Nodes whose GPUs are not scraped get no clock ratio.
        Record(series.gpu_clock, f"min by (node) (\n  {node_clock}\n)"),
        Record(
            series.clock_ratio,
            f"({clocked})\n/ on (training_job) group_left ()\n"
            f"quantile by (training_job) (0.5, {clocked})",
        ),
        Record(
            series.node_baseline,
            f"{rate_sum(config, ts.SLOWEST_RANK_COMPUTE_SECONDS, NODE_STAGE, base_w, base_o)}\n"
            f"/ {rate_sum(config, ts.SLOWEST_RANK_STEPS, NODE_STAGE, base_w, base_o)}",
        ),
    ]


def straggler_alert(config: RulesConfig, series: TrainingSeries) -> Alert:
    replica_work = replica_work_expr(config, series).replace("\n", "\n  ")
    token_work = token_work_expr(config, series).replace("\n", "\n  ")
    return Alert(
        AlertName.STRAGGLER,
        # The straggler condition, unless a replica's extra work or the extra tokens its
        # ranks processed per step explain the node.
        f"{series.straggler}\nunless on ({NODE_STAGE}) (\n  {replica_work}\n)\n"
        f"unless on ({NODE_STAGE}) (\n  {token_work}\n)",
        "warning",
        "A node computes persistently slower than its peers in the same pipeline stage.",
        f'{JOB_NODE} computes {{{{ $value | printf "%.2f" }}}}x its stage peers (the '
        "median node, or in a stage of few nodes the fastest node's median rank), for "
        f"{config.straggler_for}: in lock-step training it sets the pace for every rank. "
        "Check its GPUs' clocks and throttling; drain it and let the job continue without it.",
        config.straggler_for,
    )


def baseline_alert(config: RulesConfig, series: TrainingSeries) -> Alert:
    replica_work = replica_work_expr(config, series).replace("\n", "\n  ")
    return Alert(
        AlertName.SLOWER_THAN_BASELINE,
        # Slower than its own baseline relative to the job, while stepping; not a
        # straggler (paged as one), not a node a replica's extra work explains, not in a
        # stage that times no compute split (there a node's compute is its step time).
        f"{series.baseline_ratio} > {config.baseline_ratio}\n"
        f"and on ({NODE_STAGE}) {series.stepping}\n"
        f"unless on ({NODE_STAGE}) {series.compute_ratio} > {config.straggler_ratio}\n"
        f"unless on ({NODE_STAGE}) (\n  {replica_work}\n)\n"
        f'unless on ({STAGE}) {series.detection_active}{{reason="no_compute_split"}}',
        "warning",
        "A node computes slower than it did itself, relative to the rest of the job.",
        f'{JOB_NODE} computes {{{{ $value | printf "%.2f" }}}}x its own recent baseline '
        f"({config.baseline_window} ending {config.baseline_offset} ago), relative to the whole job. "
        "Check its GPUs' clocks and throttling.",
        config.baseline_for,
    )


def stage_imbalance_alert(config: RulesConfig, series: TrainingSeries) -> Alert:
    fastest = series.stage_fastest
    return Alert(
        AlertName.STAGE_IMBALANCE,
        # Each stage's fastest node against the job's fastest stage, unless the stage
        # holds a straggler.
        f"{fastest}\n/ on (training_job) group_left () min by (training_job) ({fastest})\n"
        f"> {config.stage_imbalance_ratio}\n"
        f"unless on ({STAGE}) {series.straggler}",
        "info",
        "A pipeline stage of a job takes noticeably longer to compute than the others.",
        "Pipeline stage {{ $labels.pp_stage }} of job {{ $labels.training_job }} computes "
        '{{ $value | printf "%.2f" }}x the fastest stage, on every node of the stage: '
        "rebalance the layers across stages.",
        config.stage_imbalance_for,
    )


def replica_imbalance_alert(config: RulesConfig, series: TrainingSeries) -> Alert:
    return Alert(
        AlertName.REPLICA_IMBALANCE,
        replica_imbalance_expr(config, series),
        "info",
        "One node in every pipeline stage of a job computes slower than its peers at once: "
        "uneven work across data-parallel replicas, not slow hardware.",
        "In job {{ $labels.training_job }} a node in every pipeline stage computes at least "
        '{{ $value | printf "%.2f" }}x its stage peers at the same time: the nodes of one '
        "data-parallel replica, given more work than the others (longer sequences, uneven "
        "packing or sharding). A node no slower than that (within "
        f"{round((config.replica_match_ratio - 1) * 100)}%) is not paged as a straggler; "
        "check how the data loader balances work across replicas.",
        config.straggler_for,
    )


def detection_inactive_alert(config: RulesConfig, series: TrainingSeries) -> Alert:
    return Alert(
        AlertName.STRAGGLER_DETECTION_INACTIVE,
        f"{series.detection_active} == 0\nand on ({STAGE}) count by ({STAGE}) ({series.node_step})",
        "info",
        "A pipeline stage of a running job has no straggler detection: too few peers, or no "
        "compute split.",
        "Stage {{ $labels.pp_stage }} of job {{ $labels.training_job }} cannot be compared "
        "with peers ({{ $labels.reason }}): "
        f"a slow node there pages nothing. Peer comparison needs {config.straggler_min_peers} "
        f"nodes or {config.straggler_min_rank_peers} reporting ranks per stage, and a "
        "compute split (report compute time, not only step time; report more ranks per "
        "node). Job slowdown and the node's own baseline still apply.",
        config.detection_inactive_for,
    )
