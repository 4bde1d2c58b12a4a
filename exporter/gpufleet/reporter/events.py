"""What a Reporter records on the training thread, and how each record becomes what the
agent accepts (in the sender thread, never on the training thread).

The records are NamedTuples: built positionally they cost a fraction of a dataclass's
``__init__`` on the training thread, and they are never changed once recorded.
Standard library only.
"""

from __future__ import annotations

import hashlib
import math
import re
from typing import Literal, NamedTuple

from gpufleet.reporter.wire import (
    MAX_CHECKPOINT_BYTES,
    MAX_CHECKPOINT_SECONDS,
    MAX_ID_LENGTH,
    MAX_STEP_NUMBER,
    MAX_STEP_SECONDS,
    MAX_TOKENS_PER_STEP,
)

Phase = Literal["train", "eval", "checkpoint"]
CheckpointOp = Literal["save", "restore"]

_PHASES = ("train", "eval", "checkpoint")


class StepEvent(NamedTuple):
    """One step as recorded: the caller's figures, checked and clamped only when sent."""

    step: int
    duration_s: float
    compute_s: float | None
    data_wait_s: float
    comm_wait_s: float
    tokens: int
    phase: Phase


class CheckpointEvent(NamedTuple):
    """The begin or the end of one checkpoint operation (the durations: at its end)."""

    op: CheckpointOp
    event: Literal["begin", "end"]
    id: str
    queue_wait_s: float
    service_s: float
    bytes: int
    ok: bool


class RankFinished(NamedTuple):
    """This rank's training ended (sent after everything recorded before it)."""


Event = StepEvent | CheckpointEvent | RankFinished

# -- job attempts: the client tells its agent, the agent writes them to the fleet ledger --

AttemptStage = Literal["started", "first_step", "ended"]
Trigger = Literal["initial", "auto", "manual"]
Outcome = Literal["success", "failed", "cancelled"]
# The launcher that numbered the attempt: the ledger's ``source`` label.
AttemptSource = Literal["torchrun", "slurm", "manual"]
MAX_CAUSE_LENGTH = 64  # the ledger's Reason
_CAUSE_UNSAFE = re.compile(r"[^A-Za-z0-9_.:-]")
_KEY_SAFE = re.compile(r"^[A-Za-z0-9._:-]+$")
_MAX_KEY_LENGTH = 128  # the ledger's Idempotency-Key


class AttemptEvent(NamedTuple):
    """One step of an attempt's life, as the ledger takes it (``at``: Unix seconds, taken
    when it happened, so a relay that retries never moves it)."""

    training_job: str
    attempt: int
    event: AttemptStage
    source: AttemptSource
    at: float
    trigger: Trigger | None = None  # started only
    outcome: Outcome | None = None  # ended only
    cause: str | None = None  # ended only, where known
    restarts_exhausted: bool | None = None  # ended only: the launcher restarts no more


def attempt_json(event: AttemptEvent) -> dict[str, object]:
    """The agent's (and the ledger's) JSON for one attempt event."""
    payload: dict[str, object] = {
        "training_job": event.training_job,
        "attempt": event.attempt,
        "event": event.event,
        "source": event.source,
        "at": event.at,
    }
    for name in ("trigger", "outcome", "cause", "restarts_exhausted"):
        value = getattr(event, name)
        if value is not None:
            payload[name] = value
    return payload


def cause_name(text: str) -> str:
    """``text`` (an exception's class name, a signal's name) as the ledger's Reason."""
    cleaned = _CAUSE_UNSAFE.sub("_", text)
    if not cleaned or not cleaned[0].isalnum():
        cleaned = "x" + cleaned
    return cleaned[:MAX_CAUSE_LENGTH]


def attempt_key(source: str, training_job: str, attempt: int, event: str) -> str:
    """The ledger's Idempotency-Key of one attempt event: ``<source>:<job>:<attempt>:<event>``,
    the same from every rank, agent and retry, so the ledger stores the event once. A job id
    with characters a key may not hold (``@/+=``), or one too long, is replaced by a hash."""
    key = f"{source}:{training_job}:{attempt}:{event}"
    if _KEY_SAFE.match(training_job) and len(key) <= _MAX_KEY_LENGTH:
        return key
    digest = hashlib.sha256(training_job.encode()).hexdigest()[:40]
    return f"{source}:h{digest}:{attempt}:{event}"


