"""The rules, unchanged, on plain dcgm-exporter fleets: real Prometheus scrapes nodes
that serve exposition shaped exactly like dcgm-exporter's (rendered from a counters
file by ``gpufleet.lab.dcgm_shape``), one fleet shape per test:

- stock counters, a Helm release's job (``<release>-dcgm-exporter``), ``Hostname``;
- gpufleet's recommended counters with the pre-4.0 bitmask name, ``Hostname``;
- the recommended counters (4.x bitmask name), Kubernetes pod labels, ``hostname``;
- the GPU Operator's job (``nvidia-dcgm-exporter``), stock counters, pod labels.

Each checks: a healthy fleet pages nothing (an old XID on every node's first scrape,
a 4-GPU node); then, with faults injected, every fault pages its node and nothing
else pages (a new pod on a GPU with an old XID, a node joining with an old XID).
The rules use short windows and ``for`` durations (seconds), as in test_rules_live.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from importlib import resources
from pathlib import Path
from typing import Any

import pytest

from gpufleet.lab.dcgm_shape import Counter, DcgmNode, Pod, parse_counters, render
from gpufleet.lab.devstack import PrometheusServer, file_sd_scrape_config
from gpufleet.lab.processes import free_port, wait_until
from gpufleet.rules.config import RulesConfig

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[1]
RECOMMENDED = ROOT / "deploy" / "dcgm-exporter" / "gpufleet-counters.csv"


def stock_counters() -> list[Counter]:
    text = resources.files("gpufleet.gpu").joinpath("fixtures/dcgm-exporter-default-counters.csv")
    return parse_counters(text.read_text("utf-8"), "stock")


def recommended_counters(bitmask: str = "DCGM_FI_DEV_CLOCKS_EVENT_REASONS") -> list[Counter]:
    text = RECOMMENDED.read_text("utf-8").replace("DCGM_FI_DEV_CLOCKS_EVENT_REASONS", bitmask)
    return parse_counters(text, str(RECOMMENDED))


@dataclass(frozen=True)
class FleetShape:
    job: str
    counters: list[Counter]
    node_label: str
    pods: bool

    def has(self, name: str) -> bool:
        return any(counter.name == name for counter in self.counters)

    @property
    def bitmask(self) -> str | None:
        names = ("DCGM_FI_DEV_CLOCK_THROTTLE_REASONS", "DCGM_FI_DEV_CLOCKS_EVENT_REASONS")
        return next((name for name in names if self.has(name)), None)


SHAPES = {
    "stock-helm-release": lambda: FleetShape(
        "gpu-metrics-dcgm-exporter", stock_counters(), "Hostname", False
    ),
    "extended-pre-4.0-bitmask": lambda: FleetShape(
        "dcgm-exporter",
        recommended_counters("DCGM_FI_DEV_CLOCK_THROTTLE_REASONS"),
        "Hostname",
        False,
    ),
    "4.x-bitmask-kubernetes-pods-hostname": lambda: FleetShape(
        "dcgm-exporter", recommended_counters(), "hostname", True
    ),
    "gpu-operator": lambda: FleetShape("nvidia-dcgm-exporter", stock_counters(), "Hostname", True),
}

# Windows of seconds instead of minutes, so that a fault pages within the test. A down
# exporter is judged by failed scrapes, and on a loaded machine a few 1 s scrapes in a row
# time out: 15 s of them, not 3, before a node counts as down.
FAST = RulesConfig(
    gpu_recording_interval="1s",
    gpu_long_window_interval="1s",
    slow_recording_interval="1s",
    dashboard_interval="1s",
    training_interval="1s",
    targets_missing_for="30s",
    exporter_down_for="15s",
    **dict.fromkeys(("xid_window", "ecc_window", "nvlink_window"), "20s"),
    **dict.fromkeys(("hw_slowdown_for", "gpu_missing_for"), "3s"),
    **dict.fromkeys(("gpus_expected_memory", "presence_memory"), "10m"),
)
HEALTHY_FOR_S = 30.0  # longer than the XID / ECC windows and every `for` above


class DcgmFleet:
    """Serves each node's dcgm-exporter-shaped /metrics at /nodes/<node>/metrics."""

    def __init__(self, shape: FleetShape) -> None:
        self.shape = shape
        self.nodes: dict[str, DcgmNode] = {}
        self.down: set[str] = set()
        self.lock = threading.Lock()
        fleet = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                name = self.path.split("/")[2] if self.path.startswith("/nodes/") else ""
                with fleet.lock:
                    node = fleet.nodes.get(name)
                    body = (
                        render(node, shape.counters, shape.node_label).encode()
                        if node is not None and name not in fleet.down
                        else None
                    )
                if body is None:
                    self.send_response(503)
                    self.end_headers()
                    return
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", free_port()), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def add(self, node: DcgmNode) -> None:
        with self.lock:
            self.nodes[node.name] = node

    def write_targets(self, path: Path) -> None:
        address = f"127.0.0.1:{self.server.server_address[1]}"
        with self.lock:
            names = sorted(self.nodes)
        targets = [
            {
                "targets": [address],
                # what a pod's address looks like: the rules must not read the node from it
                "labels": {
                    "__metrics_path__": f"/nodes/{name}/metrics",
                    "instance": f"10.0.0.{i}:9400",
                },
            }
            for i, name in enumerate(names, 1)
        ]
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(targets))
        tmp.replace(path)


