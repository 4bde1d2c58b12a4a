"""Job attempt events from the node's training ranks, relayed to the fleet ledger.

The ranks POST ``started`` / ``first_step`` / ``ended`` to their agent (``/v1/attempts``),
so a training pod needs no ledger credentials; the agent writes them to the ledger when
it is given one (``--ledger-url``). The ingest request only queues (no I/O on the request
path, none on the scrape path): a thread of its own writes the queue in order, retrying
an unreachable or failing ledger with backoff, for ``retry_for_s`` at most.

Each write's Idempotency-Key comes from the event (``<source>:<job>:<attempt>:<event>``,
``gpufleet.reporter.events.attempt_key``), so the same event from several ranks, agents
or retries is stored once: a key this agent already queued is a ``duplicate`` here, a key
the ledger already holds for a different body (another rank's ``ended``) is its 409, a
``duplicate`` too. What happened to every event is counted by outcome
(``gpufleet_agent_attempt_events_total``).
"""

from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from gpufleet.fleet.ledger_client import LedgerClient, LedgerError
from gpufleet.fleet.models import AttemptEventIn
from gpufleet.reporter.events import attempt_key
from gpufleet.reporter.wire import ATTEMPTS_PATH

log = logging.getLogger(__name__)

# received: taken from a rank; forwarded: the ledger stored it (or had stored the same
# body under its key: LedgerClient does not say which); duplicate: its key was queued here
# before, or the ledger holds it for another body (409); refused: the ledger answered
# another 4xx, or a 409 for an attempt it never saw start (the reason in
# gpufleet_agent_attempt_refusals_total: not_started, unauthorized, ledger_cap, ...);
# failed: the ledger could not be written for retry_for_s; dropped: the queue was full;
# unforwarded: this agent has no --ledger-url.
OUTCOMES = (
    "received",
    "forwarded",
    "duplicate",
    "refused",
    "failed",
    "dropped",
    "unforwarded",
)
_REFUSALS = {
    400: "bad_request",
    401: "unauthorized",
    403: "forbidden",
    404: "not_found",
    413: "too_large",
    422: "invalid",
    429: "ledger_cap",  # the ledger's label caps: waiting does not clear them
}
_RETRIED = (408, 425, 503)  # the ledger says: nothing stored, try again
_NEVER_STARTED = "was never started"  # the ledger's 409 for an attempt it does not hold
_REMEMBERED_KEYS = 4096
_WARN_EVERY_S = 60.0


@dataclass(frozen=True, slots=True)
class ForwardSettings:
    url: str
    token: str | None = None
    queue_size: int = 1024
    timeout_s: float = 5.0
    retry_for_s: float = 900.0  # a ledger restart or rollout is shorter
    backoff_min_s: float = 0.5
    backoff_max_s: float = 30.0


