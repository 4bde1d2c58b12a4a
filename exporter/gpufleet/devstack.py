"""Real Prometheus and Alertmanager processes on 127.0.0.1, for the demo and the tests.

Each server gets an explicit listen address, configuration file and storage
path under a work directory (their defaults bind 0.0.0.0 and write to system
paths), is polled until ready, and is stopped by PID.
"""

from __future__ import annotations

import http.client
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from gpufleet.promapi import PrometheusApi, PrometheusUnreachable

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
PROMETHEUS3_BIN = Path(__file__).resolve().parents[2] / ".tools" / "prometheus3" / "usr" / "bin"
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


def free_port() -> int:
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


def static_scrape_config(
    job: str, targets: Sequence[str], metrics_path: str = "/metrics", **extra: Any
) -> dict[str, Any]:
    return {
        "job_name": job,
        "metrics_path": metrics_path,
        "static_configs": [{"targets": list(targets)}],
        **extra,
    }


def file_sd_scrape_config(job: str, targets_file: Path, refresh: str = "1s") -> dict[str, Any]:
    """A scrape job whose targets come from a file_sd file (the simulator writes one)."""
    return {
        "job_name": job,
        "file_sd_configs": [{"files": [str(targets_file)], "refresh_interval": refresh}],
    }


@dataclass
class PrometheusServer:
    workdir: Path
    scrape_configs: list[dict[str, Any]] = field(default_factory=list)
    rule_files: list[str] = field(default_factory=list)
    alertmanager_urls: list[str] = field(default_factory=list)
    scrape_interval: str = "1s"
    evaluation_interval: str = "1s"
    port: int | None = None
    extra_args: list[str] = field(default_factory=list)
    storage_path: Path | None = None  # e.g. blocks backfilled by promtool; default workdir/data
    remote_write_urls: list[str] = field(default_factory=list)
    # A configuration file to run as it is (deploy/prometheus/prometheus.yml in the demo)
    # instead of one made from the fields above.
    config_file: Path | None = None
    process: ManagedProcess | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _config_path(self) -> Path:
        if self.config_file is not None:
            return self.config_file
        config_path = self.workdir / "prometheus.yml"
        # JSON is YAML: no YAML library needed at run time.
        config_path.write_text(json.dumps(self.config(), indent=1))
        return config_path

    def config(self) -> dict[str, Any]:
        config: dict[str, Any] = {
            "global": {
                "scrape_interval": self.scrape_interval,
                "evaluation_interval": self.evaluation_interval,
            },
            "scrape_configs": self.scrape_configs,
        }
        if self.rule_files:
            config["rule_files"] = self.rule_files
        if self.alertmanager_urls:
            hosts = [urllib.parse.urlparse(url).netloc for url in self.alertmanager_urls]
            config["alerting"] = {"alertmanagers": [{"static_configs": [{"targets": hosts}]}]}
        if self.remote_write_urls:
            config["remote_write"] = [
                {"url": url, "queue_config": {"batch_send_deadline": "1s"}}
                for url in self.remote_write_urls
            ]
        return config

    def firing_alerts(self) -> list[dict[str, Any]]:
        alerts: list[dict[str, Any]] = self.api("alerts")["alerts"]
        return [alert for alert in alerts if alert["state"] == "firing"]

    def start(self, timeout: float = 60.0) -> PrometheusServer:
        binary = find_binary("prometheus")
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.port = self.port or free_port()
        config_path = self._config_path()
        self.process = ManagedProcess(
            [
                binary,
                f"--config.file={config_path}",
                f"--storage.tsdb.path={self.storage_path or self.workdir / 'data'}",
                f"--web.listen-address=127.0.0.1:{self.port}",
                "--web.enable-lifecycle",
                "--log.level=warn",
                *self.extra_args,
            ],
            self.workdir / "prometheus.log",
        )
        self.process.start()
        self._wait_ready(timeout)
        return self

    def _wait_ready(self, timeout: float) -> None:
        def ready() -> bool:
            if self.process is not None and not self.process.running():
                raise DevstackError(f"prometheus exited:\n{self.process.log_tail()}")
            return http_get(f"{self.url}/-/ready", timeout=2.0).startswith(b"Prometheus")

        wait_until(ready, timeout, what=f"Prometheus ready on {self.url}")

    def stop(self) -> None:
        if self.process is not None:
            self.process.stop()

    def reload(self) -> None:
        self._config_path()
        request = urllib.request.Request(f"{self.url}/-/reload", method="POST")  # noqa: S310
        with urllib.request.urlopen(request, timeout=10):  # noqa: S310
            pass

    @property
    def client(self) -> PrometheusApi:
        return PrometheusApi(self.url, timeout=30.0)

    def api(self, path: str, **params: str) -> Any:
        """The ``data`` of ``GET /api/v1/<path>`` (``alerts``, ``rules``, ``targets``, ...)."""
        return self.client.get(path, **params)

    def query(self, expr: str) -> list[dict[str, Any]]:
        """Instant vector query; returns the result list."""
        return self.client.query(expr)

    def query_range(self, expr: str, start: float, end: float, step: float) -> list[dict[str, Any]]:
        return self.client.query_range(expr, start, end, step)

    def active_targets(self) -> list[dict[str, Any]]:
        targets: list[dict[str, Any]] = self.api("targets", state="active")["activeTargets"]
        return targets

    def wait_for_targets_up(self, count: int, timeout: float = 60.0) -> list[dict[str, Any]]:
        def up() -> list[dict[str, Any]] | None:
            targets = self.active_targets()
            healthy = [target for target in targets if target["health"] == "up"]
            return healthy if len(healthy) >= count else None

        return wait_until(up, timeout, interval=0.5, what=f"{count} scrape targets up")

    def wait_for_series(
        self, expr: str, count: int = 1, timeout: float = 60.0
    ) -> list[dict[str, Any]]:
        def present() -> list[dict[str, Any]] | None:
            result = self.query(expr)
            return result if len(result) >= count else None

        return wait_until(present, timeout, interval=0.5, what=f"{count} series for {expr}")


