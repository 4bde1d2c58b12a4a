"""Jobs that stop: a job that made no progress for many step times and has not
finished, and XIDs that NVIDIA answers by restarting the application."""

from __future__ import annotations

from gpufleet.rules.attribution import held_any
from gpufleet.rules.common import NODE_STAGE, Alert, Record, metric
from gpufleet.rules.config import RulesConfig
from gpufleet.rules.gpu import XID_INFO, GpuSeries
from gpufleet.rules.training.series import TrainingSeries, rate_sum
from gpufleet.schema import training as ts
from gpufleet.schema.alerts import AlertName


def step_average_record(config: RulesConfig, series: TrainingSeries) -> Record:
    window = config.hang_step_window
    return Record(
        series.job_step_avg,
        f"{rate_sum(config, ts.STEP_SECONDS, 'training_job', window)}\n"
        f"/ {rate_sum(config, ts.STEPS, 'training_job', window)}",
    )


def end_records(config: RulesConfig, series: TrainingSeries) -> list[Record]:
    """Each node-stage's last step and finish, remembered for hang_memory (past the
    agent's job TTL, when the series vanish), and the node-stages that stepped last in
    their job (within hang_min_seconds of its last step) and have not finished since."""
    memory, last_step, finished = config.hang_memory, series.last_step, series.finished
    return [
        Record(
            last_step,
            f"max by ({NODE_STAGE}) (max_over_time("
            f"{metric(ts.LAST_STEP_TIMESTAMP.name, config.agent_selector)}[{memory}]))",
        ),
        Record(
            finished,
            f"max by ({NODE_STAGE}) (last_over_time("
            f"{metric(ts.FINISHED_TIMESTAMP.name, config.agent_selector)}[{memory}]))",
        ),
        Record(
            series.unfinished,
            f"{last_step}\n  >= on (training_job) group_left ()\n"
            f"  (max by (training_job) ({last_step}) - {config.hang_min_seconds})\n"
            f"unless on ({NODE_STAGE}) ({finished} >= {last_step})",
        ),
    ]


def job_hung_alert(config: RulesConfig, series: TrainingSeries) -> Alert:
    in_flight = metric(ts.CHECKPOINT_IN_FLIGHT.name, config.agent_selector)
    return Alert(
        AlertName.JOB_HUNG,
        # No step for hang_step_multiple mean step times (at least hang_min_seconds),
        # not while a checkpoint is in flight, not once its last ranks all finished.
        f"(time() - max by (training_job) ({series.last_step}))\n"
        f"> on (training_job) clamp_min({config.hang_step_multiple} * {series.job_step_avg}, "
        f"{config.hang_min_seconds})\n"
        f"unless on (training_job) (sum by (training_job) ({in_flight}) > 0)\n"
        f"and on (training_job) count by (training_job) ({series.unfinished})",
        "critical",
        "A training job has made no progress for many step times.",
        "Job {{ $labels.training_job }} has reported no step for {{ $value | humanizeDuration }}. "
        "Look for a failed or hung rank (NCCL timeout, network, a crashed process).",
        config.hang_for,
    )


def application_xid_alert(config: RulesConfig) -> Alert:
    """Job-level (it must see every node of the job on a sharded setup): the job whose
    pod holds the GPU or MIG instance the XID names, else every job with ranks on the
    node."""
    app_xids = (
        f"{GpuSeries.of(config).xid_new} * on (xid) group_left (action) "
        f'{XID_INFO}{{class="application"}}'
    )
    # the attributions that name a training job (vector(1) has none: unless drops the
    # rows without one; a matcher on a record could not be inlined)
    training_held = f"({held_any(config)} unless on (training_job) vector(1))"
    return Alert(
        AlertName.APPLICATION_XID,
        f"count by (training_job, namespace, xid, action) (\n"
        f"  max by (node, training_job, namespace, xid, action) (\n"
        f"    {app_xids}\n"
        f"    * on (UUID, GPU_I_ID) group_left (training_job, namespace)\n"
        f"    max by (UUID, GPU_I_ID, training_job, namespace) {training_held}\n  )\n"
        f"  or (\n    max by (node, xid, action) ({app_xids} unless on (UUID, GPU_I_ID) {training_held})\n"
        f"    * on (node) group_left (training_job, namespace)\n"
        f"    max by (node, training_job, namespace) ({ts.RANKS.name})\n  )\n)",
        "info",
        "GPUs of a training job reported XIDs that NVIDIA answers by restarting the application.",
        "{{ $value }} node(s) of job {{ $labels.training_job }} reported XID {{ $labels.xid }} "
        f"in {config.xid_window}: the application's, not the node's. Action: {{{{ $labels.action }}}}.",
    )
