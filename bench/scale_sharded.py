"""One Prometheus beside the sharded layout, measured from 64 to 2,048 nodes x 8 GPUs.

For each size the simulator serves the demo's story on N nodes: a straggler (node 12,
from 0:20), every node checkpointing at once (1:20), an XID 79 that loses GPU 3 of
node 40 and stops the job (8:00), and an automatic retry slow enough (5 minutes) that
the job pages as hung first. Set-ups scraping it every 15 s with the shipped rules:

- one Prometheus evaluating every rule file (sizes up to --single-max);
- --shards Prometheus servers, each keeping the nodes of its hash (docs/SCALING.md) and
  evaluating gpu.rules.yaml, remote-writing only what the global files read
  (gpufleet.rules.sharding) to two global rulers, each evaluating the other files
  every 15 s: a Prometheus receiving the remote write, and VictoriaMetrics + vmalert.

All run at once on the same simulator, so their costs are measured side by side on a
shared machine. Per size: head series, the rule evaluation per 15 s (groups at longer
intervals amortized) and the costliest groups, the longest group against its interval,
missed iterations, the scrape duration, samples per second, each shard's remote-write
lag, CPU and memory of every process. At the story size (default: the largest) the
run lasts the whole story and the alerts are compared: the shards with the global
Prometheus must fire what one Prometheus fires, for the same nodes, each first seen
within one evaluation interval of its group (the training groups run every 30 s; the
median alert within 15 s), plus the 1 s send and a 2 s poll on each side; with
vmalert, the same alerts (how late each is, is printed).

    python bench/scale_sharded.py                            # 64 ... 2,048 nodes, ~35 min
    python bench/scale_sharded.py --nodes 64 --shards 2      # the story at 64 nodes, ~16 min
    python bench/scale_sharded.py --nodes 512 --story-nodes 0 --minutes 4
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

from gpufleet.lab.devstack import AlertmanagerServer, PrometheusServer
from gpufleet.lab.processes import (
    PROMETHEUS3_BIN,
    PROMETHEUS_MAJOR_VARIABLE,
    ManagedProcess,
    http_get,
    process_cpu_seconds,
    process_rss_mib,
    wait_until,
)
from gpufleet.lab.sharded import (
    RULERS,
    Firsts,
    ShardedLayout,
    StoryServer,
    compare,
    expected_story,
    prometheus,
    scraped,
)
from gpufleet.promapi import PrometheusApi
from gpufleet.rules.config import duration_seconds

ROOT = Path(__file__).resolve().parents[1]
RULES = ROOT / "alerts"
EVALUATION_S = 15.0
POLL_S = 2.0
STORY_S = 14 * 60  # the hang pages by about 11:00; the retry comes at 13:00
# the median alert: one 15 s evaluation interval, the remote write's 1 s send deadline, a
# poll on each side; each alert: its own group's interval in place of the 15 s
ALLOWED_S = EVALUATION_S + 1.0 + 2 * POLL_S
LATENCY = "5s"  # VictoriaMetrics's -search.latencyOffset and vmalert's -rule.evalDelay


@dataclass
class Usage:
    """CPU seconds and peak memory of one process over the measured window."""

    pid: int
    cpu_start: float = 0.0
    cpu: float = 0.0
    rss_mib: float = 0.0

    def begin(self) -> None:
        self.cpu_start = process_cpu_seconds(self.pid)

    def sample(self) -> None:
        self.rss_mib = max(self.rss_mib, process_rss_mib(self.pid))

    def end(self) -> None:
        self.cpu = process_cpu_seconds(self.pid) - self.cpu_start


def pid_of(process: ManagedProcess | None) -> int:
    assert process is not None and process.pid is not None, "not started"
    return process.pid


def prometheus_costs(server: PrometheusServer, window_s: float) -> dict[str, Any]:
    """Series, rule evaluation per 15 s (amortized), longest group and scrape duration of
    one Prometheus, from its own metrics over the last ``window_s``."""
    window = f"{max(60, int(window_s))}s"
    own = 'job="prometheus"'

    def one(expr: str) -> float:
        result = server.query(expr)
        return float(result[0]["value"][1]) if result else float("nan")

    # each group's mean evaluation as its share of 15 s (a 1-minute group counts a quarter)
    groups = {
        sample["metric"]["rule_group"].split(";")[-1]: float(sample["value"][1])
        for sample in server.query(
            f"avg_over_time(prometheus_rule_group_last_duration_seconds{{{own}}}[{window}])"
            f" * {EVALUATION_S} / on (rule_group) prometheus_rule_group_interval_seconds{{{own}}}"
        )
    }
    longest = max(groups, key=lambda group: groups[group], default="-")
    # how far the remote write's sending trails what was appended (a shard's; none elsewhere)
    lag = (
        f"max(prometheus_remote_storage_highest_timestamp_in_seconds{{{own}}}"
        " - ignoring (remote_name, url) group_right"
        f" prometheus_remote_storage_queue_highest_sent_timestamp_seconds{{{own}}})"
    )
    return {
        # the node's series and what the rules record from them; not Prometheus's own
        "series": one("prometheus_tsdb_head_series") - one(f"count({{{own}}})"),
        # scraped, recorded and (the global Prometheus) received by remote write
        "samples_per_s": one(
            f"sum(rate(prometheus_tsdb_head_samples_appended_total{{{own}}}[{window}]))"
        ),
        "groups": groups,
        "remote_lag_p50_s": one(f"quantile_over_time(0.5, ({lag})[{window}:{EVALUATION_S:g}s])"),
        "remote_lag_max_s": one(f"max_over_time(({lag})[{window}:{EVALUATION_S:g}s])"),
        "eval_s_per_15s": sum(groups.values()) if groups else float("nan"),
        "longest_share": groups[longest] / EVALUATION_S if groups else float("nan"),
        "longest_group": longest,
        "missed": one(
            f"sum(increase(prometheus_rule_group_iterations_missed_total{{{own}}}[{window}]))"
        ),
        "scrape_p50_ms": 1000
        * one(
            "quantile(0.5, avg_over_time(scrape_duration_seconds"
            f'{{job="gpufleet-agent"}}[{window}]))'
        ),
        "scrape_max_ms": 1000
        * one(f'max(max_over_time(scrape_duration_seconds{{job="gpufleet-agent"}}[{window}]))'),
    }


def samples(url: str) -> list[Sample]:
    """Every sample a server's /metrics page serves."""
    text = http_get(f"{url}/metrics", timeout=10.0).decode()
    return [sample for family in text_string_to_metric_families(text) for sample in family.samples]


