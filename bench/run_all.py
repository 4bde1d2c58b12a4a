"""Run every benchmark and print its headline figures in one table.

Each benchmark prints its full report and ends with one line of ``key=value``
figures; this runs them one after another (never side by side: they would
share the two cores), shows each report as it comes, and collects the last
lines into a table at the end.

    python bench/run_all.py            # what `make bench` runs
    python bench/run_all.py --fast     # fewer iterations, no 512-node scale run
    python bench/run_all.py --scale    # also 64 to 2,048 nodes, sharded (`make bench SCALE=1`)
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent

# (title, script, arguments, fast arguments)
BENCHES: list[tuple[str, str, list[str], list[str] | None]] = [
    ("agent /metrics scrape", "agent_scrape.py", [], ["--scrapes", "300"]),
    ("client overhead per step", "client_overhead.py", [], ["--calls", "50000"]),
    ("parallel layout, once per attempt", "layout_overhead.py", [], ["--objects", "0", "1000000"]),
    ("agent ingest", "ingest_throughput.py", [], ["--hours", "2"]),
    (
        "ledger: history, fsync'd writes",
        "hostile_ledger.py",
        [],
        ["--rows", "0,10000", "--scrapes", "20", "--writes", "400"],
    ),
    (
        "agent vs a hostile client",
        "hostile_agent.py",
        [],
        ["--ingest-requests", "100", "--scrapes", "100", "--slow-seconds", "15"],
    ),
    (
        "rules at scale (512 nodes)",
        "simulate_scale.py",
        ["--skip-history", "--live-nodes", "512", "--warm-hours", "7"],
        None,
    ),
    (
        # the rules of 2026-12-06, before issue 40's cuts, beside today's (same cluster)
        "rule cost, side by side (512 nodes)",
        "rule_cost.py",
        ["--before", "8691168", "--nodes", "512", "--minutes", "8"],
        ["--before", "8691168", "--nodes", "64", "--minutes", "2"],
    ),
    ("detection (quick)", "detect.py", ["--quick"], ["--quick"]),
    (
        "fail-slow on real PyTorch (DDP, gloo)",
        "real_pytorch.py",
        [],
        ["--factors", "1.3", "--placements", "1", "--overhead-steps", "600"],
    ),
    (
        "dashboard panel queries (512 nodes)",
        "dashboard_queries.py",
        [],
        ["--nodes", "64", "--repeat", "3"],
    ),
]


# With --scale: one Prometheus beside the sharded layout from 64 to 2,048 nodes (~35 min)
SCALE_BENCH: tuple[str, str, list[str], list[str] | None] = (
    "sharded, 64 to 2,048 nodes",
    "scale_sharded.py",
    [],
    ["--nodes", "64,512"],
)


def figures(output: str) -> dict[str, str]:
    for line in reversed(output.strip().splitlines()):
        pairs = [item.split("=", 1) for item in line.split() if "=" in item]
        if pairs and len(pairs) == len(line.split()):
            return {key: value for key, value in pairs}
    return {}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fast", action="store_true")
    parser.add_argument("--scale", action="store_true", help="also " + SCALE_BENCH[0])
    args = parser.parse_args()
    table: list[tuple[str, str, str]] = []
    failed = []
    for title, script, full, fast in [*BENCHES, *([SCALE_BENCH] if args.scale else [])]:
        arguments = fast if args.fast else full
        if arguments is None:
            continue
        print(f"\n=== {title}: bench/{script} {' '.join(arguments)}", flush=True)
        started = time.monotonic()
        process = subprocess.run(
            [sys.executable, str(HERE / script), *arguments],
            stdout=subprocess.PIPE,
            text=True,
            check=False,
        )
        print(process.stdout, end="", flush=True)
        print(f"(took {time.monotonic() - started:.0f} s)")
        found = figures(process.stdout)
        if process.returncode != 0 or not found:
            failed.append(script)
            continue
        for key, value in found.items():
            table.append((title, key, value))
    width = max((len(key) for _, key, _ in table), default=10)
    print("\n| benchmark | figure | value |\n|---|---|---|")
    for title, key, value in table:
        print(f"| {title} | {key:{width}} | {value} |")
    if failed:
        print(f"\nfailed or printed no figures: {', '.join(failed)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
