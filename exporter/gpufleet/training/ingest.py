"""The ingest API: ``POST /v1/steps``, ``POST /v1/checkpoints`` and ``POST /v1/finished``.

Bodies are read with a size limit and validated by pydantic straight from the
raw JSON (no intermediate Python objects), which is what makes tens of
thousands of events per second possible on one core. Every refusal is a 4xx
with a message naming what was wrong, and is counted in
``gpufleet_ingest_rejected_total{reason}``.
"""

from __future__ import annotations

import hmac
from collections.abc import Callable
from typing import Any, TypeVar

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ValidationError

from gpufleet.training.aggregate import CapExceededError, TrainingAggregator
from gpufleet.training.models import CheckpointBatch, FinishedBatch, StepBatch

BatchT = TypeVar("BatchT", StepBatch, CheckpointBatch, FinishedBatch)
_MAX_ERRORS_SHOWN = 10


class IngestRejectedError(Exception):
    def __init__(self, status: int, reason: str, detail: Any, events: int = 1) -> None:
        super().__init__(str(detail))
        self.status = status
        self.reason = reason
        self.detail = detail
        self.events = events


def _describe(error: ValidationError) -> list[dict[str, Any]]:
    described = []
    for item in error.errors(include_url=False, include_context=False)[:_MAX_ERRORS_SHOWN]:
        location = ".".join(str(part) for part in item["loc"]) or "body"
        entry: dict[str, Any] = {"field": location, "message": item["msg"]}
        if item["type"] != "json_invalid" and "input" in item:
            shown = repr(item["input"])
            entry["got"] = shown if len(shown) <= 80 else shown[:77] + "..."
        described.append(entry)
    return described


def _event_count(raw: bytes) -> int:
    # For the rejected counter only: how many events a rejected body claimed to hold.
    return max(1, raw.count(b'"training_job"'))


class IngestApi:
    def __init__(self, aggregator: TrainingAggregator, token: str | None = None) -> None:
        self.aggregator = aggregator
        self._token = token.encode() if token else None

    def router(self) -> APIRouter:
        router = APIRouter(prefix="/v1", tags=["ingest"])
        add = self.aggregator
        self._route(
            router,
            "/steps",
            StepBatch,
            add.add_steps,
            summary="Record a batch of training steps",
            description="Body: `StepBatch` (see the schema). Accepted whole or rejected whole.",
        )
        self._route(
            router,
            "/checkpoints",
            CheckpointBatch,
            add.add_checkpoints,
            summary="Record checkpoint operations (begin / end)",
            description="Body: `CheckpointBatch`. Accepted whole or rejected whole.",
        )
        self._route(
            router,
            "/finished",
            FinishedBatch,
            add.add_finished,
            summary="Record that ranks finished training",
            description="Body: `FinishedBatch`. Sent by the client when it closes, so that "
            "a job that ended is not reported as hung.",
        )
        return router

    def _route(
        self,
        router: APIRouter,
        path: str,
        model: type[BatchT],
        add: Callable[[BatchT], None],
        *,
        summary: str,
        description: str,
    ) -> None:
        async def endpoint(request: Request) -> JSONResponse:
            return await self._ingest(request, model, add)

        router.add_api_route(
            path,
            endpoint,
            methods=["POST"],
            status_code=202,
            summary=summary,
            description=description,
            openapi_extra=_body_schema(model),
        )

    async def _ingest(
        self, request: Request, model: type[BatchT], add: Callable[[BatchT], None]
    ) -> JSONResponse:
        try:
            self._authorize(request)
            raw = await self._read_body(request)
            batch = self._parse(raw, model)
            add(batch)
        except IngestRejectedError as rejected:
            self.aggregator.reject(rejected.reason, rejected.events)
            headers = {"WWW-Authenticate": "Bearer"} if rejected.status == 401 else None
            return JSONResponse({"detail": rejected.detail}, rejected.status, headers=headers)
        except CapExceededError as capped:
            return JSONResponse(
                {"detail": str(capped), "reason": capped.reason},
                429,
                headers={"Retry-After": str(int(self.aggregator.limits.job_ttl_s))},
            )
        return JSONResponse({"accepted": len(batch.events)}, 202)

    def _authorize(self, request: Request) -> None:
        if self._token is None:
            return
        header = request.headers.get("authorization", "")
        scheme, _, credentials = header.partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(
            credentials.strip().encode(), self._token
        ):
            raise IngestRejectedError(
                401,
                "unauthorized",
                "this agent requires 'Authorization: Bearer <token>' "
                "(the value of GPUFLEET_INGEST_TOKEN)",
            )

    async def _read_body(self, request: Request) -> bytes:
        limit = self.aggregator.limits.max_body_bytes
        declared = request.headers.get("content-length")
        too_large = f"the request body exceeds {limit} bytes; send smaller batches"
        if declared is not None and declared.isdigit() and int(declared) > limit:
            raise IngestRejectedError(413, "body_too_large", too_large)
        chunks, size = [], 0
        async for chunk in request.stream():
            size += len(chunk)
            if size > limit:
                raise IngestRejectedError(413, "body_too_large", too_large)
            chunks.append(chunk)
        return b"".join(chunks)

    def _parse(self, raw: bytes, model: type[BatchT]) -> BatchT:
        if not raw.strip():
            raise IngestRejectedError(
                422, "invalid", [{"field": "body", "message": "the body is empty"}]
            )
        try:
            batch = model.model_validate_json(raw)
        except ValidationError as error:
            raise IngestRejectedError(422, "invalid", _describe(error), _event_count(raw)) from None
        limit = self.aggregator.limits.max_batch_events
        if len(batch.events) > limit:
            raise IngestRejectedError(
                413,
                "batch_too_large",
                f"the batch holds {len(batch.events)} events; at most {limit} are accepted "
                "per request",
                len(batch.events),
            )
        return batch


def _body_schema(model: type[BaseModel]) -> dict[str, Any]:
    """The batch's JSON schema, inlined, for the OpenAPI document (the body is parsed by hand)."""
    schema = model.model_json_schema()
    definitions = schema.pop("$defs", {})

    def inline(node: Any) -> Any:
        if isinstance(node, dict):
            reference = node.get("$ref", "")
            if reference.startswith("#/$defs/"):
                return inline(definitions[reference.removeprefix("#/$defs/")])
            return {key: inline(value) for key, value in node.items()}
        if isinstance(node, list):
            return [inline(item) for item in node]
        return node

    return {
        "requestBody": {
            "required": True,
            "content": {"application/json": {"schema": inline(schema)}},
        }
    }
