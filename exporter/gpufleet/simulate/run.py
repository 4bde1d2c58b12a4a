"""What ``gpufleet simulate`` does: serve a cluster live, or write its history (either one
optionally reporting exclusions and job attempts to a fleet ledger)."""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

from gpufleet.fleet.ledger_client import LedgerClient
from gpufleet.simulate.cluster import Cluster
from gpufleet.simulate.config import Scenario, load_scenario, scenario_names
from gpufleet.simulate.ledger_feed import LedgerEvent, LedgerFeed, ledger_events


@dataclass(frozen=True)
class SimulatorRun:
    """How one ``gpufleet simulate`` runs (its flags, named alike): live on ``listen`` for
    ``horizon`` days of timeline, or, with ``history`` days, into files."""

    seed: int
    listen: tuple[str, int]
    horizon: float
    tick: float
    targets_file: str
    history: float | None
    end: float | None
    history_step: float
    shards: int
    rank_series: str  # auto, all or none: gpufleet_training_rank_* series in the history
    fleet_url: str | None
    fleet_token: str | None
    log_level: str


class FeedError(RuntimeError):
    """The ledger did not take every event up to the end of the history."""


def physical_nodes(scenario: Scenario) -> int:
    """The cluster's nodes: every job's and the spare pool's, or the one job's."""
    return sum(job.nodes for job in scenario.jobs) + scenario.spare_nodes or scenario.cluster.nodes


def scenario_list() -> list[str]:
    """One line per bundled scenario: its name and description."""
    return [f"{name:18} {load_scenario(name).description}" for name in scenario_names()]


def ledger_feed(
    cluster: Cluster, scenario: Scenario, run: SimulatorRun
) -> tuple[LedgerFeed, list[LedgerEvent]]:
    """A feed of the cluster's exclusions and job attempts to the run's ledger, and the
    events it will post."""
    events = ledger_events(cluster.timeline, cluster.node_names, scenario.cluster.job, run.seed)
    return LedgerFeed(LedgerClient(run.fleet_url, run.fleet_token), events), events


def write_history_files(scenario: Scenario, run: SimulatorRun, out: Path) -> str:
    """Write ``run.history`` days of history into ``out`` (and feed the ledger up to its
    end); returns a one-line summary."""
    from gpufleet.simulate.history import write_history

    days = run.history or 0.0
    result = write_history(
        scenario,
        run.seed,
        days,
        out,
        end=run.end,
        step=run.history_step,
        shards=run.shards,
        rank_series=run.rank_series,
    )
    if run.fleet_url:
        cluster = Cluster(scenario, run.seed, result.start, result.end - result.start)
        feed, events = ledger_feed(cluster, scenario, run)
        posted = feed.post_until(result.end)
        if feed.failed or posted < sum(1 for event in events if event.at <= result.end):
            raise FeedError(f"the ledger at {run.fleet_url} took {posted} of the events")
        print(f"posted {posted} exclusion and attempt events to {run.fleet_url}")
    return (
        f"wrote {result.samples:,} samples of {physical_nodes(scenario)} nodes x "
        f"{days:g} days in {result.seconds:.1f} s: "
        f"{', '.join(str(path) for path in result.files)}; ground truth: {result.ground_truth}"
    )


def serve_live(scenario: Scenario, run: SimulatorRun) -> None:
    """Serve every node at /nodes/<node>/metrics until SIGINT/SIGTERM."""
    from gpufleet.simulate.serve import SimulatorServer
    from gpufleet.simulate.story import announce
    from gpufleet.web import serve

    host, port = run.listen
    cluster = Cluster(scenario, run.seed, time.time(), run.horizon * 86400)
    feed = ledger_feed(cluster, scenario, run)[0] if run.fleet_url else None
    server = SimulatorServer(cluster, tick_s=run.tick, feed=feed)
    print(announce(scenario.name, cluster.nodes, cluster.gpus, cluster.start), flush=True)
    if run.targets_file:
        server.write_targets(Path(run.targets_file), f"{host}:{port}")
    server.start()
    try:
        serve(server, host, port, run.log_level)
    finally:
        server.stop()
