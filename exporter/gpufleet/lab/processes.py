"""Child processes of the lab on 127.0.0.1: which binary runs (the Prometheus major),
free ports, HTTP helpers, polling, and a process stopped by PID.

The servers built on these (Prometheus, Alertmanager, VictoriaMetrics, vmalert) are in
:mod:`gpufleet.lab.devstack`.
"""

from __future__ import annotations

import collections
import http.client
import json
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from gpufleet.promapi import PrometheusUnreachable

T = TypeVar("T")

_INSTALL_HINT = {
    "victoria-metrics": "apt-get install -y --no-install-recommends victoria-metrics",
    "vmalert": "apt-get install -y --no-install-recommends victoria-metrics",
    "prometheus": "apt-get install -y --no-install-recommends prometheus",
    "promtool": "apt-get install -y --no-install-recommends prometheus",
    "prometheus-alertmanager": "apt-get install -y --no-install-recommends prometheus-alertmanager",
}

# Which Prometheus (with its Alertmanager, VictoriaMetrics and vmalert) the dev stack
# runs: "2", or unset, for the system's binaries on PATH (Debian bookworm's 2.42,
# Alertmanager 0.25, VictoriaMetrics 1.79); "3" for Debian sid's Prometheus 3.5,
# Alertmanager 0.33 and VictoriaMetrics 1.145 that `make prometheus3` unpacks into the
# checkout. The tests set it per test (tests/conftest.py); bench and `gpufleet demo` read it.
PROMETHEUS_MAJOR_VARIABLE = "GPUFLEET_PROMETHEUS"
PROMETHEUS_MAJORS = ("2", "3")
PROMETHEUS3_BIN = Path(__file__).resolve().parents[3] / ".tools" / "prometheus3" / "usr" / "bin"
PROMETHEUS_FAMILY = (
    "prometheus", "promtool", "prometheus-alertmanager", "amtool", "victoria-metrics", "vmalert",
)  # fmt: skip


class DevstackError(RuntimeError):
    pass


def prometheus_major() -> str:
    """The Prometheus major the dev stack runs, from GPUFLEET_PROMETHEUS (default 2)."""
    major = os.environ.get(PROMETHEUS_MAJOR_VARIABLE) or "2"
    if major not in PROMETHEUS_MAJORS:
        raise DevstackError(
            f"{PROMETHEUS_MAJOR_VARIABLE}={major!r}: expected 2 (the system's Prometheus, "
            f"on PATH) or 3 (Prometheus 3.5 from `make prometheus3`, in {PROMETHEUS3_BIN})"
        )
    return major


def prometheus_bin_dir(major: str) -> Path | None:
    """Where Prometheus ``major``'s family of binaries lives; None: on PATH."""
    return PROMETHEUS3_BIN if major == "3" else None


def find_binary(name: str) -> str:
    """The path of ``name``; for Prometheus's family, that of the major GPUFLEET_PROMETHEUS
    names."""
    directory = prometheus_bin_dir(prometheus_major()) if name in PROMETHEUS_FAMILY else None
    if directory is not None:
        path = directory / name
        if not os.access(path, os.X_OK):
            raise DevstackError(
                f"{name} of Prometheus 3 is not in {directory} "
                f"({PROMETHEUS_MAJOR_VARIABLE}=3); fetch it with: make prometheus3"
            )
        return str(path)
    found = shutil.which(name)
    if found is None:
        hint = _INSTALL_HINT.get(name, "")
        raise DevstackError(
            f"{name} is not on PATH" + (f"; install it with: {hint}" if hint else "")
        )
    return found


# "LOW-HIGH": free_port picks from these ports alone (the test suite gives each of its
# parallel workers its own block below the kernel's ephemeral range, so that a port one
# worker picked and has not yet bound is neither another worker's pick nor the source
# port of some outgoing connection).
PORT_RANGE_VARIABLE = "GPUFLEET_LAB_PORTS"
_handed_out: collections.deque[int] = collections.deque(maxlen=256)  # not bound yet, maybe


def free_port() -> int:
    """A port on 127.0.0.1 that was free a moment ago, for a server about to bind it."""
    block = os.environ.get(PORT_RANGE_VARIABLE)
    if block:
        low_text, _, high_text = block.partition("-")
        low, high = int(low_text), int(high_text)
        start = random.randrange(low, high + 1)
        candidates: list[int] = [*range(start, high + 1), *range(low, start)]
        for candidate in candidates:
            if candidate not in _handed_out and port_is_free(candidate):
                _handed_out.append(candidate)
                return candidate
        raise RuntimeError(f"no free port left in {PORT_RANGE_VARIABLE}={block}")
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def port_is_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


def http_get(url: str, timeout: float = 5.0) -> bytes:
    with urllib.request.urlopen(url, timeout=timeout) as response:  # noqa: S310 - local URLs
        body: bytes = response.read()
        return body


