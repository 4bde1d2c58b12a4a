"""What writers send to the fleet ledger. Unknown fields are refused, times are Unix seconds.

Every event names its ``source``: the system that saw it and wrote it (``torchrun``, the
training job's own client; ``slurm``, ``gpufleet slurm-watch``; ``kubernetes``, the Node
watch; ``alertmanager``, a page through the webhook; ``manual``, a person, the default;
``auto``, any other automation). It is stored with the event and is the ``source`` label of
``gpufleet_fleet_node_exclusions_total`` and ``gpufleet_fleet_job_attempts_total``.

A writer that turns another system's events into ledger writes derives the request's
``Idempotency-Key`` from the event itself, ``<source>:<what identifies the event>`` (e.g.
``slurm:<cluster>:<node>:drain:<state change time>``), so a replayed or duplicated event
gets the first answer and is never stored twice.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, StringConstraints

from gpufleet.schema.labels import TrainingJob

NodeName = Annotated[
    str,
    StringConstraints(min_length=1, max_length=253, pattern=r"^[A-Za-z0-9][A-Za-z0-9._:-]*$"),
]
Reason = Annotated[
    str,
    StringConstraints(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9][A-Za-z0-9_.:-]*$"),
]
Source = Literal["manual", "auto", "torchrun", "slurm", "kubernetes", "alertmanager"]
SOURCES: tuple[str, ...] = Source.__args__  # type: ignore[attr-defined]
# Between 2001 and 2286: catches milliseconds sent as seconds, and zero.
Timestamp = Annotated[float, Field(gt=1e9, lt=1e10, allow_inf_nan=False)]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ExclusionIn(_Strict):
    """A node was taken out of service."""

    node: NodeName
    reason: Reason
    source: Source = "manual"
    training_job: TrainingJob | None = None
    at: Timestamp | None = None  # default: when the ledger receives it
    note: Annotated[str, StringConstraints(max_length=500)] = ""


class ReleaseIn(_Strict):
    """A node went back into service."""

    node: NodeName
    at: Timestamp | None = None
    note: Annotated[str, StringConstraints(max_length=500)] = ""
    source: Source = "manual"


class AttemptEventIn(_Strict):
    """A job attempt started, reached its first step, or ended."""

    training_job: TrainingJob
    attempt: Annotated[int, Field(ge=1, le=1_000_000)]
    event: Literal["started", "first_step", "ended"]
    trigger: Literal["initial", "auto", "manual"] | None = None  # required for started
    outcome: Literal["success", "failed", "cancelled"] | None = None  # required for ended
    cause: Reason | None = None
    # ended only: the launcher restarts the job no more (torchrun's last restart failed),
    # so its retry chain closes as abandoned
    restarts_exhausted: bool = False
    at: Timestamp | None = None
    source: Source = "manual"  # kept from the started event: the attempt's source
