"""What training ranks send to their node's agent, and what is accepted.

Every field is validated before anything is counted: a batch is accepted whole
or rejected whole, with a message naming the field (``events.3.duration_s``).
Unknown fields are rejected too, so a typo in a client is caught, not ignored.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, StringConstraints, model_validator

# Longest step / checkpoint operation that is still plausible. Anything longer is
# a clock or unit mistake (milliseconds sent as seconds), not a measurement.
MAX_STEP_SECONDS = 3600.0
MAX_CHECKPOINT_SECONDS = 86400.0
MAX_TOKENS_PER_STEP = 10**9
MAX_CHECKPOINT_BYTES = 10**15  # 1 PB
SPLIT_TOLERANCE = 1.05  # the parts of a step may exceed its wall time by timer jitter

# Label values a client can set: job ids from TorchElastic, Slurm, Kubernetes, MLflow...
TrainingJob = Annotated[
    str,
    StringConstraints(min_length=1, max_length=128, pattern=r"^[A-Za-z0-9][A-Za-z0-9._:@/+=-]*$"),
]
Rank = Annotated[int, Field(ge=0, le=1 << 20)]
Stage = Annotated[int, Field(ge=0, le=1023)]
Seconds = Annotated[float, Field(ge=0.0, allow_inf_nan=False)]
Phase = Literal["train", "eval", "checkpoint"]
CheckpointOp = Literal["save", "restore"]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class StepEvent(_Strict):
    """One rank finished one step. Times are seconds of wall clock on that rank."""

    training_job: TrainingJob
    rank: Rank
    pp_stage: Stage = 0
    dp_rank: Rank | None = None
    step: Annotated[int, Field(ge=0, le=1 << 53)]
    duration_s: Annotated[float, Field(gt=0.0, le=MAX_STEP_SECONDS, allow_inf_nan=False)]
    compute_s: Annotated[float | None, Field(ge=0.0, le=MAX_STEP_SECONDS, allow_inf_nan=False)] = (
        None
    )
    data_wait_s: Annotated[float, Field(ge=0.0, le=MAX_STEP_SECONDS, allow_inf_nan=False)] = 0.0
    comm_wait_s: Annotated[float, Field(ge=0.0, le=MAX_STEP_SECONDS, allow_inf_nan=False)] = 0.0
    tokens: Annotated[int, Field(ge=0, le=MAX_TOKENS_PER_STEP)] = 0
    phase: Phase = "train"

    @model_validator(mode="after")
    def _parts_fit_in_the_step(self) -> StepEvent:
        parts = self.data_wait_s + self.comm_wait_s + (self.compute_s or 0.0)
        if parts > self.duration_s * SPLIT_TOLERANCE + 1e-3:
            raise ValueError(
                f"compute_s + data_wait_s + comm_wait_s = {parts:.6g} s exceeds "
                f"duration_s = {self.duration_s:.6g} s"
            )
        return self

    @property
    def compute_seconds(self) -> float:
        """Compute time; when the rank did not time it, what is left of the step."""
        if self.compute_s is not None:
            return self.compute_s
        return max(0.0, self.duration_s - self.data_wait_s - self.comm_wait_s)


class StepBatch(_Strict):
    events: list[StepEvent]
    # Events the client had to drop (buffer full, agent down) since its last accepted batch.
    dropped: Annotated[int, Field(ge=0, le=1 << 40)] = 0


class CheckpointEvent(_Strict):
    """A checkpoint operation began or ended on one rank.

    ``begin`` and ``end`` share an ``id`` so the agent knows what is in flight.
    An ``end`` carries the split of the operation's time: ``queue_wait_s`` spent
    waiting for the storage (a slot, a lock, a connection, bandwidth) and
    ``service_s`` spent actually reading or writing.
    """

    training_job: TrainingJob
    rank: Rank
    op: CheckpointOp
    event: Literal["begin", "end"]
    id: Annotated[str, StringConstraints(min_length=1, max_length=128)]
    queue_wait_s: Annotated[
        float, Field(ge=0.0, le=MAX_CHECKPOINT_SECONDS, allow_inf_nan=False)
    ] = 0.0
    service_s: Annotated[float, Field(ge=0.0, le=MAX_CHECKPOINT_SECONDS, allow_inf_nan=False)] = 0.0
    bytes: Annotated[int, Field(ge=0, le=MAX_CHECKPOINT_BYTES)] = 0
    ok: bool = True

    @model_validator(mode="after")
    def _begin_carries_no_result(self) -> CheckpointEvent:
        if self.event == "begin" and (self.queue_wait_s or self.service_s or self.bytes):
            raise ValueError("a begin event carries no queue_wait_s, service_s or bytes")
        return self


class CheckpointBatch(_Strict):
    events: list[CheckpointEvent]
    dropped: Annotated[int, Field(ge=0, le=1 << 40)] = 0


class FinishedEvent(_Strict):
    """A rank is done: its training loop ended (the client sends this when it closes).

    Once every rank the agent has seen in a stage has finished, the stage exports the
    time, so that a job that ended is not taken for a job that hung."""

    training_job: TrainingJob
    rank: Rank
    pp_stage: Stage = 0


class FinishedBatch(_Strict):
    events: list[FinishedEvent]
    dropped: Annotated[int, Field(ge=0, le=1 << 40)] = 0
