"""The rule cost of two sets of rules, side by side, on one cluster.

Two Prometheus servers, one per rule folder, scrape the same simulated cluster (live)
or start from copies of the same backfilled history (warm, --warm-hours), at the same
time: both see the same data and the same contention, so their ratio is fair even on
a busy machine. Every 15 s each server's rule groups and rules are read from its API;
the figures are medians over the polls, groups at longer intervals amortized to 15 s.

    python bench/rule_cost.py --before OLD/alerts [--after alerts] [--nodes 512] [--minutes 3]
    python bench/rule_cost.py --before OLD/alerts --warm-hours 2

OLD is another checkout (``git worktree add /tmp/old <commit>``).
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

from gpufleet.lab.devstack import PrometheusServer, file_sd_scrape_config
from gpufleet.lab.processes import ManagedProcess, backfill, free_port, http_get, wait_until
from gpufleet.simulate.config import load_scenario
from gpufleet.simulate.history import write_history

RULES = Path(__file__).resolve().parents[1] / "alerts"


def rule_files(rules_dir: Path) -> list[str]:
    rules = sorted(str(path) for path in rules_dir.glob("*.rules.yaml"))
    if not rules:
        raise SystemExit(f"no *.rules.yaml in {rules_dir}")
    return rules


class Costs:
    """Each poll's group durations and rule evaluation times of one Prometheus."""

    def __init__(self) -> None:
        self.groups: dict[str, list[float]] = defaultdict(list)
        self.rules: dict[str, list[float]] = defaultdict(list)
        self.interval: dict[str, float] = {}
        self._seen: dict[str, str] = {}

    def poll(self, prometheus: PrometheusServer) -> None:
        for group in prometheus.api("rules")["groups"]:
            name = group["name"]
            self.interval[name] = float(group["interval"])
            if self._seen.get(name) == group["lastEvaluation"]:
                continue  # a group at 60 s is counted once per evaluation, not per poll
            self._seen[name] = group["lastEvaluation"]
            self.groups[name].append(float(group["evaluationTime"]))
            for rule in group["rules"]:
                key = f"{rule.get('record') or rule.get('name')}"
                self.rules[key].append(float(rule["evaluationTime"]))

    def group_median(self, name: str) -> float:
        return statistics.median(self.groups[name]) if self.groups.get(name) else 0.0

    def per_15s(self) -> float:
        return sum(
            self.group_median(name) * 15.0 / self.interval.get(name, 15.0) for name in self.groups
        )

    def rule_median(self, name: str) -> float:
        # a rule name can repeat (one record from several rules): the sum of their medians
        return statistics.median(self.rules[name]) if self.rules.get(name) else 0.0


def measure(servers: dict[str, PrometheusServer], minutes: float) -> dict[str, Costs]:
    costs = {label: Costs() for label in servers}
    deadline = time.monotonic() + minutes * 60
    while time.monotonic() < deadline:
        for label, server in servers.items():
            costs[label].poll(server)
        time.sleep(15)
    return costs


def report(costs: dict[str, Costs], servers: dict[str, PrometheusServer], nodes: int) -> None:
    labels = list(costs)
    names = sorted(
        {name for c in costs.values() for name in c.groups},
        key=lambda n: -max(c.group_median(n) for c in costs.values()),
    )
    print(f"  {'group (median of each evaluation)':40}" + "".join(f"{lab:>14}" for lab in labels))
    for name in names:
        interval = max(c.interval.get(name, 15.0) for c in costs.values())
        cells = "".join(
            f"{costs[lab].group_median(name) * 1000:11.1f} ms" if name in costs[lab].groups
            else f"{'-':>14}"
            for lab in labels
        )  # fmt: skip
        print(f"  {name + f' ({interval:.0f} s)':40}{cells}")
    totals = {lab: costs[lab].per_15s() for lab in labels}
    print(f"  {'per 15 s, amortized':40}" + "".join(f"{totals[lab] * 1000:11.0f} ms" for lab in labels))
    rules = sorted(
        {name for c in costs.values() for name in c.rules},
        key=lambda n: -max(c.rule_median(n) for c in costs.values()),
    )[:15]
    print("  costliest rules (median):")
    for name in rules:
        cells = "".join(f"{costs[lab].rule_median(name) * 1000:11.1f} ms" for lab in labels)
        print(f"    {name:58}{cells}")
    for label, server in servers.items():
        head = server.query("prometheus_tsdb_head_series") or []
        if head:
            series = float(head[0]["value"][1])
            print(f"  {label}: head series {series:,.0f} ({series / nodes:.0f} per node)")
    if len(labels) == 2 and totals[labels[0]]:
        ratio = totals[labels[1]] / totals[labels[0]]
        print(
            f"rule_eval_ms_per_15s_{labels[0]}={totals[labels[0]] * 1000:.0f} "
            f"rule_eval_ms_per_15s_{labels[1]}={totals[labels[1]] * 1000:.0f} ratio={ratio:.2f}"
        )