class InvalidEventError(ValueError):
    """An event that no clamping can make acceptable; the message names the field."""


def seconds(name: str, value: object, upper: float) -> float:
    """``value`` as seconds clamped to 0..``upper``; refused when not a finite number."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise InvalidEventError(f"{name}={value!r} is not a number of seconds")
    number = float(value)
    if not math.isfinite(number):
        raise InvalidEventError(f"{name}={value!r} is not finite")
    return min(max(number, 0.0), upper)


def whole(name: str, value: object, upper: int) -> int:
    """``value`` as a whole number in 0..``upper`` (7.0 is 7); refused otherwise."""
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= upper:
        raise InvalidEventError(f"{name}={value!r} is not a whole number in 0..{upper}")
    return value


def step_json(
    event: StepEvent,
    training_job: str,
    rank: int,
    pp_stage: int,
    *,
    dp_rank: int | None = None,
    attempt: int | None = None,
) -> dict[str, object]:
    """The agent's JSON for one step, its parts made to add up to at most the step.
    ``attempt``: the launcher's restart count, fixed per Reporter (None: not sent)."""
    duration = seconds("duration_s", event.duration_s, MAX_STEP_SECONDS)
    if duration <= 0.0:
        raise InvalidEventError(f"duration_s={event.duration_s!r} is not above 0")
    if event.phase not in _PHASES:
        raise InvalidEventError(f"phase={event.phase!r} is not one of {', '.join(_PHASES)}")
    # The parts must add up to at most the step: data and compute as measured,
    # the collective wait counted only where it was exposed (not hidden under compute).
    data_s = min(seconds("data_wait_s", event.data_wait_s, MAX_STEP_SECONDS), duration)
    payload: dict[str, object] = {
        "training_job": training_job,
        "rank": rank,
        "pp_stage": pp_stage,
        "step": whole("step", event.step, MAX_STEP_NUMBER),
        "duration_s": duration,
        "data_wait_s": data_s,
        "tokens": whole("tokens", event.tokens, MAX_TOKENS_PER_STEP),
        "phase": event.phase,
    }
    left = duration - data_s
    if event.compute_s is not None:
        compute_s = min(seconds("compute_s", event.compute_s, MAX_STEP_SECONDS), left)
        payload["compute_s"] = compute_s
        left -= compute_s
    payload["comm_wait_s"] = max(
        0.0, min(seconds("comm_wait_s", event.comm_wait_s, MAX_STEP_SECONDS), left)
    )
    if dp_rank is not None:
        payload["dp_rank"] = dp_rank
    if attempt is not None:
        payload["attempt"] = attempt
    return payload


def checkpoint_json(event: CheckpointEvent, training_job: str, rank: int) -> dict[str, object]:
    """The agent's JSON for one checkpoint begin or end."""
    if event.op not in ("save", "restore"):
        raise InvalidEventError(f"op={event.op!r} is not save or restore")
    ident = event.id
    if not isinstance(ident, str) or not 0 < len(ident) <= MAX_ID_LENGTH:
        raise InvalidEventError(f"id={ident!r} is not a string of 1..{MAX_ID_LENGTH} characters")
    payload: dict[str, object] = {
        "training_job": training_job,
        "rank": rank,
        "op": event.op,
        "event": event.event,
        "id": ident,
    }
    if event.event == "end":
        payload.update(
            queue_wait_s=seconds("queue_wait_s", event.queue_wait_s, MAX_CHECKPOINT_SECONDS),
            service_s=seconds("service_s", event.service_s, MAX_CHECKPOINT_SECONDS),
            bytes=whole("bytes", event.bytes, MAX_CHECKPOINT_BYTES),
            ok=bool(event.ok),
        )
    return payload
