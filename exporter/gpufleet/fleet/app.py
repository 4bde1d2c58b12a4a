"""The fleet ledger's HTTP API (FastAPI): write events, query history, /metrics."""

from __future__ import annotations

import asyncio
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

from gpufleet import __version__, web
from gpufleet.exposition import CONTENT_TYPE
from gpufleet.fleet.alertmanager import (
    IgnoredAlerts,
    IncidentPolicy,
    WebhookNotification,
    receive,
)
from gpufleet.fleet.chains import histories
from gpufleet.fleet.errors import CursorError, LedgerConflictError, LedgerUnavailableError
from gpufleet.fleet.incidents import IncidentCollector, IncidentStore
from gpufleet.fleet.metrics import LedgerCollector, Rejections
from gpufleet.fleet.models import AttemptEventIn, ExclusionIn, ReleaseIn
from gpufleet.fleet.paging import Page
from gpufleet.fleet.store import LedgerStore, Stored

MAX_BODY_BYTES = 64 * 1024
PAGE_DEFAULT = 1000  # rows per page of a list, unless the client asks for fewer or more
PAGE_MAX = 10_000
_KEY = re.compile(r"^[A-Za-z0-9._:-]{8,128}$")
ModelT = TypeVar("ModelT", bound=BaseModel)


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

    def writes(self) -> web.WriteGuard:
        return web.WriteGuard(
            self.token,
            self.allow_unauthenticated_writes,
            unauthorized_detail="this ledger requires 'Authorization: Bearer <token>' for writes",
            loopback_only_detail=(
                "this ledger has no write token, so it accepts writes only from loopback (this "
                "request came from {host}); start it with --token-file (or --token) and send "
                "'Authorization: Bearer <token>', or with --allow-unauthenticated-writes to "
                "accept writes from anyone"
            ),
            loopback_reason="not_loopback",
        )

    def may_read(self, request: Request) -> bool:
        tokens = [t.encode() for t in (self.token, self.read_token) if t]
        return not tokens or web.token_matches(web.bearer(request), tokens)


async def _write(
    request: Request,
    model: type[ModelT],
    submit: Callable[[str, ModelT], Future[Stored]],
    writes: web.WriteGuard,
) -> Response:
    """Check, parse and store one write; a :class:`web.Refusal` names what was wrong."""
    writes.check(request)
    key = request.headers.get("idempotency-key", "")
    if not _KEY.match(key):
        raise web.Refusal(
            400,
            "bad_key",
            "an Idempotency-Key header of 8 to 128 characters [A-Za-z0-9._:-] is required, "
            "so that a retried request is not counted twice",
        )
    raw = await web.read_body(request, MAX_BODY_BYTES, reason="too_large")
    web.parse_json(raw)  # refuses what pydantic would let through: a key given twice
    try:
        # validated from the raw JSON (pydantic's JSON mode), as the models are written for
        event = model.model_validate_json(raw)
    except ValidationError as error:
        raise web.invalid(error) from None
    try:
        # The writer thread commits (and fsyncs); the event loop only waits for the answer.
        stored = await asyncio.wrap_future(submit(key, event))
    except LedgerConflictError as conflict:
        raise web.Refusal(409, "conflict", str(conflict)) from None
    except LedgerUnavailableError as error:
        raise web.Refusal(
            503, "unavailable", f"nothing was stored ({error}); retry with the same key"
        ) from None
    headers = {"Idempotent-Replayed": "true"} if stored.replayed else None
    return JSONResponse(stored.body, stored.status, headers=headers)


def _add_writes(app: FastAPI, store: LedgerStore, access: Access, rejections: Rejections) -> None:
    writes = access.writes()

    def route(
        path: str,
        model: type[ModelT],
        submit: Callable[[str, ModelT], Future[Stored]],
        summary: str,
    ) -> None:
        async def endpoint(request: Request) -> Response:
            try:
                return await _write(request, model, submit, writes)
            except web.Refusal as refusal:
                rejections.add(refusal.reason)
                return refusal.response()

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


def _add_webhook(
    app: FastAPI,
    incidents: IncidentStore,
    access: Access,
    rejections: Rejections,
    *,
    policy: IncidentPolicy,
    ignored: IgnoredAlerts,
) -> None:
    writes = access.writes()

    @app.post(
        "/v1/alertmanager",
        summary="Record Alertmanager's pages as incidents (its webhook)",
        openapi_extra={
            "requestBody": {
                "required": True,
                "content": {
                    "application/json": {"schema": WebhookNotification.model_json_schema()}
                },
            }
        },
    )
    async def alertmanager(request: Request) -> Response:
        try:
            return await receive(request, incidents, writes, policy, ignored)
        except web.Refusal as refusal:
            rejections.add(refusal.reason)
            return refusal.response()


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
Since = Annotated[float | None, Query(description="Unix time")]
Window = Annotated[
    float | None,
    Query(
        gt=0,
        le=366 * 86400,
        description="seconds after a page within which an exclusion of its node is its "
        "consequence (default: the ledger's, 24 h)",
    ),
]


def _add_incident_reads(app: APIRouter, incidents: IncidentStore, policy: IncidentPolicy) -> None:
    @app.get("/v1/incidents")
    def list_incidents(
        request: Request,
        *,
        node: str | None = None,
        since: Since = None,
        until: Since = None,
        window: Window = None,
        limit: Limit = PAGE_DEFAULT,
        cursor: Cursor = None,
    ) -> Response:
        """Pages by start, each with the exclusion it led to and how long after."""
        span = window or policy.link_window_s
        return _paged(
            request,
            lambda: incidents.page(
                node, since=since, until=until, limit=limit, cursor=cursor, window=span
            ),
        )

    @app.get("/v1/exclusions/unpaged")
    def unpaged_exclusions(
        request: Request,
        *,
        node: str | None = None,
        since: Since = None,
        until: Since = None,
        window: Window = None,
        limit: Limit = PAGE_DEFAULT,
        cursor: Cursor = None,
    ) -> Response:
        """Exclusions no page led to: nodes that failed silently."""
        span = window or policy.link_window_s
        return _paged(
            request,
            lambda: incidents.unpaged_exclusions_page(
                node, since=since, until=until, limit=limit, cursor=cursor, window=span
            ),
        )


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
                        "restarts_exhausted": c.exhausted_at is not None,
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
    incident_policy: IncidentPolicy | None = None,
) -> FastAPI:
    """The ledger's API over ``store``.

    Writes need ``token`` when one is set; without one they are accepted only
    from loopback unless ``allow_unauthenticated_writes``. Reads under ``/v1``
    need ``token`` or ``read_token`` as soon as either is set, and are open
    when neither is. ``/metrics``, ``/healthz`` and ``/readyz`` stay open for
    Prometheus and the kubelet: they carry counts, never notes. Alertmanager's
    webhook (``/v1/alertmanager``) is a write: it sends the write token as a bearer;
    ``incident_policy`` says which alerts are pages and the link window.
    """
    access = Access(token, read_token, allow_unauthenticated_writes)
    rejections = Rejections()
    registry = CollectorRegistry(auto_describe=False)
    registry.register(LedgerCollector(store, rejections))
    policy = incident_policy or IncidentPolicy()
    incidents = IncidentStore(store)
    ignored = IgnoredAlerts()
    registry.register(IncidentCollector(incidents, ignored.snapshot))
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
    _add_webhook(app, incidents, access, rejections, policy=policy, ignored=ignored)
    reads = APIRouter(dependencies=[Depends(require_read)])
    _add_reads(reads, store, clock)
    _add_incident_reads(reads, incidents, policy)
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
