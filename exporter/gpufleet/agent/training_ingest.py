"""The ingest API: ``POST /v1/steps``, ``POST /v1/checkpoints``, ``POST /v1/finished``,
``POST /v1/layout`` (ranks' parallel groups) and ``POST /v1/attempts`` (job attempt
events, relayed to the fleet ledger).

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

from collections.abc import Callable
from typing import Any, TypeVar

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ValidationError
from starlette.requests import ClientDisconnect

from gpufleet import web
from gpufleet.agent.ledger_forward import AttemptRelay
from gpufleet.agent.training_aggregate import CapExceededError, TrainingAggregator
from gpufleet.agent.training_events import (
    AttemptBatch,
    CheckpointBatch,
    FinishedBatch,
    LayoutBatch,
    StepBatch,
)
from gpufleet.agent.training_pods import TrainingPods
from gpufleet.reporter.wire import (
    ATTEMPTS_PATH,
    CHECKPOINTS_PATH,
    FINISHED_PATH,
    LAYOUT_PATH,
    STEPS_PATH,
)

BatchT = TypeVar("BatchT", StepBatch, CheckpointBatch, FinishedBatch, AttemptBatch, LayoutBatch)


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


class IngestApi:
    def __init__(
        self,
        aggregator: TrainingAggregator,
        token: str | None = None,
        *,
        allow_unauthenticated: bool = False,
        attempts: AttemptRelay | None = None,
        pods: TrainingPods | None = None,
    ) -> None:
        self.aggregator = aggregator
        self.attempts = attempts if attempts is not None else AttemptRelay()
        self._pods = pods  # the pod a client names in its headers runs its training job
        self._guard = web.WriteGuard(
            token,
            allow_unauthenticated,
            unauthorized_detail=(
                "this agent requires 'Authorization: Bearer <token>' (the client reads it "
                "from GPUFLEET_INGEST_TOKEN or GPUFLEET_INGEST_TOKEN_FILE)"
            ),
            loopback_only_detail=(
                "this agent has no ingest token, so it accepts training events only from "
                "loopback (this request came from {host}). Give the agent a token "
                "(--ingest-token-file, GPUFLEET_INGEST_TOKEN_FILE or GPUFLEET_INGEST_TOKEN) "
                "and the clients the same GPUFLEET_INGEST_TOKEN, or start the agent with "
                "--allow-unauthenticated-ingest."
            ),
            loopback_reason="unauthenticated",
        )
        self._max_concurrent = aggregator.limits.max_concurrent_requests
        self._busy = 0  # requests being read or parsed (all on the event loop: no lock)

    def router(self) -> APIRouter:
        router = APIRouter(prefix="/v1", tags=["ingest"])
        add = self.aggregator
        self._route(
            router,
            STEPS_PATH.removeprefix("/v1"),
            StepBatch,
            add.add_steps,
            summary="Record a batch of training steps",
            description="Body: `StepBatch` (see the schema). Accepted whole or rejected whole; "
            "a 422 lists the indices of the refused events in `refused`.",
        )
        self._route(
            router,
            CHECKPOINTS_PATH.removeprefix("/v1"),
            CheckpointBatch,
            add.add_checkpoints,
            summary="Record checkpoint operations (begin / end)",
            description="Body: `CheckpointBatch`. Accepted whole or rejected whole.",
        )
        self._route(
            router,
            FINISHED_PATH.removeprefix("/v1"),
            FinishedBatch,
            add.add_finished,
            summary="Record that ranks finished training",
            description="Body: `FinishedBatch`. Sent by the client when it closes, so that "
            "a job that ended is not reported as hung.",
        )
        self._route(
            router,
            LAYOUT_PATH.removeprefix("/v1"),
            LayoutBatch,
            add.add_layout,
            summary="Record ranks' parallel layouts (tp, pp, dp... groups)",
            description="Body: `LayoutBatch`. Sent by the client once per attempt; exported as "
            "gpufleet_training_parallel_group_size, one series per rank and group.",
        )
        attempts = self.attempts
        self._route(
            router,
            ATTEMPTS_PATH.removeprefix("/v1"),
            AttemptBatch,
            lambda batch: attempts.submit(batch.events),
            summary="Record job attempt events (relayed to the fleet ledger)",
            description="Body: `AttemptBatch`. Queued and written to the ledger given by "
            "--ledger-url, each once (its Idempotency-Key comes from the event); accepted and "
            "counted as unforwarded when the agent has no ledger.",
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
            self._guard.check(request)
            raw = await web.read_body(
                request,
                self.aggregator.limits.max_body_bytes,
                reason="body_too_large",
                advice="; send smaller batches",
            )
            batch = self._parse(raw, model)
            add(batch)
            if self._pods is not None:
                self._pods.note(request.headers, batch.events)
        except web.Refusal as refusal:
            self.aggregator.reject(refusal.reason, refusal.count)
            return refusal.response()
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

    def _parse(self, raw: bytes, model: type[BatchT]) -> BatchT:
        document = web.parse_json(raw)
        events = document.get("events") if isinstance(document, dict) else None
        parsed = len(events) if isinstance(events, list) else 1
        limit = self.aggregator.limits.max_batch_events
        if parsed > limit:
            raise web.Refusal(
                413,
                "batch_too_large",
                f"the batch holds {parsed} events; at most {limit} are accepted per request",
                count=parsed,
            )
        try:
            return model.model_validate(document)
        except ValidationError as error:
            refusal = web.invalid(error, count=max(1, parsed))
            refusal.extra["refused"] = _refused_indices(error)
            raise refusal from None


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