@dataclass
class AlertmanagerServer:
    workdir: Path
    webhook_url: str | None = None
    port: int | None = None
    group_wait: str = "1s"
    group_interval: str = "1s"
    repeat_interval: str = "1h"
    # A configuration file to run as it is (deploy/alertmanager/alertmanager.yml in the demo).
    config_file: Path | None = None
    process: ManagedProcess | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def config(self) -> dict[str, Any]:
        """One page per node (or per job for job-level alerts); info alerts never page."""
        receiver: dict[str, Any] = {"name": "pages"}
        if self.webhook_url:
            receiver["webhook_configs"] = [{"url": self.webhook_url, "send_resolved": False}]
        return {
            "route": {
                "receiver": "pages",
                "group_by": ["node", "training_job"],
                "group_wait": self.group_wait,
                "group_interval": self.group_interval,
                "repeat_interval": self.repeat_interval,
                "routes": [{"matchers": ['severity="info"'], "receiver": "dashboards-only"}],
            },
            "receivers": [receiver, {"name": "dashboards-only"}],
        }

    def start(self, timeout: float = 60.0) -> AlertmanagerServer:
        binary = find_binary("prometheus-alertmanager")
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.port = self.port or free_port()
        config_path = self.config_file or self.workdir / "alertmanager.yml"
        if self.config_file is None:
            config_path.write_text(json.dumps(self.config(), indent=1))
        self.process = ManagedProcess(
            [
                binary,
                f"--config.file={config_path}",
                f"--storage.path={self.workdir / 'data'}",
                f"--web.listen-address=127.0.0.1:{self.port}",
                "--cluster.listen-address=",
                "--log.level=warn",
            ],
            self.workdir / "alertmanager.log",
        )
        self.process.start()

        def ready() -> bool:
            if self.process is not None and not self.process.running():
                raise DevstackError(f"alertmanager exited:\n{self.process.log_tail()}")
            http_get(f"{self.url}/-/ready", timeout=2.0)
            return True

        wait_until(ready, timeout, what=f"Alertmanager ready on {self.url}")
        return self

    def stop(self) -> None:
        if self.process is not None:
            self.process.stop()

    def alerts(self) -> list[dict[str, Any]]:
        alerts: list[dict[str, Any]] = http_json(f"{self.url}/api/v2/alerts")
        return alerts


@dataclass
class VictoriaMetricsServer:
    """Single-node VictoriaMetrics (Debian's victoria-metrics), the scale-out stand-in."""

    workdir: Path
    port: int | None = None
    process: ManagedProcess | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout: float = 60.0) -> VictoriaMetricsServer:
        binary = find_binary("victoria-metrics")
        self.port = self.port or free_port()
        self.process = ManagedProcess(
            [
                binary,
                f"-storageDataPath={self.workdir / 'data'}",
                f"-httpListenAddr=127.0.0.1:{self.port}",
                "-search.latencyOffset=1s",  # tests look at data seconds old
                "-loggerLevel=WARN",
            ],
            self.workdir / "victoria-metrics.log",
        )
        self.process.start()
        wait_until(lambda: http_get(f"{self.url}/health"), timeout, what="VictoriaMetrics ready")
        return self

    def stop(self) -> None:
        if self.process is not None:
            self.process.stop()


@dataclass
class VmalertServer:
    """vmalert evaluating rule files against VictoriaMetrics, writing recording rules back."""

    workdir: Path
    rule_files: list[str]
    datasource_url: str
    notifier_url: str
    evaluation_interval: str = "1s"
    port: int | None = None
    process: ManagedProcess | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout: float = 60.0) -> VmalertServer:
        binary = find_binary("vmalert")
        self.port = self.port or free_port()
        self.process = ManagedProcess(
            [
                binary,
                *(f"-rule={path}" for path in self.rule_files),
                f"-datasource.url={self.datasource_url}",
                f"-remoteWrite.url={self.datasource_url}",
                f"-notifier.url={self.notifier_url}",
                f"-evaluationInterval={self.evaluation_interval}",
                f"-httpListenAddr=127.0.0.1:{self.port}",
                "-loggerLevel=WARN",
            ],
            self.workdir / "vmalert.log",
        )
        self.process.start()
        wait_until(lambda: http_get(f"{self.url}/health"), timeout, what="vmalert ready")
        return self

    def stop(self) -> None:
        if self.process is not None:
            self.process.stop()

    def firing_alerts(self) -> list[dict[str, Any]]:
        # vmalert serves Prometheus's alerts API, but answers "alerts": null while nothing
        # is pending or firing
        data = PrometheusApi(self.url, timeout=5.0).get("alerts")
        alerts: list[dict[str, Any]] = data.get("alerts") or []
        return [alert for alert in alerts if alert["state"] == "firing"]
