"""Real Prometheus and Alertmanager processes on 127.0.0.1, for the demo and the tests.

Each server gets an explicit listen address, configuration file and storage
path under a work directory (their defaults bind 0.0.0.0 and write to system
paths), is polled until ready, and is stopped by PID (:mod:`gpufleet.lab.processes`).
"""

from __future__ import annotations

import json
import urllib.parse
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpufleet.lab.processes import (
    DevstackError,
    ManagedProcess,
    find_binary,
    free_port,
    http_get,
    http_json,
    wait_until,
)
from gpufleet.promapi import PrometheusApi


def static_scrape_config(
    job: str, targets: Sequence[str], metrics_path: str = "/metrics", **extra: Any
) -> dict[str, Any]:
    return {
        "job_name": job,
        "metrics_path": metrics_path,
        "static_configs": [{"targets": list(targets)}],
        **extra,
    }


def rules_in(folder: Path) -> list[str]:
    """Every ``*.rules.yaml`` of a folder (an alerts/), sorted; none is an error, not a
    Prometheus that quietly evaluates nothing."""
    rules = sorted(str(path) for path in folder.glob("*.rules.yaml"))
    if not rules:
        raise DevstackError(f"no *.rules.yaml in {folder}")
    return rules


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
    # write_relabel_configs of every remote_write (a shard sends the global ruler only
    # what it reads: gpufleet.rules.sharding.remote_write_relabel_configs)
    remote_write_relabel: list[dict[str, Any]] = field(default_factory=list)
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
                {
                    "url": url,
                    "queue_config": {"batch_send_deadline": "1s"},
                    **(
                        {"write_relabel_configs": self.remote_write_relabel}
                        if self.remote_write_relabel
                        else {}
                    ),
                }
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
    # how old data must be before a query reads it: tests look at data seconds old
    latency_offset: str = "1s"
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
                f"-search.latencyOffset={self.latency_offset}",
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
    extra_args: list[str] = field(default_factory=list)
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
                *self.extra_args,
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
