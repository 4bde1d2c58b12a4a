"""The HTTP layer the agent's training ingest and the fleet ledger share.

Who may write: holders of the bearer token when the service has one (compared
in constant time), else loopback clients only, unless the operator allowed
anyone explicitly. Bodies are read under a size limit (the declared length is
checked before a byte is read), parsed once by the standard JSON parser, which
refuses duplicate keys (the last one would silently win otherwise), and every
refusal is a 4xx whose ``detail`` names what was wrong; a 422 lists the fields
(``[{"field", "message", "got"}]``). ``serve()`` runs an app under uvicorn.

Needs the ``agent`` extra (fastapi / starlette, uvicorn).
"""

from __future__ import annotations

import hmac
import ipaddress
import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from fastapi import Request
from fastapi.responses import JSONResponse
from pydantic import ValidationError

MAX_ERRORS_SHOWN = 10
UNAUTHORIZED_HEADERS = {"WWW-Authenticate": "Bearer"}


class Refusal(Exception):
    """A refused request: a 4xx, or a 503 when nothing could be done. ``reason`` is the label
    it is counted under, ``count`` how many items it refused (a batch's events)."""

    def __init__(
        self,
        status: int,
        reason: str,
        detail: Any,
        *,
        count: int = 1,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(str(detail))
        self.status = status
        self.reason = reason
        self.detail = detail
        self.count = count
        self.headers = headers
        self.extra: dict[str, Any] = {}  # more top-level fields of the answer

    def response(self) -> JSONResponse:
        return JSONResponse({"detail": self.detail, **self.extra}, self.status, self.headers)


def problem(status: int, detail: Any, headers: dict[str, str] | None = None) -> JSONResponse:
    """The answer to a refused request: ``{"detail": ...}``."""
    return JSONResponse({"detail": detail}, status, headers)


def client_host(request: Request) -> str | None:
    return request.client.host if request.client else None


def is_loopback(request: Request) -> bool:
    """Whether the TCP peer is this machine (never what a forwarding header claims)."""
    if request.client is None:  # a Unix socket: only this machine can reach it
        return True
    try:
        address = ipaddress.ip_address(request.client.host)
    except ValueError:
        return False
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return address.ipv4_mapped.is_loopback  # ::ffff:127.0.0.1 on a dual-stack listener
    return address.is_loopback


def bearer(request: Request) -> bytes:
    """The credentials of an ``Authorization: Bearer`` header (empty without one)."""
    scheme, _, credentials = request.headers.get("authorization", "").partition(" ")
    return credentials.strip().encode() if scheme.lower() == "bearer" else b""


def token_matches(presented: bytes, tokens: Sequence[bytes]) -> bool:
    """Whether ``presented`` is one of ``tokens``; every token is compared (no early exit),
    each in constant time, so the answer's timing says nothing about the tokens."""
    return bool(presented) and sum(hmac.compare_digest(presented, t) for t in tokens) > 0


@dataclass(frozen=True, slots=True)
class WriteGuard:
    """Who may write: holders of ``token`` when there is one; without one, loopback clients,
    or anyone when ``allow_unauthenticated``. The messages tell the client (401) or the
    operator (403, ``{host}`` is the client's address) how to get through."""

    token: str | None
    allow_unauthenticated: bool
    unauthorized_detail: str
    loopback_only_detail: str
    loopback_reason: str  # what a 403 is counted under

    def check(self, request: Request) -> None:
        """Raise a :class:`Refusal` unless ``request`` may write."""
        if self.token:
            if token_matches(bearer(request), [self.token.encode()]):
                return
            headers = dict(UNAUTHORIZED_HEADERS)
            raise Refusal(401, "unauthorized", self.unauthorized_detail, headers=headers)
        if self.allow_unauthenticated or is_loopback(request):
            return
        raise Refusal(
            403, self.loopback_reason, self.loopback_only_detail.format(host=client_host(request))
        )


async def read_body(request: Request, limit: int, *, reason: str, advice: str = "") -> bytes:
    """The request body, refused with a 413 (counted under ``reason``) beyond ``limit``
    bytes: by its declared length before anything is read, else as soon as it passes."""
    too_large = Refusal(413, reason, f"the request body exceeds {limit} bytes{advice}")
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise too_large
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise too_large
        chunks.append(chunk)
    return b"".join(chunks)


class _DuplicateKeyError(ValueError):
    def __init__(self, key: str) -> None:
        super().__init__(f"the key {key!r} appears twice in one JSON object")


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    result = dict(pairs)
    if len(result) != len(pairs):
        seen: set[str] = set()
        for key, _ in pairs:
            if key in seen:
                raise _DuplicateKeyError(key)
            seen.add(key)
    return result


def _body_error(message: str) -> Refusal:
    return Refusal(422, "invalid", [{"field": "body", "message": message}])


def parse_json(raw: bytes) -> Any:
    """The JSON document in ``raw``; a 422 naming the problem when there is none, when it
    is not JSON, when a key appears twice in one object, or when it nests too deeply."""
    if not raw.strip():
        raise _body_error("the body is empty")
    try:
        return json.loads(raw, object_pairs_hook=_unique_keys)
    except _DuplicateKeyError as error:
        raise _body_error(str(error)) from None
    except ValueError as error:  # JSONDecodeError, UnicodeDecodeError
        raise _body_error(f"not valid JSON: {error}") from None
    except RecursionError:
        raise _body_error("the JSON is nested too deeply") from None


def describe(error: ValidationError) -> list[dict[str, Any]]:
    """The first errors of a validation, each as the field, the message and what was sent."""
    described = []
    for item in error.errors(include_url=False, include_context=False)[:MAX_ERRORS_SHOWN]:
        location = ".".join(str(part) for part in item["loc"]) or "body"
        entry: dict[str, Any] = {"field": location, "message": item["msg"]}
        if "input" in item:
            shown = repr(item["input"])
            entry["got"] = shown if len(shown) <= 80 else shown[:77] + "..."
        described.append(entry)
    return described


def invalid(error: ValidationError, count: int = 1) -> Refusal:
    """The 422 for a body that is JSON but not what the endpoint accepts."""
    return Refusal(422, "invalid", describe(error), count=count)


def serve(app: Any, host: str, port: int, log_level: str = "info") -> None:
    """Run an ASGI app under uvicorn until SIGINT/SIGTERM."""
    import uvicorn

    config = uvicorn.Config(
        app,
        host=host,
        port=port,
        log_level=log_level,
        access_log=False,
        http="httptools",
        loop="asyncio",
        lifespan="on",
        timeout_graceful_shutdown=5,
    )
    uvicorn.Server(config).run()
