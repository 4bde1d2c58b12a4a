"""What training ranks send to their node's agent, and what is accepted.

Every field is validated before anything is counted: a batch is accepted whole
or rejected whole, with a message naming the field (``events.3.duration_s``)
and the index of every refused event (so a client can resend the rest).
Validation is strict: a JSON value of the wrong type is refused, never coerced
(``"rank": "3"``, ``"rank": true``, ``"step": 7.0``, ``"duration_s": "2.5"``);
an integer is accepted where seconds are expected. Unknown fields are rejected
too, so a typo in a client is caught, not ignored.

Overlap: GPU timings overlap (collectives run under backward compute), so the
fields are defined to add up: ``compute_s`` is time spent computing,
``comm_wait_s`` the *exposed* collective wait (time the rank waited on
communication that no computation hid), ``data_wait_s`` the wait for the data
loader. Their sum cannot exceed the step beyond timer jitter; the client clamps
what a caller passes so that it never does (see ``gpufleet.client``).
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, StringConstraints, model_validator

from gpufleet.fleet.models import AttemptEventIn
from gpufleet.reporter.wire import (
    GROUP_NAME_PATTERN,
    MAX_ATTEMPT,
    MAX_ATTEMPT_EVENTS,
    MAX_CHECKPOINT_BYTES,
    MAX_CHECKPOINT_SECONDS,
    MAX_GROUPS,
    MAX_ID_LENGTH,
    MAX_RANK,
    MAX_STAGE,
    MAX_STEP_NUMBER,
    MAX_STEP_SECONDS,
    MAX_TOKENS_PER_STEP,
)
from gpufleet.schema.labels import TrainingJob

SPLIT_TOLERANCE = 1.05  # the parts of a step may exceed its wall time by timer jitter

Rank = Annotated[int, Field(ge=0, le=MAX_RANK)]
Stage = Annotated[int, Field(ge=0, le=MAX_STAGE)]
Attempt = Annotated[int, Field(ge=0, le=MAX_ATTEMPT)]
Seconds = Annotated[float, Field(ge=0.0, allow_inf_nan=False)]
Phase = Literal["train", "eval", "checkpoint"]
CheckpointOp = Literal["save", "restore"]


class _Strict(BaseModel):
    # strict: what a client sends is never coerced (JSON "3" is not the integer 3).
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)


class StepEvent(_Strict):
    """One rank finished one step. Times are seconds of wall clock on that rank."""

    training_job: TrainingJob
    rank: Rank
    pp_stage: Stage = 0
    dp_rank: Rank | None = None
    # The launcher's restart count (torchrun's TORCHELASTIC_RESTART_COUNT): 0 on the first
    # launch, the same training_job on every restart. Absent: unknown (an older client).
    attempt: Attempt | None = None
    step: Annotated[int, Field(ge=0, le=MAX_STEP_NUMBER)]
    duration_s: Annotated[float, Field(gt=0.0, le=MAX_STEP_SECONDS, allow_inf_nan=False)]
    compute_s: Annotated[float | None, Field(ge=0.0, le=MAX_STEP_SECONDS, allow_inf_nan=False)] = (
        None
    )
    data_wait_s: Annotated[float, Field(ge=0.0, le=MAX_STEP_SECONDS, allow_inf_nan=False)] = 0.0
    # Exposed (non-overlapped) collective wait: communication hidden under compute is not in it.
    comm_wait_s: Annotated[float, Field(ge=0.0, le=MAX_STEP_SECONDS, allow_inf_nan=False)] = 0.0
    tokens: Annotated[int, Field(ge=0, le=MAX_TOKENS_PER_STEP)] = 0
    phase: Phase = "train"

    @model_validator(mode="after")
    def _parts_fit_in_the_step(self) -> StepEvent:
        parts = self.data_wait_s + self.comm_wait_s + (self.compute_s or 0.0)
        if parts > self.duration_s * SPLIT_TOLERANCE + 1e-3:
            raise ValueError(
                f"compute_s + data_wait_s + comm_wait_s = {parts:.6g} s exceeds "
                f"duration_s = {self.duration_s:.6g} s; comm_wait_s is the exposed "
                "(non-overlapped) collective wait, so the parts add up to at most the step"
            )
        return self

    @property
    def timed_split(self) -> bool:
        """Whether the rank timed its compute or an exposed collective wait. Without either,
        its compute is what is left of the step: in a lock-step job the same on every rank
        (it holds the wait for the slowest), so no peer comparison can use it."""
        return self.compute_s is not None or self.comm_wait_s > 0.0

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
    id: Annotated[str, StringConstraints(min_length=1, max_length=MAX_ID_LENGTH)]
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


class AttemptBatch(BaseModel):
    """Job attempt events (started, first_step, ended) the agent relays to the fleet ledger:
    each is what the ledger takes (``gpufleet.fleet.models.AttemptEventIn``)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    events: Annotated[list[AttemptEventIn], Field(min_length=1, max_length=MAX_ATTEMPT_EVENTS)]


class ParallelGroup(_Strict):
    """One parallel group a rank is in: its kind (``tp``, ``pp``, ``dp``, ``cp``, ``ep`` or
    a DeviceMesh dimension's name), its size, the rank's position in it, and its lowest
    global rank, which names the group the same way on each of its ranks."""

    group: Annotated[str, StringConstraints(pattern=GROUP_NAME_PATTERN)]
    size: Annotated[int, Field(ge=1, le=MAX_RANK + 1)]
    group_rank: Rank
    group_first_rank: Rank

    @model_validator(mode="after")
    def _rank_within_the_group(self) -> ParallelGroup:
        if self.group_rank >= self.size:
            raise ValueError(
                f"group_rank {self.group_rank} is not below the group's size {self.size}"
            )
        return self


class LayoutEvent(_Strict):
    """A rank's parallel layout, sent once per attempt. The agent exports one series per
    group with its node; Prometheus counts the nodes (and NVLink domains) a group spans."""

    training_job: TrainingJob
    rank: Rank
    attempt: Attempt | None = None
    # The NVLink domain of the rank's node, where the site names it (GPUFLEET_NVLINK_DOMAIN).
    nvlink_domain: TrainingJob | None = None
    groups: Annotated[list[ParallelGroup], Field(max_length=MAX_GROUPS)]

    @model_validator(mode="after")
    def _one_group_per_kind(self) -> LayoutEvent:
        kinds = [group.group for group in self.groups]
        if len(set(kinds)) != len(kinds):
            raise ValueError(f"groups name a kind twice: {kinds}")
        return self


class LayoutBatch(_Strict):
    events: list[LayoutEvent]
    dropped: Annotated[int, Field(ge=0, le=1 << 40)] = 0
