"""The Reporter's sending half: the bounded buffer the training thread appends to, and
the background thread that sends it in batches, with the rank's layout and its job
attempt events, to the node's agent (``transport``). Standard library only.
"""

from __future__ import annotations

import json
import logging
import random
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import TypeVar

from gpufleet.reporter.attempts import AttemptLifecycle
from gpufleet.reporter.events import (
    AttemptEvent,
    CheckpointEvent,
    Event,
    InvalidEventError,
    RankFinished,
    StepEvent,
    attempt_json,
    checkpoint_json,
    step_json,
)
from gpufleet.reporter.layout import (
    Layout,
    discover,
    layout_json,
    nvlink_domain,
    sizes_from_environment,
)
from gpufleet.reporter.transport import AgentConnection, detail, refused_indices
from gpufleet.reporter.wire import (
    ATTEMPTS_PATH,
    CHECKPOINTS_PATH,
    FINISHED_PATH,
    LAYOUT_PATH,
    MAX_ATTEMPT_EVENTS,
    MAX_BATCH_EVENTS,
    STEPS_PATH,
)

log = logging.getLogger("gpufleet.client")
EventT = TypeVar("EventT", StepEvent, CheckpointEvent)
_WARN_EVERY_S = 60.0


class Sender:
    """Buffers events and sends them from a thread of its own; the Reporter records.

    The rank's identity (``training_job``, ``rank``...) is the Reporter's, set before
    this ``__init__`` runs."""

    training_job: str
    rank: int
    pp_stage: int
    dp_rank: int | None
    attempt: int
    agent_url: str
    enabled: bool

    def __init__(
        self,
        agent: AgentConnection,
        *,
        buffer_size: int,
        batch_size: int,
        flush_interval: float,
        layout_sizes: dict[str, int | None],
    ) -> None:
        self._agent = agent
        self._capacity = buffer_size
        self._batch_size = max(1, min(batch_size, MAX_BATCH_EVENTS))
        self._flush_interval = flush_interval
        self._buffer: deque[Event] = deque()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._thread_lock = threading.Lock()
        self._idle = threading.Condition()
        self._in_flight = 0
        self._warned: dict[str, float] = {}
        self._count_lock = threading.Lock()
        self._init_layout(layout_sizes)
        self._forget_attempt()

        self.dropped = 0  # events dropped and not yet reported to the agent
        self.dropped_total = 0
        self.sent = 0
        self.rejected = 0  # events the agent refused
        self.invalid = 0  # events dropped here because no clamping could make them valid

    def _init_layout(self, given: dict[str, int | None]) -> None:
        self._layout_sizes = sizes_from_environment() | {
            kind: size for kind, size in given.items() if size
        }
        self._layout_described = False  # described by hand, or found after the first step
        self._layout_discover = False  # the sender thread looks for it
        self._layout_outbox: dict[str, object] | None = None

    def _forget_attempt(self) -> None:
        # Attempt events wait here, apart from the steps, so that ``ended`` (sent at once
        # from whatever thread sees the end) can take what is still unsent along with it.
        self._attempt_outbox: deque[AttemptEvent] = deque()
        self._attempt_lock = threading.Lock()
        self._attempt: AttemptLifecycle | None = None
        self._first_step_pending = False  # the one check a step pays for attempts

    def _discover_layout(self) -> Layout | None:
        try:
            return discover(self.rank, self._layout_sizes)
        except Exception as error:  # noqa: BLE001 - looking must never break training
            self._warn("layout", f"gpufleet client cannot read the parallel layout: {error}")
            return None

    def _queue_layout(self, layout: Layout | None) -> None:
        self._layout_described = True
        if layout is None:
            log.debug("gpufleet: no parallel layout found; GPUFLEET_TP_SIZE... can say it")
            return
        log.info(
            "gpufleet: parallel layout from %s: %s",
            layout.source,
            ", ".join(f"{group.group} {group.size}" for group in layout.groups),
        )
        self._layout_outbox = layout_json(
            layout, self.training_job, self.rank, self.attempt, nvlink_domain()
        )
        if self._thread is None:
            self._start_thread()
        self._wake.set()

    def _send_layout(self) -> bool:
        """Find the layout if the first step asked for it, and send it (sender thread).
        False: the agent is unreachable (retry later)."""
        if self._layout_discover:
            self._layout_discover = False
            if not self._layout_described:
                self._queue_layout(self._discover_layout())
        payload = self._layout_outbox
        if payload is None:
            return True
        if not self._send_payload(LAYOUT_PATH, [payload], counted=False):
            return False
        if self._layout_outbox is payload:  # unless described again meanwhile
            self._layout_outbox = None
        return True

    def _push(self, event: Event) -> None:
        if not self.enabled:
            return
        if self._thread is None:
            self._start_thread()
        buffer = self._buffer
        if len(buffer) >= self._capacity:
            self._count_dropped(1)
            return
        buffer.append(event)
        if len(buffer) == self._batch_size:
            self._wake.set()

    # -- sending (background thread) ------------------------------------------------

    def _start_thread(self) -> None:
        with self._thread_lock:
            if self._thread is not None:
                return
            self._stop.clear()
            self._thread = threading.Thread(target=self._run, name="gpufleet-reporter", daemon=True)
            self._thread.start()

    def _after_fork(self) -> None:
        # A forked child (a DataLoader worker) has no sender thread: start afresh, empty.
        self._buffer = deque()
        self._thread = None
        self._agent.forget()
        self._thread_lock = threading.Lock()
        self._idle = threading.Condition()
        self._in_flight = 0
        self._forget_attempt()  # the child is not the attempt (attempts.py)
        self._layout_discover, self._layout_outbox = False, None  # nor the rank's layout

    def _run(self) -> None:
        backoff = 0.0
        while not self._stop.is_set():
            if backoff:
                self._stop.wait(backoff)
            else:
                self._wake.wait(self._flush_interval)
            self._wake.clear()
            if self._stop.is_set():
                return
            if self._drain() is False:
                backoff = min(30.0, max(0.5, backoff * 2)) * random.uniform(0.8, 1.2)
            else:
                backoff = 0.0

    def _drain(self) -> bool | None:
        """Send everything buffered. False: the agent is unreachable (retry later)."""
        result: bool | None = None
        if self._attempt_outbox:
            if not self._send_queued_attempts():
                return False
            result = True
        if self._layout_discover or self._layout_outbox is not None:
            if not self._send_layout():
                return False
            result = True
        while self._buffer:
            taken = self._take()
            try:
                ok = self._send_events(taken)
            finally:
                with self._idle:
                    self._in_flight -= 1
                    self._idle.notify_all()
            if not ok:
                # Put the batch back in front, within capacity; the rest is dropped and counted.
                room = self._capacity - len(self._buffer)
                keep = taken[: max(0, room)]
                self._buffer.extendleft(reversed(keep))
                if len(keep) < len(taken):
                    self._count_dropped(len(taken) - len(keep))
                return False
            result = True
        with self._idle:
            self._idle.notify_all()
        return result

    def _count_dropped(self, count: int, warn: bool = True) -> None:
        with self._count_lock:
            self.dropped += count
            self.dropped_total += count
        if warn:
            self._warn("dropped", "gpufleet client buffer full: dropping events (they are counted)")

    def _take(self) -> list[Event]:
        # Taken and marked in flight under one lock: flush() never sees the events
        # neither buffered nor in flight (it would return before they were sent).
        taken: list[Event] = []
        buffer = self._buffer
        with self._idle:
            for _ in range(min(self._batch_size, len(buffer))):
                taken.append(buffer.popleft())
            self._in_flight += 1
        return taken

    def _send_events(self, events: list[Event]) -> bool:
        steps = self._valid(self._step_json, [e for e in events if isinstance(e, StepEvent)])
        checkpoints = self._valid(
            self._checkpoint_json, [e for e in events if isinstance(e, CheckpointEvent)]
        )
        finished: list[dict[str, object]] = [
            {"training_job": self.training_job, "rank": self.rank, "pp_stage": self.pp_stage}
            for e in events
            if isinstance(e, RankFinished)
        ][:1]
        for path, payload, counted in (
            (STEPS_PATH, steps, True),
            (CHECKPOINTS_PATH, checkpoints, True),
            (FINISHED_PATH, finished, False),  # last: after this batch's steps
        ):
            if payload and not self._send_payload(path, payload, counted):
                return False
        return True

    def _valid(
        self,
        to_json: Callable[[EventT], dict[str, object]],
        events: list[EventT],
    ) -> list[dict[str, object]]:
        payload = []
        for event in events:
            try:
                payload.append(to_json(event))
            except InvalidEventError as error:
                self.invalid += 1
                self._count_dropped(1, warn=False)
                self._warn("invalid", f"gpufleet client dropped an event it cannot send: {error}")
        return payload

    def _send_payload(self, path: str, payload: list[dict[str, object]], counted: bool) -> bool:
        """POST one batch. False: the agent is unreachable or failing (retry later)."""
        for attempt in range(2):  # the second: without the events the agent named as refused
            dropped = self.dropped
            body = json.dumps({"events": payload, "dropped": dropped}).encode()
            answer = self._agent.post(path, body)
            if answer is None or answer[0] >= 500:
                return False
            status, text = answer
            if status < 300:
                self.sent += len(payload) if counted else 0
                with self._count_lock:
                    self.dropped -= dropped
                return True
            refused = refused_indices(text, len(payload)) if status == 422 else []
            if attempt == 0 and 0 < len(refused) < len(payload):
                self.rejected += len(refused)
                self._warn(
                    "http-422",
                    f"the agent at {self.agent_url} refused {len(refused)} of {len(payload)} "
                    f"events ({detail(text)}); they are dropped, the rest is resent",
                )
                skip = set(refused)
                payload = [event for index, event in enumerate(payload) if index not in skip]
                continue
            self.rejected += len(payload)
            self._warn(
                f"http-{status}",
                f"the agent at {self.agent_url} rejected {len(payload)} events with HTTP "
                f"{status} ({detail(text)}); they are dropped",
            )
            return True
        return True

    # -- attempt events --------------------------------------------------------------

    def _queue_attempt(self, event: AttemptEvent) -> None:
        if not self.enabled:
            return
        if len(self._attempt_outbox) < MAX_ATTEMPT_EVENTS:
            self._attempt_outbox.append(event)
        if self._thread is None:
            self._start_thread()
        self._wake.set()

    def _send_queued_attempts(self) -> bool:
        """Send the queued attempt events (sender thread). False: retry later."""
        with self._attempt_lock:
            events = list(self._attempt_outbox)
            if not events:
                return True
            if not self._send_attempts(events, self._agent.post):
                return False
            for _ in events:
                self._attempt_outbox.popleft()
        return True

    def _send_now(self, events: list[AttemptEvent], budget: float) -> bool:
        """Send ``events`` (an attempt's end) at once from the calling thread, after what is
        still queued, on a connection of their own; for at most about ``budget`` seconds."""
        deadline = time.monotonic() + budget
        locked = self._attempt_lock.acquire(timeout=max(0.0, budget / 2))
        try:
            if locked:
                events = [*self._attempt_outbox, *events]

            def post(path: str, body: bytes) -> tuple[int, bytes] | None:
                # one socket timeout per step (connect, send, read): about the budget in all
                remaining = max(0.05, (deadline - time.monotonic()) / 2)
                return self._agent.post_on_new_connection(path, body, remaining)

            sent = self._send_attempts(events, post)
            if sent and locked:
                self._attempt_outbox.clear()
            return sent
        finally:
            if locked:
                self._attempt_lock.release()

    def _send_attempts(
        self,
        events: list[AttemptEvent],
        post: Callable[[str, bytes], tuple[int, bytes] | None],
    ) -> bool:
        """POST attempt events to the agent. False: unreachable or failing (retry later); a
        refusal (an agent too old to know attempts, a bad token) drops them, logged."""
        body = json.dumps({"events": [attempt_json(event) for event in events]}).encode()
        answer = post(ATTEMPTS_PATH, body)
        if answer is None or answer[0] >= 500:
            return False
        status, text = answer
        if status >= 300:
            self._warn(
                f"attempts-http-{status}",
                f"the agent at {self.agent_url} refused {len(events)} job attempt events with "
                f"HTTP {status} ({detail(text)}); they are dropped",
            )
        return True

    def _step_json(self, event: StepEvent) -> dict[str, object]:
        return step_json(
            event,
            self.training_job,
            self.rank,
            self.pp_stage,
            dp_rank=self.dp_rank,
            attempt=self.attempt,
        )

    def _checkpoint_json(self, event: CheckpointEvent) -> dict[str, object]:
        return checkpoint_json(event, self.training_job, self.rank)

    def _warn(self, kind: str, message: str) -> None:
        now = time.monotonic()
        if now - self._warned.get(kind, -_WARN_EVERY_S) >= _WARN_EVERY_S:
            self._warned[kind] = now
            log.warning(message)

    def flush(self, timeout: float = 5.0) -> bool:
        """Wait until everything recorded so far is sent (or ``timeout`` passes)."""
        if not self.enabled or self._thread is None:
            return not self._buffer
        deadline = time.monotonic() + timeout
        self._wake.set()
        with self._idle:
            while (
                self._buffer
                or self._in_flight
                or self._attempt_outbox
                or self._layout_discover
                or self._layout_outbox is not None
            ):
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return False
                self._wake.set()
                self._idle.wait(min(remaining, 0.05))
        return True
