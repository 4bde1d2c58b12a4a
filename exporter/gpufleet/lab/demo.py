"""``gpufleet demo``: a complete local stack without Docker.

Starts the fleet ledger, the simulator (64 nodes running the ``demo`` scenario:
a straggler, a checkpoint storm and an XID 79 within ten minutes, each paging
on its own, then the job's automatic retry without the failed node, reported
to the ledger), a real Prometheus that discovers every virtual node through
file_sd and evaluates gpufleet's rules, a real Alertmanager, and the pager whose
log shows every page; prints where they are and what will happen when, and
stops all of them on Ctrl-C. Prometheus and Alertmanager run the same
configuration files under ``deploy/`` as ``docker compose up`` (from a wheel, the
package's copies of them) and the rules the package generates into the work
directory (see :mod:`gpufleet.lab.deploytree`).
"""

from __future__ import annotations

import signal
import sys
import threading
from pathlib import Path
from types import FrameType

from gpufleet.lab.deploytree import DeployTree, DeployTreeError
from gpufleet.lab.devstack import AlertmanagerServer, PrometheusServer
from gpufleet.lab.processes import (
    DevstackError,
    ManagedProcess,
    free_port,
    http_get,
    port_is_free,
    wait_until,
)
from gpufleet.simulate.story import story


def _port(preferred: int) -> int:
    return preferred if port_is_free(preferred) else free_port()


def run_demo_stack(
    workdir: Path,
    scenario: str = "demo",
    nodes: int = 64,
    prometheus_port: int = 9090,
    pager_port: int | None = None,
) -> int:
    workdir = workdir.resolve()
    workdir.mkdir(parents=True, exist_ok=True)
    sim_port, fleet_port = _port(9500), _port(9406)
    try:
        tree = DeployTree(workdir / "etc", pager_port=pager_port).prepare()
        pager_host, pager_port = tree.pager_address()
    except DeployTreeError as error:
        print(f"gpufleet demo: {error}", file=sys.stderr)
        return 1
    if not port_is_free(pager_port):
        print(
            f"gpufleet demo: port {pager_port} is taken; {tree.alertmanager_config} "
            "sends pages there. Stop what listens on it (another demo?), or give "
            "--pager-port.",
            file=sys.stderr,
        )
        return 1
    targets = tree.targets_file("agents")
    tree.write_targets("fleet", [f"127.0.0.1:{fleet_port}"])
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
    pager = ManagedProcess(
        [
            sys.executable, "-m", "gpufleet.lab.pager", "--listen", f"{pager_host}:{pager_port}",
        ],
        workdir / "pager.log",
    )  # fmt: skip
    alertmanager = AlertmanagerServer(
        workdir / "alertmanager", port=_port(9093), config_file=tree.alertmanager_config
    )
    prometheus = PrometheusServer(
        workdir / "prometheus", config_file=tree.prometheus_config, port=_port(prometheus_port)
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
        pager.start()
        started.append(pager)
        wait_until(lambda: http_get(f"http://{pager_host}:{pager_port}/"), 30, what="the pager")
        alertmanager.start()
        started.append(alertmanager)
        tree.write_targets("alertmanager", [f"127.0.0.1:{alertmanager.port}"])
        prometheus.start()
        started.append(prometheus)
        prometheus.wait_for_targets_up(nodes + 1, timeout=60)
        rules = f"{len(list(tree.rules_dir.glob('*.rules.yaml')))} rule files"
        print(
            f"\ngpufleet demo is up ({nodes} simulated nodes, scenario {scenario}, {rules}; "
            f"logs and data in {workdir}):\n"
            f"  simulator     http://127.0.0.1:{sim_port}/  (one target per node)\n"
            f"  fleet ledger  http://127.0.0.1:{fleet_port}/docs\n"
            f"  Prometheus    {prometheus.url}/alerts\n"
            f"  Alertmanager  {alertmanager.url}\n"
            f"  pages         tail -f {workdir / 'pager.log'}\n"
            f"{story(scenario)}"
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
