"""Job-wide slowdowns and data-loader stalls: the job's steady step time less its
data-loader stalls against its baseline, the least rise of any node's collective wait,
and one node waiting on its data loader far more than its peers."""

from __future__ import annotations

from gpufleet.rules.common import JOB_NODE, NODE_STAGE, STAGE, Alert, Record
from gpufleet.rules.config import RulesConfig
from gpufleet.rules.training.series import TrainingSeries, rate_sum
from gpufleet.schema import training as ts
from gpufleet.schema.alerts import AlertName


def job_seconds_per_step(config: RulesConfig, window: str) -> str:
    return (
        f"{rate_sum(config, ts.STEP_SECONDS, 'training_job', window)}\n"
        f"/ {rate_sum(config, ts.STEPS, 'training_job', window)}"
    )


def by_data_timing(series: TrainingSeries, timed: str, untimed: str) -> str:
    """``timed`` for jobs whose ranks time their data wait, ``untimed`` for the others
    (a job that reports step time only)."""
    return (
        f"{timed}\nand on (training_job) (max by (training_job) ({series.node_data_wait}) > 0)\n"
        f"or {untimed}"
    )


def step_time_records(config: RulesConfig, series: TrainingSeries) -> list[Record]:
    """The job's seconds per step, each node's data wait per step, the job's data-loader
    stalls per step and its step time less them, and its steady step time."""
    step_w = config.step_window
    untimed_short = [
        Record(
            series.job_step_short,
            job_seconds_per_step(config, config.job_slowdown_untimed_step_window)
            # too few samples in a stretch (missed scrapes)
            + f"\nor {series.job_step}",
        )
    ]
    return [
        # NaN (0/0) for a job that does not step.
        Record(series.job_step, job_seconds_per_step(config, step_w)),
        Record(
            series.node_data_wait,
            f"{rate_sum(config, ts.DATA_WAIT_SECONDS, NODE_STAGE, step_w)}\n"
            f"/ ({rate_sum(config, ts.STEPS, NODE_STAGE, step_w)} > 0)",
        ),
        # The most-waiting node's wait above the least-waiting node's.
        Record(
            series.job_data_stall,
            f"max by (training_job) ({series.node_data_wait})\n"
            f"- min by (training_job) ({series.node_data_wait})",
        ),
        # A job that times no data wait has no stall figure: its step time as it is.
        Record(
            series.job_step_net,
            f"{series.job_step}\n- ({series.job_data_stall} or {series.job_step} * 0)",
        ),
        # Recorded once where a long scrape interval makes both windows one length.
        *(untimed_short if series.job_step_short != series.job_step else []),
        # A low quantile of the step time less stalls over job_slowdown_window; for a job
        # that times no data wait, its fastest stretch over the untimed window.
        Record(
            series.job_steady,
            by_data_timing(
                series,
                f"quantile_over_time({config.job_slowdown_quantile}, {series.job_step_net}"
                f"[{config.job_slowdown_window}:1m])",
                f"quantile_over_time(0, {series.job_step_short}[{config.job_slowdown_untimed_window}:30s])",
            ),
        ),
    ]


def collective_wait_records(config: RulesConfig, series: TrainingSeries) -> list[Record]:
    """Each node's slowest rank's wait per step (step time less data wait and compute),
    each node's data-loader stalls and those of the other nodes of its job, and the job's
    least rise of any node's wait over its baseline, the other nodes' stalls taken off."""
    step_w = config.step_window
    step_seconds = rate_sum(config, ts.STEP_SECONDS, NODE_STAGE, step_w)
    data_wait = rate_sum(config, ts.DATA_WAIT_SECONDS, NODE_STAGE, step_w)
    comm, baseline, straggler = series.node_comm, series.node_comm_baseline, series.straggler
    return [
        Record(
            comm,
            f"(\n  {step_seconds} - {data_wait}\n"
            # a client that times no data wait sends none
            f"  or {step_seconds}\n)\n"
            # no steps, no value (not NaN: one NaN makes the baseline's quantile NaN)
            f"/ ({rate_sum(config, ts.STEPS, NODE_STAGE, step_w)} > 0)\n"
            f"- {rate_sum(config, ts.SLOWEST_RANK_COMPUTE_SECONDS, NODE_STAGE, step_w)}\n"
            f"/ ({rate_sum(config, ts.SLOWEST_RANK_STEPS, NODE_STAGE, step_w)} > 0)",
        ),
        # A node's data wait above the job's least node's, where more than a loader's
        # jitter (job_comm_stall_floor of the job's step).
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
        # Each node's rise: against its own baseline; a straggler's against the job's
        # least baseline; a node with no baseline against its stage's median baseline,
        # else none.
        Record(
            series.job_comm_rise,
            f"min by (training_job) (\n  (\n  {comm} - {baseline}\n"
            f"  unless on ({NODE_STAGE}) {straggler}\n"
            f"  or ({comm} and on ({NODE_STAGE}) {straggler})\n"
            f"  - on (training_job) group_left ()\n"
            f"  min by (training_job) ({baseline})\n"
            f"  or {comm}\n"
            f"  - on ({STAGE}) group_left ()\n"
            f"  quantile by ({STAGE}) (0.5, {baseline})\n"
            f"  or {comm} * 0\n  )\n"
            f"  - on ({NODE_STAGE}) ({series.others_data_stall} or {comm} * 0)\n)",
        ),
    ]


