"""The ``gpufleet`` command.

Every flag of a long-running service can also be set from a ``GPUFLEET_*``
environment variable (the Helm chart and compose file set those); a flag on the
command line wins over the environment.
"""

from __future__ import annotations

import argparse
import logging
import os
import re
import socket
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from gpufleet import __version__
from gpufleet.fleet.ledger_client import LedgerError
from gpufleet.secrets import SecretFileError, read_secret_file

LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"

# `pip install gpufleet` is the training client alone (standard library only); each
# service's dependencies come with an extra (pyproject.toml). The extra a command needs,
# and the extra that brings each third-party module, for the one-line hint when it is missing.
COMMAND_EXTRAS = {
    "agent": "agent",
    "fleet": "agent",
    "nvml-record": "agent",
    "simulate": "sim",
    "demo": "sim",
    "mixin": "sim",
    "report": "report",
}
MODULE_EXTRAS = {
    **dict.fromkeys(
        ("fastapi", "starlette", "pydantic", "uvicorn", "prometheus_client", "pynvml"), "agent"
    ),
    **dict.fromkeys(("numpy", "yaml"), "sim"),
    **dict.fromkeys(("pandas", "matplotlib"), "report"),
}


class ConfigError(Exception):
    """A flag or environment value is unusable; the message names it and what is accepted."""


def _env(name: str) -> str | None:
    value = os.environ.get(name)
    return value if value not in (None, "") else None


def _listen(text: str) -> tuple[str, int]:
    host, sep, port_text = text.rpartition(":")
    if not sep or not port_text.isdigit() or not 0 < int(port_text) < 65536:
        raise ValueError(f"{text!r} is not HOST:PORT (for example 0.0.0.0:9405)")
    return host.strip("[]") or "0.0.0.0", int(port_text)  # noqa: S104 - a node agent serves the node


def _positive_seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise ValueError(f"{text!r} is not a number of seconds") from None
    if not 0 < value <= 3600:
        raise ValueError(f"{text!r} must be between 0 and 3600 seconds")
    return value


def _ttl_seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise ValueError(f"{text!r} is not a number of seconds") from None
    if not 60 <= value <= 7 * 86400:
        raise ValueError(f"{text!r} must be between 60 seconds and 7 days")
    return value


def _text(text: str) -> str:
    return text


def _positive_int(text: str) -> int:
    if not text.isdigit() or int(text) <= 0:
        raise ValueError(f"{text!r} is not a positive whole number")
    return int(text)


def _boolean(text: str) -> bool:
    if text.lower() in ("1", "true", "yes", "on"):
        return True
    if text.lower() in ("0", "false", "no", "off"):
        return False
    raise ValueError(f"{text!r} is not true or false")


def _window(text: str) -> float:
    units = {"s": 1, "m": 60, "h": 3600, "d": 86400}
    number, unit = (text[:-1], text[-1]) if text[-1:] in units else (text, "s")
    try:
        value = float(number) * units[unit]
    except ValueError:
        raise ValueError(f"{text!r} is not a duration such as 7d, 48h or 3600") from None
    if not 3600 <= value <= 365 * 86400:
        raise ValueError(f"{text!r} must be between 1 hour and 365 days")
    return value


def _label_name(text: str) -> str:
    if not re.fullmatch(r"[a-zA-Z_][a-zA-Z0-9_]*", text):
        raise ValueError(f"{text!r} is not a Prometheus label name")
    return text


def _choice(*choices: str) -> Callable[[str], str]:
    def parse(text: str) -> str:
        if text not in choices:
            raise ValueError(f"{text!r} is not one of: {', '.join(choices)}")
        return text

    return parse


class _Option:
    """A flag with an environment fallback and a parser whose errors name both."""

    def __init__(
        self,
        flag: str,
        env: str,
        parse: Callable[[str], Any],
        default: str | None,
        help_text: str,
        *,
        switch: bool = False,
    ) -> None:
        self.flag = flag
        self.env = env
        self.parse = parse
        self.default = default
        self.help = help_text
        self.switch = switch  # a flag without a value; the environment says true or false

    @property
    def dest(self) -> str:
        return self.flag.lstrip("-").replace("-", "_")

    def add_to(self, parser: argparse.ArgumentParser) -> None:
        if self.switch:
            parser.add_argument(
                self.flag, dest=self.dest, action="store_const", const="true",
                help=f"{self.help} [env {self.env}=true]",
            )  # fmt: skip
            return
        shown = f" (default: {self.default})" if self.default is not None else ""
        parser.add_argument(self.flag, dest=self.dest, help=f"{self.help}{shown} [env {self.env}]")

    def resolve(self, namespace: argparse.Namespace) -> Any:
        raw: str | None = getattr(namespace, self.dest)
        origin = self.flag
        if raw is None:
            raw, origin = _env(self.env), self.env
        if raw is None:
            raw, origin = self.default, f"default of {self.flag}"
        if raw is None:
            return None
        try:
            return self.parse(raw)
        except ValueError as error:
            raise ConfigError(f"{origin}: {error}") from None


