"""The step and checkpoint timers (context managers) a Reporter hands out: they time on
the training thread and hand the result to their reporter. Standard library only."""

from __future__ import annotations

import time
from types import TracebackType
from typing import Protocol

from gpufleet.reporter.events import CheckpointEvent, CheckpointOp, Event, Phase


class _Recorder(Protocol):
    """What a timer needs of its Reporter."""

    _last_step_end: float | None

    def _finish_step(self, timer: StepTimer, started: float) -> None: ...

    def _push(self, event: Event) -> None: ...


class _Phase:
    """Times one phase (data, compute, comm) inside a step."""

    __slots__ = ("_attr", "_started", "_timer")

    def __init__(self, timer: StepTimer, attr: str) -> None:
        self._timer = timer
        self._attr = attr
        self._started = 0.0

    def __enter__(self) -> None:
        self._started = time.perf_counter()

    def __exit__(self, *exc: object) -> None:
        elapsed = time.perf_counter() - self._started
        setattr(self._timer, self._attr, getattr(self._timer, self._attr) + elapsed)


class _Timer:
    """What the step and checkpoint timers share: the exit, which tells ``_exited``
    whether the timed block ended normally."""

    __slots__ = ()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._exited(exc_type is None)

    def _exited(self, ok: bool) -> None:
        raise NotImplementedError


class StepTimer(_Timer):
    """Context manager for one step. Use ``data()``, ``comm()`` or ``compute()`` inside to
    split it; set ``tokens`` if not known up front. Without ``compute()``, compute is the
    step's time minus its data and communication waits."""

    __slots__ = (
        "_reporter",
        "_started",
        "comm_wait_s",
        "compute_s",
        "data_wait_s",
        "phase",
        "step",
        "tokens",
    )

    def __init__(self, reporter: _Recorder, tokens: int, phase: Phase, step: int | None) -> None:
        self._reporter = reporter
        self.tokens = tokens
        self.phase = phase
        self.step = step
        self.data_wait_s = 0.0
        self.comm_wait_s = 0.0
        self.compute_s: float | None = None
        self._started = 0.0

    def data(self) -> _Phase:
        return _Phase(self, "data_wait_s")

    def comm(self) -> _Phase:
        return _Phase(self, "comm_wait_s")

    def compute(self) -> _Phase:
        if self.compute_s is None:
            self.compute_s = 0.0
        return _Phase(self, "compute_s")

    def __enter__(self) -> StepTimer:
        self._started = time.perf_counter()
        return self

    def _exited(self, ok: bool) -> None:
        if not ok:
            self._reporter._last_step_end = None  # an interrupted step is not recorded
            return
        self._reporter._finish_step(self, self._started)


class CheckpointTimer(_Timer):
    """Context manager for one checkpoint save or restore.

    Call ``serving()`` at the moment the storage starts serving the operation (a
    slot, lock or connection was granted); the time before it is queue wait, the
    time after it is service. Without ``serving()`` the whole operation counts
    as service time.
    """

    __slots__ = ("_reporter", "_served_at", "_started", "bytes", "id", "op")

    def __init__(self, reporter: _Recorder, op: CheckpointOp, ident: str, size: int) -> None:
        self._reporter = reporter
        self.op = op
        self.id = ident
        self.bytes = size
        self._started = 0.0
        self._served_at: float | None = None

    def serving(self) -> None:
        self._served_at = time.perf_counter()

    def __enter__(self) -> CheckpointTimer:
        self._started = time.perf_counter()
        self._reporter._push(CheckpointEvent(self.op, "begin", self.id, 0.0, 0.0, 0, True))
        return self

    def _exited(self, ok: bool) -> None:
        ended = time.perf_counter()
        served = self._served_at if self._served_at is not None else self._started
        queue_wait, service = served - self._started, ended - served
        event = CheckpointEvent(self.op, "end", self.id, queue_wait, service, self.bytes, ok)
        self._reporter._push(event)
