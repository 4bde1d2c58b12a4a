"""Reports the simulated cluster's exclusions and job attempts to a fleet ledger.

Events are posted in time order once simulated time passes them, with their
own timestamps (``at``) and an idempotency key derived from the seed and the
event, so a restarted simulator or a retried request never counts twice.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass
from typing import Any

from gpufleet.fleet.ledger_client import LedgerClient, LedgerError
from gpufleet.simulate.timeline_types import Timeline

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class LedgerEvent:
    at: float
    path: str
    payload: dict[str, Any]
    key: str


def ledger_events(
    timeline: Timeline, node_names: list[str], job: str, seed: int
) -> list[LedgerEvent]:
    events: list[LedgerEvent] = []
    prefix = f"sim-{seed}-{int(timeline.start)}"
    for index, exclusion in enumerate(timeline.exclusions):
        node = node_names[exclusion.node]
        events.append(
            LedgerEvent(
                exclusion.start,
                "/v1/exclusions",
                {"node": node, "reason": exclusion.reason, "source": exclusion.source,
                 "training_job": job, "at": exclusion.start},
                f"{prefix}-exclude-{index}",
            )
        )  # fmt: skip
        events.append(
            LedgerEvent(
                exclusion.end,
                "/v1/releases",
                {"node": node, "at": exclusion.end, "note": "repaired"},
                f"{prefix}-release-{index}",
            )
        )
    for attempt in timeline.attempts:
        base = {"training_job": job, "attempt": attempt.number}
        events.append(
            LedgerEvent(
                attempt.start,
                "/v1/attempts",
                {**base, "event": "started", "trigger": attempt.trigger, "at": attempt.start},
                f"{prefix}-attempt-{attempt.number}-started",
            )
        )
        events.append(
            LedgerEvent(
                attempt.first_step,
                "/v1/attempts",
                {**base, "event": "first_step", "at": attempt.first_step},
                f"{prefix}-attempt-{attempt.number}-first-step",
            )
        )
        if attempt.end is not None:
            ended = {**base, "event": "ended", "outcome": attempt.outcome, "at": attempt.end}
            if attempt.cause:
                ended["cause"] = attempt.cause
            events.append(
                LedgerEvent(
                    attempt.end, "/v1/attempts", ended, f"{prefix}-attempt-{attempt.number}-ended"
                )
            )
    # Releases before exclusions at equal times; attempt events in their natural order.
    order = {"/v1/releases": 0, "/v1/exclusions": 1, "/v1/attempts": 2}
    return sorted(events, key=lambda e: (e.at, order[e.path]))


class LedgerFeed:
    """Posts events as simulated time passes them; runs in its own thread."""

    def __init__(self, client: LedgerClient, events: list[LedgerEvent]) -> None:
        self.client = client
        self._events = events
        self._next = 0
        self._now = 0.0
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.posted = 0
        self.failed = 0

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="gpufleet-sim-ledger", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(10)

    def advance(self, now: float) -> None:
        self._now = now
        self._wake.set()

    def post_until(self, now: float) -> int:
        """Post every event up to ``now`` (synchronously); returns how many were posted."""
        posted = 0
        while self._next < len(self._events) and self._events[self._next].at <= now:
            event = self._events[self._next]
            try:
                self.client.post(event.path, event.payload, event.key)
                self.posted += 1
                posted += 1
            except LedgerError as error:
                if error.status is None:
                    log.warning("fleet ledger unreachable (%s); will retry", error)
                    return posted
                self.failed += 1
                log.warning("the fleet ledger refused %s: %s", event.key, error)
            self._next += 1
        return posted

    def _run(self) -> None:
        while not self._stop.is_set():
            self._wake.wait(5.0)
            self._wake.clear()
            self.post_until(self._now)