# Both servers log the same way.
_LOG_LEVEL = _Option(
    "--log-level",
    "GPUFLEET_LOG_LEVEL",
    _choice("debug", "info", "warning", "error"),
    "info",
    "log level",
)

AGENT_OPTIONS = (
    _Option("--listen", "GPUFLEET_LISTEN", _listen, "0.0.0.0:9405", "HOST:PORT to serve on"),
    _Option(
        "--gpu-source",
        "GPUFLEET_GPU_SOURCE",
        _choice("nvml", "synthetic", "none"),
        "nvml",
        "where GPU metrics come from: nvml (the driver), synthetic (demo data for 8 H100s) "
        "or none (training-metrics ingest only)",
    ),
    _Option(
        "--gpu-interval",
        "GPUFLEET_GPU_INTERVAL",
        _positive_seconds,
        "5",
        "seconds between NVML collection cycles",
    ),
    _Option(
        "--node",
        "GPUFLEET_NODE",
        str,
        None,
        "node name on every series (default: $NODE_NAME, else the hostname)",
    ),
    _Option(
        "--node-label",
        "GPUFLEET_NODE_LABEL",
        _label_name,
        "Hostname",
        "label naming the node on GPU series: Hostname as every released dcgm-exporter, "
        "or hostname as its main branch",
    ),
    _Option(
        "--expected-gpus",
        "GPUFLEET_EXPECTED_GPUS",
        _positive_int,
        None,
        "GPUs this node should have; fewer seen is reported (default: as many as first seen)",
    ),
    _Option(
        "--nvml-call-timeout",
        "GPUFLEET_NVML_CALL_TIMEOUT",
        _positive_seconds,
        None,
        "seconds after which an NVML call that has not returned counts as hung "
        "(default: the GPU interval, at least 5)",
    ),
    _Option(
        "--gpu-stale-after",
        "GPUFLEET_GPU_STALE_AFTER",
        _positive_seconds,
        None,
        "seconds after which a snapshot is too old to serve (default: 3 intervals, at least 15)",
    ),
    _Option(
        "--ingest-token-file",
        "GPUFLEET_INGEST_TOKEN_FILE",
        _text,
        None,
        "file holding the bearer token required to POST training events (a mounted Secret); "
        "the token may also come from $GPUFLEET_INGEST_TOKEN, never from a flag",
    ),
    _Option(
        "--allow-unauthenticated-ingest",
        "GPUFLEET_ALLOW_UNAUTHENTICATED_INGEST",
        _boolean,
        "false",
        "without a token, accept training events from beyond loopback too (by default only "
        "loopback clients may write when no token is set)",
        switch=True,
    ),
    _Option(
        "--job-ttl",
        "GPUFLEET_JOB_TTL",
        _ttl_seconds,
        "900",
        "seconds after which a training job that stopped reporting is forgotten",
    ),
    _Option(
        "--max-jobs", "GPUFLEET_MAX_JOBS", _positive_int, "16", "training jobs tracked at once"
    ),
    _Option(
        "--max-stages",
        "GPUFLEET_MAX_STAGES",
        _positive_int,
        "64",
        "(training_job, pp_stage) pairs tracked at once",
    ),
    _Option(
        "--max-ranks-per-stage",
        "GPUFLEET_MAX_RANKS_PER_STAGE",
        _positive_int,
        "64",
        "ranks tracked per (training_job, pp_stage)",
    ),
    _Option(
        "--max-series",
        "GPUFLEET_MAX_SERIES",
        _positive_int,
        "5000",
        "training and checkpoint series exported, in all",
    ),
    _Option(
        "--max-batch-events",
        "GPUFLEET_MAX_BATCH_EVENTS",
        _positive_int,
        "4096",
        "events accepted in one POST",
    ),
    _Option(
        "--max-body-bytes",
        "GPUFLEET_MAX_BODY_BYTES",
        _positive_int,
        str(2 * 1024 * 1024),
        "largest ingest body accepted",
    ),
    _Option(
        "--max-connections",
        "GPUFLEET_MAX_CONNECTIONS",
        _positive_int,
        "512",
        "HTTP connections held open; beyond it the oldest idle one is closed",
    ),
    _Option(
        "--max-connections-per-client",
        "GPUFLEET_MAX_CONNECTIONS_PER_CLIENT",
        _positive_int,
        "64",
        "HTTP connections one client address may hold",
    ),
    _LOG_LEVEL,
)


