"""The one client of Prometheus's HTTP API (``/api/v1/...``): instant and range queries,
and the read endpoints (alerts, rules, targets, ...) the dev stack and the tests look at.

Stdlib only (the report, the detection benchmark and the dev stack use it; none needs
more). A request Prometheus refuses raises ``PrometheusError`` naming the endpoint, the
query and Prometheus's own error; one that cannot reach Prometheus (refused connection,
timeout, a non-API answer such as 503 while it starts) raises ``PrometheusUnreachable``,
which pollers treat as "not yet".
"""

from __future__ import annotations

import json
import urllib.error
import urllib.parse
import urllib.request
from typing import Any


class PrometheusError(RuntimeError):
    """Prometheus refused a request (bad query, query too large, ...)."""


class PrometheusUnreachable(PrometheusError):
    """No API answer from Prometheus: not running, not ready, or too slow."""


def _seconds(value: float) -> str:
    # Prometheus keeps millisecond timestamps, so three decimals lose nothing.
    return f"{value:.3f}"


class PrometheusApi:
    """``url`` is Prometheus's base URL (``http://host:9090``)."""

    def __init__(self, url: str, timeout: float = 60.0) -> None:
        self.url = url.rstrip("/")
        self.timeout = timeout

    def get(self, path: str, **params: str) -> Any:
        """The ``data`` of ``GET /api/v1/<path>?<params>`` (``alerts``, ``rules``, ...)."""
        query = urllib.parse.urlencode(params)
        request = urllib.request.Request(f"{self.url}/api/v1/{path}?{query}")  # noqa: S310
        return self._call(request, path, params.get("query"))

    def query(self, expr: str, at: float | None = None) -> list[dict[str, Any]]:
        """The instant vector ``expr`` at ``at`` (default: now): the result list."""
        params = {"query": expr} if at is None else {"query": expr, "time": _seconds(at)}
        return self._post("query", params)

    def query_range(self, expr: str, start: float, end: float, step: float) -> list[dict[str, Any]]:
        """``expr`` every ``step`` seconds over [start, end]: one series per label set."""
        params = {"query": expr, "start": _seconds(start), "end": _seconds(end)}
        return self._post("query_range", {**params, "step": _seconds(step)})

    def _post(self, path: str, params: dict[str, str]) -> list[dict[str, Any]]:
        # POST: inlined rule expressions can outgrow a URL.
        request = urllib.request.Request(  # noqa: S310
            f"{self.url}/api/v1/{path}",
            data=urllib.parse.urlencode(params).encode(),
            headers={"Content-Type": "application/x-www-form-urlencoded"},
        )
        result: list[dict[str, Any]] = self._call(request, path, params["query"])["result"]
        return result

    def _call(self, request: urllib.request.Request, path: str, expr: str | None) -> Any:
        what = f"{path} {expr!r}" if expr is not None else path
        try:
            with urllib.request.urlopen(request, timeout=self.timeout) as response:  # noqa: S310
                payload = json.loads(response.read())
        except urllib.error.HTTPError as error:
            # Refusals come as 400/422 with the API's JSON body; anything else (503 while
            # starting, a proxy's page) is not an answer from the API.
            try:
                payload = json.loads(error.read())
            except ValueError:
                payload = None
            if not isinstance(payload, dict) or "error" not in payload:
                raise PrometheusUnreachable(
                    f"Prometheus at {self.url} did not answer {what}: {error}"
                ) from None
        except (OSError, ValueError) as error:
            raise PrometheusUnreachable(f"cannot query Prometheus at {self.url}: {error}") from None
        if payload.get("status") != "success":
            raise PrometheusError(
                f"Prometheus at {self.url} refused {what}: {payload.get('error')}"
            )
        return payload["data"]
