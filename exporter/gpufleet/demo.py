"""``gpufleet demo``: a complete local stack without Docker.

Starts the fleet ledger, the simulator (64 nodes running the ``demo`` scenario:
a straggler, an XID 79 and a checkpoint storm within ten minutes, reported to
the ledger), a real Prometheus that discovers every virtual node through
file_sd and evaluates gpufleet's rules, and a real Alertmanager; prints where
they are, and stops all of them on Ctrl-C.
"""

from __future__ import annotations

import signal
import sys
import threading
from pathlib import Path
from types import FrameType

from gpufleet.devstack import (
    AlertmanagerServer,
    DevstackError,
    ManagedProcess,
    PrometheusServer,
    free_port,
    http_get,
    port_is_free,
    static_scrape_config,
    wait_until,
)

RULES_DIR = Path(__file__).resolve().parents[2] / "alerts"


def _port(preferred: int) -> int:
    return preferred if port_is_free(preferred) else free_port()


def rule_files() -> list[str]:
    """The project's rule files, when run from a checkout that has them."""
    return sorted(str(path) for path in RULES_DIR.glob("*.rules.yaml"))


def run_demo(
    workdir: Path, scenario: str = "demo", nodes: int = 64, prometheus_port: int = 9090
) -> int:
    workdir = workdir.resolve()
    workdir.mkdir(parents=True, exist_ok=True)
    sim_port, fleet_port = _port(9500), _port(9406)
    targets = workdir / "targets.json"
    ledger = ManagedProcess(
        [
            sys.executable, "-m", "gpufleet", "fleet", "--listen", f"127.0.0.1:{fleet_port}",
            "--db", str(workdir / "fleet.db"), "--log-level", "warning",
        ],
        workdir / "fleet.log",
    )  # fmt: skip
    simulator = ManagedProcess(
        [
            sys.executable, "-m", "gpufleet", "simulate", "--scenario", scenario,
            "--nodes", str(nodes), "--listen", f"127.0.0.1:{sim_port}",
            "--targets-file", str(targets), "--tick", "1", "--log-level", "warning",
            "--fleet-url", f"http://127.0.0.1:{fleet_port}",
        ],
        workdir / "simulator.log",
    )  # fmt: skip
    alertmanager = AlertmanagerServer(workdir / "alertmanager", port=_port(9093))
    prometheus = PrometheusServer(
        workdir / "prometheus",
        scrape_configs=[
            {
                "job_name": "gpufleet-agent",
                "file_sd_configs": [{"files": [str(targets)], "refresh_interval": "5s"}],
            },
            static_scrape_config("gpufleet-fleet", [f"127.0.0.1:{fleet_port}"]),
        ],
        rule_files=rule_files(),
        scrape_interval="5s",
        evaluation_interval="5s",
        port=_port(prometheus_port),
    )
    started: list[ManagedProcess | PrometheusServer | AlertmanagerServer] = []
    stop = threading.Event()

    def request_stop(signum: int, frame: FrameType | None) -> None:
        stop.set()

    signal.signal(signal.SIGINT, request_stop)
    signal.signal(signal.SIGTERM, request_stop)
    try:
        ledger.start()
        started.append(ledger)
        wait_until(lambda: http_get(f"http://127.0.0.1:{fleet_port}/readyz"), 30, what="the ledger")
        simulator.start()
        started.append(simulator)
        wait_until(
            lambda: http_get(f"http://127.0.0.1:{sim_port}/healthz") and targets.exists(),
            30,
            what="the simulator to be ready",
        )
        alertmanager.start()
        started.append(alertmanager)
        prometheus.alertmanager_urls = [alertmanager.url]
        prometheus.start()
        started.append(prometheus)
        prometheus.wait_for_targets_up(nodes + 1, timeout=60)
        rules = f"{len(rule_files())} rule files" if rule_files() else "no rule files yet"
        print(
            f"\ngpufleet demo is up ({nodes} simulated nodes, scenario {scenario}, {rules}; "
            f"logs and data in {workdir}):\n"
            f"  simulator     http://127.0.0.1:{sim_port}/  (one target per node)\n"
            f"  fleet ledger  http://127.0.0.1:{fleet_port}/docs\n"
            f"  Prometheus    {prometheus.url}/alerts\n"
            f"  Alertmanager  {alertmanager.url}\n"
            "Within ten minutes: node-012 turns slow (minute 1), GPU 3 of node-040 falls off\n"
            "the bus with XID 79 (minute 4), every node checkpoints at once (minute 5).\n"
            "Press Ctrl-C to stop everything.",
            flush=True,
        )
        while not stop.wait(1.0):
            if not simulator.running():
                print(f"the simulator exited:\n{simulator.log_tail()}", file=sys.stderr)
                return 1
        return 0
    except (DevstackError, TimeoutError) as error:
        print(f"gpufleet demo: {error}", file=sys.stderr)
        return 1
    finally:
        for part in reversed(started):
            part.stop()
        print("gpufleet demo stopped.", flush=True)