def vmalert_iterations(url: str) -> dict[tuple[str, str], float]:
    """vmalert's per-group evaluation seconds and iteration counts so far."""
    found: dict[tuple[str, str], float] = {}
    for sample in samples(url):
        kind = sample.name.removeprefix("vmalert_iteration_duration_seconds_")
        if kind in ("sum", "count"):
            key = (sample.labels["group"], kind)
            found[key] = found.get(key, 0.0) + sample.value
    return found


def victoria_rows_inserted(url: str) -> float:
    """Samples VictoriaMetrics has taken in so far (every ingestion path)."""
    return sum(sample.value for sample in samples(url) if sample.name == "vm_rows_inserted_total")


def rule_files() -> list[str]:
    return sorted(str(path) for path in RULES.glob("*.rules.yaml"))


def intervals_of(files: list[str]) -> list[tuple[dict[str, Any], float]]:
    """Each rule group of ``files`` with its evaluation interval in seconds."""
    return [
        (group, duration_seconds(group.get("interval", f"{EVALUATION_S:g}s")))
        for path in files
        for group in yaml.safe_load(Path(path).read_text())["groups"]
    ]


def group_intervals(files: list[str]) -> dict[str, float]:
    return {group["name"]: seconds for group, seconds in intervals_of(files)}


def alert_intervals(files: list[str]) -> dict[str, float]:
    """Each alert's evaluation interval: its group's."""
    return {
        rule["alert"]: seconds
        for group, seconds in intervals_of(files)
        for rule in group["rules"]
        if "alert" in rule
    }


