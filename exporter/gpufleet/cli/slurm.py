"""``gpufleet slurm-watch``: node exclusions and job requeues from Slurm into the ledger."""

from __future__ import annotations

import argparse
import re
from pathlib import Path

from gpufleet.cli import kinds, resolve
from gpufleet.cli.options import Command, ConfigError, Option, log_level_option, variables


def cluster_name(value: str) -> str:
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}", value):
        raise ValueError(f"{value!r} is not a Slurm cluster name (letters, digits, _ . -)")
    return value


def poll_interval(value: str) -> float:
    seconds = kinds.number(value, "a number of seconds")
    if not 1 <= seconds <= 600:
        raise ValueError(f"{value!r} must be between 1 and 600 seconds")
    return seconds


# fmt: off
SLURM_WATCH_OPTIONS = variables("GPUFLEET_SLURM_WATCH_", (
    Option("--listen", kinds.listen, "0.0.0.0:9408", "HOST:PORT serving the watcher's /metrics"),
    Option("--fleet-url", kinds.text, "http://127.0.0.1:9406", "the ledger",
           env="GPUFLEET_FLEET_URL"),
    Option("--fleet-token-file", kinds.text, None,
           "file holding the ledger's write token (else $GPUFLEET_FLEET_TOKEN)",
           env="GPUFLEET_FLEET_TOKEN_FILE"),
    Option("--cluster", cluster_name, None,
           "the cluster's name in the writes' keys (default: slurm.conf's ClusterName)"),
    Option("--interval", poll_interval, "15", "seconds between two polls of sinfo and squeue"),
    Option("--state-file", kinds.text, "/var/lib/gpufleet/slurm-watch.json",
           "where the watcher keeps its queued writes and the keys already answered "
           "(\"\": in memory only)"),
    Option("--attempts", kinds.choice("requeued", "all", "off"), "requeued",
           "which jobs' attempts to record: those requeued at least once, every job, none"),
    Option("--max-event-age", kinds.window, "6d",
           "changes older than this that the state file does not know are skipped, not sent "
           "(keep it under the ledger's 7-day key window)"),
    log_level_option("GPUFLEET_LOG_LEVEL"),
))
# fmt: on


def run_slurm_watch(values: argparse.Namespace) -> int:
    from gpufleet.fleet.ledger_client import LedgerError, token_from_file
    from gpufleet.sources.slurm_service import SlurmWatchSettings, serve_slurm_watch

    resolve.configure_logging(values.log_level)
    try:
        token = token_from_file(values.fleet_token_file) if values.fleet_token_file else None
    except LedgerError as error:
        raise ConfigError(f"--fleet-token-file: {error}") from None
    state_file = Path(values.state_file) if values.state_file else None
    if state_file is not None and not state_file.parent.is_dir():
        raise ConfigError(f"--state-file {state_file}: its directory does not exist")
    settings = SlurmWatchSettings(
        values.listen,
        values.fleet_url,
        token,
        values.cluster,
        values.interval,
        state_file,
        values.attempts,
        values.max_event_age,
    )
    return serve_slurm_watch(settings)


SLURM_WATCH = Command(
    "slurm-watch",
    run_slurm_watch,
    SLURM_WATCH_OPTIONS,
    help="record node drains and job requeues from Slurm in the ledger",
    description="Poll sinfo --json and squeue --json (one watcher per cluster, beside "
    "slurmctld, with the Slurm client commands on PATH) and record each node drained, down "
    "or failed as an exclusion in the ledger, its return as a release, and each job requeue "
    "as the end of one attempt and the start of the next.",
    extra="agent",
    service=True,
)
