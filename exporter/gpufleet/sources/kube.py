"""Node exclusions from Kubernetes: ``gpufleet kube-watch``.

One watcher per cluster (a sidecar in the ledger's pod) follows the Node objects
through the API server's list/watch protocol (``kubeapi``). BOOKMARK events move the
resource version on; ``410 Gone`` means the version was compacted away, so it lists
again and diffs what it finds against what it knew, which is how a change missed in
the gap (a node uncordoned meanwhile) is still recorded. Other failures reconnect with
exponential backoff, a broken watch from its last version; a watch the server ends
(``timeoutSeconds``) resumes at once.

A node going out of service (``kube_signals``: cordoned, tainted, or a condition) is one
exclusion in the ledger, coming back one release; the first reason of an episode stays
(the ledger keeps one open exclusion per node). ``kube_service`` runs it with its /metrics.

Writes go through the ledger's idempotent API with ``source="kubernetes"`` and a key
derived from the node and the resource version at which the change was seen, so a
replayed event or a resync never counts twice. What the watcher knows starts from the
ledger's open exclusions, so a restarted watcher does not record again what is already
there; it releases only exclusions it wrote itself (their keys start ``kube-``), never
one an operator or another source opened. The writes wait in an in-memory queue while
the ledger cannot be reached; one lost with the process is found again by the next
start's list.
"""

from __future__ import annotations

import collections
import hashlib
import logging
import random
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from gpufleet.fleet.ledger_client import LedgerClient, LedgerError
from gpufleet.sources.kube_signals import NodeRules, episode_reason
from gpufleet.sources.kubeapi import Gone, KubeApi, KubeApiError

log = logging.getLogger(__name__)

SOURCE = "kubernetes"
KEY_PREFIX = "kube-"


def ledger_key(action: str, node: str, resource_version: str) -> str:
    """The Idempotency-Key of one change: the same node changed at the same resource
    version is the same write, however often the event is replayed."""
    digest = hashlib.sha256(f"{action}\0{node}\0{resource_version}".encode()).hexdigest()
    return f"{KEY_PREFIX}{action}-{digest[:40]}"


@dataclass(slots=True)
class Tracked:
    """A node as the ledger will see it once the queued writes are in."""

    excluded: bool
    ours: bool  # this watcher opened the exclusion, so it may release it
    at: float  # when it was excluded / released
    key: str = ""  # the exclusion's Idempotency-Key


@dataclass(frozen=True, slots=True)
class KubeWrite:
    action: str  # exclude or release
    node: str
    key: str
    payload: dict[str, Any]

    @property
    def path(self) -> str:
        return "/v1/exclusions" if self.action == "exclude" else "/v1/releases"


@dataclass
class KubeWatchStats:
    """What the watcher saw and did, for its /metrics."""

    events: collections.Counter[str] = field(default_factory=collections.Counter)
    changes: collections.Counter[str] = field(default_factory=collections.Counter)
    writes: collections.Counter[tuple[str, str]] = field(default_factory=collections.Counter)
    send_failures: collections.Counter[str] = field(default_factory=collections.Counter)
    resyncs: collections.Counter[str] = field(default_factory=collections.Counter)
    api_errors: collections.Counter[str] = field(default_factory=collections.Counter)
    nodes: int = 0
    out_of_service: int = 0
    pending: int = 0
    watching: bool = False
    last_list: float = 0.0


class Backoff:
    """Exponential delays with jitter, reset after a success."""

    def __init__(self, initial: float, maximum: float) -> None:
        self.initial, self.maximum = initial, maximum
        self.delay = initial

    def next(self) -> float:
        delay = self.delay * random.uniform(0.5, 1.0)
        self.delay = min(self.delay * 2, self.maximum)
        return delay

    def reset(self) -> None:
        self.delay = self.initial


