"""``gpufleet fleet`` (the ledger) and the operators' commands that talk to it."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from gpufleet.cli import kinds, resolve
from gpufleet.cli.options import Command, ConfigError, Group, Option, log_level_option, variables

# fmt: off
FLEET_OPTIONS = variables("GPUFLEET_FLEET_", (
    Option("--listen", kinds.listen, "0.0.0.0:9406", "HOST:PORT to serve on"),
    Option("--db", kinds.text, "gpufleet-fleet.db", "SQLite database file"),
    Option("--token", kinds.text, None,
           "bearer token for writes and reads; prefer --token-file (a flag shows in `ps`)"),
    Option("--token-file", kinds.text, None,
           "file holding the bearer token for writes and reads (e.g. a mounted Secret)"),
    Option("--read-token", kinds.text, None,
           "a second token that may only read /v1 (prefer --read-token-file)"),
    Option("--read-token-file", kinds.text, None, "file holding the read-only token"),
    Option("--allow-unauthenticated-writes", kinds.boolean, "false",
           "without a token, accept writes from beyond loopback too (otherwise they get 403)",
           switch=True),
    Option("--max-nodes", kinds.positive_int, "10000",
           "excluded nodes /metrics exports at most (writes are never refused for it)"),
    Option("--max-training-jobs", kinds.positive_int, "2000",
           "training jobs /metrics exports at most, the most recently written first"),
    Option("--max-exclusion-series", kinds.positive_int, "10000",
           "(node, reason, source) exclusion series /metrics exports at most, newest first"),
    Option("--export-retention", kinds.window, "40d",
           "how long /metrics keeps a series after its last change; longer than the rules' "
           "longest window (reliability_window, 30d), e.g. 40d"),
    Option("--idempotency-window", kinds.window, "7d",
           "how long an Idempotency-Key is remembered (a retry must come within it), e.g. 7d, 48h"),
    log_level_option("GPUFLEET_LOG_LEVEL"),
))
# fmt: on

# The flags every command that talks to a running ledger takes. The tokens' variables are
# read by LedgerClient (GPUFLEET_FLEET_TOKEN wins over GPUFLEET_FLEET_TOKEN_FILE there).
LEDGER_OPTIONS = (
    Option(
        "--fleet-url", kinds.text, "http://127.0.0.1:9406", "the ledger", env="GPUFLEET_FLEET_URL"
    ),
    Option(
        "--token",
        kinds.text,
        None,
        "bearer token (default: $GPUFLEET_FLEET_TOKEN, else the file named by "
        "$GPUFLEET_FLEET_TOKEN_FILE); prefer --token-file, a flag shows in `ps`",
    ),
    Option("--token-file", kinds.text, None, "file holding the bearer token"),
)


def run_fleet(values: argparse.Namespace) -> int:
    from gpufleet.fleet.exported import LedgerLimits
    from gpufleet.fleet.service import LedgerOpenError, open_ledger, serve_ledger

    resolve.configure_logging(values.log_level)
    token, read_token = resolve.secret(values, "token"), resolve.secret(values, "read_token")
    limits = resolve.settings(
        LedgerLimits,
        values,
        idempotency_window_s=values.idempotency_window,
        export_retention_s=values.export_retention,
    )
    try:
        store = open_ledger(values.db, limits)
    except LedgerOpenError as error:
        raise ConfigError(f"--db {values.db}: {error}") from None
    host, port = values.listen
    serve_ledger(
        store,
        host,
        port,
        token=token,
        read_token=read_token,
        allow_unauthenticated_writes=values.allow_unauthenticated_writes,
        log_level=values.log_level,
    )
    return 0


def ledger_client(values: argparse.Namespace) -> Any:
    from gpufleet.fleet.ledger_client import LedgerClient, token_from_file

    if values.token and values.token_file:
        raise ConfigError("set --token or --token-file, not both")
    token = token_from_file(values.token_file) if values.token_file else values.token
    return LedgerClient(values.fleet_url, token)


def run_exclude(values: argparse.Namespace) -> int:
    fields = {"source": values.source, "note": values.note}
    if values.job:
        fields["training_job"] = values.job
    stored = ledger_client(values).exclude(values.node, values.reason, **fields)
    print(f"excluded {stored['node']} (exclusion {stored['id']})")
    return 0


def run_release(values: argparse.Namespace) -> int:
    stored = ledger_client(values).release(values.node, note=values.note)
    print(f"released {stored['node']}")
    return 0


def run_exclusions_top(values: argparse.Namespace) -> int:
    top = ledger_client(values).get("/v1/exclusions/top", days=values.days)
    print(f"exclusions in the last {values.days:g} days: {top['total']} on {top['nodes']} nodes")
    print(f"{'rank':>4}  {'node':24} {'exclusions':>10} {'share':>7}")
    for rank, row in enumerate(top["leaderboard"], start=1):
        print(f"{rank:>4}  {row['node']:24} {row['exclusions']:>10} {row['share']:>7.1%}")
    print(f"top 3 nodes: {top['top3_share']:.1%} of all exclusions")
    return 0


def run_report(values: argparse.Namespace) -> int:
    from gpufleet.fleet.report import (
        ReportError,
        build_report,
        parse_since,
        read_ledger,
        write_report,
    )
    from gpufleet.promapi import PrometheusApi, PrometheusError

    try:
        since = parse_since(values.since)
        ledger = read_ledger(values.db, None if values.db else ledger_client(values))
        out = Path(values.out)
        report = build_report(
            PrometheusApi(values.prometheus), ledger, out, since, until=values.until
        )
        path = write_report(report, out, values.format)
    except (ReportError, PrometheusError) as error:
        print(f"gpufleet report: {error}", file=sys.stderr)
        return 1
    print(f"report written to {path} ({len(report.images)} charts)")
    return 0


FLEET = Command(
    "fleet",
    run_fleet,
    FLEET_OPTIONS,
    help="run the cluster's fleet ledger (exclusions, job attempts, recoveries)",
    description="A durable ledger (SQLite, WAL) of node exclusions and job attempts, with "
    "an HTTP API and Prometheus metrics.",
    extra="agent",
    service=True,
)
EXCLUDE = Command(
    "exclude",
    run_exclude,
    (
        Option("node", kinds.text, None, ""),
        Option(
            "--reason", kinds.text, None, "why, e.g. xid79, ecc, slow, maintenance", required=True
        ),
        Option("--source", kinds.choice("manual", "auto"), "manual", "who decided: manual or auto"),
        Option("--job", kinds.text, None, "the training job it was excluded from"),
        Option("--note", kinds.text, "", "free text for the postmortem"),
        *LEDGER_OPTIONS,
    ),
    help="record that a node is taken out of service",
)
RELEASE = Command(
    "release",
    run_release,
    (Option("node", kinds.text, None, ""), Option("--note", kinds.text, "", ""), *LEDGER_OPTIONS),
    help="record that a node is back in service",
)
REPORT = Command(
    "report",
    run_report,
    (
        Option("--prometheus", kinds.text, None, "Prometheus URL", required=True),
        Option("--since", kinds.text, "30d", "period to cover, e.g. 12h, 30d"),
        Option("--until", kinds.number, None, "end of the period, Unix time (default: now)"),
        Option("--out", kinds.text, "gpufleet-report", "output directory"),
        Option("--format", kinds.choice("md", "html"), "md", "md or html"),
        Option("--db", kinds.text, None, "read the ledger's SQLite file instead of its API"),
        *LEDGER_OPTIONS,
    ),
    help="write a postmortem / capacity-review report (Markdown or HTML, PNG charts)",
    description="Exclusion leaderboard and concentration, incidents by cause, fail-slow "
    "episodes per node, checkpoint queue-wait share, auto vs manual recovery, fleet MTBF "
    "and the Young/Daly checkpoint interval, from the ledger and Prometheus.",
    extra="report",
)
EXCLUSIONS = Group(
    "exclusions",
    "query exclusions",
    (
        Command(
            "top",
            run_exclusions_top,
            (Option("--days", kinds.number, "30", "the period, in days"), *LEDGER_OPTIONS),
            help="nodes by exclusions, their share and the top-3 share",
        ),
    ),
)