def vmalert_costs(
    before: dict[tuple[str, str], float],
    after: dict[tuple[str, str], float],
    intervals: dict[str, float],
) -> dict[str, Any]:
    """Mean evaluation time per group over the window: per 15 s (amortized) and the
    longest group against its interval."""
    per_group = {}
    for (group, kind), total in after.items():
        if kind != "sum":
            continue
        runs = after.get((group, "count"), 0.0) - before.get((group, "count"), 0.0)
        if runs > 0:
            per_group[group] = (total - before.get((group, "sum"), 0.0)) / runs
    if not per_group:
        return {
            "eval_s_per_15s": float("nan"), "longest_share": float("nan"), "longest": "-",
            "groups": {},
        }  # fmt: skip
    share = {
        group: seconds / intervals.get(group, EVALUATION_S) for group, seconds in per_group.items()
    }
    longest = max(share, key=lambda group: share[group])
    return {
        "eval_s_per_15s": sum(share.values()) * EVALUATION_S,
        "longest_share": share[longest],
        "longest_group": longest,
        "longest_s": per_group[longest],
        "groups": {group: share[group] * EVALUATION_S for group in per_group},
    }


def run_size(
    nodes: int, shards: int, *, single: bool, story_run: bool, minutes: float, workdir: Path
) -> dict[str, Any]:
    workdir.mkdir(parents=True)
    rules = rule_files()
    simulator = StoryServer(workdir, nodes, tick=15.0)
    targets = simulator.targets
    interval = f"{EVALUATION_S:g}s"
    manager = AlertmanagerServer(workdir / "alertmanager")  # pages go nowhere
    one = prometheus(workdir / "single", targets, interval, rule_files=rules) if single else None
    layout: ShardedLayout | None = None
    try:
        t0 = simulator.start().started
        manager.start()
        if one is not None:
            one.alertmanager_urls = [manager.url]
            one.start(300)
        layout = ShardedLayout(
            workdir / "sharded", targets, rules, manager.url, shards=shards, interval=interval,
            latency=LATENCY,
        ).start()  # fmt: skip
        assert layout.victoria and layout.vmalert and layout.ruler
        vmalert, ruler = layout.vmalert, layout.ruler

        def every_target_up() -> bool:
            assert layout is not None
            return layout.scraped() == nodes and (one is None or scraped(one) == nodes)

        wait_until(every_target_up, 300, interval=2.0, what=f"{nodes} nodes scraped")
        print(f"  {nodes} nodes up in {time.time() - t0:.0f} s", flush=True)

        usage = {"simulator": Usage(pid_of(simulator.process)),
                 "vm": Usage(pid_of(layout.victoria.process)),
                 "vmalert": Usage(pid_of(vmalert.process)),
                 "ruler": Usage(pid_of(ruler.process))}  # fmt: skip
        if one is not None:
            usage["single"] = Usage(pid_of(one.process))
        for index, shard in enumerate(layout.shard_servers):
            usage[f"shard-{index}"] = Usage(pid_of(shard.process))
        warm_until = max(time.time() + 30, t0 + 120)
        end = t0 + STORY_S if story_run else warm_until + minutes * 60
        firsts = {name: Firsts(t0) for name in ("single", *RULERS)}
        started = vm_before = None
        rows_before = 0.0
        while time.time() < end:
            if started is None and time.time() >= warm_until:
                started = time.time()
                vm_before = vmalert_iterations(vmalert.url)
                rows_before = victoria_rows_inserted(layout.victoria.url)
                for use in usage.values():
                    use.begin()
            if one is not None:
                firsts["single"].add(one.firing_alerts())
            for name in RULERS:
                firsts[name].add(layout.firing_alerts(name))
            for use in usage.values():
                use.sample()
            time.sleep(POLL_S)
        assert started is not None and vm_before is not None
        window = time.time() - started
        for use in usage.values():
            use.end()
        vm_after = vmalert_iterations(vmalert.url)
        rows_per_s = (victoria_rows_inserted(layout.victoria.url) - rows_before) / window
        return {
            "nodes": nodes,
            "window_s": window,
            "single": prometheus_costs(one, window) if one is not None else None,
            "shards": [prometheus_costs(shard, window) for shard in layout.shard_servers],
            "ruler": prometheus_costs(ruler, window),
            "vmalert": vmalert_costs(vm_before, vm_after, group_intervals(layout.global_files)),
            "vm_series": float(victoria_series(layout.victoria.url)),
            "vm_rows_per_s": rows_per_s,
            "cpu": {name: use.cpu / window for name, use in usage.items()},
            "rss_mib": {name: use.rss_mib for name, use in usage.items()},
            "firsts": {name: f.seen for name, f in firsts.items()},
        }
    finally:
        if layout is not None:
            layout.stop()
        if one is not None:
            one.stop()
        manager.stop()
        simulator.stop()


