"""``gpufleet kube-watch``: node exclusions from the Kubernetes API into the ledger."""

from __future__ import annotations

import argparse

from gpufleet.cli import kinds, resolve
from gpufleet.cli.options import Command, ConfigError, Option, log_level_option, variables
from gpufleet.sources import kube_signals as signals


def patterns(value: str) -> tuple[str, ...]:
    """Comma-separated names or shell-style patterns (``nvidia.com/*``); empty: none."""
    found = tuple(part.strip() for part in value.split(",") if part.strip())
    if any(" " in part for part in found):
        raise ValueError(f"{value!r} is not a comma-separated list of names or patterns")
    return found


def watch_timeout(value: str) -> int:
    seconds = kinds.positive_int(value)
    if not 30 <= seconds <= 3600:
        raise ValueError(f"{value!r} must be between 30 and 3600 seconds")
    return seconds


# NodeRules' defaults, as the flags' text (kube_signals imports the standard library only).
DEFAULT_TAINTS = ",".join(signals.DEFAULT_TAINTS)
DEFAULT_IGNORED_TAINTS = ",".join(signals.DEFAULT_IGNORED_TAINTS)
DEFAULT_CONDITIONS = ",".join(signals.DEFAULT_CONDITIONS)
# fmt: off
KUBE_WATCH_OPTIONS = variables("GPUFLEET_KUBE_WATCH_", (
    Option("--listen", kinds.listen, "0.0.0.0:9407", "HOST:PORT serving the watcher's /metrics"),
    Option("--fleet-url", kinds.text, "http://127.0.0.1:9406",
           "the ledger (beside it in its pod: loopback)", env="GPUFLEET_FLEET_URL"),
    Option("--fleet-token-file", kinds.text, None,
           "file holding the ledger's write token (else $GPUFLEET_FLEET_TOKEN)",
           env="GPUFLEET_FLEET_TOKEN_FILE"),
    Option("--kubeconfig", kinds.text, None,
           "a kubeconfig to reach the API server with (default: the pod's service account)"),
    Option("--context", kinds.text, None, "the kubeconfig context (default: its current one)"),
    Option("--taints", patterns, DEFAULT_TAINTS,
           "taint keys (NoSchedule / NoExecute) that take a node out of service"),
    Option("--ignore-taints", patterns, DEFAULT_IGNORED_TAINTS,
           "taint keys that never do (nvidia.com/gpu reserves a GPU pool; \"\" for none)"),
    Option("--conditions", patterns, DEFAULT_CONDITIONS,
           "node condition types that take a node out of service while True"),
    Option("--cordon", kinds.boolean, "true",
           "whether a cordon (spec.unschedulable) alone takes a node out of service"),
    Option("--watch-timeout", watch_timeout, "300",
           "seconds each watch request asks the API server to hold it open"),
    log_level_option("GPUFLEET_LOG_LEVEL"),
))
# fmt: on


def run_kube_watch(values: argparse.Namespace) -> int:
    from gpufleet.fleet.ledger_client import LedgerError, token_from_file
    from gpufleet.sources.kube_service import KubeWatchSettings, serve_kube_watch
    from gpufleet.sources.kube_signals import NodeRules
    from gpufleet.sources.kubeapi import in_cluster_access, kubeconfig_access

    resolve.configure_logging(values.log_level)
    if values.context and not values.kubeconfig:
        raise ConfigError("--context needs --kubeconfig")
    try:
        access = (
            kubeconfig_access(values.kubeconfig, values.context)
            if values.kubeconfig
            else in_cluster_access()
        )
    except (OSError, ValueError) as error:
        raise ConfigError(f"--kubeconfig {values.kubeconfig}: {error}" if values.kubeconfig
                          else str(error)) from None  # fmt: skip
    try:
        token = token_from_file(values.fleet_token_file) if values.fleet_token_file else None
    except LedgerError as error:
        raise ConfigError(f"--fleet-token-file: {error}") from None
    rules = NodeRules(values.taints, values.ignore_taints, values.conditions, values.cordon)
    settings = KubeWatchSettings(
        values.listen, values.fleet_url, token, access, rules, values.watch_timeout
    )
    return serve_kube_watch(settings)


KUBE_WATCH = Command(
    "kube-watch",
    run_kube_watch,
    KUBE_WATCH_OPTIONS,
    help="record node exclusions from Kubernetes (cordons, taints, conditions) in the ledger",
    description="Watch the cluster's Node objects (list/watch, bookmarks, 410 resync) and "
    "record each node going out of service (cordoned, tainted, or a GPU health condition) as "
    "an exclusion in the ledger, and its return as a release. Needs get/list/watch on nodes.",
    extra="agent",
    service=True,
)
