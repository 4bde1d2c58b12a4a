"""HTTP to the node's agent: one kept-alive connection for the sender thread, a
connection of its own for a call that must not wait on it, and the reading of the
agent's answers. Standard library only."""

from __future__ import annotations

import http.client
import json
import urllib.parse
from collections.abc import Callable, Mapping

Answer = tuple[int, bytes]  # HTTP status and body


class AgentConnection:
    """POSTs to one agent. ``warn(kind, message)`` hears of an unreachable agent."""

    def __init__(
        self,
        url: str,
        headers: Mapping[str, str],
        timeout: float,
        warn: Callable[[str, str], None],
    ) -> None:
        parsed = urllib.parse.urlsplit(url if "//" in url else f"http://{url}")
        self.url = url
        self.host = parsed.hostname or "127.0.0.1"
        self.port = parsed.port or 9405
        self.base_path = parsed.path.rstrip("/")
        self.headers = dict(headers)
        self._timeout = timeout
        self._warn = warn
        self._connection: http.client.HTTPConnection | None = None

    def post(self, path: str, body: bytes) -> Answer | None:
        """POST on the kept-alive connection. None: the agent is unreachable."""
        for attempt in range(2):  # one retry on a stale keep-alive connection
            connection = self._connection
            if connection is None:
                connection = self._connection = http.client.HTTPConnection(
                    self.host, self.port, timeout=self._timeout
                )
            try:
                connection.request("POST", self.base_path + path, body, self.headers)
                response = connection.getresponse()
                return response.status, response.read()
            except (OSError, http.client.HTTPException) as error:
                connection.close()
                self._connection = None
                if attempt == 1 or not isinstance(
                    error, http.client.RemoteDisconnected | BrokenPipeError
                ):
                    self._warn(
                        "unreachable",
                        f"gpufleet agent at {self.url} unreachable ({error}); "
                        "buffering and retrying",
                    )
                    return None
        return None

    def post_on_new_connection(self, path: str, body: bytes, timeout: float) -> Answer | None:
        """POST on a connection of its own, closed after. None: the agent is unreachable."""
        connection = http.client.HTTPConnection(self.host, self.port, timeout=timeout)
        try:
            connection.request("POST", self.base_path + path, body, self.headers)
            response = connection.getresponse()
            return response.status, response.read()
        except (OSError, http.client.HTTPException):
            return None
        finally:
            connection.close()

    def forget(self) -> None:
        """Drop the kept-alive connection without closing it (a forked child's: the
        parent's socket)."""
        self._connection = None

    def close(self) -> None:
        if self._connection is not None:
            self._connection.close()
            self._connection = None


def refused_indices(text: bytes, size: int) -> list[int]:
    """The indices a 422 names in ``refused`` (the agent's answer), within the batch."""
    try:
        refused = json.loads(text).get("refused", [])
    except (ValueError, AttributeError):
        return []
    if not isinstance(refused, list):
        return []
    return sorted({i for i in refused if isinstance(i, int) and 0 <= i < size})


def detail(text: bytes) -> str:
    """The agent's ``detail``, or the start of its answer, short enough to log."""
    try:
        detail = json.loads(text).get("detail", "")
    except (ValueError, AttributeError):
        detail = text[:200].decode("utf-8", "replace")
    shown = json.dumps(detail) if not isinstance(detail, str) else detail
    return shown if len(shown) <= 300 else shown[:297] + "..."