def victoria_series(url: str) -> int:
    result = PrometheusApi(url, timeout=60.0).query('count({__name__!=""})')
    return int(float(result[0]["value"][1])) if result else 0


def costliest(groups: dict[str, float], count: int = 4) -> str:
    """The costliest groups, in ms per 15 s (a slower group's share of 15 s)."""
    ranked = sorted(groups.items(), key=lambda item: -item[1])[:count]
    return ", ".join(f"{name} {seconds * 1000:,.0f}" for name, seconds in ranked) or "-"


def report(result: dict[str, Any], shards: int) -> None:
    nodes = result["nodes"]
    cpu, rss = result["cpu"], result["rss_mib"]
    shard_names = [name for name in cpu if name.startswith("shard-")]
    print(f"\n{nodes} nodes x 8 GPUs ({nodes * 8:,} GPUs), measured over "
          f"{result['window_s'] / 60:.1f} min, both set-ups at once on one machine")  # fmt: skip
    single = result["single"]
    if single is not None:
        print(f"  one Prometheus: {single['series']:,.0f} head series "
              f"({single['series'] / nodes:.0f} per node); rule evaluation "
              f"{single['eval_s_per_15s'] * 1000:,.0f} ms per 15 s "
              f"({single['eval_s_per_15s'] * 1000 * 512 / nodes:,.0f} ms per 512 nodes); longest "
              f"group {single['longest_group']} at {single['longest_share']:.0%} of its interval; "
              f"{single['missed']:.0f} missed; scrape p50 {single['scrape_p50_ms']:.0f} ms, "
              f"max {single['scrape_max_ms']:.0f} ms; CPU {cpu['single']:.0%} of a core; "
              f"RSS {rss['single']:,.0f} MiB; "
              f"{single['samples_per_s']:,.0f} samples/s")  # fmt: skip
        print(f"    costliest groups (ms per 15 s): {costliest(single['groups'])}")
    for name, costs in zip(shard_names, result["shards"], strict=True):
        print(f"  {name}: {costs['series']:,.0f} series; gpu.rules.yaml "
              f"{costs['eval_s_per_15s'] * 1000:,.0f} ms per 15 s, longest group "
              f"{costs['longest_share']:.0%} of its interval, {costs['missed']:.0f} missed; "
              f"scrape p50 {costs['scrape_p50_ms']:.0f} ms; CPU {cpu[name]:.0%}, "
              f"RSS {rss[name]:,.0f} MiB; {costs['samples_per_s']:,.0f} samples/s; "
              f"remote-write lag median {costs['remote_lag_p50_s']:.1f} s, "
              f"max {costs['remote_lag_max_s']:.1f} s")  # fmt: skip
    ruler = result["vmalert"]
    print(f"  VictoriaMetrics: {result['vm_series']:,.0f} series "
          f"({result['vm_series'] / nodes:.0f} per node); CPU {cpu['vm']:.0%}, "
          f"RSS {rss['vm']:,.0f} MiB; {result['vm_rows_per_s']:,.0f} samples/s in")  # fmt: skip
    print(f"  vmalert (the global files): {ruler['eval_s_per_15s'] * 1000:,.0f} ms per 15 s; "
          f"longest group {ruler.get('longest_group')} "
          f"{ruler.get('longest_s', float('nan')) * 1000:,.0f} ms "
          f"({ruler['longest_share']:.0%} of its interval); CPU {cpu['vmalert']:.0%}, "
          f"RSS {rss['vmalert']:,.0f} MiB")  # fmt: skip
    print(f"    costliest groups (ms per 15 s): {costliest(ruler['groups'])}")
    own = result["ruler"]
    print(f"  global Prometheus (the global files, fed by remote write): {own['series']:,.0f} "
          f"series ({own['series'] / nodes:.0f} per node); {own['eval_s_per_15s'] * 1000:,.0f} ms "
          f"per 15 s; longest group {own['longest_group']} at {own['longest_share']:.0%} of its "
          f"interval; CPU {cpu['ruler']:.0%}, RSS {rss['ruler']:,.0f} MiB; "
          f"{own['samples_per_s']:,.0f} samples/s")  # fmt: skip
    print(f"    costliest groups (ms per 15 s): {costliest(own['groups'])}")
    print(f"  simulator serving both: CPU {cpu['simulator']:.0%} of a core")
    shards_cpu, shards_rss = sum(cpu[n] for n in shard_names), sum(rss[n] for n in shard_names)
    print(f"  shards + global Prometheus: CPU {shards_cpu + cpu['ruler']:.0%} of a core, RSS "
          f"{(shards_rss + rss['ruler']) / 1024:.1f} GiB; shards + VictoriaMetrics + vmalert: "
          f"CPU {shards_cpu + cpu['vm'] + cpu['vmalert']:.0%}, "
          f"RSS {(shards_rss + rss['vm'] + rss['vmalert']) / 1024:.1f} GiB "
          f"({shards} shards)")  # fmt: skip


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", default="64,256,512,1024,2048",
                        help="comma-separated cluster sizes")  # fmt: skip
    parser.add_argument("--shards", type=int, default=4)
    parser.add_argument("--minutes", type=float, default=3.0,
                        help="measured minutes of a size that does not run the story")  # fmt: skip
    parser.add_argument("--story-nodes", type=int, default=-1,
                        help="the size that runs the story (-1: the largest, 0: none)")  # fmt: skip
    parser.add_argument("--single-max", type=int, default=2048,
                        help="the largest size one Prometheus runs at")  # fmt: skip
    args = parser.parse_args()
    sizes = [int(size) for size in args.nodes.split(",")]
    story_nodes = max(sizes) if args.story_nodes == -1 else args.story_nodes
    if PROMETHEUS3_BIN.exists():
        os.environ.setdefault(PROMETHEUS_MAJOR_VARIABLE, "3")  # what compose and the chart ship
    workdir = Path(tempfile.mkdtemp(prefix="gpufleet-bench-shards-"))
    results: list[dict[str, Any]] = []
    identical: bool | None = None
    try:
        for nodes in sizes:
            shards = min(args.shards, max(1, nodes // 32))
            print(f"\n=== {nodes} nodes, one Prometheus and {shards} shards", flush=True)
            result = run_size(
                nodes, shards, single=nodes <= args.single_max, story_run=nodes == story_nodes,
                minutes=args.minutes, workdir=workdir / str(nodes),
            )  # fmt: skip
            report(result, shards)
            if nodes == story_nodes:
                firsts = result["firsts"]
                # each alert within one interval of its own group (the training groups
                # run every 30 s), the send deadline and a poll each side; the median at 15 s
                intervals = alert_intervals(rule_files())
                identical, lines = compare(
                    firsts["single"],
                    firsts["prometheus"],
                    expected_story(nodes),
                    ALLOWED_S,
                    each_s={
                        name: intervals[name] + ALLOWED_S - EVALUATION_S
                        for name, _ in expected_story(nodes)
                    },
                )
                print("\n  shards + a global Prometheus:\n  " + "\n  ".join(lines))
                # vmalert: the same alerts, chains of recording rules a write apart each
                same, lines = compare(
                    firsts["single"], firsts["vmalert"], expected_story(nodes), float("inf")
                )
                print("\n  shards + VictoriaMetrics + vmalert:\n  " + "\n  ".join(lines))
                identical = identical and same
            results.append(result)
    except BaseException:
        print(f"\nlogs and data kept in {workdir}", file=sys.stderr)
        raise
    shutil.rmtree(workdir, ignore_errors=True)
    table(results)
    largest = results[-1]
    single = largest["single"] or {}
    eval_512 = [r["single"]["eval_s_per_15s"] * 512 / r["nodes"] for r in results if r["single"]]
    print(
        f"largest_nodes={largest['nodes']} "
        f"single_eval_ms_per_15s={single.get('eval_s_per_15s', float('nan')) * 1000:.0f} "
        f"eval_ms_per_512_nodes_median="
        f"{statistics.median(eval_512) * 1000 if eval_512 else float('nan'):.0f} "
        f"global_ruler_ms_per_15s={largest['ruler']['eval_s_per_15s'] * 1000:.0f} "
        f"vmalert_ms_per_15s={largest['vmalert']['eval_s_per_15s'] * 1000:.0f} "
        f"series_per_node={single.get('series', float('nan')) / largest['nodes']:.0f} "
        f"alerts_identical={'n/a' if identical is None else str(identical).lower()}"
    )
    return 1 if identical is False else 0


def table(results: list[dict[str, Any]]) -> None:
    """One row per size: the cost curve (docs/SCALING.md's table)."""
    print("\n| nodes | GPUs | one Prometheus: series per node, rules per 15 s, CPU, RSS "
          "| shards | largest shard: rules per 15 s, RSS "
          "| global Prometheus: rules per 15 s, RSS | vmalert: rules per 15 s (longest group) "
          "|")  # fmt: skip
    print("|---|---|---|---|---|---|---|")
    for result in results:
        nodes, cpu, rss = result["nodes"], result["cpu"], result["rss_mib"]
        single = result["single"]
        alone = (
            f"{single['series'] / nodes:.0f}, {single['eval_s_per_15s'] * 1000:,.0f} ms, "
            f"{cpu['single']:.0%}, {rss['single'] / 1024:.1f} GiB"
            if single
            else "-"
        )
        shards = [name for name in cpu if name.startswith("shard-")]
        per_shard = max(costs["eval_s_per_15s"] for costs in result["shards"])
        own, ruler = result["ruler"], result["vmalert"]
        print(f"| {nodes:,} | {nodes * 8:,} | {alone} | {len(shards)} "
              f"| {per_shard * 1000:,.0f} ms, {max(rss[n] for n in shards) / 1024:.1f} GiB "
              f"| {own['eval_s_per_15s'] * 1000:,.0f} ms, {rss['ruler'] / 1024:.1f} GiB "
              f"| {ruler['eval_s_per_15s'] * 1000:,.0f} ms "
              f"({ruler.get('longest_s', float('nan')) * 1000:,.0f} ms) |")  # fmt: skip
    print("\n| nodes | one Prometheus: samples/s, scrape median / max "
          "| largest shard: samples/s, scrape median / max, remote-write lag median / max "
          "| global Prometheus: samples/s | VictoriaMetrics: samples/s in |")  # fmt: skip
    print("|---|---|---|---|---|")
    for result in results:
        single = result["single"]
        alone = (
            f"{single['samples_per_s']:,.0f}, {single['scrape_p50_ms']:.0f} / "
            f"{single['scrape_max_ms']:,.0f} ms"
            if single
            else "-"
        )
        shard = max(result["shards"], key=lambda costs: costs["samples_per_s"])
        print(f"| {result['nodes']:,} | {alone} "
              f"| {shard['samples_per_s']:,.0f}, {shard['scrape_p50_ms']:.0f} / "
              f"{shard['scrape_max_ms']:,.0f} ms, {shard['remote_lag_p50_s']:.1f} / "
              f"{shard['remote_lag_max_s']:.1f} s "
              f"| {result['ruler']['samples_per_s']:,.0f} "
              f"| {result['vm_rows_per_s']:,.0f} |")  # fmt: skip


if __name__ == "__main__":
    raise SystemExit(main())