class AttemptCounts:
    """What became of the attempt events this agent received (thread-safe)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._outcomes = dict.fromkeys(OUTCOMES, 0)
        self._refusals: dict[str, int] = {}
        self.queued = 0

    def add(self, outcome: str, count: int = 1) -> None:
        with self._lock:
            self._outcomes[outcome] += count

    def refused(self, reason: str) -> None:
        with self._lock:
            self._outcomes["refused"] += 1
            self._refusals[reason] = self._refusals.get(reason, 0) + 1

    def outcomes(self) -> dict[str, int]:
        with self._lock:
            return dict(self._outcomes)

    def refusals(self) -> dict[str, int]:
        with self._lock:
            return dict(self._refusals)


@dataclass(frozen=True, slots=True)
class _Pending:
    key: str
    payload: dict[str, object]


class AttemptRelay:
    """Takes the ranks' attempt events; hands them to a forwarder, or counts them as
    unforwarded when the agent has no ledger."""

    def __init__(self, forwarder: LedgerForwarder | None = None) -> None:
        self.forwarder = forwarder
        self.counts = forwarder.counts if forwarder is not None else AttemptCounts()

    def submit(self, events: Iterable[AttemptEventIn]) -> None:
        events = list(events)
        self.counts.add("received", len(events))
        if self.forwarder is None:
            self.counts.add("unforwarded", len(events))
            return
        self.forwarder.submit(events)


class LedgerForwarder:
    """A bounded queue of attempt events and the thread that writes them to the ledger."""

    def __init__(
        self,
        settings: ForwardSettings,
        *,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        self.settings = settings
        self.counts = AttemptCounts()
        self._client = LedgerClient(settings.url, settings.token or "", settings.timeout_s)
        self._clock = clock
        self._wall_clock = wall_clock
        self._queue: deque[_Pending] = deque()
        self._keys: OrderedDict[str, None] = OrderedDict()  # recently queued, oldest first
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._idle = threading.Condition(self._lock)
        self._busy = False
        self._thread: threading.Thread | None = None
        self._warned: dict[str, float] = {}

    # -- the request path: queue only ------------------------------------------------

    def submit(self, events: Iterable[AttemptEventIn]) -> None:
        for received in events:
            event = received
            if event.at is None:  # the time it happened, not the time a retry got through
                event = event.model_copy(update={"at": self._wall_clock()})
            key = attempt_key(event.source, event.training_job, event.attempt, event.event)
            with self._lock:
                if key in self._keys:
                    self.counts.add("duplicate")
                    continue
                if len(self._queue) >= self.settings.queue_size:
                    self.counts.add("dropped")
                    self._warn("dropped", "the attempt queue is full: dropping events (counted)")
                    continue
                self._keys[key] = None
                if len(self._keys) > _REMEMBERED_KEYS:
                    self._keys.popitem(last=False)
                self._queue.append(_Pending(key, event.model_dump(mode="json", exclude_none=True)))
                self.counts.queued = len(self._queue)
        self._wake.set()

    # -- the writer thread ---------------------------------------------------------------

    def start(self) -> None:
        if self._thread is not None:
            return
        self._stop.clear()
        self._thread = threading.Thread(
            target=self._run, name="gpufleet-ledger-forwarder", daemon=True
        )
        self._thread.start()

    def stop(self, drain_s: float = 2.0) -> None:
        """Write what is queued for at most ``drain_s`` (a rollout replaces the agent), then
        stop the thread."""
        if self._thread is None:
            return
        self.wait_idle(drain_s)
        self._stop.set()
        self._wake.set()
        self._thread.join(self.settings.timeout_s + 1.0)
        self._thread = None

    def wait_idle(self, timeout: float) -> bool:
        """Wait until the queue is empty and nothing is being written (tests, shutdown)."""
        deadline = self._clock() + timeout
        with self._idle:
            while self._queue or self._busy:
                remaining = deadline - self._clock()
                if remaining <= 0:
                    return False
                self._idle.wait(min(remaining, 0.05))
        return True

    def _run(self) -> None:
        while not self._stop.is_set():
            self._wake.wait()
            self._wake.clear()
            self._drain()

    def _drain(self) -> None:
        backoff = 0.0
        first_failure: float | None = None
        while not self._stop.is_set():
            with self._lock:
                if not self._queue:
                    self._idle.notify_all()
                    return
                head = self._queue[0]
                self._busy = True
            try:
                outcome = self._write(head)
            finally:
                with self._lock:
                    self._busy = False
            if outcome == "retry":
                now = self._clock()
                first_failure = now if first_failure is None else first_failure
                if now - first_failure < self.settings.retry_for_s:
                    backoff = min(
                        self.settings.backoff_max_s, max(self.settings.backoff_min_s, backoff * 2)
                    )
                    self._stop.wait(backoff)
                    continue
                self.counts.add("failed")
            backoff, first_failure = 0.0, None
            with self._lock:
                self._queue.popleft()
                self.counts.queued = len(self._queue)
                self._idle.notify_all()

    def _write(self, pending: _Pending) -> str:
        """One write; its outcome, or ``retry``."""
        try:
            self._client.post(ATTEMPTS_PATH, pending.payload, pending.key, retries=0)
        except LedgerError as error:
            status = error.status
            if status is None or status >= 500 or status in _RETRIED:
                self._warn("retry", f"attempt event {pending.key} not written, retrying: {error}")
                return "retry"
            if status == 409 and _NEVER_STARTED in str(error):
                # a first step or an end whose start the ledger never got (rank 0 died
                # before telling it, or its start was refused): not stored, said so
                self.counts.refused("not_started")
                self._warn("not-started", f"the ledger refused {pending.key}: {error}")
                return "refused"
            if status == 409:
                self.counts.add("duplicate")
                return "duplicate"
            reason = _REFUSALS.get(status, f"http_{status}")
            self.counts.refused(reason)
            self._warn(f"refused-{status}", f"the ledger refused {pending.key}: {error}")
            return "refused"
        self.counts.add("forwarded")
        return "forwarded"

    def _warn(self, kind: str, message: str) -> None:
        now = self._clock()
        if now - self._warned.get(kind, -_WARN_EVERY_S) >= _WARN_EVERY_S:
            self._warned[kind] = now
            log.warning(message)
