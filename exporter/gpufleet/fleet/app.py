"""The fleet ledger's HTTP API (FastAPI): write events, query history, /metrics."""

from __future__ import annotations

import hmac
import re
import time
from collections import Counter
from collections.abc import Callable
from typing import Any, TypeVar

from fastapi import FastAPI, Query, Request
from fastapi.responses import JSONResponse, Response
from prometheus_client import CollectorRegistry, generate_latest
from pydantic import BaseModel, ValidationError

from gpufleet import __version__
from gpufleet.exposition import CONTENT_TYPE
from gpufleet.fleet.chains import histories
from gpufleet.fleet.metrics import LedgerCollector
from gpufleet.fleet.models import AttemptEventIn, ExclusionIn, ReleaseIn
from gpufleet.fleet.store import LedgerConflictError, LedgerStore, Stored

DEFAULT_PORT = 9406
MAX_BODY_BYTES = 64 * 1024
_KEY = re.compile(r"^[A-Za-z0-9._:-]{8,128}$")
ModelT = TypeVar("ModelT", bound=BaseModel)


def _problem(status: int, detail: Any) -> JSONResponse:
    return JSONResponse({"detail": detail}, status)


def top_nodes(rows: list[dict[str, Any]], limit: int = 20) -> dict[str, Any]:
    """Nodes by exclusions, each one's share, and the share of the top three."""
    counts = Counter(row["node"] for row in rows)
    total = sum(counts.values())
    ranked = counts.most_common()
    top3 = sum(count for _, count in ranked[:3])
    return {
        "total": total,
        "nodes": len(counts),
        "top3_share": top3 / total if total else 0.0,
        "leaderboard": [
            {"node": node, "exclusions": count, "share": count / total}
            for node, count in ranked[:limit]
        ],
    }


def create_app(
    store: LedgerStore, token: str | None = None, clock: Callable[[], float] = time.time
) -> FastAPI:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(LedgerCollector(store, clock))
    app = FastAPI(title="gpufleet fleet ledger", version=__version__, redoc_url=None)
    expected = token.encode() if token else None

    async def parsed(
        request: Request, model: type[ModelT], write: Callable[[str, ModelT], Stored]
    ) -> Response:
        if expected is not None:
            scheme, _, credentials = request.headers.get("authorization", "").partition(" ")
            if scheme.lower() != "bearer" or not hmac.compare_digest(
                credentials.strip().encode(), expected
            ):
                return JSONResponse(
                    {"detail": "this ledger requires 'Authorization: Bearer <token>'"},
                    401,
                    headers={"WWW-Authenticate": "Bearer"},
                )
        key = request.headers.get("idempotency-key", "")
        if not _KEY.match(key):
            return _problem(
                400,
                "an Idempotency-Key header of 8 to 128 characters [A-Za-z0-9._:-] is required, "
                "so that a retried request is not counted twice",
            )
        body = b""
        async for chunk in request.stream():
            body += chunk
            if len(body) > MAX_BODY_BYTES:
                return _problem(413, f"the body exceeds {MAX_BODY_BYTES} bytes")
        try:
            event = model.model_validate_json(body)
        except ValidationError as error:
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
        try:
            stored = write(key, event)
        except LedgerConflictError as conflict:
            return _problem(409, str(conflict))
        headers = {"Idempotent-Replayed": "true"} if stored.replayed else None
        return JSONResponse(stored.body, stored.status, headers=headers)

    def route(
        path: str, model: type[ModelT], write: Callable[[str, ModelT], Stored], summary: str
    ) -> None:
        async def endpoint(request: Request) -> Response:
            return await parsed(request, model, write)

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

    route("/v1/exclusions", ExclusionIn, store.exclude, "Record that a node was excluded")
    route("/v1/releases", ReleaseIn, store.release, "Record that a node went back into service")
    route("/v1/attempts", AttemptEventIn, store.attempt_event, "Record a job attempt event")

    @app.get("/v1/exclusions")
    def list_exclusions(
        node: str | None = None,
        since: float | None = Query(None, description="Unix time"),
        until: float | None = Query(None, description="Unix time"),
    ) -> list[dict[str, Any]]:
        return store.exclusions(node, since, until)

    @app.get("/v1/exclusions/top")
    def exclusions_top(days: float = Query(30.0, gt=0, le=3650)) -> dict[str, Any]:
        return top_nodes(store.exclusions(since=clock() - days * 86400))

    @app.get("/v1/excluded")
    def excluded() -> list[dict[str, Any]]:
        return store.excluded_now()

    @app.get("/v1/attempts")
    def list_attempts(training_job: str | None = None) -> list[dict[str, Any]]:
        return store.attempts(training_job)

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
