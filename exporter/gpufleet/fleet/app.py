"""The fleet ledger's HTTP API (FastAPI): write events, query history, /metrics."""

from __future__ import annotations

import asyncio
import hmac
import ipaddress
import re
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Annotated, Any, TypeVar

from fastapi import APIRouter, Depends, FastAPI, HTTPException, Query, Request
from fastapi.responses import JSONResponse, Response
from prometheus_client import CollectorRegistry, generate_latest
from pydantic import BaseModel, ValidationError

from gpufleet import __version__
from gpufleet.exposition import CONTENT_TYPE
from gpufleet.fleet.chains import histories
from gpufleet.fleet.metrics import LedgerCollector, Rejections
from gpufleet.fleet.models import AttemptEventIn, ExclusionIn, ReleaseIn
from gpufleet.fleet.store import (
    CursorError,
    LedgerCapError,
    LedgerConflictError,
    LedgerStore,
    LedgerUnavailableError,
    Page,
    Stored,
)

MAX_BODY_BYTES = 64 * 1024
PAGE_DEFAULT = 1000  # rows per page of a list, unless the client asks for fewer or more
PAGE_MAX = 10_000
_KEY = re.compile(r"^[A-Za-z0-9._:-]{8,128}$")
ModelT = TypeVar("ModelT", bound=BaseModel)


def _problem(status: int, detail: Any) -> JSONResponse:
    return JSONResponse({"detail": detail}, status)


def top_nodes(counts: list[tuple[str, int]], limit: int = 20) -> dict[str, Any]:
    """Nodes by exclusions (most first), each one's share, and the share of the top three."""
    total = sum(count for _, count in counts)
    top3 = sum(count for _, count in counts[:3])
    return {
        "total": total,
        "nodes": len(counts),
        "top3_share": top3 / total if total else 0.0,
        "leaderboard": [
            {"node": node, "exclusions": count, "share": count / total}
            for node, count in counts[:limit]
        ],
    }


@dataclass(frozen=True, slots=True)
class Access:
    """Who may write and who may read (see ``create_app``)."""

    token: str | None = None
    read_token: str | None = None
    allow_unauthenticated_writes: bool = False

    def write_refusal(self, request: Request) -> tuple[str, JSONResponse] | None:
        """None when the request may write, else the rejection reason and the answer."""
        if self.token:
            if _matches(_bearer(request), [self.token.encode()]):
                return None
            return "unauthorized", JSONResponse(
                {"detail": "this ledger requires 'Authorization: Bearer <token>' for writes"},
                401,
                headers={"WWW-Authenticate": "Bearer"},
            )
        if self.allow_unauthenticated_writes or _loopback(request):
            return None
        return "not_loopback", _problem(
            403,
            "this ledger has no write token, so it accepts writes only from loopback; start it "
            "with --token-file (or --token) and send 'Authorization: Bearer <token>', or with "
            "--allow-unauthenticated-writes to accept writes from anyone",
        )

    def may_read(self, request: Request) -> bool:
        tokens = [t.encode() for t in (self.token, self.read_token) if t]
        return not tokens or _matches(_bearer(request), tokens)


def _loopback(request: Request) -> bool:
    if request.client is None:  # a Unix socket: only this machine can reach it
        return True
    try:
        address = ipaddress.ip_address(request.client.host)
    except ValueError:
        return False
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    return address.is_loopback


def _bearer(request: Request) -> bytes:
    scheme, _, credentials = request.headers.get("authorization", "").partition(" ")
    return credentials.strip().encode() if scheme.lower() == "bearer" else b""


def _matches(presented: bytes, tokens: list[bytes]) -> bool:
    # every token is compared (no early exit), each in constant time
    return bool(presented) and sum(hmac.compare_digest(presented, t) for t in tokens) > 0


def _invalid(error: ValidationError) -> JSONResponse:
    return _problem(
        422,
        [
            {
                "field": ".".join(str(part) for part in item["loc"]) or "body",
                "message": item["msg"],
            }
            for item in error.errors(include_url=False)[:10]
        ],
    )


async def _write(
    request: Request,
    model: type[ModelT],
    submit: Callable[[str, ModelT], Future[Stored]],
    access: Access,
) -> tuple[str | None, Response]:
    """Check, parse and store one write; returns the rejection reason (if any) and the answer."""
    refusal = access.write_refusal(request)
    if refusal is not None:
        return refusal
    key = request.headers.get("idempotency-key", "")
    if not _KEY.match(key):
        return "bad_key", _problem(
            400,
            "an Idempotency-Key header of 8 to 128 characters [A-Za-z0-9._:-] is required, "
            "so that a retried request is not counted twice",
        )
    body = b""
    async for chunk in request.stream():
        body += chunk
        if len(body) > MAX_BODY_BYTES:
            return "too_large", _problem(413, f"the body exceeds {MAX_BODY_BYTES} bytes")
    try:
        event = model.model_validate_json(body)
    except ValidationError as error:
        return "invalid", _invalid(error)
    try:
        # The writer thread commits (and fsyncs); the event loop only waits for the answer.
        stored = await asyncio.wrap_future(submit(key, event))
    except LedgerConflictError as conflict:
        return "conflict", _problem(409, str(conflict))
    except LedgerCapError as cap:
        return cap.reason, _problem(429, str(cap))
    except LedgerUnavailableError as error:
        return "unavailable", _problem(
            503, f"nothing was stored ({error}); retry with the same key"
        )
    headers = {"Idempotent-Replayed": "true"} if stored.replayed else None
    return None, JSONResponse(stored.body, stored.status, headers=headers)