FLEET_OPTIONS = (
    _Option("--listen", "GPUFLEET_FLEET_LISTEN", _listen, "0.0.0.0:9406", "HOST:PORT to serve on"),
    _Option("--db", "GPUFLEET_FLEET_DB", _text, "gpufleet-fleet.db", "SQLite database file"),
    _Option(
        "--token",
        "GPUFLEET_FLEET_TOKEN",
        _text,
        None,
        "bearer token for writes and reads; prefer --token-file (a flag shows in `ps`)",
    ),
    _Option(
        "--token-file",
        "GPUFLEET_FLEET_TOKEN_FILE",
        _text,
        None,
        "file holding the bearer token for writes and reads (e.g. a mounted Secret)",
    ),
    _Option(
        "--read-token",
        "GPUFLEET_FLEET_READ_TOKEN",
        _text,
        None,
        "a second token that may only read /v1 (prefer --read-token-file)",
    ),
    _Option(
        "--read-token-file",
        "GPUFLEET_FLEET_READ_TOKEN_FILE",
        _text,
        None,
        "file holding the read-only token",
    ),
    _Option(
        "--allow-unauthenticated-writes",
        "GPUFLEET_FLEET_ALLOW_UNAUTHENTICATED_WRITES",
        _boolean,
        "false",
        "without a token, accept writes from beyond loopback too (otherwise they get 403)",
        switch=True,
    ),
    _Option(
        "--max-nodes",
        "GPUFLEET_FLEET_MAX_NODES",
        _positive_int,
        "10000",
        "distinct node label values the ledger exports, ever (beyond: 429)",
    ),
    _Option(
        "--max-training-jobs",
        "GPUFLEET_FLEET_MAX_TRAINING_JOBS",
        _positive_int,
        "500",
        "distinct training_job label values the ledger exports, ever (beyond: 429)",
    ),
    _Option(
        "--max-reasons",
        "GPUFLEET_FLEET_MAX_REASONS",
        _positive_int,
        "256",
        "distinct exclusion reasons the ledger exports, ever (beyond: 429)",
    ),
    _Option(
        "--max-exclusion-series",
        "GPUFLEET_FLEET_MAX_EXCLUSION_SERIES",
        _positive_int,
        "10000",
        "distinct (node, reason, source) exclusion series, ever (beyond: 429)",
    ),
    _Option(
        "--idempotency-window",
        "GPUFLEET_FLEET_IDEMPOTENCY_WINDOW",
        _window,
        "7d",
        "how long an Idempotency-Key is remembered (a retry must come within it), e.g. 7d, 48h",
    ),
    _LOG_LEVEL,
)


def node_name(explicit: str | None) -> str:
    """The node identity: --node / GPUFLEET_NODE, else NODE_NAME (downward API), else hostname."""
    return explicit or _env("NODE_NAME") or socket.gethostname()


def ingest_token(token_file: str | None) -> str | None:
    """The agent's ingest token: from --ingest-token-file / GPUFLEET_INGEST_TOKEN_FILE, else
    GPUFLEET_INGEST_TOKEN. Never from a flag: a command line is visible in ``ps``."""
    from_env = _env("GPUFLEET_INGEST_TOKEN")
    if token_file is None:
        return from_env.strip() if from_env else None
    if from_env:
        raise ConfigError(
            "both an ingest token file (--ingest-token-file / GPUFLEET_INGEST_TOKEN_FILE) and "
            "GPUFLEET_INGEST_TOKEN are set; keep one"
        )
    return _read_secret("--ingest-token-file", token_file)


def _read_secret(flag: str, path: str) -> str:
    try:
        return read_secret_file(path)
    except SecretFileError as error:
        raise ConfigError(f"{flag}: {error}") from None


