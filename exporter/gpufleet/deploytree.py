"""The demo's Prometheus and Alertmanager configuration, laid out as docker compose does.

``docker compose up`` and ``make demo`` run the same files under ``deploy/``. Those
files name no host: Prometheus finds its targets and Alertmanagers through file_sd
lists under ``targets/<job>/`` beside its configuration, and the pager listens on
the loopback address the Alertmanager webhook names. :class:`DeployTree` builds
the tree compose mounts (``<root>/deploy/prometheus/prometheus.yml``,
``<root>/alerts``) in a work directory from symbolic links to the checkout's files,
and writes the target lists with this machine's addresses.
"""

from __future__ import annotations

import json
import urllib.parse
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[2]
DEPLOY = REPO / "deploy"
PROMETHEUS_CONFIG = Path("deploy/prometheus/prometheus.yml")
ALERTMANAGER_CONFIG = Path("deploy/alertmanager/alertmanager.yml")
# file_sd directories the Prometheus configuration reads (targets/<job>/*.json).
TARGET_JOBS = ("agents", "fleet", "alertmanager")


class DeployTreeError(RuntimeError):
    pass


@dataclass(frozen=True, slots=True)
class DeployTree:
    """``deploy/`` and ``alerts/`` of the checkout, linked into ``root`` as compose mounts them."""

    root: Path
    repo: Path = REPO

    @property
    def prometheus_config(self) -> Path:
        return self.root / PROMETHEUS_CONFIG

    @property
    def alertmanager_config(self) -> Path:
        return self.root / ALERTMANAGER_CONFIG

    def prepare(self) -> DeployTree:
        for relative in (PROMETHEUS_CONFIG, ALERTMANAGER_CONFIG, Path("alerts")):
            source = self.repo / relative
            if not source.exists():
                raise DeployTreeError(
                    f"{source} is missing: the demo runs from a gpufleet checkout"
                )
            link = self.root / relative
            link.parent.mkdir(parents=True, exist_ok=True)
            if link.is_symlink() or link.exists():
                link.unlink()
            # A link, not a copy: Prometheus resolves relative paths against the link's
            # directory, and an edit to deploy/ shows on the next demo.
            link.symlink_to(source)
        for job in TARGET_JOBS:
            self.targets_dir(job).mkdir(parents=True, exist_ok=True)
        return self

    def targets_dir(self, job: str) -> Path:
        if job not in TARGET_JOBS:
            raise DeployTreeError(f"{job!r} is not one of the file_sd jobs {TARGET_JOBS}")
        return self.prometheus_config.parent / "targets" / job

    def targets_file(self, job: str) -> Path:
        return self.targets_dir(job) / f"{job}.json"

    def write_targets(self, job: str, addresses: Sequence[str]) -> Path:
        path = self.targets_file(job)
        temporary = path.with_suffix(".tmp")
        temporary.write_text(json.dumps([{"targets": list(addresses)}], indent=1))
        temporary.replace(path)  # atomically: Prometheus may read it at any moment
        return path

    def pager_address(self) -> tuple[str, int]:
        """Where the Alertmanager configuration sends pages (the pager listens there)."""
        config = yaml.safe_load((self.repo / ALERTMANAGER_CONFIG).read_text())
        for receiver in config.get("receivers", []):
            for webhook in receiver.get("webhook_configs", []):
                url = urllib.parse.urlsplit(webhook["url"])
                if url.hostname and url.port:
                    return url.hostname, url.port
        raise DeployTreeError(f"{ALERTMANAGER_CONFIG} has no webhook receiver with host:port")
