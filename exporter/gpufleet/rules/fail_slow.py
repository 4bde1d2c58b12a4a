"""Fail-slow rules for training jobs: stragglers against their stage peers and against
their own baseline, job-wide slowdowns, stage imbalance, hangs and data-loader stalls."""

from __future__ import annotations

from dataclasses import dataclass

from gpufleet.rules.attribution import held_any
from gpufleet.rules.common import (
    JOB_NODE,
    NODE_STAGE,
    STAGE,
    Alert,
    Group,
    Record,
    SeriesNames,
    metric,
    with_node,
)
from gpufleet.rules.config import RulesConfig
from gpufleet.rules.gpu import XID_INFO, GpuSeries
from gpufleet.schema import gpu as cat
from gpufleet.schema import training as ts


@dataclass(frozen=True, slots=True)
class TrainingSeries(SeriesNames):
    """What training.rules.yaml records, each named once here: the training alerts, the
    node health signals and the dashboards refer to these."""

    # per node-stage: compute seconds per step of its slowest rank; its stage's median
    # and median absolute deviation; nodes per stage
    slowest: str = "node:gpufleet_training_slowest_compute_per_step:rate{rate_window}"
    stage_median: str = "stage:gpufleet_training_slowest_compute_per_step:median{rate_window}"
    stage_mad: str = "stage:gpufleet_training_slowest_compute_per_step:mad{rate_window}"
    stage_nodes: str = "stage:gpufleet_training_nodes:count{rate_window}"
    # a node's compute against its stage median
    compute_ratio: str = "node:gpufleet_training_compute_ratio:rate{rate_window}"
    compute_zscore: str = "node:gpufleet_training_compute_zscore:rate{rate_window}"
    # per node-stage where its ranks report tokens: tokens per rank-step; its stage's
    # median; the node's against that median
    tokens: str = "node:gpufleet_training_tokens_per_step:rate{rate_window}"
    stage_tokens: str = "stage:gpufleet_training_tokens_per_step:median{rate_window}"
    tokens_ratio: str = "node:gpufleet_training_tokens_ratio:rate{rate_window}"
    # the stage's fastest node (stage imbalance compares stages by it)
    stage_fastest: str = "stage:gpufleet_training_slowest_compute_per_step:min{rate_window}"
    # per rank: compute seconds per step; ranks per stage
    rank: str = "rank:gpufleet_training_compute_per_step:rate{rate_window}"
    stage_ranks: str = "stage:gpufleet_training_ranks:count{rate_window}"
    # in stages of fewer than straggler_min_peers nodes: each node's median, MAD and
    # slowest rank; the stage's reference (the fastest node's median rank) and spread
    # (the least within-node MAD); each node's slowest rank against them
    node_rank_median: str = "node:gpufleet_training_rank_compute_per_step:median{rate_window}"
    node_rank_mad: str = "node:gpufleet_training_rank_compute_per_step:mad{rate_window}"
    node_rank_max: str = "node:gpufleet_training_rank_compute_per_step:max{rate_window}"
    rank_reference: str = "stage:gpufleet_training_rank_compute_per_step:reference{rate_window}"
    rank_spread: str = "stage:gpufleet_training_rank_compute_per_step:spread{rate_window}"
    rank_ratio: str = "node:gpufleet_training_rank_compute_ratio:max{rate_window}"
    rank_zscore: str = "node:gpufleet_training_rank_compute_zscore:max{rate_window}"
    rank_excess: str = "node:gpufleet_training_rank_compute_excess:max{rate_window}"
    # subtle stragglers: the node's compute against its stage over a longer window
    slowest_long: str = (
        "node:gpufleet_training_slowest_compute_per_step:rate{straggler_subtle_window}"
    )
    stage_median_long: str = (
        "stage:gpufleet_training_slowest_compute_per_step:median{straggler_subtle_window}"
    )
    stage_mad_long: str = (
        "stage:gpufleet_training_slowest_compute_per_step:mad{straggler_subtle_window}"
    )
    compute_ratio_long: str = "node:gpufleet_training_compute_ratio:rate{straggler_subtle_window}"
    compute_zscore_long: str = "node:gpufleet_training_compute_zscore:rate{straggler_subtle_window}"
    # in a stage of fewer than straggler_min_peers nodes: against the stage's fastest node
    fastest_ratio_long: str = (
        "node:gpufleet_training_compute_ratio_to_fastest:rate{straggler_subtle_window}"
    )
    # ... whose GPU must run slower too: the node's least-clocked GPU over that window, and
    # it against the job's median node
    gpu_clock: str = "node:DCGM_FI_DEV_SM_CLOCK:min_avg{straggler_subtle_window}"
    clock_ratio: str = "node:gpufleet_training_sm_clock_ratio:min{straggler_subtle_window}"
    # the straggler condition without its `for`, valued by how much slower
    straggler: str = "node:gpufleet_training_straggler:ratio{rate_window}"
    # per job: the least, over its stages of two or more nodes, of each stage's slowest
    # node against its peers (only for jobs of two such stages or more): well above 1, one
    # node in every stage is slower at once, a data-parallel replica given more work
    replica_floor: str = "job:gpufleet_training_replica_floor:ratio{rate_window}"
    # per stage: 1 if a peer comparison covers it, 0 if not (label reason says why)
    detection_active: str = "stage:gpufleet_straggler_detection:active"
    # node-stages whose slowest rank stepped within step_window; their step seconds
    stepping: str = "node:gpufleet_training_slowest_rank_steps:rate{step_window}"
    node_step: str = "node:gpufleet_training_step_seconds:rate{step_window}"
    # a node against its own baseline, then against the job's median trend
    node_baseline: str = "node:gpufleet_training_slowest_compute_per_step:baseline{baseline_window}"
    own_trend: str = "node:gpufleet_training_own_trend:rate{rate_window}"
    baseline_ratio: str = "node:gpufleet_training_baseline_ratio:rate{rate_window}"
    # the job's seconds per step over step_window, its steady step time now and over
    # its baseline, and its mean over hang_step_window
    job_step: str = "job:gpufleet_training_step_seconds:rate{step_window}"
    # ... over shorter stretches, for jobs that time no data wait
    job_step_short: str = (
        "job:gpufleet_training_step_seconds:rate{job_slowdown_untimed_step_window}"
    )
    # each node's data wait per step, the job's data-loader stalls per step (the most
    # waiting node's wait above the least's) and its step time less them
    node_data_wait: str = "node:gpufleet_training_data_wait_per_step:rate{step_window}"
    job_data_stall: str = "job:gpufleet_training_data_stall_per_step:rate{step_window}"
    job_step_net: str = "job:gpufleet_training_step_seconds_less_stalls:rate{step_window}"
    job_steady: str = "job:gpufleet_training_step_seconds_less_stalls:steady{job_slowdown_window}"
    job_steady_baseline: str = (
        "job:gpufleet_training_step_seconds_less_stalls:steady_baseline{baseline_window}"
    )
    job_step_avg: str = "job:gpufleet_training_step_seconds:avg{hang_step_window}"
    # each node's slowest rank's wait per step (collectives, pipeline bubbles), its
    # baseline, and the job's least rise over it
    node_comm: str = "node:gpufleet_training_slowest_rank_wait_per_step:rate{step_window}"
    node_comm_baseline: str = (
        "node:gpufleet_training_slowest_rank_wait_per_step:baseline{job_comm_baseline_window}"
    )
    job_comm_rise: str = "job:gpufleet_training_slowest_rank_wait_per_step:min_rise{step_window}"
    # each node's data-loader stalls per step (its data wait above the job's least node's,
    # where more than a loader's jitter), and those of the other nodes of its job
    node_data_stall: str = "node:gpufleet_training_data_stall_per_step:rate{step_window}"
    others_data_stall: str = "node:gpufleet_training_others_data_stall_per_step:rate{step_window}"
    data_wait_share: str = "node:gpufleet_training_data_wait_share:rate{data_wait_window}"
    data_wait_median: str = "stage:gpufleet_training_data_wait_share:median{data_wait_window}"
    # the hang detector's memory of each node-stage's last step and finish
    last_step: str = "node:gpufleet_training_last_step_timestamp:max{hang_memory}"
    finished: str = "node:gpufleet_training_finished_timestamp:last{hang_memory}"
    unfinished: str = "node:gpufleet_training_unfinished_last_step_timestamp:max{hang_memory}"


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
        f"  and on ({NODE_STAGE}) {series.baseline_ratio} > {config.straggler_subtle_baseline_ratio}\n"
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
    node: more work runs at full clock, a slow GPU does not (a replica given 13% more
    work hid a node 13% slower on 506)."""
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


def training_recording(config: RulesConfig) -> list[Group]:
    sel = config.agent_selector
    w = config.rate_window

    def rate_sum(name: str, by: str, window: str = w, offset: str = "") -> str:
        suffix = f" offset {offset}" if offset else ""
        function = "increase" if offset else "rate"
        return f"sum by ({by}) ({function}({metric(name, sel)}[{window}]{suffix}))"

    series = TrainingSeries.of(config)
    step_w = config.step_window
    slow = series.slowest
    median = series.stage_median
    mad = series.stage_mad
    steady, steady_baseline = series.job_steady, series.job_steady_baseline
    q, steady_w = config.job_slowdown_quantile, config.job_slowdown_window
    rank = series.rank
    nodes, ranks = series.stage_nodes, series.stage_ranks
    node_rank_median, node_rank_mad = series.node_rank_median, series.node_rank_mad
    node_rank_max = series.node_rank_max
    rank_reference, rank_spread = series.rank_reference, series.rank_spread
    slow_long, median_long, mad_long = (
        series.slowest_long,
        series.stage_median_long,
        series.stage_mad_long,
    )
    long_w = config.straggler_subtle_window
    floor = config.mad_floor
    base_w, base_o = config.baseline_window, config.baseline_offset
    # The job's step times less stalls over its baseline window, minutes without a step
    # left out (> 0 drops NaN).
    stepped = f"({series.job_step_net} > 0)[{base_w}:1m] offset {base_o}"
    stepped_short = f"({series.job_step_short} > 0)[{base_w}:1m] offset {base_o}"

    def by_data_timing(timed: str, untimed: str) -> str:
        """``timed`` for jobs whose ranks time their data wait, ``untimed`` for the others
        (a job that reports step time only)."""
        return (
            f"{timed}\nand on (training_job) (max by (training_job) ({series.node_data_wait}) > 0)\n"
            f"or {untimed}"
        )

    def job_seconds_per_step(window: str) -> str:
        return (
            f"{rate_sum('gpufleet_training_step_seconds_total', 'training_job', window)}\n"
            f"/ {rate_sum('gpufleet_training_steps_total', 'training_job', window)}"
        )

    def scale(spread: str, center: str) -> str:
        return f"((1.4826 * {spread} > {center} * {floor}) or ({center} * {floor}))"

    peers = [
        Record(
            slow,
            f"{rate_sum('gpufleet_training_slowest_rank_compute_seconds_total', NODE_STAGE)}\n"
            f"/ {rate_sum('gpufleet_training_slowest_rank_steps_total', NODE_STAGE)}",
        ),
        Record(median, f"quantile by ({STAGE}) (0.5, {slow})"),
        Record(series.stage_fastest, f"min by ({STAGE}) ({slow})"),
        Record(mad, f"quantile by ({STAGE}) (0.5, abs({slow} - on ({STAGE}) group_left {median}))"),
        Record(series.stage_nodes, f"count by ({STAGE}) ({slow})"),
        Record(
            series.compute_ratio,
            f"{slow} / on ({STAGE}) group_left {median}",
        ),
        Record(
            series.compute_zscore,
            f"({slow} - on ({STAGE}) group_left {median})\n/ on ({STAGE}) group_left () {scale(mad, median)}",
        ),
        Record(
            rank,
            f"{rate_sum('gpufleet_training_rank_compute_seconds_total', NODE_STAGE + ', rank')}\n"
            f"/ {rate_sum('gpufleet_training_rank_steps_total', NODE_STAGE + ', rank')}",
        ),
        Record(ranks, f"count by ({STAGE}) ({rank})"),
        # Tokens per rank-step (steps count one per rank per step). A stage whose ranks
        # report no tokens (> 0 drops 0 and 0/0) has none, no median and no ratio.
        Record(
            series.tokens,
            f"{rate_sum(ts.TOKENS.name, NODE_STAGE)}\n/ {rate_sum(ts.STEPS.name, NODE_STAGE)}\n> 0",
        ),
        Record(series.stage_tokens, f"quantile by ({STAGE}) (0.5, {series.tokens})"),
        Record(
            series.tokens_ratio,
            f"{series.tokens} / on ({STAGE}) group_left {series.stage_tokens}",
        ),
    ]
    coverage = [
        # Rank level, for stages of fewer nodes than straggler_min_peers only (a big stage
        # has its node comparison, and this keeps the cost off the fleet's big jobs). The
        # reference is the fastest node's median rank, not the stage's median: with two
        # nodes one slow node holds half the ranks and would drag the median halfway to
        # itself. The spread is the least within-node MAD: what healthy peers vary by.
        Record(
            node_rank_median,
            f"quantile by ({NODE_STAGE}) (0.5,\n  {rank}\n"
            f"  and on ({STAGE}) ({nodes} < {config.straggler_min_peers})\n)",
        ),
        Record(
            node_rank_mad,
            f"quantile by ({NODE_STAGE}) (0.5, abs({rank} - on ({NODE_STAGE}) group_left {node_rank_median}))",
        ),
        Record(
            node_rank_max,
            f"max by ({NODE_STAGE}) (\n  {rank}\n"
            f"  and on ({STAGE}) ({nodes} < {config.straggler_min_peers})\n)",
        ),
        Record(rank_reference, f"min by ({STAGE}) ({node_rank_median})"),
        Record(rank_spread, f"min by ({STAGE}) ({node_rank_mad})"),
        # Each node's slowest rank against the reference (node level from here: cheap).
        Record(series.rank_ratio, f"{node_rank_max} / on ({STAGE}) group_left {rank_reference}"),
        Record(
            series.rank_zscore,
            f"({node_rank_max} - on ({STAGE}) group_left {rank_reference})\n"
            f"/ on ({STAGE}) group_left () {scale(rank_spread, rank_reference)}",
        ),
        Record(series.rank_excess, f"{node_rank_max} - on ({STAGE}) group_left {rank_reference}"),
        # The straggler condition without its `for`: the alert reads it, and stage
        # imbalance is silent for a stage that holds one.
        Record(series.straggler, straggler_expr(config, series)),
        # A data-parallel replica spans one node (or a few) in every pipeline stage: given
        # more work than the others (longer sequences, uneven packing or sharding) its nodes
        # compute longer in every stage at once, on healthy GPUs. Slow hardware is one node;
        # a slow node in every stage of a job at the same moment is the replica's work.
        Record(series.replica_floor, replica_floor_expr(series)),
        # Which stages have a peer comparison, and why not where none: 1 covered, 0 not.
        # A stepping stage none of whose ranks timed a split (compute or collective wait)
        # is blind first of all: its compute is the rest of each step, the same on every
        # rank of a lock-step job, however many peers it has. (An agent too old to count
        # split steps leaves the stage to the peer count, as before.)
        Record(
            series.detection_active,
            f"label_replace(\n  {rate_sum(ts.SPLIT_STEPS.name, STAGE)} == 0\n"
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
    node_baseline = series.node_baseline
    step_seconds = rate_sum("gpufleet_training_step_seconds_total", NODE_STAGE, step_w)
    trends = [
        # Rates over windows keep a stopped job's last minutes "frozen": the alerts below
        # only judge a node that is still stepping.
        Record(
            series.stepping,
            rate_sum("gpufleet_training_slowest_rank_steps_total", NODE_STAGE, step_w) + " > 0",
        ),
        Record(
            series.node_step,
            rate_sum("gpufleet_training_step_seconds_total", NODE_STAGE, step_w) + " > 0",
        ),
        Record(series.own_trend, f"{slow} / {node_baseline}"),
        # Relative to the whole job's median trend (all stages): a cluster-wide slowdown
        # cancels out, and a node alone in its stage still has a reference.
        Record(
            series.baseline_ratio,
            f"{series.own_trend}\n/ on (training_job) group_left ()\n"
            f"quantile by (training_job) (0.5, {series.own_trend})",
        ),
        # The job's steady step time, a low quantile of its 2-minute step times: in a
        # lock-step job every data-loader stall on any node stops all ranks for a minute
        # or two, several times an hour on a big job. A mean, or even a median when two
        # or three stalls fall in one window, reads that as a slowdown; the fastest
        # quarter of the window's 2-minute stretches only rises when all of them do. A
        # job that does not step has 0/0 = NaN here.
        Record(series.job_step, job_seconds_per_step(step_w)),
        # A data-loader stall on one node stops every rank of a lock-step job: the node
        # waits for its data, the others for it. Its wait per step above the job's least
        # node's is what the stall added to the job's step time (storage slow for every
        # node raises the least too, and stays in the step time); a run of stalls on one
        # node after another (a small job can spend a quarter of ten minutes in them) is
        # the input pipeline's, not a slower job. The most-waiting node's, not the sum
        # over nodes: stalls on two nodes at once cost the job the longer one, and a sum
        # would take more off than they added (a step time below the job's pace, which
        # pulls its baseline down and hides a slowdown after the stalls). A job that
        # times no data wait (step time only) has no stall figure, and its step time
        # stands as it is.
        Record(
            series.node_data_wait,
            f"{rate_sum('gpufleet_training_data_wait_seconds_total', NODE_STAGE, step_w)}\n"
            f"/ ({rate_sum('gpufleet_training_steps_total', NODE_STAGE, step_w)} > 0)",
        ),
        Record(
            series.job_data_stall,
            f"max by (training_job) ({series.node_data_wait})\n"
            f"- min by (training_job) ({series.node_data_wait})",
        ),
        Record(
            series.job_step_net,
            f"{series.job_step}\n- ({series.job_data_stall} or {series.job_step} * 0)",
        ),
        # A job that times no data wait has no stall figure: a run of stalls raises its
        # step time as a slowdown does. Between stalls it steps at its pace, so its
        # steady step time is its fastest 1-minute stretch instead, held by the alert:
        # a slowdown raises every stretch; stalls leave one clean now and then (a big
        # job's, one minute between them more often than two).
        *(
            [
                Record(
                    series.job_step_short,
                    job_seconds_per_step(config.job_slowdown_untimed_step_window)
                    # too few samples in a stretch (missed scrapes)
                    + f"\nor {series.job_step}",
                )
            ]
            # a scrape interval long enough to move both windows to the same length
            # makes them one series, recorded once
            if series.job_step_short != series.job_step
            else []
        ),
        Record(
            steady,
            by_data_timing(
                f"quantile_over_time({q}, {series.job_step_net}[{steady_w}:1m])",
                f"quantile_over_time(0, {series.job_step_short}[{config.job_slowdown_untimed_window}:30s])",
            ),
        ),
        # How much the job's collectives slowed: the wait of each node's slowest rank
        # (its step time less its compute and data wait) against its own baseline, the
        # least rise of any node. A rank's wait holds the collective itself and the wait
        # for slower ranks (a straggler, another node's data-loader stall, a heavier
        # stage): those raise other ranks' wait, never that of the rank everyone waited
        # for, whose wait is the collective's own; a slow link or switch raises every
        # rank's. The slowest rank, not the node's mean: the other ranks of a straggler's
        # node wait for it too, and their mean would rise with every other node's.
        Record(
            series.node_comm,
            f"(\n  {step_seconds} - {rate_sum('gpufleet_training_data_wait_seconds_total', NODE_STAGE, step_w)}\n"
            # a client that times no data wait sends none
            f"  or {step_seconds}\n)\n"
            # no steps, no value (not NaN: one NaN makes the baseline's quantile NaN)
            f"/ ({rate_sum('gpufleet_training_steps_total', NODE_STAGE, step_w)} > 0)\n"
            f"- {rate_sum('gpufleet_training_slowest_rank_compute_seconds_total', NODE_STAGE, step_w)}\n"
            f"/ ({rate_sum('gpufleet_training_slowest_rank_steps_total', NODE_STAGE, step_w)} > 0)",
        ),
        # A node's wait holds every other node's data-loader stall in its step_window: in
        # a lock-step job each stall stops all ranks but the stalled one's. Stalls on
        # node after node within two minutes (a run of them on a small job) raise every
        # node's wait, the least rise too, as a slow network would: each node's has the
        # others' stalls taken off. Stalls on two nodes at once cost the job the longer
        # one only, so this takes off more than they added: while they overlap, a slow
        # network shows less, never more.
        Record(
            series.node_data_stall,
            f"(\n  {series.node_data_wait}\n"
            f"  - on (training_job) group_left () min by (training_job) ({series.node_data_wait})\n)\n"
            f"> on (training_job) group_left () ({series.job_step} * {config.job_comm_stall_floor})",
        ),
        Record(
            series.others_data_stall,
            f"sum by (training_job) ({series.node_data_stall})\n"
            f"- on (training_job) group_right ()\n"
            f"({series.node_data_stall} or {series.node_data_wait} * 0)",
        ),
        # A straggler is held against the job's least baseline, not its own: a node of a
        # lighter stage waited for the heavier one as well as for the collective, and
        # loses that wait when it becomes the slowest, so its own rise went negative and,
        # the least of any node, hid a slow network. The least baseline is the wait of
        # a node everyone else waited for: the collective's alone, as the straggler's
        # now. A node with no baseline yet (back from repair, a spare that took a slot)
        # is held against its stage's median baseline: it may be the straggler everyone
        # else waits for (its wait then is the collective's alone, no rise), or a node
        # like any other, whose wait rises with the network (counting it as no rise left
        # the job blind to a slow network for two hours after every repair). In a stage
        # of no baselines at all it counts as no rise. Each rise has the other nodes'
        # stalls (above) taken off.
        Record(
            series.job_comm_rise,
            f"min by (training_job) (\n  (\n  {series.node_comm} - {series.node_comm_baseline}\n"
            f"  unless on ({NODE_STAGE}) {series.straggler}\n"
            f"  or ({series.node_comm} and on ({NODE_STAGE}) {series.straggler})\n"
            f"  - on (training_job) group_left ()\n"
            f"  min by (training_job) ({series.node_comm_baseline})\n"
            f"  or {series.node_comm}\n"
            f"  - on ({STAGE}) group_left ()\n"
            f"  quantile by ({STAGE}) (0.5, {series.node_comm_baseline})\n"
            f"  or {series.node_comm} * 0\n  )\n"
            f"  - on ({NODE_STAGE}) ({series.others_data_stall} or {series.node_comm} * 0)\n)",
        ),
    ]
    # Windows of 15 minutes to 2 hours move little in a minute: evaluated once a minute
    # (config.slow_recording_interval), at a quarter of the cost. The records and alerts
    # that read them every 15 s see the latest minute's value.
    long_windows = [
        # Subtle slowdowns (5-10%) need a longer window: over 15 minutes rank-to-rank
        # noise and workload imbalance (sequence lengths) average out, a slow GPU does not.
        Record(
            slow_long,
            f"{rate_sum('gpufleet_training_slowest_rank_compute_seconds_total', NODE_STAGE, long_w)}\n"
            f"/ {rate_sum('gpufleet_training_slowest_rank_steps_total', NODE_STAGE, long_w)}",
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
            f"/ on ({STAGE}) group_left () {scale(mad_long, median_long)}",
        ),
        Record(
            series.fastest_ratio_long,
            f"(\n  {slow_long}\n  and on ({STAGE}) ({nodes} < {config.straggler_min_peers})\n)\n"
            f"/ on ({STAGE}) group_left () min by ({STAGE}) ({slow_long})",
        ),
        # A subtle straggler's GPU clocks lower than the job's median node (clock-locked,
        # thermally or power limited); uneven work does not lower a clock. Nodes whose
        # GPUs are not scraped get no ratio: the subtle path stays silent for them.
        Record(
            series.gpu_clock,
            "min by (node) (\n  "
            + with_node(
                f"avg_over_time({metric(cat.SM_CLOCK.name, config.gpu_selector)}[{long_w}])",
                config.node_labels,
            )
            + "\n)",
        ),
        Record(
            series.clock_ratio,
            f"({slow_long} * 0 + on (node) group_left () {series.gpu_clock})\n"
            f"/ on (training_job) group_left ()\n"
            f"quantile by (training_job) (0.5, {slow_long} * 0 + on (node) group_left () {series.gpu_clock})",
        ),
        Record(
            node_baseline,
            f"{rate_sum('gpufleet_training_slowest_rank_compute_seconds_total', NODE_STAGE, base_w, base_o)}\n"
            f"/ {rate_sum('gpufleet_training_slowest_rank_steps_total', NODE_STAGE, base_w, base_o)}",
        ),
        # The baseline is the job's pace while it stepped: minutes it did not step are left
        # out (> 0 drops NaN). In the steady reading they stay NaN, which the quantile sorts
        # first: minutes without steps (an eval, a stall) pull it down, never up, so the
        # slow steps around them are not read as the job's pace.
        Record(
            steady_baseline,
            "(\n"
            + by_data_timing(
                f"quantile_over_time({q}, {stepped})",
                f"quantile_over_time({config.job_slowdown_untimed_baseline_quantile}, {stepped_short})",
            )
            + f"\n)\nand on (training_job) count_over_time({stepped}) >= {config.job_slowdown_baseline_min_minutes}",
        ),
        # A low quantile, not the mean: an earlier slow spell in the window must not
        # raise the baseline (the job's collectives at their fastest are the reference).
        Record(
            series.node_comm_baseline,
            f"quantile_over_time({config.job_comm_baseline_quantile}, {series.node_comm}"
            f"[{config.job_comm_baseline_window}:{config.job_comm_baseline_resolution}] offset {base_o})",
        ),
        Record(
            series.job_step_avg,
            f"{rate_sum('gpufleet_training_step_seconds_total', 'training_job', config.hang_step_window)}\n"
            f"/ {rate_sum('gpufleet_training_steps_total', 'training_job', config.hang_step_window)}",
        ),
        Record(
            series.data_wait_share,
            f"{rate_sum('gpufleet_training_data_wait_seconds_total', NODE_STAGE, config.data_wait_window)}\n"
            f"/ {rate_sum('gpufleet_training_step_seconds_total', NODE_STAGE, config.data_wait_window)}",
        ),
        Record(
            series.data_wait_median,
            f"quantile by ({STAGE}) (0.5, {series.data_wait_share})",
        ),
    ]
    memory = config.hang_memory
    last_step = series.last_step
    finished = series.finished
    ends = [
        # For hang detection, remembered past the agent's job TTL (series vanish then).
        Record(
            last_step,
            f"max by ({NODE_STAGE}) (max_over_time("
            f"{metric('gpufleet_training_last_step_timestamp_seconds', config.agent_selector)}[{memory}]))",
        ),
        Record(
            finished,
            f"max by ({NODE_STAGE}) (last_over_time("
            f"{metric('gpufleet_training_finished_timestamp_seconds', config.agent_selector)}[{memory}]))",
        ),
        # The node-stages that stepped last in their job and have not finished since:
        # a job with none left ended; one with some left may have hung. Node-stages that
        # stopped long before the rest (a node excluded an attempt ago) do not count.
        Record(
            series.unfinished,
            f"{last_step}\n  >= on (training_job) group_left ()\n"
            f"  (max by (training_job) ({last_step}) - {config.hang_min_seconds})\n"
            f"unless on ({NODE_STAGE}) ({finished} >= {last_step})",
        ),
    ]
    return [
        Group("gpufleet-training-peers", peers),
        Group("gpufleet-training-long-windows", long_windows, config.slow_recording_interval),
        Group("gpufleet-training-coverage", coverage),
        Group("gpufleet-training-trends", [*trends, *ends]),
    ]


def training_alerts(config: RulesConfig) -> Group:
    series = TrainingSeries.of(config)
    steady, steady_baseline = series.job_steady, series.job_steady_baseline
    ratio = series.compute_ratio
    fastest = series.stage_fastest
    last_step_memory = series.last_step
    unfinished = series.unfinished
    in_flight = metric("gpufleet_checkpoint_in_flight", config.agent_selector)
    share = series.data_wait_share
    share_median = series.data_wait_median
    replica = replica_imbalance_expr(config, series)
    app_xids = (
        f"{GpuSeries.of(config).xid_new} * on (xid) group_left (action) "
        f'{XID_INFO}{{class="application"}}'
    )
    # the attributions that name a training job (vector(1) has none: unless drops the
    # rows without one; a matcher on a record could not be inlined)
    training_held = f"({held_any(config)} unless on (training_job) vector(1))"
    replica_work = replica_work_expr(config, series).replace("\n", "\n  ")
    token_work = token_work_expr(config, series).replace("\n", "\n  ")
    rules: list[Record | Alert] = [
        Alert(
            "GpuFleetStragglerNode",
            # Not a node that a replica's extra work explains, nor one that the extra
            # tokens its ranks processed per step explain.
            f"{series.straggler}\nunless on ({NODE_STAGE}) (\n  {replica_work}\n)\n"
            f"unless on ({NODE_STAGE}) (\n  {token_work}\n)",
            "warning",
            "A node computes persistently slower than its peers in the same pipeline stage.",
            f'{JOB_NODE} computes {{{{ $value | printf "%.2f" }}}}x its stage peers (the '
            "median node, or in a stage of few nodes the fastest node's median rank), for "
            f"{config.straggler_for}: in lock-step training it sets the pace for every rank. "
            "Check its GPUs' clocks and throttling; drain it and let the job continue without it.",
            config.straggler_for,
        ),
        Alert(
            "GpuFleetNodeSlowerThanBaseline",
            # Not a node that a replica's extra work explains (as for the straggler): in
            # a job of two nodes per stage a replica is half the job, and one given more
            # work in the baseline window moves the job's median trend as much as now.
            f"{series.baseline_ratio} > {config.baseline_ratio}\n"
            f"and on ({NODE_STAGE}) {series.stepping}\n"
            f"unless on ({NODE_STAGE}) {ratio} > {config.straggler_ratio}\n"
            f"unless on ({NODE_STAGE}) (\n  {replica_work}\n)\n"
            # Nor in a stage that times no compute split, where a node's "compute" is its
            # step time, the same on every rank: what moves it against its own baseline is
            # the job (a spare that joined in a fast hour), not the node.
            f'unless on ({STAGE}) {series.detection_active}{{reason="no_compute_split"}}',
            "warning",
            "A node computes slower than it did itself, relative to the rest of the job.",
            f'{JOB_NODE} computes {{{{ $value | printf "%.2f" }}}}x its own recent baseline '
            f"({config.baseline_window} ending {config.baseline_offset} ago), relative to the whole job. "
            "Check its GPUs' clocks and throttling.",
            config.baseline_for,
        ),
        Alert(
            "GpuFleetJobSlowdown",
            # Two signals, valued as the job's step time against its baseline. The steady
            # step time is the slowest of every GPU each step: it grazes the ratio now and
            # then, so its least over a while (the baseline barely moves in it) must be
            # above the ratio: it must hold for job_slowdown_hold_window first. A straggler
            # slows a lock-step job too, and has its own page naming the node: while the
            # job has one, the step time says nothing of the rest.
            f"(\n  min_over_time({steady}[{config.job_slowdown_hold_window}:1m]) / {steady_baseline}\n"
            f"  > {config.job_slowdown_ratio}\n"
            f"  unless on (training_job) max by (training_job) ({ratio}) > {config.straggler_ratio}\n"
            f"  unless on (training_job) count by (training_job) ({series.straggler})\n"
            # The least rise of any node's slowest-rank wait is steadier and sees a slow
            # network at once, as a share of the step time; a straggler does not raise it
            # (the straggler waits for no one), so it stands while a node straggles.
            f"  or on (training_job)\n"
            f"  1 + {series.job_comm_rise} / {steady_baseline} > {1 + config.job_comm_step_share}\n)\n"
            f"and on (training_job) count by (training_job) ({series.node_step})",
            "warning",
            "A training job runs slower than its recent baseline (job-wide, not one node).",
            'Job {{ $labels.training_job }} takes {{ $value | printf "%.2f" }}x its recent '
            "step time across all nodes: a cluster-wide cause (network, storage, cooling, a "
            "communication fail-slow), not one slow node (that pages as GpuFleetStragglerNode).",
            config.job_slowdown_for,
        ),
        Alert(
            "GpuFleetStageImbalance",
            # Stages compared by their fastest node, which one slow node does not move (with
            # two nodes a stage's median is their mean), and never while a node of the
            # stage is a straggler: that is the node's fault, not the layout's.
            f"{fastest}\n/ on (training_job) group_left () min by (training_job) ({fastest})\n"
            f"> {config.stage_imbalance_ratio}\n"
            f"unless on ({STAGE}) {series.straggler}",
            "info",
            "A pipeline stage of a job takes noticeably longer to compute than the others.",
            "Pipeline stage {{ $labels.pp_stage }} of job {{ $labels.training_job }} computes "
            '{{ $value | printf "%.2f" }}x the fastest stage, on every node of the stage: '
            "rebalance the layers across stages.",
            config.stage_imbalance_for,
        ),
        Alert(
            "GpuFleetReplicaImbalance",
            replica,
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
        ),
        Alert(
            "GpuFleetStragglerDetectionInactive",
            f"{series.detection_active} == 0\n"
            f"and on ({STAGE}) count by ({STAGE}) ({series.node_step})",
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
        ),
        Alert(
            "GpuFleetJobHung",
            f"(time() - max by (training_job) ({last_step_memory}))\n"
            f"> on (training_job) clamp_min({config.hang_step_multiple} * {series.job_step_avg}, "
            f"{config.hang_min_seconds})\n"
            f"unless on (training_job) (sum by (training_job) ({in_flight}) > 0)\n"
            # A job whose last ranks all said they finished ended; it did not hang.
            f"and on (training_job) count by (training_job) ({unfinished})",
            "critical",
            "A training job has made no progress for many step times.",
            "Job {{ $labels.training_job }} has reported no step for {{ $value | humanizeDuration }}. "
            "Look for a failed or hung rank (NCCL timeout, network, a crashed process).",
            config.hang_for,
        ),
        Alert(
            "GpuFleetDataLoaderStall",
            f"{share} > {config.data_wait_share}\n"
            f"and {share} > on ({STAGE}) group_left {config.data_wait_peer_multiple} * {share_median}\n"
            f"and on ({NODE_STAGE}) {series.node_step}",
            "warning",
            "One node's ranks keep waiting on the data loader.",
            f"{JOB_NODE} spends {{{{ $value | humanizePercentage }}}} of its steps waiting for data, "
            "far more than its peers: check its local disk, page cache, CPU and network to storage.",
            config.data_wait_for,
        ),
        # Job-level, so it lives with the training alerts: on a sharded setup it must
        # see every node of the job (docs/SCALING.md).
        # The job whose pod holds the GPU or MIG instance the XID names (its
        # attribution's training_job: an XID on one tenant's MIG slice names that
        # tenant's job), else every job with ranks on the node.
        Alert(
            "GpuFleetApplicationXid",
            f"count by (training_job, namespace, xid, action) (\n"
            f"  max by (node, training_job, namespace, xid, action) (\n"
            f"    {app_xids}\n"
            f"    * on (UUID, GPU_I_ID) group_left (training_job, namespace)\n"
            f"    max by (UUID, GPU_I_ID, training_job, namespace) {training_held}\n  )\n"
            f"  or (\n    max by (node, xid, action) ({app_xids} unless on (UUID, GPU_I_ID) {training_held})\n"
            f"    * on (node) group_left (training_job, namespace)\n"
            f"    max by (node, training_job, namespace) (gpufleet_training_ranks)\n  )\n)",
            "info",
            "GPUs of a training job reported XIDs that NVIDIA answers by restarting the application.",
            "{{ $value }} node(s) of job {{ $labels.training_job }} reported XID {{ $labels.xid }} "
            f"in {config.xid_window}: the application's, not the node's. Action: {{{{ $labels.action }}}}.",
        ),
    ]
    return Group("gpufleet-training-alerts", rules)
