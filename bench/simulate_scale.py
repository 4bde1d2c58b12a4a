"""What the simulator costs: writing a multi-day history, and serving a big live cluster.

1. History: 256 nodes x 8 GPUs, 3 days at a 30 s step, default fault rates
   (realistic-week), written by 2 processes; the wall time, samples and bytes.
   With --promtool, also the time promtool needs to turn it into TSDB blocks.
2. Live: 512 nodes x 8 GPUs served to a real Prometheus scraping every 15 s and
   evaluating every rule, for a few minutes; the simulator's and Prometheus's
   CPU, the scrape durations, head series and memory, the rule evaluation time.
3. Warm rules (--warm-hours H): the live run's windows hold only minutes of data,
   so long-window rules (6 h, 2 h baselines) look cheap there. Here a history of
   the same cluster ending now, with every GPU's error counters, is backfilled
   and a Prometheus evaluates every rule over it: the rule cost at full windows.

    python bench/simulate_scale.py [--days 3] [--nodes 256] [--live-nodes 512] [--promtool]
    python bench/simulate_scale.py --skip-history --skip-live --warm-hours 7
    python bench/simulate_scale.py --skip-history --skip-live --warm-hours 1 --rules OLD/alerts

--rules evaluates another checkout's rule files (its alerts/ folder), live and warm:
the cost of two sets of rules, side by side, on the same cluster.
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
import time
from pathlib import Path

from gpufleet.lab.devstack import PrometheusServer, file_sd_scrape_config, rules_in
from gpufleet.lab.processes import DevstackError, backfill, free_port, start_simulator
from gpufleet.lab.processes import process_cpu_seconds as cpu_seconds
from gpufleet.simulate.config import load_scenario
from gpufleet.simulate.history import write_history

RULES = Path(__file__).resolve().parents[1] / "alerts"


def history(days: float, nodes: int, promtool: bool, workdir: Path) -> None:
    scenario = load_scenario("realistic-week").with_cluster(nodes=nodes)
    out = workdir / "history"
    result = write_history(scenario, 0, days, out, shards=2)
    size = sum(path.stat().st_size for path in result.files)
    print(f"\nhistory: {nodes} nodes x 8 GPUs x {days:g} days at a 30 s step, 2 processes")
    gigabytes = size / 1e9
    print(f"  wrote {result.samples:,} samples ({gigabytes:.2f} GB) in {result.seconds:.1f} s")
    if promtool:
        seconds = backfill(result.files, workdir / "tsdb")
        print(f"  promtool (2 in parallel) made TSDB blocks in {seconds:.1f} s")
    print(f"sim_history_write_s={result.seconds:.1f} sim_history_samples={result.samples}")


def live(nodes: int, minutes: float, workdir: Path, rules_dir: Path = RULES) -> None:
    rules = rules_in(rules_dir)
    simulator, targets = start_simulator(workdir, nodes)
    prometheus_port = free_port()
    prometheus = PrometheusServer(
        workdir / "prometheus",
        port=prometheus_port,
        scrape_configs=[
            file_sd_scrape_config("gpufleet-agent", targets, refresh="5s"),
            {"job_name": "prometheus",
             "static_configs": [{"targets": [f"127.0.0.1:{prometheus_port}"]}]},
        ],
        rule_files=rules,
        scrape_interval="15s",
        evaluation_interval="15s",
    )  # fmt: skip
    try:
        prometheus.start()
        prometheus.wait_for_targets_up(nodes, timeout=120)
        pid = simulator.pid
        assert pid is not None
        time.sleep(30)  # let every target settle into its scrape slot
        before, started = cpu_seconds(pid), time.monotonic()
        time.sleep(minutes * 60)
        cpu = cpu_seconds(pid) - before
        wall = time.monotonic() - started
        head = prometheus.query("prometheus_tsdb_head_series")
        memory = prometheus.query('process_resident_memory_bytes{job="prometheus"}') or []
        prometheus_cpu = prometheus.query('rate(process_cpu_seconds_total{job="prometheus"}[2m])')
        durations = prometheus.query("quantile(0.5, scrape_duration_seconds)")
        p99 = prometheus.query("quantile(0.99, scrape_duration_seconds)")
        series = prometheus.query("sum(scrape_samples_scraped)")
        print(f"\nlive: {nodes} nodes x 8 GPUs, Prometheus scraping every 15 s, {minutes:g} min")
        print(
            f"  simulator CPU: {cpu / wall * 100:.1f}% of one core ({cpu:.1f} s over {wall:.0f} s)"
        )
        if prometheus_cpu:
            print("  Prometheus CPU (scraping, storing, evaluating rules): "
                  f"{float(prometheus_cpu[0]['value'][1]) * 100:.0f}% of one core")  # fmt: skip
        print(f"  scrape duration median {float(durations[0]['value'][1]) * 1000:.1f} ms, "
              f"p99 {float(p99[0]['value'][1]) * 1000:.1f} ms; "
              f"{float(series[0]['value'][1]):,.0f} samples per scrape round")  # fmt: skip
        amortized = rule_costs(prometheus, f"{max(2, int(minutes))}m")
        head_series = float(head[0]["value"][1]) if head else float("nan")
        print(
            f"  head series {head_series:,.0f} ({head_series / nodes:,.0f} per node incl. recorded)"
        )
        if memory:
            print(f"  Prometheus RSS {float(memory[0]['value'][1]) / 2**20:,.0f} MiB")
        series_by_name(prometheus, nodes)
        print(
            f"sim_live_cpu_percent={cpu / wall * 100:.1f} "
            f"rule_eval_ms_per_15s={amortized * 1000:.0f} series_per_node={head_series / nodes:.0f}"
        )
    finally:
        prometheus.stop()
        simulator.stop()


def series_by_name(prometheus: PrometheusServer, nodes: int, top: int = 12) -> None:
    """Print the series per node that rules record, and the largest metric names."""
    counts = prometheus.query('count by (__name__) ({__name__=~".+"})') or []
    by_name = sorted(
        ((float(s["value"][1]), s["metric"]["__name__"]) for s in counts), reverse=True
    )
    recorded = sum(count for count, name in by_name if ":" in name)
    print(f"  recorded series {recorded:,.0f} ({recorded / nodes:,.1f} per node); largest names:")
    for count, name in by_name[:top]:
        print(f"    {name:60} {count / nodes:6.1f} per node")


def rule_costs(prometheus: PrometheusServer, window: str = "2m") -> float:
    """Print each rule group's evaluation time over ``window`` (the median of its last
    durations there, and their mean, which one slow evaluation can double) and the
    costliest rules; return the median evaluation seconds per 15 s, groups at longer
    intervals amortized."""
    groups = prometheus.api("rules")["groups"]
    interval = {group["name"]: float(group["interval"]) for group in groups}
    duration = "prometheus_rule_group_last_duration_seconds"

    def by_group(query: str) -> dict[str, float]:
        return {
            s["metric"]["rule_group"].split(";")[-1]: float(s["value"][1])
            for s in prometheus.query(query) or []
        }

    # A group not yet evaluated reads 0: left out, so a group run once in the window
    # (every 3 minutes, in a 2-minute window) counts that evaluation, not the zeros.
    ran = f"({duration} > 0)[{window}:15s]"
    median = by_group(f"quantile_over_time(0.5, {ran})")
    mean = by_group(f"avg_over_time({ran})")

    def amortize(seconds: dict[str, float]) -> float:
        return sum(value * 15.0 / interval.get(name, 15.0) for name, value in seconds.items())

    amortized = amortize(median)
    print(f"  rule evaluation (all {len(median)} groups over {window}): "
          f"{sum(median.values()) * 1000:.0f} ms if every group ran together; "
          f"{amortized * 1000:.0f} ms per 15 s amortized by the medians, "
          f"{amortize(mean) * 1000:.0f} ms by the means")  # fmt: skip
    for name, seconds in sorted(median.items(), key=lambda item: -item[1]):
        print(f"    {name:34} {seconds * 1000:8.1f} ms (mean {mean.get(name, 0) * 1000:6.1f}) "
              f"every {interval.get(name, 15.0):.0f} s")  # fmt: skip
    costly = sorted(
        ((rule["evaluationTime"], rule.get("record") or rule.get("name")) for group in groups
         for rule in group["rules"]),
        reverse=True,
    )[:8]  # fmt: skip
    print("  costliest rules (last evaluation):")
    for seconds, name in costly:
        print(f"    {name:60} {seconds * 1000:8.1f} ms")
    return amortized


def warm(nodes: int, hours: float, workdir: Path, rules_dir: Path = RULES) -> None:
    scenario = load_scenario("realistic-week").with_cluster(nodes=nodes)
    end = float(int(time.time()) // 30 * 30)
    result = write_history(
        scenario, 0, hours / 24, workdir / "warm-history", end=end, shards=2, every_gpu=True
    )
    tsdb = workdir / "warm-tsdb"
    imported = backfill(result.files, tsdb)
    shutil.rmtree(workdir / "warm-history")
    rules = rules_in(rules_dir)
    prometheus_port = free_port()
    prometheus = PrometheusServer(
        workdir / "warm-prometheus",
        port=prometheus_port,
        storage_path=tsdb,
        scrape_configs=[
            {"job_name": "prometheus",
             "static_configs": [{"targets": [f"127.0.0.1:{prometheus_port}"]}]},
        ],
        rule_files=rules,
        scrape_interval="15s",
        evaluation_interval="15s",
        extra_args=["--storage.tsdb.retention.time=30d"],
    )  # fmt: skip
    try:
        prometheus.start(timeout=300)
        # The history ends when Prometheus starts: for the next ~2 minutes every rule
        # window is (almost) full of backfilled data. Measure then.
        time.sleep(150)
        print(
            f"\nwarm rules ({rules_dir}): {nodes} nodes x 8 GPUs, {hours:g} h backfilled "
            f"({result.samples:,} samples, every GPU's counters; imported in {imported:.0f} s)"
        )
        amortized = rule_costs(prometheus)
        memory = prometheus.query('process_resident_memory_bytes{job="prometheus"}') or []
        if memory:
            print(f"  Prometheus RSS {float(memory[0]['value'][1]) / 2**20:,.0f} MiB")
        print(f"rule_eval_warm_ms_per_15s={amortized * 1000:.0f}")
    finally:
        prometheus.stop()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--days", type=float, default=3.0)
    parser.add_argument("--nodes", type=int, default=256)
    parser.add_argument("--live-nodes", type=int, default=512)
    parser.add_argument("--live-minutes", type=float, default=3.0)
    parser.add_argument("--promtool", action="store_true")
    parser.add_argument("--skip-history", action="store_true")
    parser.add_argument("--skip-live", action="store_true")
    parser.add_argument("--warm-hours", type=float, default=0.0)
    parser.add_argument("--warm-nodes", type=int, default=512)
    parser.add_argument(
        "--rules", type=Path, default=RULES, help="the rule files' folder (default: alerts/)"
    )
    args = parser.parse_args()
    try:
        rules_in(args.rules)  # before anything starts
    except DevstackError as error:
        raise SystemExit(str(error)) from None
    workdir = Path(tempfile.mkdtemp(prefix="gpufleet-bench-sim-"))
    try:
        if not args.skip_history:
            history(args.days, args.nodes, args.promtool, workdir)
        if not args.skip_live:
            live(args.live_nodes, args.live_minutes, workdir, args.rules)
        if args.warm_hours:
            warm(args.warm_nodes, args.warm_hours, workdir, args.rules)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
