"""The demo's Prometheus and Alertmanager configuration, laid out as docker compose does.

``docker compose up`` and ``make demo`` run the same files under ``deploy/``. Those
files name no host: Prometheus finds its targets and Alertmanagers through file_sd
lists under ``targets/<job>/`` beside its configuration, and the pager listens on
the loopback address the Alertmanager webhook names. :class:`DeployTree` builds
the tree compose mounts (``<root>/deploy/prometheus/prometheus.yml``,
``<root>/alerts``) in a work directory and writes the target lists with this
machine's addresses.

In a checkout the two configurations are symbolic links to ``deploy/`` (the files
compose mounts); installed from a wheel, where no ``deploy/`` exists, they are
copied from the package. The package's ``gpufleet/deploy/`` files are links to
``deploy/``'s, which the wheel and the sdist carry as the files themselves: one
committed copy. The rules are always generated into ``<root>/alerts`` by the
package's own rule generator, the same code that writes ``alerts/``.
"""

from __future__ import annotations

import json
import urllib.parse
from collections.abc import Sequence
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

import yaml

PROMETHEUS_CONFIG = Path("deploy/prometheus/prometheus.yml")
ALERTMANAGER_CONFIG = Path("deploy/alertmanager/alertmanager.yml")
CONFIGS = (PROMETHEUS_CONFIG, ALERTMANAGER_CONFIG)
# Where the package links CONFIGS: gpufleet/deploy/<...> for deploy/<...>.
PACKAGE_COPIES = Path("exporter/gpufleet")
# file_sd directories the Prometheus configuration reads (targets/<job>/*.json).
TARGET_JOBS = ("agents", "fleet", "alertmanager")


def find_checkout() -> Path | None:
    """The repository this package runs from, if it is a checkout with ``deploy/`` (not a wheel)."""
    root = Path(__file__).resolve().parents[3]
    if (root / "pyproject.toml").exists() and all((root / path).exists() for path in CONFIGS):
        return root
    return None


CHECKOUT = find_checkout()


class DeployTreeError(RuntimeError):
    pass


@dataclass(frozen=True, slots=True)
class DeployTree:
    """The compose layout in ``root``: ``deploy/``'s configurations and generated rules.

    ``checkout`` is the repository whose ``deploy/`` files are linked; None (a wheel
    install) copies the package's copies of them instead."""

    root: Path
    checkout: Path | None = CHECKOUT
    # Another port for the pager than the configuration's (a second demo on one machine,
    # tests): the Alertmanager configuration is then a copy with only that port changed.
    pager_port: int | None = None

    @property
    def prometheus_config(self) -> Path:
        return self.root / PROMETHEUS_CONFIG

    @property
    def alertmanager_config(self) -> Path:
        return self.root / ALERTMANAGER_CONFIG

    @property
    def rules_dir(self) -> Path:
        return self.root / "alerts"

    def prepare(self) -> DeployTree:
        from gpufleet.rules.__main__ import write_rules

        for relative in CONFIGS:
            target = self.root / relative
            target.parent.mkdir(parents=True, exist_ok=True)
            if target.is_symlink() or target.exists():
                target.unlink()
            if self.checkout is not None:
                # A link, not a copy: an edit to deploy/ shows on the next demo, and the
                # demo runs the very file compose mounts.
                target.symlink_to(self.checkout / relative)
            else:
                target.write_bytes(packaged_config(relative))
        if self.pager_port is not None:
            self._move_pager(self.pager_port)
        if self.rules_dir.is_symlink():
            self.rules_dir.unlink()  # a work directory laid out by an older gpufleet
        for stale in self.rules_dir.glob("*.rules.yaml"):
            stale.unlink()
        write_rules(self.rules_dir)
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

    def _move_pager(self, port: int) -> None:
        host, configured = self.pager_address()
        text = self.alertmanager_config.read_text()
        moved = text.replace(f"//{host}:{configured}/", f"//{host}:{port}/")
        if moved == text and port != configured:
            raise DeployTreeError(f"{ALERTMANAGER_CONFIG}: no webhook URL is {host}:{configured}")
        self.alertmanager_config.unlink()  # a link to deploy/: replace it, never write through it
        self.alertmanager_config.write_text(moved)

    def pager_address(self) -> tuple[str, int]:
        """Where the Alertmanager configuration sends pages (the pager listens there)."""
        config = yaml.safe_load(self.alertmanager_config.read_text())
        for receiver in config.get("receivers", []):
            for webhook in receiver.get("webhook_configs", []):
                url = urllib.parse.urlsplit(webhook["url"])
                if url.hostname and url.port:
                    return url.hostname, url.port
        raise DeployTreeError(f"{ALERTMANAGER_CONFIG} has no webhook receiver with host:port")


def packaged_config(relative: Path) -> bytes:
    """The package's copy of ``deploy/...`` file ``relative``."""
    copy = resources.files("gpufleet").joinpath(*relative.parts)
    if not copy.is_file():
        raise DeployTreeError(f"the installed gpufleet package has no {relative}")
    return copy.read_bytes()
