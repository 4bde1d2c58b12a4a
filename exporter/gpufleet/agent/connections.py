"""Connection limits for the agent's HTTP server, so that abuse cannot take /metrics down.

uvicorn cuts idle keep-alive connections, but not a connection that never sends
a request, sends its header a byte at a time (slowloris) or its body slowly,
and its ``limit_concurrency`` answers 503 to every request over the limit,
Prometheus's included. This guard, a subclass of uvicorn's httptools protocol
(uvicorn's documented way to bring one's own protocol class), adds:

- a header deadline: a request head must arrive within ``header_timeout_s`` of
  the connection opening (or of its first byte on a kept-alive connection);
- a body deadline: the body must arrive within ``body_timeout_s`` of its head;
  the ingest handler then sees a disconnect and counts it;
- a header size limit (431);
- a share per client address: a connection beyond it is closed at once, before
  uvicorn sets anything up, so a flood from one host never crowds out
  Prometheus and costs the agent as little as an accept can;
- a total cap that gives priority to the newest connection: over it, a
  connection of the address holding the most is closed to make room, its oldest
  one still waiting for a request head (idle, slow or never used), else its
  oldest one still sending a body. A connection whose request is complete and
  being answered is never cut, so a scraper that connects gets in.

Every cut is counted in ``gpufleet_agent_connections_closed_total{reason}``.
"""

from __future__ import annotations

import asyncio
import threading
from collections import Counter
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from gpufleet.agent.limits import ConnectionLimits


class ConnectionGuard:
    """Shared by every connection of one server: the open ones per client address, in
    opening order."""

    def __init__(self, limits: ConnectionLimits | None = None) -> None:
        self.limits = limits or ConnectionLimits()
        # client address -> its open connections (an insertion-ordered set)
        self._open: dict[str, dict[GuardedHttpToolsProtocol, None]] = {}
        self._count = 0
        self._lock = threading.Lock()  # the counters are read by scrapes in another thread
        self._closed: Counter[str] = Counter()

    def admits(self, peer: str) -> bool:
        """Whether a new connection from ``peer`` is within that address's share."""
        return len(self._open.get(peer, ())) < self.limits.max_connections_per_client

    def opened(self, connection: GuardedHttpToolsProtocol) -> None:
        self._open.setdefault(connection.peer, {})[connection] = None
        self._count += 1
        if self._count > self.limits.max_connections:
            # From the address holding the most connections (a flood's, not Prometheus's).
            self._make_room(max(self._open.values(), key=len), connection)

    def _make_room(
        self,
        among: dict[GuardedHttpToolsProtocol, None],
        newcomer: GuardedHttpToolsProtocol,
    ) -> None:
        # The oldest idle or never-used connection, else the oldest still sending a body;
        # a request being answered is never cut. Failing those, the newcomer is refused.
        for evictable in (_idle, _receiving_body):
            for candidate in among:
                if (
                    candidate is not newcomer
                    and not candidate.transport.is_closing()  # cut, not yet gone
                    and evictable(candidate)
                ):
                    candidate.cut("evicted")
                    return
        newcomer.cut("over_limit")

    def lost(self, connection: GuardedHttpToolsProtocol) -> None:
        mine = self._open.get(connection.peer)
        if mine is None or connection not in mine:
            return
        del mine[connection]
        self._count -= 1
        if not mine:
            del self._open[connection.peer]

    def count(self, reason: str) -> None:
        with self._lock:
            self._closed[reason] += 1

    @property
    def open_connections(self) -> int:
        return self._count

    def closed(self) -> dict[str, int]:
        with self._lock:
            return dict(self._closed)


class GuardedHttpToolsProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol with the deadlines and caps of a ConnectionGuard."""

    guard: ConnectionGuard  # set on the subclass made by protocol_for()

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.awaiting_head = True
        self.receiving_body = False
        self.peer = ""
        self._refused = False
        self._head_bytes = 0
        self._deadline: asyncio.TimerHandle | None = None

    def _arm(self, seconds: float, reason: str) -> None:
        self._disarm()
        self._deadline = self.loop.call_later(seconds, self.cut, reason)

    def _disarm(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None

    def cut(self, reason: str, status: bytes | None = None) -> None:
        """Close the connection now, counting why; ``status`` is a response line to send first."""
        self._disarm()
        if self.transport is None or self.transport.is_closing():
            return
        self.guard.count(reason)
        if status is not None:
            self.transport.write(
                b"HTTP/1.1 " + status + b"\r\ncontent-length: 0\r\nconnection: close\r\n\r\n"
            )
        self.transport.close()

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        peer = transport.get_extra_info("peername")
        self.peer = str(peer[0]) if isinstance(peer, tuple) and peer else ""
        if not self.guard.admits(self.peer):
            # Over its address's share: refused before uvicorn sets anything up, the cheapest
            # answer to a flood (whose every connection costs an accept here).
            self._refused = True
            self.guard.count("over_client_limit")
            transport.close()
            return
        super().connection_made(transport)
        self._arm(self.guard.limits.header_timeout_s, "header_timeout")
        self.guard.opened(self)

    def connection_lost(self, exc: Exception | None) -> None:
        if self._refused:
            return  # uvicorn never knew this connection
        self._disarm()
        self.guard.lost(self)
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self.awaiting_head:
            self._head_bytes += len(data)
            if self._deadline is None:  # the first byte of a request on a kept-alive connection
                self._arm(self.guard.limits.header_timeout_s, "header_timeout")
        super().data_received(data)
        if self.awaiting_head and self._head_bytes > self.guard.limits.max_header_bytes:
            self.cut("header_too_large", b"431 Request Header Fields Too Large")

    def on_headers_complete(self) -> None:
        self.awaiting_head = False
        self.receiving_body = True
        self._arm(self.guard.limits.body_timeout_s, "body_timeout")
        super().on_headers_complete()

    def on_message_complete(self) -> None:
        # The body is in (an early answer, e.g. 413, leaves the body deadline armed until
        # then): from here on, what arrives is the next request's head.
        self._disarm()
        self.awaiting_head = True
        self.receiving_body = False
        self._head_bytes = 0
        super().on_message_complete()

    @property
    def idle(self) -> bool:
        """No request in progress and the next one's head not complete: safe to close."""
        return self.awaiting_head and (self.cycle is None or self.cycle.response_complete)


def _idle(connection: GuardedHttpToolsProtocol) -> bool:
    return connection.idle


def _receiving_body(connection: GuardedHttpToolsProtocol) -> bool:
    return connection.receiving_body


def protocol_for(guard: ConnectionGuard) -> type[GuardedHttpToolsProtocol]:
    """A protocol class bound to ``guard``, for ``uvicorn.Config(http=...)``."""
    return type("AgentHttpProtocol", (GuardedHttpToolsProtocol,), {"guard": guard})