def _run_agent(namespace: argparse.Namespace) -> int:
    from gpufleet.agent.app import Agent, AgentSettings, serve_agent
    from gpufleet.agent.connections import ConnectionLimits
    from gpufleet.agent.training_aggregate import IngestLimits
    from gpufleet.gpu.reader import NvmlUnavailable

    values = {option.dest: option.resolve(namespace) for option in AGENT_OPTIONS}
    logging.basicConfig(level=values["log_level"].upper(), format=LOG_FORMAT)
    token = ingest_token(values["ingest_token_file"])
    host, port = values["listen"]
    settings = AgentSettings(
        node=node_name(values["node"]),
        host=host,
        port=port,
        gpu_source=values["gpu_source"],
        gpu_interval=values["gpu_interval"],
        expected_gpus=values["expected_gpus"],
        stale_after=values["gpu_stale_after"],
        nvml_call_timeout=values["nvml_call_timeout"],
        ingest_token=token,
        allow_unauthenticated_ingest=values["allow_unauthenticated_ingest"],
        node_label=values["node_label"],
        limits=IngestLimits(
            job_ttl_s=values["job_ttl"],
            max_jobs=values["max_jobs"],
            max_stages=values["max_stages"],
            max_ranks_per_stage=values["max_ranks_per_stage"],
            max_series=values["max_series"],
            max_batch_events=values["max_batch_events"],
            max_body_bytes=values["max_body_bytes"],
        ),
        connections=ConnectionLimits(
            max_connections=values["max_connections"],
            max_connections_per_client=values["max_connections_per_client"],
        ),
    )
    agent = Agent(settings)
    try:
        agent.open()
    except NvmlUnavailable as error:
        print(
            f"gpufleet agent: {error}. On a machine without NVIDIA GPUs use "
            "--gpu-source none (training-metrics ingest only) or --gpu-source synthetic (demo).",
            file=sys.stderr,
        )
        return 1
    log = logging.getLogger("gpufleet.agent")
    if token is None and settings.allow_unauthenticated_ingest:
        log.warning(
            "the ingest API on %s:%d accepts training events from anyone who can reach it "
            "(--allow-unauthenticated-ingest)",
            host,
            port,
        )
    elif token is None:
        log.info(
            "no ingest token: training events are accepted from loopback only; set "
            "--ingest-token-file (or GPUFLEET_INGEST_TOKEN) for clients beyond it"
        )
    serve_agent(agent, values["log_level"])
    return 0


def _secret(values: dict[str, Any], name: str) -> str | None:
    """A token from its flag / variable or from its file, never both; errors name the source."""
    flag = name.replace("_", "-")
    direct, path = values[name], values[f"{name}_file"]
    if direct and path:
        raise ConfigError(f"set --{flag} or --{flag}-file, not both")
    if not path:
        return str(direct) if direct else None
    return _read_secret(f"--{flag}-file", path)


def _run_fleet(namespace: argparse.Namespace) -> int:
    from gpufleet.fleet.app import create_app
    from gpufleet.fleet.store import LedgerLimits, LedgerStore
    from gpufleet.web import serve

    values = {option.dest: option.resolve(namespace) for option in FLEET_OPTIONS}
    logging.basicConfig(level=values["log_level"].upper(), format=LOG_FORMAT)
    host, port = values["listen"]
    token, read_token = _secret(values, "token"), _secret(values, "read_token")
    limits = LedgerLimits(
        max_nodes=values["max_nodes"],
        max_training_jobs=values["max_training_jobs"],
        max_reasons=values["max_reasons"],
        max_exclusion_series=values["max_exclusion_series"],
        idempotency_window_s=values["idempotency_window"],
    )
    try:
        store = LedgerStore(values["db"], limits=limits)
    except (OSError, sqlite3_error()) as error:
        raise ConfigError(f"--db {values['db']}: cannot open the database: {error}") from None
    log = logging.getLogger("gpufleet.fleet")
    if not token and values["allow_unauthenticated_writes"]:
        log.warning(
            "the ledger on %s:%d accepts writes from anyone who can reach it "
            "(--allow-unauthenticated-writes); set --token-file to require a bearer token",
            host,
            port,
        )
    elif not token and host not in ("127.0.0.1", "::1", "localhost"):
        log.warning(
            "the ledger has no write token: writes from beyond loopback get 403 "
            "(set --token-file, or --allow-unauthenticated-writes to accept them)"
        )
    app = create_app(
        store,
        token,
        read_token=read_token,
        allow_unauthenticated_writes=values["allow_unauthenticated_writes"],
    )
    try:
        serve(app, host, port, values["log_level"])
    finally:
        store.close()
    return 0