def job_baseline_records(config: RulesConfig, series: TrainingSeries) -> list[Record]:
    """The job's steady step time over its baseline window (minutes without a step left
    out), and each node's collective wait at its fastest over its own baseline window."""
    base_w, base_o = config.baseline_window, config.baseline_offset
    # > 0 drops the minutes the job did not step (NaN).
    stepped = f"({series.job_step_net} > 0)[{base_w}:1m] offset {base_o}"
    stepped_short = f"({series.job_step_short} > 0)[{base_w}:1m] offset {base_o}"
    return [
        Record(
            series.job_steady_baseline,
            "(\n"
            + by_data_timing(
                series,
                f"quantile_over_time({config.job_slowdown_quantile}, {stepped})",
                f"quantile_over_time({config.job_slowdown_untimed_baseline_quantile}, {stepped_short})",
            )
            + f"\n)\nand on (training_job) count_over_time({stepped}) >= {config.job_slowdown_baseline_min_minutes}",
        ),
        Record(
            series.node_comm_baseline,
            f"quantile_over_time({config.job_comm_baseline_quantile}, {series.node_comm}"
            f"[{config.job_comm_baseline_window}:{config.job_comm_baseline_resolution}] offset {base_o})",
        ),
    ]


def data_wait_records(config: RulesConfig, series: TrainingSeries) -> list[Record]:
    """Each node's share of its step time spent waiting for data, and its stage's median."""
    window = config.data_wait_window
    return [
        Record(
            series.data_wait_share,
            f"{rate_sum(config, ts.DATA_WAIT_SECONDS, NODE_STAGE, window)}\n"
            f"/ {rate_sum(config, ts.STEP_SECONDS, NODE_STAGE, window)}",
        ),
        Record(
            series.data_wait_median,
            f"quantile by ({STAGE}) (0.5, {series.data_wait_share})",
        ),
    ]


def job_slowdown_alert(config: RulesConfig, series: TrainingSeries) -> Alert:
    steady, steady_baseline = series.job_steady, series.job_steady_baseline
    return Alert(
        AlertName.JOB_SLOWDOWN,
        # The steady step time's least over job_slowdown_hold_window against its
        # baseline, unless the job holds a straggler; or the least rise of any node's
        # collective wait as a share of the baseline step time.
        f"(\n  min_over_time({steady}[{config.job_slowdown_hold_window}:1m]) / {steady_baseline}\n"
        f"  > {config.job_slowdown_ratio}\n"
        f"  unless on (training_job) max by (training_job) ({series.compute_ratio}) > {config.straggler_ratio}\n"
        f"  unless on (training_job) count by (training_job) ({series.straggler})\n"
        f"  or on (training_job)\n"
        f"  1 + {series.job_comm_rise} / {steady_baseline} > {1 + config.job_comm_step_share}\n)\n"
        f"and on (training_job) count by (training_job) ({series.node_step})",
        "warning",
        "A training job runs slower than its recent baseline (job-wide, not one node).",
        'Job {{ $labels.training_job }} takes {{ $value | printf "%.2f" }}x its recent '
        "step time across all nodes: a cluster-wide cause (network, storage, cooling, a "
        f"communication fail-slow), not one slow node (that pages as {AlertName.STRAGGLER}).",
        config.job_slowdown_for,
    )


def data_loader_stall_alert(config: RulesConfig, series: TrainingSeries) -> Alert:
    share, share_median = series.data_wait_share, series.data_wait_median
    return Alert(
        AlertName.DATA_LOADER_STALL,
        f"{share} > {config.data_wait_share}\n"
        f"and {share} > on ({STAGE}) group_left {config.data_wait_peer_multiple} * {share_median}\n"
        f"and on ({NODE_STAGE}) {series.node_step}",
        "warning",
        "One node's ranks keep waiting on the data loader.",
        f"{JOB_NODE} spends {{{{ $value | humanizePercentage }}}} of its steps waiting for data, "
        "far more than its peers: check its local disk, page cache, CPU and network to storage.",
        config.data_wait_for,
    )