def http_json(url: str, payload: Any | None = None, timeout: float = 5.0) -> Any:
    data = None if payload is None else json.dumps(payload).encode()
    request = urllib.request.Request(  # noqa: S310 - local URLs
        url, data=data, headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=timeout) as response:  # noqa: S310
        body = response.read()
        return json.loads(body) if body.strip() else None


def ledger_post(
    connection: http.client.HTTPConnection, path: str, body: dict[str, Any], key: str
) -> int:
    """One write to the ledger over a kept-alive connection (load tests); its HTTP status."""
    connection.request(
        "POST", path, json.dumps(body),
        {"Content-Type": "application/json", "Idempotency-Key": key},
    )  # fmt: skip
    response = connection.getresponse()
    response.read()
    return response.status


def wait_until(
    probe: Callable[[], T | None],
    timeout: float,
    interval: float = 0.25,
    what: str = "condition",
) -> T:
    """Poll ``probe`` until it returns something truthy; raise with ``what`` on timeout."""
    deadline = time.monotonic() + timeout
    last_error: Exception | None = None
    while time.monotonic() < deadline:
        try:
            result = probe()
        except (OSError, PrometheusUnreachable, ValueError, KeyError) as error:
            last_error = error
            result = None
        if result:
            return result
        time.sleep(interval)
    detail = f" (last error: {last_error})" if last_error else ""
    raise TimeoutError(f"timed out after {timeout:.0f}s waiting for {what}{detail}")


@dataclass
class ManagedProcess:
    """A child process with its log file; stopped by PID, SIGTERM then SIGKILL."""

    argv: list[str]
    log_path: Path
    env: dict[str, str] | None = None
    process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        log = open(self.log_path, "ab")  # noqa: SIM115 - owned by the child for its lifetime
        try:
            self.process = subprocess.Popen(
                self.argv,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=self.env,
            )
        finally:
            log.close()

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process else None

    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def stop(self, timeout: float = 10.0) -> None:
        if self.process is None or self.process.poll() is not None:
            return
        os.kill(self.process.pid, signal.SIGTERM)
        try:
            self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            os.kill(self.process.pid, signal.SIGKILL)
            self.process.wait(timeout)

    def log_tail(self, lines: int = 30) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])


def backfill(history_files: Sequence[Path], tsdb: Path) -> float:
    """Turn OpenMetrics files into TSDB blocks under ``tsdb`` with promtool, one process
    per file in parallel; return the wall seconds it took."""
    started = time.monotonic()
    binary = find_binary("promtool")
    # promtool reads the whole file once per block it writes: with its default 2 h blocks
    # a 3-day history is read 36 times. One block of up to 31 days reads it once (4-5x
    # faster here, same peak memory); Prometheus serves and compacts such blocks as usual.
    one_block = "--max-block-duration=744h"
    workers = [
        subprocess.Popen(
            [binary, "tsdb", "create-blocks-from", "openmetrics", one_block, str(path), str(tsdb)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        for path in history_files
    ]
    failures = []
    for path, worker in zip(history_files, workers, strict=True):
        _, error = worker.communicate()
        if worker.returncode != 0:
            failures.append(f"{path}: {error.decode(errors='replace')[-2000:]}")
    if failures:
        raise DevstackError("promtool could not import the history:\n" + "\n".join(failures))
    return time.monotonic() - started


def process_rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def process_cpu_seconds(pid: int) -> float:
    """User + system CPU seconds the process has used (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def agent_process(
    workdir: Path, port: int, gpu_source: str = "none", *extra: str, prefix: Sequence[str] = ()
) -> ManagedProcess:
    """``gpufleet agent`` on 127.0.0.1:port as a child process (not started yet)."""
    return ManagedProcess(
        [
            *prefix,
            sys.executable,
            "-m",
            "gpufleet",
            "agent",
            "--gpu-source",
            gpu_source,
            "--listen",
            f"127.0.0.1:{port}",
            "--log-level",
            "warning",
            *extra,
        ],
        workdir / "agent.log",
    )


def start_simulator(
    workdir: Path, nodes: int, scenario: str = "realistic-week", tick: float = 5.0
) -> tuple[ManagedProcess, Path]:
    """``gpufleet simulate`` serving ``nodes`` on 127.0.0.1, started and answering, and
    the file_sd targets file it wrote (workdir/targets.json)."""
    port = free_port()
    targets = workdir / "targets.json"
    simulator = ManagedProcess(
        [sys.executable, "-m", "gpufleet", "simulate", "--scenario", scenario,
         "--nodes", str(nodes), "--listen", f"127.0.0.1:{port}", "--targets-file", str(targets),
         "--tick", f"{tick:g}"],
        workdir / "simulator.log",
    )  # fmt: skip
    simulator.start()
    try:
        wait_until(
            lambda: http_get(f"http://127.0.0.1:{port}/healthz") and targets.exists(),
            60,
            what="simulator",
        )
    except BaseException:
        simulator.stop()
        raise
    return simulator, targets