@pytest.fixture
def dcgm_fleet() -> Iterator[Callable[[FleetShape], DcgmFleet]]:
    started: list[DcgmFleet] = []

    def start(shape: FleetShape) -> DcgmFleet:
        fleet = DcgmFleet(shape)
        fleet.thread.start()
        started.append(fleet)
        return fleet

    yield start
    for fleet in started:
        fleet.server.shutdown()
        fleet.server.server_close()


def pages(prometheus: PrometheusServer, start: float, end: float) -> set[tuple[str, str]]:
    """Every (alert, node) that was pending or firing between start and end, info excluded."""
    found = prometheus.query_range('ALERTS{severity=~"critical|warning"}', start, end, 1.0)
    return {(s["metric"]["alertname"], s["metric"].get("node", "-")) for s in found}


@pytest.mark.parametrize("shape_name", list(SHAPES))
def test_every_fault_pages_its_node_and_nothing_else_pages(
    shape_name: str,
    tmp_path: Path,
    dcgm_fleet: Callable[[FleetShape], DcgmFleet],
    prometheus_factory: Callable[..., PrometheusServer],
    rule_files: Callable[[RulesConfig], list[str]],
) -> None:
    shape = SHAPES[shape_name]()
    fleet = dcgm_fleet(shape)
    for index in range(6):
        fleet.add(DcgmNode.with_gpus(f"d{index:02d}"))
    fleet.add(DcgmNode.with_gpus("d06", 4))  # a GB200 tray / PCIe server: 4 GPUs is healthy
    old_xid = fleet.nodes["d01"].gpu(0)
    old_xid.last_xid = 48  # from last week: DCGM never resets it
    if shape.pods:
        for node in fleet.nodes.values():
            for gpu in node.gpus:
                gpu.pod = Pod(f"train-a-{node.name}", "ml", "trainer")

    targets = tmp_path / "targets.json"
    fleet.write_targets(targets)
    rules = rule_files(FAST)
    scrape = file_sd_scrape_config(shape.job, targets)
    prometheus = prometheus_factory(scrape_configs=[scrape], rule_files=rules)
    prometheus.wait_for_targets_up(7, timeout=60)
    healthy_from = time.time()
    # the per-node expectation is recorded (4 for d06, 8 elsewhere) before judging
    prometheus.wait_for_series('node:gpufleet_dcgm_gpus:max10m{node="d06"} == 4', timeout=60)
    wait_until(lambda: time.time() - healthy_from > HEALTHY_FOR_S, HEALTHY_FOR_S + 5, 0.5)
    assert pages(prometheus, healthy_from, time.time()) == set(), "a healthy fleet paged"

    # -- faults, and changes that must not page ------------------------------------------
    expected = set()
    with fleet.lock:
        fleet.nodes["d00"].gpu(3).xid(79)
        expected.add(("GpuFleetCriticalXid", "d00"))
        ecc = fleet.nodes["d02"].gpu(1)
        ecc.values["DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS"] = 1.0
        ecc.values["DCGM_FI_DEV_ECC_DBE_VOL_TOTAL"] = 1.0
        expected.add(("GpuFleetEccUncorrectable", "d02"))
        if shape.bitmask:  # opt-in: the stock counters file has no clock-event bitmask
            fleet.nodes["d03"].gpu(2).values[shape.bitmask] = 64.0  # HW thermal slowdown
            expected.add(("GpuFleetHwSlowdown", "d03"))
        if shape.has("DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL"):
            fleet.nodes["d03"].gpu(4).values["DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL"] = 2
            expected.add(("GpuFleetNvlinkErrors", "d03"))
        fleet.nodes["d04"].gpus.pop(5)  # fell off the bus: dcgm-exporter stops exporting it
        expected.add(("GpuFleetGpuMissing", "d04"))
        fleet.down.add("d05")  # the host died
        expected.add(("GpuFleetGpuExporterDown", "d05"))
        if shape.pods:  # a new job's pod lands on the GPU with the old XID 48
            old_xid.pod = Pod("train-b-0", "ml", "trainer")
        joining = DcgmNode.with_gpus("d07")
        joining.gpu(6).last_xid = 79  # a node (re)joins showing an old XID
        fleet.nodes["d07"] = joining
    faults_from = time.time()
    fleet.write_targets(targets)

    def all_paged() -> bool:
        return expected <= pages(prometheus, faults_from, time.time())

    wait_until(all_paged, 120, interval=1.0, what=f"{sorted(expected)} firing")
    prometheus.wait_for_targets_up(7, timeout=30)  # d07 joined (d05 is down)
    settle_from = time.time()
    # anything else about to page has had the time to: the windows and `for`s above
    wait_until(lambda: time.time() - settle_from > 25, 30, 0.5)
    assert pages(prometheus, faults_from, time.time()) == expected
    xids = prometheus.query_range(
        'ALERTS{alertname="GpuFleetCriticalXid"}', faults_from, time.time(), 1.0
    )
    assert {(a["metric"]["node"], a["metric"]["gpu"], a["metric"]["xid"]) for a in xids} == {
        ("d00", "3", "79")
    }
