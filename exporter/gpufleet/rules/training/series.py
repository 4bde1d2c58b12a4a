"""The series training.rules.yaml records, each named once, and the expression helpers
every training rule module shares."""

from __future__ import annotations

from dataclasses import dataclass

from gpufleet.rules.common import SeriesNames, metric
from gpufleet.rules.config import RulesConfig
from gpufleet.schema.family import MetricDef


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
    # per rank: compute seconds per step; ranks per stage (both in stages of fewer than
    # straggler_min_peers nodes only: the rank-level comparison's)
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


def rate_sum(
    config: RulesConfig, family: MetricDef, by: str, window: str | None = None, offset: str = ""
) -> str:
    """The per-second rate of an agent counter summed ``by`` labels over ``window`` (the
    rate window by default); with ``offset``, its increase over the window that ended
    ``offset`` ago."""
    suffix = f" offset {offset}" if offset else ""
    function = "increase" if offset else "rate"
    return (
        f"sum by ({by}) ({function}({metric(family.name, config.agent_selector)}"
        f"[{window or config.rate_window}]{suffix}))"
    )


def robust_scale(config: RulesConfig, spread: str, center: str) -> str:
    """A z-score's denominator: the spread (a MAD, scaled to a standard deviation), at
    least ``mad_floor`` of the center, so a stage of identical nodes divides by no zero."""
    floor = config.mad_floor
    return f"((1.4826 * {spread} > {center} * {floor}) or ({center} * {floor}))"
