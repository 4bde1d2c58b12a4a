"""Training and checkpoint families: what the agent aggregates from its local ranks.

Steps are keyed by (training_job, node, pp_stage), checkpoints by
(training_job, node, op); never by step number. ``training_job``, never
``job``, which is Prometheus's scrape-job label.
"""

from __future__ import annotations

from gpufleet.schema.family import MetricDef

STAGE_LABELS = ("training_job", "node", "pp_stage")
CHECKPOINT_LABELS = ("training_job", "node", "op")
PHASES = ("train", "eval", "checkpoint")
CHECKPOINT_OUTCOMES = ("ok", "failed", "abandoned")
# Optional on every family here: the namespace and pod the job's training clients name
# (the downward API, gpufleet/reporter/pod.py), which the agent puts on the job's series
# while it knows them (agent/training_pods.py); a job without a pod has neither.
JOB_POD_LABELS = ("namespace", "pod")


def _stage_counter(name: str, help_text: str, *extra: str) -> MetricDef:
    return MetricDef(name, "counter", help_text, (*STAGE_LABELS, *extra), JOB_POD_LABELS)


def _stage_gauge(name: str, help_text: str) -> MetricDef:
    return MetricDef(name, "gauge", help_text, STAGE_LABELS, JOB_POD_LABELS)


STEPS = _stage_counter(
    "gpufleet_training_steps_total", "Training-phase steps, one per rank per step."
)
STEP_SECONDS = _stage_counter(
    "gpufleet_training_step_seconds_total",
    "Wall time of training-phase steps, summed over ranks.",
)
COMPUTE_SECONDS = _stage_counter(
    "gpufleet_training_compute_seconds_total",
    "Compute time of training-phase steps (excluding data and collective waits).",
)
DATA_WAIT_SECONDS = _stage_counter(
    "gpufleet_training_data_wait_seconds_total", "Time ranks waited on the data loader."
)
COLLECTIVE_WAIT_SECONDS = _stage_counter(
    "gpufleet_training_collective_wait_seconds_total",
    "Time ranks waited in collectives (communication, and waiting for slower peers).",
)
TOKENS = _stage_counter(
    "gpufleet_training_tokens_total", "Tokens processed in training-phase steps."
)
SLOWEST_RANK_COMPUTE_SECONDS = _stage_counter(
    "gpufleet_training_slowest_rank_compute_seconds_total",
    "Per step, the largest compute time among this node's ranks in the stage, summed.",
)
SLOWEST_RANK_STEPS = _stage_counter(
    "gpufleet_training_slowest_rank_steps_total",
    f"Steps counted in {SLOWEST_RANK_COMPUTE_SECONDS.name}.",
)
SPLIT_STEPS = _stage_counter(
    "gpufleet_training_split_steps_total",
    "Training-phase steps whose rank timed its compute or collective wait, one per rank per "
    "step; peer comparison needs them (without a split, a rank's compute is the rest of its "
    "step, the same on every rank of a lock-step job).",
)
STEP_DURATION = MetricDef(
    "gpufleet_training_step_duration_seconds",
    "histogram",
    "Distribution of training-phase step wall times (per rank).",
    STAGE_LABELS,
    JOB_POD_LABELS,
)
LAST_STEP_TIMESTAMP = _stage_gauge(
    "gpufleet_training_last_step_timestamp_seconds",
    "When the agent last received a step of any phase (Unix time, agent clock).",
)
STEP_NUMBER = _stage_gauge("gpufleet_training_step_number", "Highest step number reported.")
RANKS = _stage_gauge(
    "gpufleet_training_ranks", "Ranks that reported a step recently (within the rank window)."
)
FINISHED_TIMESTAMP = _stage_gauge(
    "gpufleet_training_finished_timestamp_seconds",
    "When every rank seen in this stage had reported that it finished (Unix time, "
    "agent clock); 0 while any rank still runs.",
)
ATTEMPT = _stage_gauge(
    "gpufleet_training_attempt",
    "The highest launcher restart count (attempt) a rank of this job reported on this node: "
    "torchrun's TORCHELASTIC_RESTART_COUNT, Slurm's SLURM_RESTART_COUNT.",
)
PHASE_STEPS = _stage_counter(
    "gpufleet_training_phase_steps_total",
    "Steps per phase (train, eval, checkpoint), one per rank per step.",
    "phase",
)
PHASE_SECONDS = _stage_counter(
    "gpufleet_training_phase_seconds_total", "Wall time per phase, summed over ranks.", "phase"
)
RANK_COMPUTE_SECONDS = _stage_counter(
    "gpufleet_training_rank_compute_seconds_total",
    "Compute time of training-phase steps per rank (for rank-level peer comparison).",
    "rank",
)
RANK_STEPS = _stage_counter(
    "gpufleet_training_rank_steps_total", "Training-phase steps per rank.", "rank"
)

