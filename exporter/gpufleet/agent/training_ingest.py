"""The ingest API: ``POST /v1/steps``, ``POST /v1/checkpoints`` and ``POST /v1/finished``.

Bodies are read with a size limit and a concurrency limit, parsed once by the
standard JSON parser (which also refuses duplicate keys: the last one would
silently win otherwise) and validated strictly by pydantic. Every refusal is a
4xx (or a 503 when busy) with a message naming what was wrong, and is counted in
``gpufleet_ingest_rejected_total{reason}``: the events of a batch that could be
parsed, else the request (never a figure guessed from the raw bytes).

A 422 lists the index of every refused event (``refused``), so a client can
resend the rest: one bad event never costs its neighbours.

Writes are authorised by a bearer token when the agent has one; without one,
only loopback clients may write unless the operator allowed unauthenticated
ingest explicitly.
"""

from __future__ import annotations

import hmac
import ipaddress
import json
from collections.abc import Callable
from typing import Any, TypeVar

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ValidationError
from starlette.requests import ClientDisconnect

from gpufleet.agent.training_aggregate import CapExceededError, TrainingAggregator
from gpufleet.agent.training_events import CheckpointBatch, FinishedBatch, StepBatch

BatchT = TypeVar("BatchT", StepBatch, CheckpointBatch, FinishedBatch)
_MAX_ERRORS_SHOWN = 10


class IngestRejectedError(Exception):
    def __init__(self, status: int, reason: str, detail: Any, events: int = 1) -> None:
        super().__init__(str(detail))
        self.status = status
        self.reason = reason
        self.detail = detail
        self.events = events
        self.extra: dict[str, Any] = {}
        self.headers: dict[str, str] | None = None


class DuplicateKeyError(ValueError):
    def __init__(self, key: str) -> None:
        super().__init__(f"the key {key!r} appears twice in one JSON object")


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    result = dict(pairs)
    if len(result) != len(pairs):
        seen: set[str] = set()
        for key, _ in pairs:
            if key in seen:
                raise DuplicateKeyError(key)
            seen.add(key)
    return result


def _describe(error: ValidationError) -> list[dict[str, Any]]:
    described = []
    for item in error.errors(include_url=False, include_context=False)[:_MAX_ERRORS_SHOWN]:
        location = ".".join(str(part) for part in item["loc"]) or "body"
        entry: dict[str, Any] = {"field": location, "message": item["msg"]}
        if "input" in item:
            shown = repr(item["input"])
            entry["got"] = shown if len(shown) <= 80 else shown[:77] + "..."
        described.append(entry)
    return described


def _refused_indices(error: ValidationError) -> list[int]:
    return sorted(
        {
            location[1]
            for item in error.errors(include_url=False, include_context=False)
            if len(location := item["loc"]) >= 2
            and location[0] == "events"
            and isinstance(location[1], int)
        }
    )


def _is_loopback(host: str | None) -> bool:
    if host is None:
        return False
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return False
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return address.ipv4_mapped.is_loopback  # ::ffff:127.0.0.1 on a dual-stack listener
    return address.is_loopback


class IngestApi:
    def __init__(
        self,
        aggregator: TrainingAggregator,
        token: str | None = None,
        *,
        allow_unauthenticated: bool = False,
    ) -> None:
        self.aggregator = aggregator
        self._token = token.encode() if token else None
        self._allow_unauthenticated = allow_unauthenticated
        self._max_concurrent = aggregator.limits.max_concurrent_requests
        self._busy = 0  # requests being read or parsed (all on the event loop: no lock)

    def router(self) -> APIRouter:
        router = APIRouter(prefix="/v1", tags=["ingest"])
        add = self.aggregator
        self._route(
            router,
            "/steps",
            StepBatch,
            add.add_steps,
            summary="Record a batch of training steps",
            description="Body: `StepBatch` (see the schema). Accepted whole or rejected whole; "
            "a 422 lists the indices of the refused events in `refused`.",
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
        if self._busy >= self._max_concurrent:
            self.aggregator.reject("busy", 1)
            return JSONResponse(
                {"detail": f"{self._busy} ingest requests are in progress; retry shortly"},
                503,
                headers={"Retry-After": "1"},
            )
        self._busy += 1
        try:
            self._authorize(request)
            raw = await self._read_body(request)
            batch = self._parse(raw, model)
            add(batch)
        except IngestRejectedError as rejected:
            self.aggregator.reject(rejected.reason, rejected.events)
            body = {"detail": rejected.detail, **rejected.extra}
            return JSONResponse(body, rejected.status, headers=rejected.headers)
        except ClientDisconnect:
            # The client went away mid-body (or its body read timed out): nothing to answer.
            self.aggregator.reject("disconnected", 1)
            return JSONResponse({"detail": "the client disconnected"}, 400)
        except CapExceededError as capped:
            return JSONResponse(
                {"detail": str(capped), "reason": capped.reason},
                429,
                headers={"Retry-After": str(int(self.aggregator.limits.job_ttl_s))},
            )
        finally:
            self._busy -= 1
        return JSONResponse({"accepted": len(batch.events)}, 202)

    def _authorize(self, request: Request) -> None:
        if self._token is None:
            host = request.client.host if request.client else None
            if self._allow_unauthenticated or _is_loopback(host):
                return
            raise IngestRejectedError(
                403,
                "unauthenticated",
                f"this agent has no ingest token, so it accepts training events only from "
                f"loopback (this request came from {host}). Give the agent a token "
                "(--ingest-token-file, GPUFLEET_INGEST_TOKEN_FILE or GPUFLEET_INGEST_TOKEN) and "
                "the clients the same GPUFLEET_INGEST_TOKEN, or start the agent with "
                "--allow-unauthenticated-ingest.",
            )
        header = request.headers.get("authorization", "")
        scheme, _, credentials = header.partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(
            credentials.strip().encode(), self._token
        ):
            rejected = IngestRejectedError(
                401,
                "unauthorized",
                "this agent requires 'Authorization: Bearer <token>' "
                "(the client reads it from GPUFLEET_INGEST_TOKEN or GPUFLEET_INGEST_TOKEN_FILE)",
            )
            rejected.headers = {"WWW-Authenticate": "Bearer"}
            raise rejected

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
            document = json.loads(raw, object_pairs_hook=_unique_keys)
        except DuplicateKeyError as error:
            raise IngestRejectedError(
                422, "invalid", [{"field": "body", "message": str(error)}]
            ) from None
        except ValueError as error:  # JSONDecodeError, UnicodeDecodeError
            raise IngestRejectedError(
                422, "invalid", [{"field": "body", "message": f"not valid JSON: {error}"}]
            ) from None
        except RecursionError:
            raise IngestRejectedError(
                422, "invalid", [{"field": "body", "message": "the JSON is nested too deeply"}]
            ) from None
        events = document.get("events") if isinstance(document, dict) else None
        parsed = len(events) if isinstance(events, list) else 1
        limit = self.aggregator.limits.max_batch_events
        if parsed > limit:
            raise IngestRejectedError(
                413,
                "batch_too_large",
                f"the batch holds {parsed} events; at most {limit} are accepted per request",
                parsed,
            )
        try:
            return model.model_validate(document)
        except ValidationError as error:
            rejected = IngestRejectedError(422, "invalid", _describe(error), max(1, parsed))
            rejected.extra["refused"] = _refused_indices(error)
            raise rejected from None


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
