"""Shared fixtures: fake NVML from recorded fixtures, real Prometheus / Alertmanager,
an ASGI app served for real by uvicorn, and a webhook receiver for alerts.

Prometheus majors: a test that runs Prometheus's family (prometheus, promtool,
Alertmanager, VictoriaMetrics, vmalert) runs on 3 (Debian sid's 3.5 LTS, Alertmanager
0.33, VictoriaMetrics 1.145; `make prometheus3`), the major the compose demo and the
chart's partner kube-prometheus-stack ship, unless it is marked
``@pytest.mark.prometheus("2", "3")`` (or ``("2")``), then once per major listed (2: the
system's, Debian bookworm's 2.42, Alertmanager 0.25, VictoriaMetrics 1.79). On both: the
promtool suites, the vmalert dry run, the webhook, the demo story and the dashboards'
live queries; the heavier live suites (dcgm fleets, scale-out) run on 3 alone, to keep
`make test` in CI's time (issue 41). A test that asks for ``prometheus_major``
(directly, or through ``prometheus_factory`` / ``alertmanager_factory``) carries it in its
id (``[prom3]``), as does every marked test; a module fixture that starts one of those
servers takes ``prometheus_major`` too, so that each major gets its own. Every test
gets GPUFLEET_PROMETHEUS and PATH set to its major, so ``find_binary``, a bare
``promtool`` and child processes all find the same binaries. The report header lists
the exact versions of both.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Protocol, Self, TypeVar

import pytest
import uvicorn

from gpufleet.gpu.fake import FakeNvml
from gpufleet.gpu.fixture import bundled_fixture
from gpufleet.lab.devstack import AlertmanagerServer, PrometheusServer
from gpufleet.lab.processes import (
    PORT_RANGE_VARIABLE,
    PROMETHEUS3_BIN,
    PROMETHEUS_MAJOR_VARIABLE,
    PROMETHEUS_MAJORS,
    free_port,
    prometheus_bin_dir,
    wait_until,
)
from gpufleet.rules.__main__ import write_rules
from gpufleet.rules.config import RulesConfig

ServerT = TypeVar("ServerT", bound="Server")


REPO = Path(__file__).resolve().parents[1]
# 3: what compose and the chart ship (issue 41); GPUFLEET_PROMETHEUS=2 in the environment
# runs the unmarked tests on 2 instead (every live suite on 2, or no Prometheus 3 at hand).
DEFAULT_MAJOR = os.environ.get(PROMETHEUS_MAJOR_VARIABLE) or "3"
SYSTEM_PATH = os.environ.get("PATH", "")
_VERSIONED = ("prometheus", "promtool", "prometheus-alertmanager")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        'prometheus(*majors): run once per Prometheus major listed ("2", "3"); default "3"',
    )
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")  # gw0, gw1, ... under pytest -n
    if worker.startswith("gw"):
        os.environ[PORT_RANGE_VARIABLE] = worker_ports(int(worker[2:]))


def worker_ports(index: int, block: int = 2000) -> str:
    """Parallel worker ``index``'s own ports for its servers, below the kernel's
    ephemeral range (where outgoing connections take their source ports)."""
    ephemeral_low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    low = ephemeral_low - block * (index + 1)
    assert low >= 10000, f"too many parallel workers for ports below {ephemeral_low}"
    return f"{low}-{low + block - 1}"


def majors_of(node: pytest.Item | pytest.Function | Any) -> tuple[str, ...]:
    marker = node.get_closest_marker("prometheus")
    majors = tuple(marker.args) if marker is not None else (DEFAULT_MAJOR,)
    unknown = set(majors) - set(PROMETHEUS_MAJORS)
    assert not unknown, f"{node.nodeid}: no Prometheus major {sorted(unknown)}"
    return majors


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    marked = metafunc.definition.get_closest_marker("prometheus") is not None
    if marked and "prometheus_major" not in metafunc.fixturenames:
        # A marked test runs once per major listed even when none of its fixtures asks
        # for prometheus_major (its id still says which): the name joins its closure.
        metafunc.fixturenames.append("prometheus_major")
    if "prometheus_major" in metafunc.fixturenames:
        # Module scope: a module's shared Prometheus (a module fixture) is started once
        # per major, and its tests are grouped by major.
        majors = majors_of(metafunc.definition)
        metafunc.parametrize(
            "prometheus_major", majors, ids=[f"prom{major}" for major in majors], scope="module"
        )


@pytest.fixture(scope="module")
def prometheus_major() -> str:
    """The Prometheus major this test runs on (parametrized by pytest_generate_tests)."""
    return DEFAULT_MAJOR


def fetch_prometheus3() -> None:
    """Debian sid's Prometheus 3 into .tools/ (`make prometheus3`), once, when missing."""
    if (PROMETHEUS3_BIN / "promtool").exists():
        return
    script = REPO / "deploy" / "tools" / "fetch-prometheus3.sh"
    result = subprocess.run(
        [str(script), str(PROMETHEUS3_BIN.parents[1])],
        capture_output=True, text=True, timeout=600, check=False,
    )  # fmt: skip
    if result.returncode != 0:
        from deploy_tools import unavailable

        unavailable(f"`make prometheus3` could not fetch Prometheus 3:\n{result.stderr[-2000:]}")