def sqlite3_error() -> type[Exception]:
    import sqlite3

    return sqlite3.Error


def _ledger(namespace: argparse.Namespace) -> Any:
    from gpufleet.fleet.ledger_client import LedgerClient, token_from_file

    if namespace.token and namespace.token_file:
        raise ConfigError("set --token or --token-file, not both")
    token = token_from_file(namespace.token_file) if namespace.token_file else namespace.token
    return LedgerClient(namespace.fleet_url, token)


def _run_exclude(namespace: argparse.Namespace) -> int:
    fields = {"source": namespace.source, "note": namespace.note}
    if namespace.job:
        fields["training_job"] = namespace.job
    stored = _ledger(namespace).exclude(namespace.node, namespace.reason, **fields)
    print(f"excluded {stored['node']} (exclusion {stored['id']})")
    return 0


def _run_release(namespace: argparse.Namespace) -> int:
    stored = _ledger(namespace).release(namespace.node, note=namespace.note)
    print(f"released {stored['node']}")
    return 0


def _run_exclusions_top(namespace: argparse.Namespace) -> int:
    top = _ledger(namespace).get("/v1/exclusions/top", days=namespace.days)
    print(f"exclusions in the last {namespace.days:g} days: {top['total']} on {top['nodes']} nodes")
    print(f"{'rank':>4}  {'node':24} {'exclusions':>10} {'share':>7}")
    for rank, row in enumerate(top["leaderboard"], start=1):
        print(f"{rank:>4}  {row['node']:24} {row['exclusions']:>10} {row['share']:>7.1%}")
    print(f"top 3 nodes: {top['top3_share']:.1%} of all exclusions")
    return 0


def _run_report(namespace: argparse.Namespace) -> int:
    from gpufleet.fleet.report import (
        LedgerData,
        ReportError,
        build_report,
        parse_since,
        write_report,
    )
    from gpufleet.promapi import PrometheusApi, PrometheusError

    try:
        since = parse_since(namespace.since)
        if namespace.db:
            from gpufleet.fleet.store import LedgerStore

            if not Path(namespace.db).exists():
                raise ReportError(f"--db {namespace.db}: no such file")
            store = LedgerStore(namespace.db)
            ledger = LedgerData(store.exclusions(), store.attempts())
            store.close()
        else:
            client = _ledger(namespace)
            ledger = LedgerData(client.get_all("/v1/exclusions"), client.get_all("/v1/attempts"))
        out = Path(namespace.out)
        report = build_report(
            PrometheusApi(namespace.prometheus), ledger, out, since, until=namespace.until
        )
        path = write_report(report, out, namespace.format)
    except (ReportError, PrometheusError) as error:
        print(f"gpufleet report: {error}", file=sys.stderr)
        return 1
    print(f"report written to {path} ({len(report.images)} charts)")
    return 0


def _run_nvml_record(namespace: argparse.Namespace) -> int:
    import json
    import time

    import pynvml

    from gpufleet.exposition import render
    from gpufleet.gpu.reader import NvmlReader, NvmlUnavailable
    from gpufleet.gpu.record import RecordingNvml
    from gpufleet.gpu.render import gpu_families

    recorder = RecordingNvml(pynvml)
    reader = NvmlReader(recorder, node_name(namespace.node))
    try:
        reader.open()
    except NvmlUnavailable as error:
        print(f"gpufleet nvml-record: {error}", file=sys.stderr)
        return 1
    reader.read()
    time.sleep(1.0)  # GPM metrics are rates between two samples
    snapshot = reader.read()
    reader.close()
    with open(namespace.out, "w", encoding="utf-8") as handle:
        json.dump(recorder.fixture(), handle, indent=1)
        handle.write("\n")
    if namespace.metrics_out:
        with open(namespace.metrics_out, "wb") as handle:
            handle.write(render(gpu_families(snapshot)))
    print(
        f"recorded {len(snapshot.gpus)} GPUs into {namespace.out}; "
        f"errors: {reader.errors.snapshot() or 'none'}; unsupported: {snapshot.unsupported}"
    )
    return 0