def _add_writes(app: FastAPI, store: LedgerStore, access: Access, rejections: Rejections) -> None:
    def route(
        path: str,
        model: type[ModelT],
        submit: Callable[[str, ModelT], Future[Stored]],
        summary: str,
    ) -> None:
        async def endpoint(request: Request) -> Response:
            reason, response = await _write(request, model, submit, access)
            if reason is not None:
                rejections.add(reason)
            return response

        app.add_api_route(
            path,
            endpoint,
            methods=["POST"],
            summary=summary,
            openapi_extra={
                "requestBody": {
                    "required": True,
                    "content": {"application/json": {"schema": model.model_json_schema()}},
                }
            },
        )

    route("/v1/exclusions", ExclusionIn, store.submit_exclusion, "Record that a node was excluded")
    route(
        "/v1/releases", ReleaseIn, store.submit_release, "Record that a node went back into service"
    )
    route("/v1/attempts", AttemptEventIn, store.submit_attempt_event, "Record a job attempt event")


def _paged(request: Request, fetch: Callable[[], Page]) -> Response:
    """One page as a JSON list; a ``Link: <...>; rel="next"`` header when more follow."""
    try:
        page = fetch()
    except CursorError as error:
        raise HTTPException(400, str(error)) from None
    headers = {}
    if page.next_cursor is not None:
        following = request.url.include_query_params(cursor=page.next_cursor)
        headers["Link"] = f'<{following.path}?{following.query}>; rel="next"'
    return JSONResponse(page.rows, headers=headers)


Limit = Annotated[int, Query(ge=1, le=PAGE_MAX, description="rows per page")]
Cursor = Annotated[str | None, Query(description="from the previous page's Link header")]


def _add_reads(app: APIRouter, store: LedgerStore, clock: Callable[[], float]) -> None:
    @app.get("/v1/exclusions")
    def list_exclusions(
        request: Request,
        *,
        node: str | None = None,
        since: Annotated[float | None, Query(description="Unix time")] = None,
        until: Annotated[float | None, Query(description="Unix time")] = None,
        limit: Limit = PAGE_DEFAULT,
        cursor: Cursor = None,
    ) -> Response:
        return _paged(request, lambda: store.exclusions_page(node, since, until, limit, cursor))

    @app.get("/v1/exclusions/top")
    def exclusions_top(days: float = Query(30.0, gt=0, le=3650)) -> dict[str, Any]:
        return top_nodes(store.exclusions_by_node(since=clock() - days * 86400))

    @app.get("/v1/excluded")
    def excluded() -> list[dict[str, Any]]:
        return store.excluded_now()

    @app.get("/v1/attempts")
    def list_attempts(
        request: Request,
        training_job: str | None = None,
        limit: Limit = PAGE_DEFAULT,
        cursor: Cursor = None,
    ) -> Response:
        return _paged(request, lambda: store.attempts_page(training_job, limit, cursor))

    @app.get("/v1/chains")
    def chains(training_job: str | None = None) -> dict[str, Any]:
        result = {}
        for job, history in histories(store.attempts(training_job), clock()).items():
            result[job] = {
                "chains": [
                    {
                        "started_at": c.started_at,
                        "attempts": c.attempts,
                        "failed_attempts": c.failed_attempts,
                        "outcome": c.outcome or "open",
                        "ended_at": c.ended_at,
                    }
                    for c in history.chains
                ],
                "recoveries": [
                    {
                        "failed_attempt": r.failed_attempt,
                        "next_attempt": r.next_attempt,
                        "trigger": r.trigger,
                        "downtime_s": r.downtime_s,
                    }
                    for r in history.recoveries
                ],
            }
        return result


def create_app(
    store: LedgerStore,
    token: str | None = None,
    clock: Callable[[], float] = time.time,
    *,
    read_token: str | None = None,
    allow_unauthenticated_writes: bool = False,
) -> FastAPI:
    """The ledger's API over ``store``.

    Writes need ``token`` when one is set; without one they are accepted only
    from loopback unless ``allow_unauthenticated_writes``. Reads under ``/v1``
    need ``token`` or ``read_token`` as soon as either is set, and are open
    when neither is. ``/metrics``, ``/healthz`` and ``/readyz`` stay open for
    Prometheus and the kubelet: they carry counts, never notes.
    """
    access = Access(token, read_token, allow_unauthenticated_writes)
    rejections = Rejections()
    registry = CollectorRegistry(auto_describe=False)
    registry.register(LedgerCollector(store, rejections))
    app = FastAPI(title="gpufleet fleet ledger", version=__version__, redoc_url=None)

    def require_read(request: Request) -> None:
        if not access.may_read(request):
            raise HTTPException(
                401,
                "this ledger requires 'Authorization: Bearer <token>' for reads (the write "
                "token or the read token)",
                headers={"WWW-Authenticate": "Bearer"},
            )

    _add_writes(app, store, access, rejections)
    reads = APIRouter(dependencies=[Depends(require_read)])
    _add_reads(reads, store, clock)
    app.include_router(reads)

    @app.get("/healthz")
    def healthz() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/readyz")
    def readyz() -> dict[str, Any]:
        return {"status": "ready", "schema_version": store.schema_version}

    @app.get("/metrics", include_in_schema=False)
    def metrics() -> Response:
        return Response(generate_latest(registry), media_type=CONTENT_TYPE)

    return app