CHECKPOINT_OPERATIONS = MetricDef(
    "gpufleet_checkpoint_operations_total",
    "counter",
    "Completed checkpoint operations by outcome (ok, failed, abandoned: no end seen).",
    (*CHECKPOINT_LABELS, "outcome"),
    JOB_POD_LABELS,
)
CHECKPOINT_QUEUE_WAIT_SECONDS = MetricDef(
    "gpufleet_checkpoint_queue_wait_seconds_total",
    "counter",
    "Time checkpoint operations spent queued for storage before being served.",
    CHECKPOINT_LABELS,
    JOB_POD_LABELS,
)
CHECKPOINT_SERVICE_SECONDS = MetricDef(
    "gpufleet_checkpoint_service_seconds_total",
    "counter",
    "Time checkpoint operations spent being served (reading or writing).",
    CHECKPOINT_LABELS,
    JOB_POD_LABELS,
)
CHECKPOINT_BYTES = MetricDef(
    "gpufleet_checkpoint_bytes_total",
    "counter",
    "Bytes written or read by checkpoints.",
    CHECKPOINT_LABELS,
    JOB_POD_LABELS,
)
CHECKPOINT_IN_FLIGHT = MetricDef(
    "gpufleet_checkpoint_in_flight",
    "gauge",
    "Checkpoint operations begun on this node and not yet ended (concurrency).",
    CHECKPOINT_LABELS,
    JOB_POD_LABELS,
)

# In the order the agent exposes them.
TRAINING_FAMILIES = (
    STEPS,
    STEP_SECONDS,
    COMPUTE_SECONDS,
    DATA_WAIT_SECONDS,
    COLLECTIVE_WAIT_SECONDS,
    TOKENS,
    SLOWEST_RANK_COMPUTE_SECONDS,
    SLOWEST_RANK_STEPS,
    SPLIT_STEPS,
    STEP_DURATION,
    LAST_STEP_TIMESTAMP,
    STEP_NUMBER,
    RANKS,
    FINISHED_TIMESTAMP,
    ATTEMPT,
    PHASE_STEPS,
    PHASE_SECONDS,
    RANK_COMPUTE_SECONDS,
    RANK_STEPS,
)
CHECKPOINT_FAMILIES = (
    CHECKPOINT_OPERATIONS,
    CHECKPOINT_QUEUE_WAIT_SECONDS,
    CHECKPOINT_SERVICE_SECONDS,
    CHECKPOINT_BYTES,
    CHECKPOINT_IN_FLIGHT,
)

# A rank's parallel layout, reported once per attempt (gpufleet.reporter.layout): one series
# per group the rank is in, with its node; rules count the nodes each group spans.
PARALLEL_GROUP_LABELS = (
    "training_job",
    "node",
    "rank",
    "attempt",
    "group",
    "group_first_rank",
    "group_rank",
    "nvlink_domain",
)
PARALLEL_GROUP_SIZE = MetricDef(
    "gpufleet_training_parallel_group_size",
    "gauge",
    "Ranks in a parallel group (group: tp, pp, dp, cp, ep or a DeviceMesh dimension's name) "
    "this rank is in; group_first_rank: the group's lowest global rank (names the group), "
    "group_rank: this rank's position in it, nvlink_domain: the node's, where the site names "
    "it. One series per rank and group, reported once per attempt.",
    PARALLEL_GROUP_LABELS,
    JOB_POD_LABELS,
)
LAYOUT_FAMILIES = (PARALLEL_GROUP_SIZE,)