def live(dirs: dict[str, Path], nodes: int, minutes: float, workdir: Path) -> None:
    port = free_port()
    targets = workdir / "targets.json"
    simulator = ManagedProcess(
        [sys.executable, "-m", "gpufleet", "simulate", "--scenario", "realistic-week",
         "--nodes", str(nodes), "--listen", f"127.0.0.1:{port}", "--targets-file", str(targets),
         "--tick", "5"],
        workdir / "simulator.log",
    )  # fmt: skip
    simulator.start()
    servers: dict[str, PrometheusServer] = {}
    try:
        wait_until(lambda: http_get(f"http://127.0.0.1:{port}/healthz") and targets.exists(), 60,
                   what="simulator")  # fmt: skip
        for label, rules_dir in dirs.items():
            servers[label] = PrometheusServer(
                workdir / f"prometheus-{label}",
                scrape_configs=[file_sd_scrape_config("gpufleet-agent", targets, refresh="5s")],
                rule_files=rule_files(rules_dir),
                scrape_interval="15s",
                evaluation_interval="15s",
            ).start()
        for server in servers.values():
            server.wait_for_targets_up(nodes, timeout=180)
        time.sleep(45)  # every target in its scrape slot, the 60 s groups evaluated once
        print(f"\nlive: {nodes} nodes x 8 GPUs, {minutes:g} min, "
              + ", ".join(f"{lab}={path}" for lab, path in dirs.items()))  # fmt: skip
        report(measure(servers, minutes), servers, nodes)
    finally:
        for server in servers.values():
            server.stop()
        simulator.stop()


def warm(dirs: dict[str, Path], nodes: int, hours: float, minutes: float, workdir: Path) -> None:
    scenario = load_scenario("realistic-week").with_cluster(nodes=nodes)
    end = float(int(time.time()) // 30 * 30)
    result = write_history(
        scenario, 0, hours / 24, workdir / "warm-history", end=end, shards=2, every_gpu=True
    )
    tsdb = workdir / "warm-tsdb"
    imported = backfill(result.files, tsdb)
    shutil.rmtree(workdir / "warm-history")
    servers: dict[str, PrometheusServer] = {}
    try:
        for label, rules_dir in dirs.items():
            copy = workdir / f"tsdb-{label}"
            shutil.copytree(tsdb, copy)
            servers[label] = PrometheusServer(
                workdir / f"prometheus-{label}",
                storage_path=copy,
                scrape_configs=[],
                rule_files=rule_files(rules_dir),
                scrape_interval="15s",
                evaluation_interval="15s",
                extra_args=["--storage.tsdb.retention.time=30d"],
            ).start(timeout=300)
        time.sleep(20)
        print(f"\nwarm: {nodes} nodes x 8 GPUs, {hours:g} h backfilled ({result.samples:,} "
              f"samples, imported in {imported:.0f} s), {minutes:g} min, "
              + ", ".join(f"{lab}={path}" for lab, path in dirs.items()))  # fmt: skip
        # the history ends when the servers start: measure while the windows are full
        report(measure(servers, minutes), servers, nodes)
    finally:
        for server in servers.values():
            server.stop()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", type=Path, required=True, help="the old rules' folder")
    parser.add_argument("--after", type=Path, default=RULES, help="default: alerts/")
    parser.add_argument("--nodes", type=int, default=512)
    parser.add_argument("--minutes", type=float, default=3.0)
    parser.add_argument("--warm-hours", type=float, default=0.0,
                        help="evaluate over a backfilled history instead of a live cluster")  # fmt: skip
    args = parser.parse_args()
    dirs = {"before": args.before, "after": args.after}
    for path in dirs.values():
        rule_files(path)
    workdir = Path(tempfile.mkdtemp(prefix="gpufleet-bench-rules-"))
    try:
        if args.warm_hours:
            warm(dirs, args.nodes, args.warm_hours, args.minutes, workdir)
        else:
            live(dirs, args.nodes, args.minutes, workdir)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
