"""Fail-slow rules for training jobs: stragglers against their stage peers and against
their own baseline, job-wide slowdowns, stage imbalance, hangs and data-loader stalls."""

from __future__ import annotations

from dataclasses import dataclass

from gpufleet.rules.common import (
    JOB_NODE,
    NODE_STAGE,
    STAGE,
    Alert,
    Group,
    Record,
    SeriesNames,
    metric,
)
from gpufleet.rules.config import RulesConfig
from gpufleet.rules.gpu import XID_INFO, GpuSeries


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
    # per rank: compute seconds per step, and the same against the rank peers
    rank: str = "rank:gpufleet_training_compute_per_step:rate{rate_window}"
    rank_median: str = "stage:gpufleet_training_rank_compute_per_step:median{rate_window}"
    rank_mad: str = "stage:gpufleet_training_rank_compute_per_step:mad{rate_window}"
    stage_ranks: str = "stage:gpufleet_training_ranks:count{rate_window}"
    rank_ratio: str = "node:gpufleet_training_rank_compute_ratio:max{rate_window}"
    rank_zscore: str = "node:gpufleet_training_rank_compute_zscore:max{rate_window}"
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
    job_steady: str = "job:gpufleet_training_step_seconds:p{slowdown_percent}_{job_slowdown_window}"
    job_steady_baseline: str = (
        "job:gpufleet_training_step_seconds:p{slowdown_percent}_baseline{baseline_window}"
    )
    job_step_avg: str = "job:gpufleet_training_step_seconds:avg{hang_step_window}"
    data_wait_share: str = "node:gpufleet_training_data_wait_share:rate{data_wait_window}"
    data_wait_median: str = "stage:gpufleet_training_data_wait_share:median{data_wait_window}"
    # the hang detector's memory of each node-stage's last step and finish
    last_step: str = "node:gpufleet_training_last_step_timestamp:max{hang_memory}"
    finished: str = "node:gpufleet_training_finished_timestamp:last{hang_memory}"
    unfinished: str = "node:gpufleet_training_unfinished_last_step_timestamp:max{hang_memory}"

    @classmethod
    def derived(cls, config: RulesConfig) -> dict[str, object]:
        return {"slowdown_percent": round(config.job_slowdown_quantile * 100)}


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
    rank_median = series.rank_median
    rank_mad = series.rank_mad
    floor = config.mad_floor
    base_w, base_o = config.baseline_window, config.baseline_offset

    def scale(spread: str, center: str) -> str:
        return f"((1.4826 * {spread} > {center} * {floor}) or ({center} * {floor}))"

    peers = [
        Record(
            slow,
            f"{rate_sum('gpufleet_training_slowest_rank_compute_seconds_total', NODE_STAGE)}\n"
            f"/ {rate_sum('gpufleet_training_slowest_rank_steps_total', NODE_STAGE)}",
        ),
        Record(median, f"quantile by ({STAGE}) (0.5, {slow})"),
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
        Record(rank_median, f"quantile by ({STAGE}) (0.5, {rank})"),
        Record(
            rank_mad,
            f"quantile by ({STAGE}) (0.5, abs({rank} - on ({STAGE}) group_left {rank_median}))",
        ),
        Record(series.stage_ranks, f"count by ({STAGE}) ({rank})"),
        Record(
            series.rank_ratio,
            f"max by ({NODE_STAGE}) ({rank} / on ({STAGE}) group_left {rank_median})",
        ),
        Record(
            series.rank_zscore,
            f"max by ({NODE_STAGE}) (\n  ({rank} - on ({STAGE}) group_left {rank_median})\n"
            f"  / on ({STAGE}) group_left () {scale(rank_mad, rank_median)}\n)",
        ),
    ]
    node_baseline = series.node_baseline
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
        Record(
            node_baseline,
            f"{rate_sum('gpufleet_training_slowest_rank_compute_seconds_total', NODE_STAGE, base_w, base_o)}\n"
            f"/ {rate_sum('gpufleet_training_slowest_rank_steps_total', NODE_STAGE, base_w, base_o)}",
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
        # quarter of the window's 2-minute stretches only rises when all of them do.
        Record(
            series.job_step,
            f"{rate_sum('gpufleet_training_step_seconds_total', 'training_job', step_w)}\n"
            f"/ {rate_sum('gpufleet_training_steps_total', 'training_job', step_w)}",
        ),
        Record(
            steady,
            f"quantile_over_time({q}, {series.job_step}[{steady_w}:1m])",
        ),
        Record(
            steady_baseline,
            f"quantile_over_time({q}, {series.job_step}[{base_w}:1m] offset {base_o})",
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
        Group("gpufleet-training-trends", [*trends, *ends]),
    ]


def training_alerts(config: RulesConfig) -> Group:
    series = TrainingSeries.of(config)
    steady, steady_baseline = series.job_steady, series.job_steady_baseline
    ratio = series.compute_ratio
    zscore = series.compute_zscore
    nodes = series.stage_nodes
    rank_ratio = series.rank_ratio
    rank_z = series.rank_zscore
    ranks = series.stage_ranks
    median = series.stage_median
    last_step_memory = series.last_step
    unfinished = series.unfinished
    in_flight = metric("gpufleet_checkpoint_in_flight", config.agent_selector)
    share = series.data_wait_share
    share_median = series.data_wait_median
    rules: list[Record | Alert] = [
        Alert(
            "GpuFleetStragglerNode",
            f"(\n  (\n  {ratio} > {config.straggler_ratio}\n  and {zscore} > {config.straggler_zscore}\n"
            f"  and on ({STAGE}) ({nodes} >= {config.straggler_min_peers})\n  )\n  or (\n"
            f"  {rank_ratio} > {config.straggler_ratio}\n  and {rank_z} > {config.straggler_zscore}\n"
            f"  and on ({STAGE}) ({nodes} < {config.straggler_min_peers})\n"
            f"  and on ({STAGE}) ({ranks} >= {config.straggler_min_rank_peers})\n  )\n)\n"
            f"and on ({NODE_STAGE}) {series.stepping}",
            "warning",
            "A node computes persistently slower than its peers in the same pipeline stage.",
            f'{JOB_NODE} computes {{{{ $value | printf "%.2f" }}}}x the median of its stage '
            f"peers, for {config.straggler_for}: in lock-step training it sets the pace for every rank. "
            "Check its GPUs' clocks and throttling; drain it and let the job continue without it.",
            config.straggler_for,
        ),
        Alert(
            "GpuFleetNodeSlowerThanBaseline",
            f"{series.baseline_ratio} > {config.baseline_ratio}\n"
            f"and on ({NODE_STAGE}) {series.stepping}\n"
            f"unless on ({NODE_STAGE}) {ratio} > {config.straggler_ratio}",
            "warning",
            "A node computes slower than it did itself, relative to the rest of the job.",
            f'{JOB_NODE} computes {{{{ $value | printf "%.2f" }}}}x its own recent baseline '
            f"({config.baseline_window} ending {config.baseline_offset} ago), relative to the whole job. "
            "Check its GPUs' clocks and throttling.",
            config.baseline_for,
        ),
        Alert(
            "GpuFleetJobSlowdown",
            f"{steady}\n/ {steady_baseline} > {config.job_slowdown_ratio}\n"
            f"and on (training_job) count by (training_job) ({series.node_step})\n"
            # A straggler slows a lock-step job too; it has its own page, naming the node.
            f"unless on (training_job) max by (training_job) ({ratio}) > {config.straggler_ratio}",
            "warning",
            "A training job runs slower than its recent baseline (job-wide, not one node).",
            'Job {{ $labels.training_job }} takes {{ $value | printf "%.2f" }}x its recent '
            "step time across all nodes: a cluster-wide cause (network, storage, cooling, a "
            "communication fail-slow). No single node is slower than its peers.",
            config.job_slowdown_for,
        ),
        Alert(
            "GpuFleetStageImbalance",
            f"max by (training_job) ({median}) / min by (training_job) ({median}) > {config.stage_imbalance_ratio}",
            "info",
            "Pipeline stages of a job take noticeably different compute time.",
            "The slowest pipeline stage of job {{ $labels.training_job }} computes "
            '{{ $value | printf "%.2f" }}x the fastest: rebalance the layers across stages.',
            config.stage_imbalance_for,
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
        Alert(
            "GpuFleetApplicationXid",
            f"count by (training_job, xid) (\n"
            f'  max by (node, xid) ({GpuSeries.of(config).xid_new} * on (xid) group_left {XID_INFO}{{class="application"}})\n'
            f"  * on (node) group_left (training_job) max by (node, training_job) (gpufleet_training_ranks)\n)",
            "info",
            "GPUs of a training job reported XIDs that usually come from the application.",
            "{{ $value }} node(s) of job {{ $labels.training_job }} reported XID {{ $labels.xid }} "
            f"in {config.xid_window}: usually the application, not the hardware. Check the job's logs.",
        ),
    ]
    return Group("gpufleet-training-alerts", rules)
