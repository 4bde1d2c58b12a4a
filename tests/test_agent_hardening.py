"""The agent under a hostile or careless client: connection deadlines and caps, a scrape
that never blocks ingest or /healthz, quiet disconnects, bounded cardinality.

Every server here listens on 127.0.0.1; request loops are bounded. Deadlines are
generous: the tests assert that a connection was closed, never how fast.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import sys
import threading
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, cast

import pytest
from prometheus_client.metrics_core import GaugeMetricFamily, Metric
from prometheus_client.parser import text_string_to_metric_families

from gpufleet.agent.app import Agent, AgentSettings
from gpufleet.agent.connections import ConnectionGuard, GuardedHttpToolsProtocol
from gpufleet.agent.limits import ConnectionLimits, IngestLimits
from gpufleet.lab.processes import ManagedProcess, free_port, wait_until

GENEROUS_S = 30.0


def make_agent(
    connections: ConnectionLimits | None = None, limits: IngestLimits | None = None
) -> Agent:
    agent = Agent(
        AgentSettings(
            node="node-h",
            port=free_port(),
            gpu_source="none",
            connections=connections or ConnectionLimits(),
            limits=limits or IngestLimits(),
        )
    )
    agent.open()
    return agent


def get(port: int, path: str, timeout: float = GENEROUS_S) -> tuple[int, bytes]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=timeout) as response:
        return response.status, response.read()


def post_steps(port: int, events: list[dict[str, Any]], token: str | None = None) -> int:
    headers = {"Content-Type": "application/json"}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}/v1/steps",
        data=json.dumps({"events": events}).encode(),
        headers=headers,
    )
    try:
        with urllib.request.urlopen(request, timeout=GENEROUS_S) as response:
            return int(response.status)
    except urllib.error.HTTPError as error:
        return int(error.code)


def sample(port: int, name: str, **labels: str) -> float | None:
    text = get(port, "/metrics")[1].decode()
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()):
                return float(s.value)
    return None


def closed_by_server(connection: socket.socket) -> bool:
    """Read until the server closes (True) or the generous deadline passes (False)."""
    connection.settimeout(GENEROUS_S)
    try:
        while connection.recv(65536):
            pass
    except TimeoutError:
        return False
    except ConnectionResetError:
        return True
    return True


def connect(port: int) -> socket.socket:
    return socket.create_connection(("127.0.0.1", port), timeout=GENEROUS_S)


def step(rank: int, n: int, job: str = "job-h") -> dict[str, Any]:
    return {"training_job": job, "rank": rank, "step": n, "duration_s": 1.0}


@pytest.fixture
def quick_deadlines() -> ConnectionLimits:
    return ConnectionLimits(header_timeout_s=1.0, body_timeout_s=1.0)


def test_a_connection_that_never_sends_is_closed(
    serve_agent: Callable[..., Any], quick_deadlines: ConnectionLimits
) -> None:
    agent = make_agent(quick_deadlines)
    serve_agent(agent)
    with connect(agent.settings.port) as idle:
        assert closed_by_server(idle)
    assert sample(agent.settings.port, "gpufleet_agent_connections_closed_total") is not None
    assert agent.connections.closed()["header_timeout"] >= 1


def test_a_slow_header_is_cut_at_the_header_deadline(
    serve_agent: Callable[..., Any], quick_deadlines: ConnectionLimits
) -> None:
    agent = make_agent(quick_deadlines)
    serve_agent(agent)
    with connect(agent.settings.port) as slowloris:
        slowloris.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\nX-a: ")  # never finished
        assert closed_by_server(slowloris)
    assert agent.connections.closed()["header_timeout"] >= 1


def test_a_slow_body_is_cut_and_counted_quietly(
    serve_agent: Callable[..., Any],
    quick_deadlines: ConnectionLimits,
    caplog: pytest.LogCaptureFixture,
) -> None:
    agent = make_agent(quick_deadlines)
    serve_agent(agent)
    port = agent.settings.port
    with caplog.at_level(logging.WARNING), connect(port) as slow:
        slow.sendall(
            b"POST /v1/steps HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Content-Length: 1000\r\n\r\n" + b'{"events": ['
        )
        assert closed_by_server(slow)
        wait_until(
            lambda: sample(port, "gpufleet_ingest_rejected_total", reason="disconnected") == 1,
            GENEROUS_S,
            what="the cut body to be counted",
        )
    assert agent.connections.closed()["body_timeout"] == 1
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR], caplog.text


def test_a_client_that_disconnects_mid_body_is_counted_without_a_traceback(
    serve_agent: Callable[..., Any], caplog: pytest.LogCaptureFixture
) -> None:
    agent = make_agent()
    serve_agent(agent)
    port = agent.settings.port
    with caplog.at_level(logging.WARNING):
        for _ in range(3):
            with connect(port) as gone:
                gone.sendall(
                    b"POST /v1/steps HTTP/1.1\r\nHost: x\r\nContent-Length: 5000\r\n\r\n"
                    + b'{"events": ['
                    + b" " * 100
                )
        wait_until(
            lambda: sample(port, "gpufleet_ingest_rejected_total", reason="disconnected") == 3,
            GENEROUS_S,
            what="three disconnects to be counted",
        )
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR], caplog.text
    assert "Traceback" not in caplog.text


def test_an_oversized_header_gets_431(serve_agent: Callable[..., Any]) -> None:
    agent = make_agent(ConnectionLimits(max_header_bytes=4096))
    serve_agent(agent)
    with connect(agent.settings.port) as big:
        big.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\nX-a: " + b"a" * 8192)
        big.settimeout(GENEROUS_S)
        assert big.recv(4096).startswith(b"HTTP/1.1 431")
    assert agent.connections.closed()["header_too_large"] == 1


def test_metrics_answers_when_idle_connections_fill_the_cap(
    serve_agent: Callable[..., Any],
) -> None:
    agent = make_agent(ConnectionLimits(max_connections=8))
    serve_agent(agent)
    port = agent.settings.port
    idle = [connect(port) for _ in range(8)]  # held open, never sending: the cap is full
    try:
        wait_until(lambda: agent.connections.open_connections >= 8, GENEROUS_S, what="8 open")
        status, body = get(port, "/metrics")  # its connection evicts the oldest idle one
        assert status == 200 and b"gpufleet_agent_info" in body
        assert agent.connections.closed()["evicted"] == 1
        assert closed_by_server(idle[0])  # the oldest went first
        idle.append(connect(port))  # the cap is full again
        wait_until(lambda: agent.connections.open_connections >= 8, GENEROUS_S, what="8 open")
        assert get(port, "/metrics")[0] == 200
        assert agent.connections.closed()["evicted"] == 2
    finally:
        for connection in idle:
            connection.close()


def test_metrics_answers_when_slow_bodies_fill_the_cap(serve_agent: Callable[..., Any]) -> None:
    agent = make_agent(ConnectionLimits(max_connections=6))
    serve_agent(agent)
    port = agent.settings.port
    slow = [connect(port) for _ in range(6)]
    try:
        for connection in slow:  # each holds an ingest body it never finishes
            connection.sendall(
                b"POST /v1/steps HTTP/1.1\r\nHost: x\r\nContent-Length: 5000\r\n\r\n{"
            )
        wait_until(lambda: agent.connections.open_connections >= 6, GENEROUS_S, what="6 open")
        status, body = get(port, "/metrics")
        assert status == 200 and b"gpufleet_agent_info" in body
        assert agent.connections.closed()["evicted"] == 1
        assert closed_by_server(slow[0])
    finally:
        for connection in slow:
            connection.close()


def test_beyond_the_concurrent_ingest_limit_a_request_gets_503_and_is_counted(
    serve_agent: Callable[..., Any],
) -> None:
    agent = make_agent(limits=IngestLimits(max_concurrent_requests=1))
    serve_agent(agent)
    port = agent.settings.port
    with connect(port) as holder:  # its body never completes: it holds the one slot
        holder.sendall(b"POST /v1/steps HTTP/1.1\r\nHost: x\r\nContent-Length: 5000\r\n\r\n{")
        wait_until(lambda: post_steps(port, [step(0, 0)]) == 503, GENEROUS_S, what="a 503")
        assert sample(port, "gpufleet_ingest_rejected_total", reason="busy") == 1
    wait_until(lambda: post_steps(port, [step(0, 0)]) == 202, GENEROUS_S, what="the slot back")


class BlockingCollector:
    """A collector that holds a render until released: a scrape that takes forever."""

    def __init__(self) -> None:
        self.entered = threading.Event()
        self.release = threading.Event()

    def collect(self) -> Iterator[Metric]:
        self.entered.set()
        self.release.wait(GENEROUS_S)
        family = GaugeMetricFamily("test_blocking", "Held until released.")
        family.add_metric([], 1.0)
        yield family


def test_a_scrape_in_progress_blocks_neither_ingest_nor_healthz(
    serve_agent: Callable[..., Any],
) -> None:
    agent = make_agent()
    blocker = BlockingCollector()
    agent.registry.register(blocker)
    serve_agent(agent)
    port = agent.settings.port
    scrape: dict[str, Any] = {}
    thread = threading.Thread(target=lambda: scrape.update(result=get(port, "/metrics")))
    thread.start()
    try:
        assert blocker.entered.wait(GENEROUS_S)
        # The render is still held: before the fix these waited behind it (event loop).
        assert get(port, "/healthz", timeout=GENEROUS_S / 2)[0] == 200
        assert post_steps(port, [step(0, 0)]) == 202
        assert agent.training.series > 0
    finally:
        blocker.release.set()
        thread.join(GENEROUS_S)
    assert scrape["result"][0] == 200


def test_the_agent_command_takes_its_token_from_a_file(tmp_path: Path) -> None:
    secret = tmp_path / "ingest-token"
    secret.write_text("from-a-secret\n")
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUFLEET_")}
    env["GPUFLEET_INGEST_TOKEN_FILE"] = str(secret)
    agent = ManagedProcess(
        [
            *(sys.executable, "-m", "gpufleet", "agent"),
            *("--gpu-source", "none", "--listen", f"127.0.0.1:{port}"),
        ],
        tmp_path / "agent.log",
        env,
    )
    agent.start()
    try:
        wait_until(lambda: get(port, "/readyz")[0] == 200, GENEROUS_S, what="the agent")
        assert post_steps(port, [step(0, 0)]) == 401  # loopback, but a token is set
        assert post_steps(port, [step(0, 0)], token="from-a-secret") == 202
        assert "from-a-secret" not in " ".join(agent.argv)
    finally:
        agent.stop()


class FakeConnection:
    """What the guard reads of a connection: its peer, its state, and a way to cut it."""

    def __init__(self, peer: str, idle: bool = True, receiving_body: bool = False) -> None:
        self.peer = peer
        self.idle = idle
        self.receiving_body = receiving_body
        self.cut_for: str | None = None
        self.transport = self

    def is_closing(self) -> bool:
        return self.cut_for is not None

    def cut(self, reason: str) -> None:
        self.cut_for = reason


def test_one_address_never_holds_more_than_its_share(serve_agent: Callable[..., Any]) -> None:
    agent = make_agent(ConnectionLimits(max_connections_per_client=3))
    serve_agent(agent)
    port = agent.settings.port
    held = [connect(port) for _ in range(3)]
    try:
        wait_until(lambda: agent.connections.open_connections == 3, GENEROUS_S, what="3 open")
        with connect(port) as fourth:
            assert closed_by_server(fourth)
        assert agent.connections.closed()["over_client_limit"] >= 1
        assert agent.connections.open_connections == 3  # the three held are untouched
    finally:
        for connection in held:
            connection.close()
    wait_until(lambda: get(port, "/healthz")[0] == 200, GENEROUS_S, what="room again")


def test_over_the_cap_the_victim_comes_from_the_address_holding_the_most() -> None:
    guard = ConnectionGuard(ConnectionLimits(max_connections=5))

    def open_one(connection: FakeConnection) -> FakeConnection:
        guard.opened(cast(GuardedHttpToolsProtocol, connection))
        return connection

    prometheus = open_one(FakeConnection("10.0.0.1"))  # idle between scrapes, and oldest
    flood = [open_one(FakeConnection("10.9.9.9")) for _ in range(4)]
    newcomer = open_one(FakeConnection("10.0.0.1"))
    assert prometheus.cut_for is None and newcomer.cut_for is None
    assert flood[0].cut_for == "evicted"  # the flood's oldest, not the oldest overall
    guard.lost(cast(GuardedHttpToolsProtocol, flood[0]))
    for connection in flood[1:]:  # the flood's others are mid-body, then being answered
        connection.idle, connection.receiving_body = False, True
    open_one(FakeConnection("10.0.0.2"))
    assert flood[1].cut_for == "evicted"
    guard.lost(cast(GuardedHttpToolsProtocol, flood[1]))
    for connection in [*flood[2:], prometheus, newcomer]:
        connection.idle = connection.receiving_body = False  # every request being answered
    refused = open_one(FakeConnection("10.0.0.3"))
    assert refused.cut_for == "over_limit"
    assert all(c.cut_for is None for c in [*flood[2:], prometheus, newcomer])
