"""A small client for the ledger's API (the CLI and the simulator use it)."""

from __future__ import annotations

import json
import os
import re
import time
import urllib.error
import urllib.parse
import urllib.request
import uuid
from typing import Any

from gpufleet.secrets import SecretFileError, read_secret_file

DEFAULT_URL = "http://127.0.0.1:9406"
_NEXT = re.compile(r'<([^>]*)>\s*;\s*rel="next"')


def token_from_file(path: str) -> str:
    """The token in ``path`` (a mounted Secret), without the trailing newline editors add."""
    try:
        return read_secret_file(path)
    except SecretFileError as error:
        raise LedgerError(f"the token file: {error}") from None


def default_token() -> str | None:
    """$GPUFLEET_FLEET_TOKEN, else the file named by $GPUFLEET_FLEET_TOKEN_FILE, else none."""
    if os.environ.get("GPUFLEET_FLEET_TOKEN"):
        return os.environ["GPUFLEET_FLEET_TOKEN"]
    path = os.environ.get("GPUFLEET_FLEET_TOKEN_FILE")
    return token_from_file(path) if path else None


class LedgerError(RuntimeError):
    """The ledger refused a request or could not be reached; the message says which."""

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


class LedgerClient:
    def __init__(
        self, url: str | None = None, token: str | None = None, timeout: float = 10.0
    ) -> None:
        self.url = (url or os.environ.get("GPUFLEET_FLEET_URL") or DEFAULT_URL).rstrip("/")
        self.token = token if token is not None else default_token()
        self.timeout = timeout

    def _request(
        self, method: str, path: str, payload: dict[str, Any] | None = None, key: str | None = None
    ) -> Any:
        return self._exchange(method, path, payload, key)[0]

    def _exchange(
        self, method: str, path: str, payload: dict[str, Any] | None = None, key: str | None = None
    ) -> tuple[Any, str | None, bool]:
        """The decoded answer, the path of the next page if the answer has one, and whether
        the ledger replayed an earlier answer to the same Idempotency-Key."""
        headers = {"Content-Type": "application/json"}
        if self.token:
            headers["Authorization"] = f"Bearer {self.token}"
        if key:
            headers["Idempotency-Key"] = key
        data = json.dumps(payload).encode() if payload is not None else None
        request = urllib.request.Request(  # noqa: S310 - the ledger's own URL
            self.url + path, data=data, headers=headers, method=method
        )
        try:
            with urllib.request.urlopen(request, timeout=self.timeout) as response:  # noqa: S310
                following = _NEXT.search(response.headers.get("Link") or "")
                return (
                    json.loads(response.read() or b"null"),
                    following.group(1) if following else None,
                    response.headers.get("Idempotent-Replayed") == "true",
                )
        except urllib.error.HTTPError as error:
            body = error.read().decode(errors="replace")
            try:
                detail = json.loads(body).get("detail", body)
            except (ValueError, AttributeError):
                detail = body
            raise LedgerError(f"the ledger answered {error.code}: {detail}", error.code) from None
        except (urllib.error.URLError, OSError) as error:
            raise LedgerError(f"cannot reach the ledger at {self.url}: {error}") from None

    def post(
        self, path: str, payload: dict[str, Any], key: str | None = None, retries: int = 3
    ) -> Any:
        """POST with an idempotency key, retrying transport failures with the same key."""
        key = key or uuid.uuid4().hex
        for attempt in range(retries + 1):
            try:
                return self._request("POST", path, payload, key)
            except LedgerError as error:
                if error.status is not None or attempt == retries:
                    raise
                time.sleep(0.5 * 2**attempt)
        raise AssertionError("unreachable")

    def post_once(self, path: str, payload: dict[str, Any], key: str) -> bool:
        """One POST, not retried; True when the ledger replayed its earlier answer to
        ``key`` (the write was already stored). Raises LedgerError."""
        return self._exchange("POST", path, payload, key)[2]

    def get(self, path: str, **params: Any) -> Any:
        """One GET; a list endpoint answers its first page only (see ``get_all``)."""
        query = urllib.parse.urlencode({k: v for k, v in params.items() if v is not None})
        return self._request("GET", f"{path}?{query}" if query else path)

    def get_all(self, path: str, **params: Any) -> list[Any]:
        """Every row of a paged list (``/v1/exclusions``, ``/v1/attempts``), page after page."""
        query = urllib.parse.urlencode({k: v for k, v in params.items() if v is not None})
        following: str | None = f"{path}?{query}" if query else path
        rows: list[Any] = []
        while following is not None:
            page, following, _ = self._exchange("GET", following)
            rows += page
        return rows

    def exclude(self, node: str, reason: str, key: str | None = None, **fields: Any) -> Any:
        return self.post("/v1/exclusions", {"node": node, "reason": reason, **fields}, key)

    def release(self, node: str, key: str | None = None, **fields: Any) -> Any:
        return self.post("/v1/releases", {"node": node, **fields}, key)

    def attempt(self, training_job: str, attempt: int, event: str, key: str | None = None,
                **fields: Any) -> Any:  # fmt: skip
        payload = {"training_job": training_job, "attempt": attempt, "event": event, **fields}
        return self.post("/v1/attempts", payload, key)