# The longest files (over a minute each, most of it waiting on alert windows), started
# first: make test runs files on two workers (Makefile), and one of these begun last
# would leave the other worker idle through it. Longest first; the rest keep their order.
LONGEST_FILES = (
    "test_real_pytorch.py",
    "test_dcgm_live.py",
    "test_rules.py",
    "test_demo_story.py",
    "test_simulate_hbm_pages.py",
    "test_scale_identity.py",
    "test_parallel_layout.py",
    "test_rules_live.py",
    "test_detect.py",
    "test_detect_materialize.py",
)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    rank = {name: i for i, name in enumerate(LONGEST_FILES)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    """Before any fixture of ``item`` starts: its Prometheus major in the environment."""
    callspec = getattr(item, "callspec", None)
    major = callspec.params.get("prometheus_major") if callspec is not None else None
    major = major or majors_of(item)[0]
    if major == "3":
        fetch_prometheus3()
    directory = prometheus_bin_dir(major)
    os.environ[PROMETHEUS_MAJOR_VARIABLE] = major
    os.environ["PATH"] = SYSTEM_PATH if directory is None else f"{directory}:{SYSTEM_PATH}"
    item.user_properties.append(("prometheus_major", major))


def binary_version(path: Path | str) -> str:
    try:
        first = subprocess.run(
            [str(path), "--version"], capture_output=True, text=True, timeout=20, check=False
        ).stdout.splitlines()
    except OSError:
        return "missing"
    # "prometheus, version 3.5.3+ds1 (branch: ...)"
    return first[0].split(" version ")[-1].split()[0] if first else "unknown"


def toolset_versions(major: str) -> dict[str, str]:
    """The version of each of ``major``'s binaries; VictoriaMetrics's Debian builds print
    none, so their package's version stands in."""
    directory = prometheus_bin_dir(major)
    versions = {
        name: binary_version(directory / name if directory else f"/usr/bin/{name}")
        for name in _VERSIONED
    }
    if directory is None:
        package = subprocess.run(
            ["dpkg-query", "-W", "-f=${Version}", "victoria-metrics"],
            capture_output=True, text=True, check=False,
        ).stdout  # fmt: skip
    else:
        stamp = directory.parents[1] / "fetched"
        lines = stamp.read_text().splitlines() if stamp.exists() else []
        package = next((line.split("=", 1)[1] for line in lines
                        if line.startswith("victoria-metrics=")), "")  # fmt: skip
    versions["victoria-metrics/vmalert"] = package or "missing"
    return versions


def pytest_report_header(config: pytest.Config) -> list[str]:
    lines = []
    for major in PROMETHEUS_MAJORS:
        where = prometheus_bin_dir(major) or "PATH"
        found = ", ".join(f"{name} {version}" for name, version in toolset_versions(major).items())
        default = " (unmarked tests)" if major == DEFAULT_MAJOR else ""
        lines.append(f"prom{major}{default}: {found} [{where}]")
    return lines


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
def prometheus_factory(
    tmp_path: Path, prometheus_major: str
) -> Iterator[Callable[..., PrometheusServer]]:
    """Start real Prometheus servers on 127.0.0.1 (of the test's major); all are stopped
    by PID afterwards."""
    yield from started_servers(PrometheusServer, tmp_path, "prometheus")


@pytest.fixture
def alertmanager_factory(
    tmp_path: Path, prometheus_major: str
) -> Iterator[Callable[..., AlertmanagerServer]]:
    """Start real Alertmanagers on 127.0.0.1 (0.25 beside Prometheus 2, 0.33 beside 3);
    all are stopped by PID afterwards."""
    yield from started_servers(AlertmanagerServer, tmp_path, "alertmanager")


@pytest.fixture
def rule_files(tmp_path: Path) -> Callable[[RulesConfig], list[str]]:
    """Writes gpufleet's rules with a config under ``tmp_path/rules``; their paths."""

    def write(config: RulesConfig) -> list[str]:
        return [str(path) for path in write_rules(tmp_path / "rules", config)]

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
