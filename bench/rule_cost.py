"""The rule cost of two sets of rules, side by side, on one cluster.

Two Prometheus servers, one per rule folder, scrape the same simulated cluster (live)
or start from copies of the same backfilled history (warm, --warm-hours), at the same
time: both see the same data and the same contention, so their ratio is fair even on
a busy machine. Every 15 s each server's rule groups and rules are read from its API;
the figures are medians over the polls, groups at longer intervals amortized to 15 s.

Prometheus starts each group at an offset within its interval hashed from the group's
name and file path: two servers loading the same rules from two folders evaluate them
at different moments, and on a busy machine that alone moved one group's median by 2x
between identical rule sets. So both load their rules through one path (a link switched
to each folder before its server starts): the same group runs at the same moment on
both, and they share the machine alike. Each server's CPU seconds over the run are
printed too: unlike evaluation times, they do not grow when the machine is busy.

    python bench/rule_cost.py --before REV [--after alerts] [--nodes 512] [--minutes 3]
    python bench/rule_cost.py --before OLD/alerts --warm-hours 2

``--before`` is a folder of rule files or a git revision of this repository, whose
``alerts/*.rules.yaml`` are taken (``git show``). The cluster is the current code's
simulator for both: the figures compare the rules, not what the agent exports.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import subprocess
import tempfile
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

from gpufleet.lab.devstack import PrometheusServer, file_sd_scrape_config, rules_in
from gpufleet.lab.processes import (
    backfill,
    http_get,
    process_cpu_seconds,
    start_simulator,
    wait_until,
)
from gpufleet.simulate.config import load_scenario
from gpufleet.simulate.history import write_history

RULES = Path(__file__).resolve().parents[1] / "alerts"


def start_all(dirs: dict[str, Path], workdir: Path, make: Any) -> dict[str, PrometheusServer]:
    """One server per rule folder, each loading its rules through the same path (see the
    module's docstring); ``make(label, rule_files)`` builds an unstarted server."""
    link = workdir / "rules"
    servers: dict[str, PrometheusServer] = {}
    for label, rules_dir in dirs.items():
        link.unlink(missing_ok=True)
        link.symlink_to(rules_dir.resolve(), target_is_directory=True)
        files = [str(link / Path(path).name) for path in rules_in(rules_dir)]
        server = make(label, files)
        servers[label] = server
        server.start(timeout=300)
        # loaded at start-up: the link may move on once the server lists every group
        wait_until(lambda s=server: s.api("rules")["groups"], 60, what=f"{label}'s rules")
    return servers


def own_metric(server: PrometheusServer, name: str) -> float:
    """One of the server's own metrics, from its /metrics (it does not scrape itself)."""
    for line in http_get(f"{server.url}/metrics", timeout=10.0).decode().splitlines():
        if line.startswith(f"{name} "):
            return float(line.split()[1])
    raise RuntimeError(f"{name} not found on {server.url}/metrics")


def cpu_seconds(server: PrometheusServer) -> float:
    assert server.process is not None and server.process.pid is not None
    return process_cpu_seconds(server.process.pid)


class Costs:
    """Each poll's group durations and rule evaluation times of one Prometheus."""

    def __init__(self) -> None:
        self.groups: dict[str, list[float]] = defaultdict(list)
        self.rules: dict[str, list[float]] = defaultdict(list)
        self.interval: dict[str, float] = {}
        self._seen: dict[str, str] = {}
        self.cpu_per_15s = 0.0  # the server's CPU seconds (rules, scrapes, all) per 15 s

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
    cpu = {label: cpu_seconds(server) for label, server in servers.items()}
    started = time.monotonic()
    deadline = started + minutes * 60
    while time.monotonic() < deadline:
        for label, server in servers.items():
            costs[label].poll(server)
        time.sleep(15)
    wall = time.monotonic() - started
    for label, server in servers.items():
        costs[label].cpu_per_15s = (cpu_seconds(server) - cpu[label]) / wall * 15
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
    amortized = "".join(f"{totals[lab] * 1000:11.0f} ms" for lab in labels)
    print(f"  {'per 15 s, amortized':40}{amortized}")
    cpu = {lab: costs[lab].cpu_per_15s for lab in labels}
    print(f"  {'server CPU per 15 s (rules, scrapes, all)':40}"
          + "".join(f"{cpu[lab] * 1000:11.0f} ms" for lab in labels))  # fmt: skip
    rules = sorted(
        {name for c in costs.values() for name in c.rules},
        key=lambda n: -max(c.rule_median(n) for c in costs.values()),
    )[:15]
    print("  costliest rules (median):")
    for name in rules:
        cells = "".join(f"{costs[lab].rule_median(name) * 1000:11.1f} ms" for lab in labels)
        print(f"    {name:58}{cells}")
    for label, server in servers.items():
        series = own_metric(server, "prometheus_tsdb_head_series")
        per_node = f"{series / nodes:.1f} per node, recorded included"
        print(f"  {label}: head series {series:,.0f} ({per_node})")
    if len(labels) == 2 and totals[labels[0]]:
        ratio = totals[labels[1]] / totals[labels[0]]
        print(
            f"rule_eval_ms_per_15s_{labels[0]}={totals[labels[0]] * 1000:.0f} "
            f"rule_eval_ms_per_15s_{labels[1]}={totals[labels[1]] * 1000:.0f} ratio={ratio:.2f} "
            f"cpu_ms_per_15s_{labels[0]}={cpu[labels[0]] * 1000:.0f} "
            f"cpu_ms_per_15s_{labels[1]}={cpu[labels[1]] * 1000:.0f}"
        )


def live(dirs: dict[str, Path], nodes: int, minutes: float, workdir: Path) -> None:
    simulator, targets = start_simulator(workdir, nodes)
    servers: dict[str, PrometheusServer] = {}
    try:
        servers.update(start_all(dirs, workdir, lambda label, files: PrometheusServer(
            workdir / f"prometheus-{label}",
            scrape_configs=[file_sd_scrape_config("gpufleet-agent", targets, refresh="5s")],
            rule_files=files,
            scrape_interval="15s",
            evaluation_interval="15s",
        )))  # fmt: skip
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
        for label in dirs:
            shutil.copytree(tsdb, workdir / f"tsdb-{label}")
        servers.update(start_all(dirs, workdir, lambda label, files: PrometheusServer(
            workdir / f"prometheus-{label}",
            storage_path=workdir / f"tsdb-{label}",
            scrape_configs=[],
            rule_files=files,
            scrape_interval="15s",
            evaluation_interval="15s",
            extra_args=["--storage.tsdb.retention.time=30d"],
        )))  # fmt: skip
        time.sleep(20)
        print(f"\nwarm: {nodes} nodes x 8 GPUs, {hours:g} h backfilled ({result.samples:,} "
              f"samples, imported in {imported:.0f} s), {minutes:g} min, "
              + ", ".join(f"{lab}={path}" for lab, path in dirs.items()))  # fmt: skip
        # the history ends when the servers start: measure while the windows are full
        report(measure(servers, minutes), servers, nodes)
    finally:
        for server in servers.values():
            server.stop()


def rules_of(before: str, workdir: Path) -> Path:
    """``before`` as a folder of rule files: itself, or a revision's ``alerts/``."""
    if Path(before).is_dir():
        return Path(before)
    repo = RULES.parent
    listed = subprocess.run(
        ["git", "-C", str(repo), "ls-tree", "--name-only", before, "alerts/"],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    names = [name for name in listed.stdout.split() if name.endswith(".rules.yaml")]
    if listed.returncode or not names:
        raise SystemExit(f"--before {before}: neither a folder nor a revision with alerts/")
    folder = workdir / "before-rules"
    folder.mkdir()
    for name in names:
        text = subprocess.run(
            ["git", "-C", str(repo), "show", f"{before}:{name}"],
            capture_output=True, text=True, check=True,
        ).stdout  # fmt: skip
        (folder / Path(name).name).write_text(text)
    return folder


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", required=True, help="the old rules' folder, or a revision")
    parser.add_argument("--after", type=Path, default=RULES, help="default: alerts/")
    parser.add_argument("--nodes", type=int, default=512)
    parser.add_argument("--minutes", type=float, default=3.0)
    parser.add_argument(
        "--warm-hours",
        type=float,
        default=0.0,
        help="evaluate over a backfilled history instead of a live cluster",
    )
    args = parser.parse_args()
    workdir = Path(tempfile.mkdtemp(prefix="gpufleet-bench-rules-"))
    try:
        dirs = {"before": rules_of(args.before, workdir), "after": args.after}
        for path in dirs.values():
            rules_in(path)  # before anything starts
        if args.warm_hours:
            warm(dirs, args.nodes, args.warm_hours, args.minutes, workdir)
        else:
            live(dirs, args.nodes, args.minutes, workdir)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