class NodeWatcher:
    """Turns Node changes into the ledger's exclusions and releases."""

    def __init__(
        self,
        api: KubeApi,
        ledger: LedgerClient,
        rules: NodeRules | None = None,
        *,
        clock: Callable[[], float] = time.time,
        watch_timeout_s: int = 300,
        backoff: tuple[float, float] = (1.0, 30.0),
    ) -> None:
        self.api, self.ledger, self.rules = api, ledger, rules or NodeRules()
        self.clock = clock
        self.watch_timeout_s = watch_timeout_s
        self.backoff = backoff
        self.stats = KubeWatchStats()
        self.source = SOURCE  # "auto" once a ledger that predates named sources refuses it
        self.known: dict[str, Tracked] = {}
        self.out_of_service: set[str] = set()
        self.seen: set[str] = set()
        self.resource_version = ""
        self._delivered = 0  # watch events since the last list
        self._lock = threading.Lock()
        self._queue: collections.deque[KubeWrite] = collections.deque()
        self._wake = threading.Condition(self._lock)

    # The API side: list, diff, watch.

    def run(self, stop: threading.Event) -> None:
        """List and watch until ``stop`` is set; a sender thread delivers the writes."""
        sender = threading.Thread(target=self._send_loop, args=(stop,), daemon=True,
                                  name="kube-watch-sender")  # fmt: skip
        self._load_ledger_state(stop)
        sender.start()
        retry = Backoff(*self.backoff)
        relist, reason = True, "startup"
        while not stop.is_set():
            try:
                if relist:
                    self.resync(reason)
                    relist = False
                    retry.reset()
                self.watch_once()  # until the server ends it: watch again from where it was
            except Gone as gone:
                log.info("%s; listing the nodes again", gone)
                self._count_api_error(gone)
                if reason == "gone" and not self._delivered:
                    stop.wait(retry.next())  # gone again before a single event: slow down
                relist, reason = True, "gone"
            except KubeApiError as error:
                # A failed list is listed again; a broken watch resumes at its version.
                log.warning("%s; retrying", error)
                self._count_api_error(error)
                reason = "error"
                stop.wait(retry.next())
            else:
                retry.reset()
            with self._lock:
                self.stats.watching = False
        with self._wake:
            self._wake.notify_all()

    def _count_api_error(self, error: KubeApiError) -> None:
        with self._lock:
            self.stats.api_errors[error.reason] += 1

    def _load_ledger_state(self, stop: threading.Event) -> None:
        """Start from the ledger's open exclusions, waiting until the ledger answers."""
        retry = Backoff(*self.backoff)
        while not stop.is_set():
            if self._refresh_from_ledger():
                return
            stop.wait(retry.next())

    def _refresh_from_ledger(self) -> bool:
        try:
            rows = self.ledger.get("/v1/excluded")
        except LedgerError as error:
            log.warning("cannot read the ledger's open exclusions: %s", error)
            with self._lock:
                self.stats.send_failures["read"] += 1
            return False
        with self._lock:
            self.known = {
                str(row["node"]): Tracked(
                    True,
                    str(row.get("idempotency_key", "")).startswith(KEY_PREFIX),
                    float(row["excluded_at"]),
                    str(row.get("idempotency_key", "")),
                )
                for row in rows
            }
        return True

    def resync(self, reason: str) -> None:
        """List every node and record what changed since what was known."""
        items, resource_version = self.api.list_nodes()
        with self._lock:
            idle = not self._queue
        # With nothing queued, the ledger's own state is the truth to diff against (an
        # operator may have released a node meanwhile); else what the queue will make it.
        if idle:
            self._refresh_from_ledger()
        listed = {}
        for node in items:
            name = str((node.get("metadata") or {}).get("name", ""))
            if name:
                listed[name] = node
        with self._lock:
            self._delivered = 0
            self.stats.resyncs[reason] += 1
            self.stats.last_list = self.clock()
            gone = (self.seen | set(self.known)) - set(listed)
            for name, node in listed.items():
                self._reconcile(name, node, self._version(node, resource_version))
            for name in sorted(gone):
                self._reconcile(name, None, resource_version)
            self.seen = set(listed)
            self.resource_version = resource_version
            self._gauges()
        log.info("listed %d nodes at resource version %s (%s)", len(listed),
                 resource_version, reason)  # fmt: skip

    @staticmethod
    def _version(node: Mapping[str, Any], fallback: str) -> str:
        return str((node.get("metadata") or {}).get("resourceVersion") or fallback)

    def watch_once(self) -> None:
        """One watch request, from the last resource version until the server ends it."""
        events = self.api.watch_nodes(self.resource_version, self.watch_timeout_s)
        with self._lock:
            self.stats.watching = True
        for event in events:
            with self._lock:
                self._delivered += 1
                self.stats.events[event.type] += 1
                version = event.resource_version or self.resource_version
                if event.type in ("ADDED", "MODIFIED", "DELETED"):
                    name = str((event.object.get("metadata") or {}).get("name", ""))
                    if name:
                        live = event.type != "DELETED"
                        (self.seen.add if live else self.seen.discard)(name)
                        self._reconcile(name, event.object if live else None, version)
                        self._gauges()
                if version:
                    self.resource_version = version

    def _gauges(self) -> None:
        self.stats.nodes = len(self.seen)
        self.stats.out_of_service = len(self.out_of_service)
        self.stats.pending = len(self._queue)

    def _reconcile(self, name: str, node: Mapping[str, Any] | None, version: str) -> None:
        """Queue the write, if any, that brings the ledger to what ``node`` says (under the
        lock)."""
        signals = self.rules.signals(node) if node is not None else ()
        (self.out_of_service.add if signals else self.out_of_service.discard)(name)
        tracked = self.known.get(name)
        now = self.clock()
        if signals and (tracked is None or not tracked.excluded):
            began = [s.since for s in signals if s.since is not None]
            at = min(min(began, default=now), now)
            if tracked is not None:
                at = max(at, tracked.at)  # never before the last release
            key = ledger_key("exclude", name, version)
            note = "; ".join(f"{s.kind} {s.name}" for s in signals)
            payload = {"node": name, "reason": episode_reason(signals), "source": SOURCE,
                       "at": at, "note": f"kubernetes: {note}"[:500]}  # fmt: skip
            self._enqueue(KubeWrite("exclude", name, key, payload))
            self.known[name] = Tracked(True, True, at, key)
            self.stats.changes["exclude"] += 1
        elif not signals and tracked is not None and tracked.excluded and tracked.ours:
            at = max(now, tracked.at)
            why = "back in service" if node is not None else "the Node object was deleted"
            payload = {"node": name, "at": at, "note": f"kubernetes: {why}"}
            self._enqueue(KubeWrite("release", name, ledger_key("release", name, version), payload))
            self.known[name] = Tracked(False, False, at)
            self.stats.changes["release"] += 1

    def _enqueue(self, write: KubeWrite) -> None:
        self._queue.append(write)
        self._wake.notify_all()

    # The ledger side: one sender, in order, retrying what did not arrive with its key.

    def _send_loop(self, stop: threading.Event) -> None:
        retry = Backoff(*self.backoff)
        while True:
            with self._wake:
                while not self._queue and not stop.is_set():
                    self._wake.wait()
                if not self._queue:
                    return
                write = self._queue[0]
            if self._send(write):
                retry.reset()
                with self._lock:
                    self._queue.popleft()
                    self._gauges()
            elif stop.wait(retry.next()):
                return

    def _send(self, write: KubeWrite) -> bool:
        """Deliver one write; False when it should be tried again (same key)."""
        payload = write.payload
        if "source" in payload and self.source != SOURCE:
            payload = {**payload, "source": self.source}
        try:
            self.ledger.post(write.path, payload, write.key, retries=0)
            outcome = "accepted"
        except LedgerError as error:
            if error.status == 422 and "source" in str(error) and self.source == SOURCE:
                # A ledger from before sources were named: record it as "auto" (the note
                # still says kubernetes) rather than not at all; refused, nothing was stored.
                log.warning("the ledger does not know source=%s; sending source=auto", SOURCE)
                self.source = "auto"
                return self._send(write)
            if error.status is None or error.status >= 500:
                log.warning("%s of %s not delivered (will retry): %s", write.action,
                            write.node, error)  # fmt: skip
                with self._lock:
                    self.stats.send_failures[write.action] += 1
                return False
            outcome = "conflict" if error.status == 409 else "refused"
            log_at = logging.INFO if outcome == "conflict" else logging.ERROR
            log.log(log_at, "%s of %s: %s", write.action, write.node, error)
            if outcome == "conflict" and write.action == "exclude":
                # Already excluded by someone else (an operator, another source): theirs
                # to release, not ours.
                with self._lock:
                    tracked = self.known.get(write.node)
                    if tracked is not None and tracked.key == write.key:
                        tracked.ours = False
        with self._lock:
            self.stats.writes[(write.action, outcome)] += 1
        return True

    def pending(self) -> int:
        with self._lock:
            return len(self._queue)

    def snapshot(self) -> KubeWatchStats:
        with self._lock:
            return KubeWatchStats(
                events=collections.Counter(self.stats.events),
                changes=collections.Counter(self.stats.changes),
                writes=collections.Counter(self.stats.writes),
                send_failures=collections.Counter(self.stats.send_failures),
                resyncs=collections.Counter(self.stats.resyncs),
                api_errors=collections.Counter(self.stats.api_errors),
                nodes=self.stats.nodes,
                out_of_service=self.stats.out_of_service,
                pending=len(self._queue),
                watching=self.stats.watching,
                last_list=self.stats.last_list,
            )


def drain(watcher: NodeWatcher, within_s: float) -> int:
    """Wait up to ``within_s`` for the queued writes to be delivered; how many are left."""
    deadline = time.monotonic() + within_s
    while watcher.pending() and time.monotonic() < deadline:
        time.sleep(0.1)
    return watcher.pending()
