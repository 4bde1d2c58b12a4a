"""Shared fixtures: fake NVML from recorded fixtures, real Prometheus / Alertmanager,
an ASGI app served for real by uvicorn, and a webhook receiver for alerts."""

from __future__ import annotations

import importlib.util
import json
import sys
import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Protocol, Self, TypeVar

import pytest
import uvicorn

from gpufleet.devstack import AlertmanagerServer, PrometheusServer, free_port, wait_until
from gpufleet.gpu.fake import FakeNvml, bundled_fixture
from gpufleet.rules.__main__ import write_all
from gpufleet.rules.config import RulesConfig

ServerT = TypeVar("ServerT", bound="Server")


@pytest.fixture
def fixture_data() -> dict[str, Any]:
    """The recorded 8x H100 node, fresh (tests may edit it)."""
    return bundled_fixture()


@pytest.fixture
def fake_nvml(fixture_data: dict[str, Any]) -> FakeNvml:
    return FakeNvml(fixture_data)


class Server(Protocol):
    """What the dev stack's servers offer: start (returning the server) and stop."""

    def start(self) -> Self: ...
    def stop(self) -> None: ...


def started_servers(
    kind: Callable[..., ServerT], parent: Path, name: str
) -> Iterator[Callable[..., ServerT]]:
    """A factory of real servers, each in its own ``parent/name-N``; all stopped by PID after."""
    servers: list[ServerT] = []

    def start(**kwargs: Any) -> ServerT:
        server = kind(parent / f"{name}-{len(servers)}", **kwargs)
        servers.append(server)
        return server.start()

    yield start
    for server in servers:
        server.stop()


@pytest.fixture
def prometheus_factory(tmp_path: Path) -> Iterator[Callable[..., PrometheusServer]]:
    """Start real Prometheus servers on 127.0.0.1; all are stopped by PID afterwards."""
    yield from started_servers(PrometheusServer, tmp_path, "prometheus")


@pytest.fixture
def alertmanager_factory(tmp_path: Path) -> Iterator[Callable[..., AlertmanagerServer]]:
    """Start real Alertmanagers on 127.0.0.1; all are stopped by PID afterwards."""
    yield from started_servers(AlertmanagerServer, tmp_path, "alertmanager")


@pytest.fixture
def rule_files(tmp_path: Path) -> Callable[[RulesConfig], list[str]]:
    """Writes gpufleet's rules with a config under ``tmp_path/rules``; their paths."""

    def write(config: RulesConfig) -> list[str]:
        return [str(path) for path in write_all(tmp_path / "rules", config)]

    return write


class UvicornThread:
    """Serves an ASGI app on 127.0.0.1 from a background thread, with its lifespan."""

    def __init__(
        self, app: Any, port: int | None = None, config: uvicorn.Config | None = None
    ) -> None:
        self.port = config.port if config is not None else port or free_port()
        if config is None:
            config = uvicorn.Config(
                app, host="127.0.0.1", port=self.port, log_level="warning", lifespan="on"
            )
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> UvicornThread:
        self.thread.start()
        wait_until(lambda: self.server.started, 20, what="uvicorn to start")
        return self

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(10)


@pytest.fixture
def serve_asgi() -> Iterator[Callable[..., UvicornThread]]:
    running: list[UvicornThread] = []

    def serve(app: Any, port: int | None = None) -> UvicornThread:
        server = UvicornThread(app, port).start()
        running.append(server)
        return server

    yield serve
    for server in running:
        server.stop()


@pytest.fixture
def serve_agent() -> Iterator[Callable[..., UvicornThread]]:
    """Serve an Agent as ``gpufleet agent`` does (its protocol guard and limits)."""
    from gpufleet.agent.app import Agent, agent_server_config

    running: list[UvicornThread] = []

    def serve(agent: Agent) -> UvicornThread:
        server = UvicornThread(None, config=agent_server_config(agent, "warning")).start()
        running.append(server)
        return server

    yield serve
    for server in running:
        server.stop()


class WebhookReceiver:
    """Records every Alertmanager webhook notification it receives."""

    def __init__(self) -> None:
        self.notifications: list[dict[str, Any]] = []
        self._lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length", "0"))
                body = json.loads(self.rfile.read(length) or b"{}")
                with receiver._lock:
                    receiver.notifications.append(body)
                self.send_response(200)
                self.end_headers()

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.port = free_port()
        self.server = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/alerts"

    def alerts(self) -> list[dict[str, Any]]:
        with self._lock:
            return [alert for note in self.notifications for alert in note.get("alerts", [])]

    def wait_for_alerts(
        self, predicate: Callable[[list[dict[str, Any]]], bool], timeout: float = 60.0
    ) -> list[dict[str, Any]]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            alerts = self.alerts()
            if predicate(alerts):
                return alerts
            time.sleep(0.25)
        raise TimeoutError(f"alerts never matched; received: {self.alerts()}")


@pytest.fixture
def webhook_receiver() -> Iterator[WebhookReceiver]:
    receiver = WebhookReceiver()
    receiver.thread.start()
    yield receiver
    receiver.server.shutdown()
    receiver.server.server_close()


@pytest.fixture
def paged_alertmanager(
    alertmanager_factory: Callable[..., AlertmanagerServer], webhook_receiver: WebhookReceiver
) -> AlertmanagerServer:
    """A real Alertmanager that sends every notification to ``webhook_receiver``."""
    return alertmanager_factory(webhook_url=webhook_receiver.url)


@pytest.fixture(scope="session")
def bench_detect() -> Any:
    """bench/detect.py as a module (it is a script, not part of the package)."""
    path = Path(__file__).resolve().parents[1] / "bench" / "detect.py"
    spec = importlib.util.spec_from_file_location("bench_detect", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["bench_detect"] = module
    spec.loader.exec_module(module)
    return module
