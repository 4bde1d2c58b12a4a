"""``gpufleet simulate``, ``gpufleet demo`` and ``gpufleet mixin``."""

from __future__ import annotations

import argparse
from pathlib import Path

from gpufleet.cli import kinds, resolve
from gpufleet.cli.options import Command, ConfigError, Option, log_level_option, variables

# fmt: off
SIMULATE_OPTIONS = variables("GPUFLEET_SIM_", (
    Option("--nodes", kinds.integer, None, "nodes (default: the scenario's)"),
    Option("--gpus-per-node", kinds.integer, None, "GPUs per node (default: 8)"),
    Option("--layout", kinds.text, None, "DPxPPxTP, e.g. 8x4x8 (default: TP = GPUs per node)"),
    Option("--scenario", kinds.text, "realistic-week", "a bundled scenario name or a YAML file"),
    Option("--list-scenarios", kinds.boolean, "false", "list bundled scenarios", switch=True),
    Option("--seed", kinds.integer, "0", "random seed"),
    Option("--listen", kinds.listen, "127.0.0.1:9500", "HOST:PORT to serve on"),
    Option("--targets-file", kinds.text, "gpufleet-sim-targets.json",
           "Prometheus file_sd file to write ('' for none)"),
    Option("--tick", kinds.number, "1", "seconds between updates"),
    Option("--compress", kinds.number, "1",
           "run the scenario FACTOR times faster (for rules with windows FACTOR times shorter)",
           metavar="FACTOR"),
    Option("--horizon", kinds.number, "30", "days of timeline to draw up (live mode)"),
    Option("--history", kinds.number, None, "write DAYS of history", metavar="DAYS"),
    Option("--out", kinds.text, None, "directory for the history and its ground truth"),
    Option("--end", kinds.number, None, "Unix time the history ends (default: now)"),
    Option("--history-step", kinds.number, "30", "seconds between history samples"),
    Option("--shards", kinds.integer, "2", "processes writing the history"),
    Option("--rank-series", kinds.choice("auto", "all", "none"), "auto",
           "write per-rank compute series in the history "
           "(auto: jobs with at most 4 nodes per pipeline stage)"),
    Option("--fleet-url", kinds.text, None,
           "also report exclusions and job attempts to this ledger"),
    # The ledger's own variable, as every command that talks to the ledger reads it.
    Option("--fleet-token", kinds.text, None,
           "the ledger's bearer token, if it needs one (else from $GPUFLEET_FLEET_TOKEN_FILE)",
           env="GPUFLEET_FLEET_TOKEN"),
    log_level_option("GPUFLEET_SIM_LOG_LEVEL", default="warning"),
))
DEMO_OPTIONS = variables("GPUFLEET_DEMO_", (
    Option("--workdir", kinds.text, ".demo", "where logs and data go"),
    Option("--scenario", kinds.text, "demo", "simulator scenario"),
    Option("--nodes", kinds.integer, "64", "simulated nodes"),
    Option("--pager-port", kinds.integer, None,
           "run the pager on this port instead of the one deploy/alertmanager/alertmanager.yml "
           "names (9407): Alertmanager then reads a copy with only that port changed"),
))
# fmt: on


def run_simulate(values: argparse.Namespace) -> int:
    from gpufleet.simulate.config import ScenarioError, load_scenario
    from gpufleet.simulate.run import (
        FeedError,
        SimulatorRun,
        scenario_list,
        serve_live,
        write_history_files,
    )

    if values.list_scenarios:
        print("\n".join(scenario_list()))
        return 0
    resolve.configure_logging(values.log_level)
    try:
        scenario = load_scenario(values.scenario).with_cluster(
            nodes=values.nodes, gpus_per_node=values.gpus_per_node, layout=values.layout
        )
        scenario.cluster.resolved_layout()
        if values.compress != 1:
            scenario = scenario.compressed(values.compress)
    except ScenarioError as error:
        raise ConfigError(str(error)) from None
    shared = values.history is None or values.fleet_url or values.nodes or values.layout
    if scenario.jobs and shared:
        raise ConfigError(
            f"scenario {scenario.name} runs several jobs (a shared cluster): write its history "
            "with --history; serving live, --fleet-url, --nodes and --layout are for one job"
        )
    run = resolve.settings(SimulatorRun, values)
    if run.history is None:
        serve_live(scenario, run)
        return 0
    if values.out is None:
        raise ConfigError("--history needs --out DIR")
    try:
        print(write_history_files(scenario, run, Path(values.out)))
    except FeedError as error:
        raise ConfigError(str(error)) from None
    return 0


def run_demo(values: argparse.Namespace) -> int:
    from gpufleet.lab.demo import run_demo_stack

    return run_demo_stack(
        Path(values.workdir), values.scenario, values.nodes, pager_port=values.pager_port
    )


def run_mixin(values: argparse.Namespace) -> int:
    from gpufleet.rules.__main__ import generate
    from gpufleet.rules.config import ConfigError as RulesConfigError

    try:
        written = generate(values.out, values.config)
    except RulesConfigError as error:
        raise ConfigError(str(error)) from None
    for path in written:
        print(f"wrote {path}")
    return 0


SIMULATE = Command(
    "simulate",
    run_simulate,
    SIMULATE_OPTIONS,
    help="serve a synthetic cluster as scrape targets, or write its history",
    description="A seeded synthetic cluster of N nodes x G GPUs training one synchronous "
    "job, with realistic faults. Serves every node at /nodes/<node>/metrics, or with "
    "--history writes DAYS of it as OpenMetrics (for promtool) plus the ground truth.",
    extra="sim",
    service=True,
)
DEMO = Command(
    "demo",
    run_demo,
    DEMO_OPTIONS,
    help="run a local demo stack (simulator, Prometheus, Alertmanager) until Ctrl-C",
    description="Start a 64-node simulated cluster, a real Prometheus and Alertmanager on "
    "127.0.0.1, and print their URLs.",
    extra="sim",
    service=True,
)
MIXIN = Command(
    "mixin",
    run_mixin,
    (
        Option("--config", kinds.text, None, "site YAML of knobs (default: none, the defaults)"),
        Option("--out", kinds.text, "gpufleet-rules", "directory for the rule files"),
    ),
    help="write the alerting and recording rules with a site's own settings",
    description="Generate gpufleet's rule files with the knobs of a site YAML (scrape job "
    "selectors, node label names, thresholds, presence alerts) over the defaults.",
    extra="sim",
)
