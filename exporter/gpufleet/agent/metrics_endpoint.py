"""``/metrics`` as a raw ASGI endpoint: cached GPU bytes plus the live registry.

The GPU part (hundreds of series) is rendered once per NVML snapshot and kept
raw and deflated; a scrape renders only the small live registry (training
counters, self-metrics) and splices it on. This keeps a scrape far below the
cost of rendering every series each time.

The render runs in one worker thread, never on the event loop, so ingest,
``/healthz`` and other scrapes are served while a large exposition renders;
scrapes that arrive during a render wait for the next one in turn (one render
at a time bounds the CPU a scrape storm can take).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, MutableMapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from prometheus_client import CollectorRegistry, generate_latest

from gpufleet.agent.selfmetrics import ScrapeStats
from gpufleet.exposition import CONTENT_TYPE, EMPTY_PART, PrecompressedPart

log = logging.getLogger(__name__)

AsgiScope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]


def _accepts_gzip(scope: AsgiScope) -> bool:
    for name, value in scope.get("headers", ()):
        if name == b"accept-encoding":
            return b"gzip" in value
    return False


class MetricsEndpoint:
    def __init__(
        self,
        registry: CollectorRegistry,
        stats: ScrapeStats,
        cached_part: Callable[[], PrecompressedPart] | None = None,
    ) -> None:
        self._registry = registry
        self._stats = stats
        self._cached_part = cached_part
        self._renderer = ThreadPoolExecutor(1, thread_name_prefix="gpufleet-metrics")

    def body(self, gzip: bool) -> bytes:
        part = self._cached_part() if self._cached_part is not None else EMPTY_PART
        live = generate_latest(self._registry)
        if gzip:
            return part.gzip_with(live)
        return part.raw + live

    async def __call__(self, scope: AsgiScope, receive: Receive, send: Send) -> None:
        method = scope.get("method", "GET")
        if method not in ("GET", "HEAD"):
            await _plain(send, 405, b"/metrics answers GET only\n", [(b"allow", b"GET, HEAD")])
            return
        started = time.perf_counter()
        gzip = _accepts_gzip(scope)
        try:
            loop = asyncio.get_running_loop()
            body = await loop.run_in_executor(self._renderer, self.body, gzip)
        except Exception:
            log.exception("rendering /metrics failed")
            await _plain(send, 500, b"rendering /metrics failed; see the agent's log\n")
            return
        headers = [(b"content-type", CONTENT_TYPE.encode()), (b"vary", b"Accept-Encoding")]
        if gzip:
            headers.append((b"content-encoding", b"gzip"))
        headers.append((b"content-length", str(len(body)).encode()))
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": body if method == "GET" else b""})
        self._stats.observe(time.perf_counter() - started)


async def _plain(
    send: Send, status: int, text: bytes, extra: list[tuple[bytes, bytes]] | None = None
) -> None:
    headers = [(b"content-type", b"text/plain; charset=utf-8")] + (extra or [])
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": text})
