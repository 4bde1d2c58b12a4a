"""What ``gpufleet simulate`` does: serve a cluster live, or write its history (either one
optionally reporting exclusions and job attempts to a fleet ledger)."""

from __future__ import annotations

import time
from pathlib import Path

from gpufleet.fleet.ledger_client import LedgerClient
from gpufleet.simulate.cluster import Cluster
from gpufleet.simulate.config import Scenario, load_scenario, scenario_names
from gpufleet.simulate.ledger_feed import LedgerEvent, LedgerFeed, ledger_events


class FeedError(RuntimeError):
    """The ledger did not take every event up to the end of the history."""


def scenario_list() -> list[str]:
    """One line per bundled scenario: its name and description."""
    return [f"{name:18} {load_scenario(name).description}" for name in scenario_names()]


def ledger_feed(
    cluster: Cluster, scenario: Scenario, seed: int, url: str, token: str | None
) -> tuple[LedgerFeed, list[LedgerEvent]]:
    """A feed of the cluster's exclusions and job attempts to the ledger at ``url``, and the
    events it will post."""
    events = ledger_events(cluster.timeline, cluster.node_names, scenario.cluster.job, seed)
    return LedgerFeed(LedgerClient(url, token), events), events


def write_history(
    scenario: Scenario,
    seed: int,
    days: float,
    out: Path,
    *,
    end: float | None,
    step: float,
    shards: int,
    fleet_url: str | None = None,
    fleet_token: str | None = None,
) -> str:
    """Write ``days`` of history (and feed the ledger up to its end); a one-line summary."""
    from gpufleet.simulate.history import write_history as write

    result = write(scenario, seed, days, out, end=end, step=step, shards=shards)
    if fleet_url:
        cluster = Cluster(scenario, seed, result.start, result.end - result.start)
        feed, events = ledger_feed(cluster, scenario, seed, fleet_url, fleet_token)
        posted = feed.post_until(result.end)
        if feed.failed or posted < sum(1 for event in events if event.at <= result.end):
            raise FeedError(f"the ledger at {fleet_url} took {posted} of the events")
        print(f"posted {posted} exclusion and attempt events to {fleet_url}")
    return (
        f"wrote {result.samples:,} samples of {scenario.cluster.nodes} nodes x "
        f"{days:g} days in {result.seconds:.1f} s: "
        f"{', '.join(str(path) for path in result.files)}; ground truth: {result.ground_truth}"
    )


def serve_live(
    scenario: Scenario,
    seed: int,
    host: str,
    port: int,
    *,
    horizon_days: float,
    tick: float,
    targets_file: str,
    fleet_url: str | None,
    fleet_token: str | None,
    log_level: str,
) -> None:
    """Serve every node at /nodes/<node>/metrics until SIGINT/SIGTERM."""
    from gpufleet.simulate.serve import SimulatorServer
    from gpufleet.web import serve

    cluster = Cluster(scenario, seed, time.time(), horizon_days * 86400)
    feed = ledger_feed(cluster, scenario, seed, fleet_url, fleet_token)[0] if fleet_url else None
    server = SimulatorServer(cluster, tick_s=tick, feed=feed)
    if targets_file:
        server.write_targets(Path(targets_file), f"{host}:{port}")
    server.start()
    try:
        serve(server, host, port, log_level)
    finally:
        server.stop()