def _run_simulate(namespace: argparse.Namespace) -> int:
    import time

    from gpufleet.simulate.config import ScenarioError, load_scenario, scenario_names

    if namespace.list_scenarios:
        for name in scenario_names():
            scenario = load_scenario(name)
            print(f"{name:18} {scenario.description}")
        return 0
    logging.basicConfig(level=namespace.log_level.upper(), format=LOG_FORMAT)
    try:
        scenario = load_scenario(namespace.scenario).with_cluster(
            nodes=namespace.nodes,
            gpus_per_node=namespace.gpus_per_node,
            layout=namespace.layout,
        )
        scenario.cluster.resolved_layout()
    except ScenarioError as error:
        raise ConfigError(str(error)) from None
    shared = namespace.history is None or namespace.fleet_url or namespace.nodes or namespace.layout
    if scenario.jobs and shared:
        raise ConfigError(
            f"scenario {scenario.name} runs several jobs (a shared cluster): write its history "
            "with --history; serving live, --fleet-url, --nodes and --layout are for one job"
        )
    nodes = sum(job.nodes for job in scenario.jobs) + scenario.spare_nodes or scenario.cluster.nodes
    if namespace.history is not None:
        from gpufleet.simulate.history import write_history

        if namespace.out is None:
            raise ConfigError("--history needs --out DIR")
        result = write_history(
            scenario,
            namespace.seed,
            namespace.history,
            Path(namespace.out),
            end=namespace.end,
            step=namespace.history_step,
            shards=namespace.shards,
            rank_series=namespace.rank_series,
        )
        if namespace.fleet_url:
            _feed_ledger(namespace, scenario, result.start, result.end)
        print(
            f"wrote {result.samples:,} samples of {nodes} nodes x "
            f"{namespace.history:g} days in {result.seconds:.1f} s: "
            f"{', '.join(str(path) for path in result.files)}; ground truth: {result.ground_truth}"
        )
        return 0
    from gpufleet.simulate.cluster import Cluster
    from gpufleet.simulate.serve import SimulatorServer
    from gpufleet.web import serve

    host, port = namespace.listen
    cluster = Cluster(scenario, namespace.seed, time.time(), namespace.horizon * 86400)
    feed = None
    if namespace.fleet_url:
        from gpufleet.fleet.ledger_client import LedgerClient
        from gpufleet.simulate.ledger_feed import LedgerFeed, ledger_events

        events = ledger_events(
            cluster.timeline, cluster.node_names, scenario.cluster.job, namespace.seed
        )
        feed = LedgerFeed(LedgerClient(namespace.fleet_url, namespace.fleet_token), events)
    server = SimulatorServer(cluster, tick_s=namespace.tick, feed=feed)
    if namespace.targets_file:
        server.write_targets(Path(namespace.targets_file), f"{host}:{port}")
    server.start()
    try:
        serve(server, host, port, namespace.log_level)
    finally:
        server.stop()
    return 0


def _feed_ledger(namespace: argparse.Namespace, scenario: Any, start: float, end: float) -> None:
    from gpufleet.fleet.ledger_client import LedgerClient
    from gpufleet.simulate.cluster import Cluster
    from gpufleet.simulate.ledger_feed import LedgerFeed, ledger_events

    cluster = Cluster(scenario, namespace.seed, start, end - start)
    events = ledger_events(
        cluster.timeline, cluster.node_names, scenario.cluster.job, namespace.seed
    )
    feed = LedgerFeed(LedgerClient(namespace.fleet_url, namespace.fleet_token), events)
    posted = feed.post_until(end)
    if feed.failed or posted < sum(1 for event in events if event.at <= end):
        raise ConfigError(f"the ledger at {namespace.fleet_url} took {posted} of the events")
    print(f"posted {posted} exclusion and attempt events to {namespace.fleet_url}")


