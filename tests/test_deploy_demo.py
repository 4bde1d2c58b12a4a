"""The deploy/ configuration runs for real: Prometheus and Alertmanager started from
the very files `docker compose up` mounts, laid out by DeployTree as `make demo` does,
scrape a simulated cluster and the ledger under the job names the rules select, load
every rule file, and deliver pages to the pager's log."""

from __future__ import annotations

import json
import sys
import threading
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from http.server import ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpufleet.lab.deploytree import DeployTree
from gpufleet.lab.devstack import AlertmanagerServer, PrometheusServer
from gpufleet.lab.pager import PagerHandler, page_lines
from gpufleet.lab.processes import ManagedProcess, free_port, http_get, http_json, wait_until

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture
def processes() -> Iterator[list[ManagedProcess]]:
    started: list[ManagedProcess] = []
    yield started
    for process in reversed(started):
        process.stop()


def start(processes: list[ManagedProcess], argv: list[str], log: Path) -> ManagedProcess:
    process = ManagedProcess(argv, log)
    process.start()
    processes.append(process)
    return process


def test_demo_stack_runs_the_deploy_files_and_pages_reach_the_pager_log(
    tmp_path: Path,
    processes: list[ManagedProcess],
    prometheus_factory: Callable[..., PrometheusServer],
    alertmanager_factory: Callable[..., AlertmanagerServer],
) -> None:
    # The deploy files, with the pager moved to a free port: a demo running beside the
    # test (on the configured 9407) must not receive this test's pages.
    tree = DeployTree(tmp_path / "etc", pager_port=free_port()).prepare()
    assert tree.prometheus_config.resolve() == REPO / "deploy/prometheus/prometheus.yml"
    deployed = (REPO / "deploy/alertmanager/alertmanager.yml").read_text()
    pager_host, pager_port = tree.pager_address()
    assert pager_port == tree.pager_port
    assert tree.alertmanager_config.read_text() == deployed.replace(
        f"{pager_host}:9407/", f"{pager_host}:{pager_port}/"
    )
    # The rules are generated into the tree by the package's generator, as from a wheel.
    assert not tree.rules_dir.is_symlink() and list(tree.rules_dir.glob("*.rules.yaml"))
    start(
        processes,
        [sys.executable, "-m", "gpufleet.lab.pager", "--listen", f"{pager_host}:{pager_port}"],
        tmp_path / "pager.log",
    )
    fleet_port, sim_port = free_port(), free_port()
    start(
        processes,
        [
            sys.executable, "-m", "gpufleet", "fleet", "--listen", f"127.0.0.1:{fleet_port}",
            "--db", str(tmp_path / "fleet.db"), "--log-level", "warning",
        ],
        tmp_path / "fleet.log",
    )  # fmt: skip
    start(
        processes,
        [
            sys.executable, "-m", "gpufleet", "simulate", "--scenario", "healthy",
            "--nodes", "4", "--listen", f"127.0.0.1:{sim_port}",
            "--targets-file", str(tree.targets_file("agents")), "--tick", "1",
        ],
        tmp_path / "simulator.log",
    )  # fmt: skip
    tree.write_targets("fleet", [f"127.0.0.1:{fleet_port}"])
    wait_until(lambda: http_get(f"http://{pager_host}:{pager_port}/"), 60, what="the pager")
    alertmanager = alertmanager_factory(config_file=tree.alertmanager_config)
    tree.write_targets("alertmanager", [f"127.0.0.1:{alertmanager.port}"])
    prometheus = prometheus_factory(config_file=tree.prometheus_config)

    targets = prometheus.wait_for_targets_up(5, timeout=120)
    jobs = sorted({target["labels"]["job"] for target in targets})
    assert jobs == ["gpufleet-agent", "gpufleet-fleet"]
    expected_groups = {
        group["name"]
        for path in (REPO / "alerts").glob("*.rules.yaml")
        for group in yaml.safe_load(path.read_text())["groups"]
    }
    loaded = {group["name"] for group in prometheus.api("rules")["groups"]}
    assert loaded == expected_groups
    wait_until(
        lambda: prometheus.api("alertmanagers")["activeAlertmanagers"],
        60,
        what="Prometheus to discover the Alertmanager through file_sd",
    )

    now = datetime.now(UTC)
    alert_times = {"startsAt": now.isoformat(), "endsAt": (now + timedelta(hours=1)).isoformat()}
    http_json(
        f"{alertmanager.url}/api/v2/alerts",
        [
            {
                "labels": {"alertname": "GpuFleetTestPage", "severity": "critical",
                           "node": "node-007"},
                "annotations": {"summary": "A page from the deploy test."},
                **alert_times,
            },
            {
                "labels": {"alertname": "GpuFleetTestInfo", "severity": "info",
                           "node": "node-008"},
                **alert_times,
            },
        ],
    )  # fmt: skip
    log = tmp_path / "pager.log"
    wait_until(
        lambda: "GpuFleetTestPage" in log.read_text(),
        120,
        what="the page in the pager's log",
    )
    page = next(line for line in log.read_text().splitlines() if "GpuFleetTestPage" in line)
    assert page.startswith("PAGE firing GpuFleetTestPage severity=critical node=node-007")
    assert page.endswith("A page from the deploy test.")
    # info alerts are routed to the receiver without a pager.
    receivers = {
        alert["labels"]["alertname"]: [receiver["name"] for receiver in alert["receivers"]]
        for alert in alertmanager.alerts()
    }
    assert receivers == {"GpuFleetTestPage": ["pages"], "GpuFleetTestInfo": ["dashboards-only"]}
    assert "GpuFleetTestInfo" not in log.read_text()


def test_page_lines_name_the_alert_and_where(tmp_path: Path) -> None:
    payload: dict[str, Any] = json.loads(
        json.dumps(
            {
                "receiver": "pages",
                "alerts": [
                    {
                        "status": "resolved",
                        "labels": {"alertname": "GpuFleetXid79", "severity": "critical",
                                   "node": "node-040", "gpu": "3"},
                        "annotations": {"summary": "A GPU fell off the bus."},
                    }
                ],
            }
        )
    )  # fmt: skip
    assert page_lines(payload) == [
        "PAGE resolved GpuFleetXid79 severity=critical node=node-040 gpu=3 receiver=pages: "
        "A GPU fell off the bus."
    ]


def test_pager_answers_bad_input_with_a_400_naming_it() -> None:
    server = ThreadingHTTPServer(("127.0.0.1", free_port()), PagerHandler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}/"
        for body, expected in ((b"not json", "expected an Alertmanager webhook JSON object"),
                               (b"[1]", "the body is not a JSON object")):  # fmt: skip
            request = urllib.request.Request(url, data=body, method="POST")
            with pytest.raises(urllib.error.HTTPError) as caught:
                urllib.request.urlopen(request, timeout=10)
            assert caught.value.code == 400
            assert expected in caught.value.read().decode()
    finally:
        server.shutdown()
        server.server_close()
