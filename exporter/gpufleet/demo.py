"""``gpufleet demo``: a complete local stack without Docker.

Starts the agent on its synthetic GPU source, a real Prometheus scraping it and
a real Alertmanager, prints where they are, and stops all of them on Ctrl-C.
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


def _port(preferred: int) -> int:
    return preferred if port_is_free(preferred) else free_port()


def run_demo(workdir: Path, agent_port: int = 9405, prometheus_port: int = 9090) -> int:
    workdir = workdir.resolve()
    agent_port = _port(agent_port)
    agent = ManagedProcess(
        [
            sys.executable,
            "-m",
            "gpufleet",
            "agent",
            "--gpu-source",
            "synthetic",
            "--gpu-interval",
            "2",
            "--node",
            "demo-node-0",
            "--listen",
            f"127.0.0.1:{agent_port}",
        ],
        workdir / "agent.log",
    )
    alertmanager = AlertmanagerServer(workdir / "alertmanager", port=_port(9093))
    prometheus = PrometheusServer(
        workdir / "prometheus",
        scrape_configs=[static_scrape_config("gpufleet-agent", [f"127.0.0.1:{agent_port}"])],
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
        agent.start()
        started.append(agent)
        wait_until(
            lambda: http_get(f"http://127.0.0.1:{agent_port}/readyz") and True,
            30,
            what="the agent to be ready",
        )
        alertmanager.start()
        started.append(alertmanager)
        prometheus.alertmanager_urls = [alertmanager.url]
        prometheus.start()
        started.append(prometheus)
        prometheus.wait_for_targets_up(1, timeout=30)
        print(
            f"\ngpufleet demo is up (logs and data in {workdir}):\n"
            f"  agent metrics   http://127.0.0.1:{agent_port}/metrics\n"
            f"  Prometheus      {prometheus.url}/graph?g0.expr=DCGM_FI_DEV_POWER_USAGE\n"
            f"  Alertmanager    {alertmanager.url}\n"
            "Press Ctrl-C to stop everything.",
            flush=True,
        )
        while not stop.wait(1.0):
            if not agent.running():
                print(f"the agent exited:\n{agent.log_tail()}", file=sys.stderr)
                return 1
        return 0
    except (DevstackError, TimeoutError) as error:
        print(f"gpufleet demo: {error}", file=sys.stderr)
        return 1
    finally:
        for part in reversed(started):
            part.stop()
        print("gpufleet demo stopped.", flush=True)