def _listen_flag(text: str) -> tuple[str, int]:
    try:
        return _listen(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def _run_demo(namespace: argparse.Namespace) -> int:

    from gpufleet.demo import run_demo

    return run_demo(
        Path(namespace.workdir),
        namespace.scenario,
        namespace.nodes,
        pager_port=namespace.pager_port,
    )


def _run_mixin(namespace: argparse.Namespace) -> int:
    from gpufleet.rules.__main__ import generate
    from gpufleet.rules.config import ConfigError as RulesConfigError

    try:
        written = generate(namespace.out, namespace.config)
    except RulesConfigError as error:
        raise ConfigError(str(error)) from None
    for path in written:
        print(f"wrote {path}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="gpufleet",
        description="Observability for large GPU training clusters.",
    )
    parser.add_argument("--version", action="version", version=f"gpufleet {__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    agent = commands.add_parser(
        "agent",
        help="run the per-node agent (GPU metrics and training-metrics ingest)",
        description="Serve DCGM-compatible GPU metrics and the training-metrics ingest API.",
        # No abbreviations: "--ingest-token SECRET" must fail, not read a file named SECRET.
        allow_abbrev=False,
    )
    for option in AGENT_OPTIONS:
        option.add_to(agent)
    agent.set_defaults(run=_run_agent)

    record = commands.add_parser(
        "nvml-record",
        help="record this machine's NVML answers as a test fixture",
        description="Run one collection through real NVML and save every answer as a fixture "
        "that the tests' fake NVML replays.",
    )
    record.add_argument("--out", required=True, help="fixture JSON to write")
    record.add_argument("--metrics-out", help="also write the GPU part of /metrics here")
    record.add_argument("--node", help="node name for the labels (default: hostname)")
    record.set_defaults(run=_run_nvml_record)

    _add_simulate(commands)
    _add_fleet_commands(commands)
    demo = commands.add_parser(
        "demo",
        help="run a local demo stack (simulator, Prometheus, Alertmanager) until Ctrl-C",
        description="Start a 64-node simulated cluster, a real Prometheus and Alertmanager on "
        "127.0.0.1, and print their URLs.",
    )
    demo.add_argument("--workdir", default=".demo", help="where logs and data go")
    demo.add_argument("--scenario", default="demo", help="simulator scenario (default: demo)")
    demo.add_argument("--nodes", type=int, default=64, help="simulated nodes (default: 64)")
    demo.add_argument(
        "--pager-port",
        type=int,
        help="run the pager on this port instead of the one deploy/alertmanager/alertmanager.yml "
        "names (9407): Alertmanager then reads a copy with only that port changed",
    )
    demo.set_defaults(run=_run_demo)

    mixin = commands.add_parser(
        "mixin",
        help="write the alerting and recording rules with a site's own settings",
        description="Generate gpufleet's rule files with the knobs of a site YAML (scrape job "
        "selectors, node label names, thresholds, presence alerts) over the defaults.",
    )
    mixin.add_argument("--config", help="site YAML of knobs (default: none, the defaults)")
    mixin.add_argument("--out", default="gpufleet-rules", help="directory for the rule files")
    mixin.set_defaults(run=_run_mixin)
    return parser


Commands = Any  # argparse's private _SubParsersAction


def _add_simulate(commands: Commands) -> None:
    simulate = commands.add_parser(
        "simulate",
        help="serve a synthetic cluster as scrape targets, or write its history",
        description="A seeded synthetic cluster of N nodes x G GPUs training one synchronous "
        "job, with realistic faults. Serves every node at /nodes/<node>/metrics, or with "
        "--history writes DAYS of it as OpenMetrics (for promtool) plus the ground truth.",
    )
    simulate.add_argument("--nodes", type=int, help="nodes (default: the scenario's)")
    simulate.add_argument("--gpus-per-node", type=int, help="GPUs per node (default: 8)")
    simulate.add_argument("--layout", help="DPxPPxTP, e.g. 8x4x8 (default: TP = GPUs per node)")
    simulate.add_argument(
        "--scenario", default="realistic-week", help="a bundled scenario name or a YAML file"
    )
    simulate.add_argument("--list-scenarios", action="store_true", help="list bundled scenarios")
    simulate.add_argument("--seed", type=int, default=0, help="random seed (default: 0)")
    simulate.add_argument(
        "--listen", type=_listen_flag, default=("127.0.0.1", 9500), help="HOST:PORT to serve on"
    )
    simulate.add_argument(
        "--targets-file",
        default="gpufleet-sim-targets.json",
        help="Prometheus file_sd file to write (default: gpufleet-sim-targets.json; '' for none)",
    )
    simulate.add_argument("--tick", type=float, default=1.0, help="seconds between updates")
    simulate.add_argument(
        "--horizon", type=float, default=30.0, help="days of timeline to draw up (live mode)"
    )
    simulate.add_argument("--history", type=float, metavar="DAYS", help="write DAYS of history")
    simulate.add_argument("--out", help="directory for the history and its ground truth")
    simulate.add_argument("--end", type=float, help="Unix time the history ends (default: now)")
    simulate.add_argument(
        "--history-step", type=float, default=30.0, help="seconds between history samples"
    )
    simulate.add_argument("--shards", type=int, default=2, help="processes writing the history")
    simulate.add_argument(
        "--rank-series",
        choices=["auto", "all", "none"],
        default="auto",
        help="write per-rank compute series in the history (auto: jobs with at most 4 nodes "
        "per pipeline stage)",
    )
    simulate.add_argument(
        "--fleet-url", help="also report exclusions and job attempts to this fleet ledger"
    )
    simulate.add_argument("--fleet-token", help="the ledger's bearer token, if it needs one")
    simulate.add_argument("--log-level", default="warning", choices=["debug", "info", "warning"])
    simulate.set_defaults(run=_run_simulate)


def _add_fleet_commands(commands: Commands) -> None:
    fleet = commands.add_parser(
        "fleet",
        help="run the cluster's fleet ledger (exclusions, job attempts, recoveries)",
        description="A durable ledger (SQLite, WAL) of node exclusions and job attempts, with "
        "an HTTP API and Prometheus metrics.",
    )
    for option in FLEET_OPTIONS:
        option.add_to(fleet)
    fleet.set_defaults(run=_run_fleet)

    def ledger_flags(sub: argparse.ArgumentParser) -> None:
        sub.add_argument(
            "--fleet-url", help="the ledger (default: $GPUFLEET_FLEET_URL or http://127.0.0.1:9406)"
        )
        sub.add_argument(
            "--token",
            help="bearer token (default: $GPUFLEET_FLEET_TOKEN, else the file named by "
            "$GPUFLEET_FLEET_TOKEN_FILE); prefer --token-file, a flag shows in `ps`",
        )
        sub.add_argument("--token-file", help="file holding the bearer token")

    exclude = commands.add_parser("exclude", help="record that a node is taken out of service")
    exclude.add_argument("node")
    exclude.add_argument("--reason", required=True, help="why, e.g. xid79, ecc, slow, maintenance")
    exclude.add_argument("--source", choices=["manual", "auto"], default="manual")
    exclude.add_argument("--job", help="the training job it was excluded from")
    exclude.add_argument("--note", default="", help="free text for the postmortem")
    ledger_flags(exclude)
    exclude.set_defaults(run=_run_exclude)

    release = commands.add_parser("release", help="record that a node is back in service")
    release.add_argument("node")
    release.add_argument("--note", default="")
    ledger_flags(release)
    release.set_defaults(run=_run_release)

    report = commands.add_parser(
        "report",
        help="write a postmortem / capacity-review report (Markdown or HTML, PNG charts)",
        description="Exclusion leaderboard and concentration, incidents by cause, fail-slow "
        "episodes per node, checkpoint queue-wait share, auto vs manual recovery, fleet MTBF "
        "and the Young/Daly checkpoint interval, from the ledger and Prometheus.",
    )
    report.add_argument("--prometheus", required=True, help="Prometheus URL")
    report.add_argument("--since", default="30d", help="period to cover, e.g. 12h, 30d (default)")
    report.add_argument("--until", type=float, help="end of the period, Unix time (default: now)")
    report.add_argument("--out", default="gpufleet-report", help="output directory")
    report.add_argument("--format", choices=["md", "html"], default="md")
    report.add_argument("--db", help="read the ledger's SQLite file instead of its API")
    ledger_flags(report)
    report.set_defaults(run=_run_report)

    exclusions = commands.add_parser("exclusions", help="query exclusions")
    views = exclusions.add_subparsers(dest="view", metavar="VIEW", required=True)
    top = views.add_parser("top", help="nodes by exclusions, their share and the top-3 share")
    top.add_argument("--days", type=float, default=30.0)
    ledger_flags(top)
    top.set_defaults(run=_run_exclusions_top)


def missing_extra_hint(command: str, module: str | None) -> str | None:
    """What to install when ``command`` failed to import ``module`` (None: not one of ours)."""
    top = (module or "").split(".")[0]
    if top not in MODULE_EXTRAS:
        return None
    extra = COMMAND_EXTRAS.get(command, MODULE_EXTRAS[top])
    return f"{top} is not installed; this command needs pip install 'gpufleet[{extra}]'"


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    namespace = parser.parse_args(argv)
    run: Callable[[argparse.Namespace], int] = namespace.run
    try:
        return run(namespace)
    except ConfigError as error:
        parser.exit(2, f"gpufleet {namespace.command}: {error}\n")
    except ModuleNotFoundError as error:
        hint = missing_extra_hint(namespace.command, error.name)
        if hint is None:
            raise
        parser.exit(1, f"gpufleet {namespace.command}: {hint}\n")
    except LedgerError as error:  # the ledger refused the command, or cannot be reached
        command = " ".join(filter(None, (namespace.command, getattr(namespace, "view", None))))
        print(f"gpufleet {command}: {error}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
