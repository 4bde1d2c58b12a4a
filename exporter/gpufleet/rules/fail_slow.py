"""Fail-slow rules for training jobs: stragglers against their stage peers and against
their own baseline, job-wide slowdowns, stage imbalance, hangs and data-loader stalls."""

from __future__ import annotations

from gpufleet.rules.common import JOB_NODE, NODE_STAGE, STAGE, Alert, Group, Record, metric
from gpufleet.rules.config import RulesConfig


def job_steady_step(config: RulesConfig) -> tuple[str, str]:
    """Names of the job's steady step time now and over its baseline."""
    percent = round(config.job_slowdown_quantile * 100)
    return (
        f"job:gpufleet_training_step_seconds:p{percent}_{config.job_slowdown_window}",
        f"job:gpufleet_training_step_seconds:p{percent}_baseline{config.baseline_window}",
    )


def training_recording(config: RulesConfig) -> list[Group]:
    sel = config.agent_selector
    w = config.rate_window

    def rate_sum(name: str, by: str, window: str = w, offset: str = "") -> str:
        suffix = f" offset {offset}" if offset else ""
        function = "increase" if offset else "rate"
        return f"sum by ({by}) ({function}({metric(name, sel)}[{window}]{suffix}))"

    slow = f"node:gpufleet_training_slowest_compute_per_step:rate{w}"
    median = f"stage:gpufleet_training_slowest_compute_per_step:median{w}"
    mad = f"stage:gpufleet_training_slowest_compute_per_step:mad{w}"
    steady, steady_baseline = job_steady_step(config)
    q, steady_w = config.job_slowdown_quantile, config.job_slowdown_window
    rank = f"rank:gpufleet_training_compute_per_step:rate{w}"
    rank_median = f"stage:gpufleet_training_rank_compute_per_step:median{w}"
    rank_mad = f"stage:gpufleet_training_rank_compute_per_step:mad{w}"
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
        Record(f"stage:gpufleet_training_nodes:count{w}", f"count by ({STAGE}) ({slow})"),
        Record(
            f"node:gpufleet_training_compute_ratio:rate{w}",
            f"{slow} / on ({STAGE}) group_left {median}",
        ),
        Record(
            f"node:gpufleet_training_compute_zscore:rate{w}",
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
        Record(f"stage:gpufleet_training_ranks:count{w}", f"count by ({STAGE}) ({rank})"),
        Record(
            f"node:gpufleet_training_rank_compute_ratio:max{w}",
            f"max by ({NODE_STAGE}) ({rank} / on ({STAGE}) group_left {rank_median})",
        ),
        Record(
            f"node:gpufleet_training_rank_compute_zscore:max{w}",
            f"max by ({NODE_STAGE}) (\n  ({rank} - on ({STAGE}) group_left {rank_median})\n"
            f"  / on ({STAGE}) group_left () {scale(rank_mad, rank_median)}\n)",
        ),
    ]
    node_baseline = f"node:gpufleet_training_slowest_compute_per_step:baseline{base_w}"
    trends = [
        # Rates over windows keep a stopped job's last minutes "frozen": the alerts below
        # only judge a node that is still stepping.
        Record(
            "node:gpufleet_training_slowest_rank_steps:rate2m",
            rate_sum("gpufleet_training_slowest_rank_steps_total", NODE_STAGE, "2m") + " > 0",
        ),
        Record(
            "node:gpufleet_training_step_seconds:rate2m",
            rate_sum("gpufleet_training_step_seconds_total", NODE_STAGE, "2m") + " > 0",
        ),
        Record(
            node_baseline,
            f"{rate_sum('gpufleet_training_slowest_rank_compute_seconds_total', NODE_STAGE, base_w, base_o)}\n"
            f"/ {rate_sum('gpufleet_training_slowest_rank_steps_total', NODE_STAGE, base_w, base_o)}",
        ),
        Record(f"node:gpufleet_training_own_trend:rate{w}", f"{slow} / {node_baseline}"),
        # Relative to the whole job's median trend (all stages): a cluster-wide slowdown
        # cancels out, and a node alone in its stage still has a reference.
        Record(
            f"node:gpufleet_training_baseline_ratio:rate{w}",
            f"node:gpufleet_training_own_trend:rate{w}\n/ on (training_job) group_left ()\n"
            f"quantile by (training_job) (0.5, node:gpufleet_training_own_trend:rate{w})",
        ),
        # The job's steady step time, a low quantile of its 2-minute step times: in a
        # lock-step job every data-loader stall on any node stops all ranks for a minute
        # or two, several times an hour on a big job. A mean, or even a median when two
        # or three stalls fall in one window, reads that as a slowdown; the fastest
        # quarter of the window's 2-minute stretches only rises when all of them do.
        Record(
            "job:gpufleet_training_step_seconds:rate2m",
            f"{rate_sum('gpufleet_training_step_seconds_total', 'training_job', '2m')}\n"
            f"/ {rate_sum('gpufleet_training_steps_total', 'training_job', '2m')}",
        ),
        Record(
            steady,
            f"quantile_over_time({q}, job:gpufleet_training_step_seconds:rate2m[{steady_w}:1m])",
        ),
        Record(
            steady_baseline,
            f"quantile_over_time({q}, job:gpufleet_training_step_seconds:rate2m[{base_w}:1m] offset {base_o})",
        ),
        Record(
            "job:gpufleet_training_step_seconds:avg1h",
            f"{rate_sum('gpufleet_training_step_seconds_total', 'training_job', '1h')}\n"
            f"/ {rate_sum('gpufleet_training_steps_total', 'training_job', '1h')}",
        ),
        Record(
            f"node:gpufleet_training_data_wait_share:rate{config.data_wait_window}",
            f"{rate_sum('gpufleet_training_data_wait_seconds_total', NODE_STAGE, config.data_wait_window)}\n"
            f"/ {rate_sum('gpufleet_training_step_seconds_total', NODE_STAGE, config.data_wait_window)}",
        ),
        Record(
            f"stage:gpufleet_training_data_wait_share:median{config.data_wait_window}",
            f"quantile by ({STAGE}) (0.5, node:gpufleet_training_data_wait_share:rate{config.data_wait_window})",
        ),
    ]
    memory = config.hang_memory
    last_step = f"node:gpufleet_training_last_step_timestamp:max{memory}"
    finished = f"node:gpufleet_training_finished_timestamp:last{memory}"
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
            f"node:gpufleet_training_unfinished_last_step_timestamp:max{memory}",
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
    w = config.rate_window
    steady, steady_baseline = job_steady_step(config)
    ratio = f"node:gpufleet_training_compute_ratio:rate{w}"
    zscore = f"node:gpufleet_training_compute_zscore:rate{w}"
    nodes = f"stage:gpufleet_training_nodes:count{w}"
    rank_ratio = f"node:gpufleet_training_rank_compute_ratio:max{w}"
    rank_z = f"node:gpufleet_training_rank_compute_zscore:max{w}"
    ranks = f"stage:gpufleet_training_ranks:count{w}"
    median = f"stage:gpufleet_training_slowest_compute_per_step:median{w}"
    last_step_memory = f"node:gpufleet_training_last_step_timestamp:max{config.hang_memory}"
    unfinished = f"node:gpufleet_training_unfinished_last_step_timestamp:max{config.hang_memory}"
    in_flight = metric("gpufleet_checkpoint_in_flight", config.agent_selector)
    share = f"node:gpufleet_training_data_wait_share:rate{config.data_wait_window}"
    share_median = f"stage:gpufleet_training_data_wait_share:median{config.data_wait_window}"
    rules: list[Record | Alert] = [
        Alert(
            "GpuFleetStragglerNode",
            f"(\n  (\n  {ratio} > {config.straggler_ratio}\n  and {zscore} > {config.straggler_zscore}\n"
            f"  and on ({STAGE}) ({nodes} >= {config.straggler_min_peers})\n  )\n  or (\n"
            f"  {rank_ratio} > {config.straggler_ratio}\n  and {rank_z} > {config.straggler_zscore}\n"
            f"  and on ({STAGE}) ({nodes} < {config.straggler_min_peers})\n"
            f"  and on ({STAGE}) ({ranks} >= {config.straggler_min_rank_peers})\n  )\n)\n"
            f"and on ({NODE_STAGE}) node:gpufleet_training_slowest_rank_steps:rate2m",
            "warning",
            "A node computes persistently slower than its peers in the same pipeline stage.",
            f'{JOB_NODE} computes {{{{ $value | printf "%.2f" }}}}x the median of its stage '
            f"peers, for {config.straggler_for}: in lock-step training it sets the pace for every rank. "
            "Check its GPUs' clocks and throttling; drain it and let the job continue without it.",
            config.straggler_for,
        ),
        Alert(
            "GpuFleetNodeSlowerThanBaseline",
            f"node:gpufleet_training_baseline_ratio:rate{w} > {config.baseline_ratio}\n"
            f"and on ({NODE_STAGE}) node:gpufleet_training_slowest_rank_steps:rate2m\n"
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
            f"and on (training_job) count by (training_job) (node:gpufleet_training_step_seconds:rate2m)\n"
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
            f"> on (training_job) clamp_min({config.hang_step_multiple} * job:gpufleet_training_step_seconds:avg1h, "
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
            f"and on ({NODE_STAGE}) node:gpufleet_training_step_seconds:rate2m",
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
            f'  max by (node, xid) (gpu:gpufleet_gpu_xid_errors:new{config.xid_window} * on (xid) group_left gpufleet:xid_catalogue:info{{class="application"}})\n'
            f"  * on (node) group_left (training_job) max by (node, training_job) (gpufleet_training_ranks)\n)",
            "info",
            "GPUs of a training job reported XIDs that usually come from the application.",
            "{{ $value }} node(s) of job {{ $labels.training_job }} reported XID {{ $labels.xid }} "
            f"in {config.xid_window}: usually the application, not the hardware. Check the job's logs.",
        ),
    ]
    return Group("gpufleet-training-alerts", rules)
