"""What the dashboards cost Prometheus at 512 simulated nodes (4,096 GPUs).

The dashboard tests' scenario is simulated for a short history (3 h by default),
backfilled with promtool, and served by a real Prometheus that evaluates gpufleet's real
rules (recording and alerting, default intervals) on it. Then every panel target is
timed as Grafana would send it, variables substituted:

- instant: the query at the present, reading the recorded series as a live Grafana
  would (one refresh of a stat or table, one point of a graph);
- range: every target over the whole history at a 30 s step, as a 3-hour graph draws
  it. Targets marked ``range*`` read recorded series, which exist only since
  Prometheus started: their range figure counts the raw series they read in full and
  the recorded ones for a few minutes only (a lower bound).

Prints the median of ``--repeat`` runs per target, heaviest first.

    python bench/dashboard_queries.py [--nodes 512] [--hours 3] [--repeat 5]
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
import tempfile
import time
from pathlib import Path

from gpufleet.dashboards.build import dashboards
from gpufleet.dashboards.common import render
from gpufleet.dashboards.names import Recorded
from gpufleet.lab.processes import wait_until
from gpufleet.lab.stack import FedPrometheus, fed_prometheus
from gpufleet.rules.config import RulesConfig

RECORDED = re.compile(r"\b[a-z]+:[A-Za-z0-9_]+:[a-z0-9_]+\b")
STEP_S = 30.0


def timed(run: object, repeat: int) -> float:
    samples = []
    for _ in range(repeat):
        started = time.perf_counter()
        run()  # type: ignore[operator]
        samples.append(time.perf_counter() - started)
    return statistics.median(samples)


def measure(fed: FedPrometheus, repeat: int) -> list[tuple[str, str, str, float]]:
    rows = []
    for stem, board in dashboards().items():
        data = json.loads(render(board))
        for panel in data["panels"]:
            for target in panel["targets"]:
                where = f"{stem} / {panel['title']} [{target['refId']}]"
                now = time.time()
                expr = fed.substitute(target["expr"], now, inline=False)
                seconds = timed(lambda e=expr: fed.prometheus.query(e), repeat)
                rows.append(("instant", where, expr, seconds))
                # Tables query at one instant; graphs and stats over the range.
                if "ALERTS" not in target["expr"] and not target.get("instant"):
                    kind = "range*" if RECORDED.search(target["expr"]) else "range"
                    start = fed.start + 600
                    seconds = timed(
                        lambda e=expr, s=start: fed.prometheus.query_range(
                            e, s, time.time(), STEP_S
                        ),
                        repeat,
                    )
                    rows.append((kind, where, expr, seconds))
    return sorted(rows, key=lambda row: -row[3])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--nodes", type=int, default=512)
    parser.add_argument("--hours", type=float, default=3.0)
    parser.add_argument("--repeat", type=int, default=5)
    arguments = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="gpufleet-dashboard-bench-") as workdir:
        started = time.monotonic()
        with fed_prometheus(
            Path(workdir),
            nodes=arguments.nodes,
            hours=arguments.hours,
            live_rules=RulesConfig(),
            evaluation_interval="15s",
            pending=(),  # what the panels cost does not depend on which alerts are pending
        ) as fed:
            print(
                f"{arguments.nodes} nodes, {arguments.hours:g} h backfilled and served in "
                f"{time.monotonic() - started:.0f} s",
                file=sys.stderr,
            )
            # The recorded series the panels read exist once each group has run once.
            recorded = Recorded.of(RulesConfig())
            wait_until(
                lambda: (
                    fed.prometheus.query(recorded.support.node_gpus)
                    and fed.prometheus.query(recorded.training.compute_ratio)
                    and fed.prometheus.query(f"{recorded.gpu.hw_slowdown} or vector(1)")
                ),
                180,
                what="the recording rules' first evaluation",
            )
            rows = measure(fed, arguments.repeat)
    print(f"| query | panel | median ms ({arguments.repeat} runs) |")
    print("|---|---|---:|")
    for kind, where, _, seconds in rows:
        print(f"| {kind} | {where} | {seconds * 1000:.1f} |")
    kind, where, expr, seconds = rows[0]
    print(f"\nheaviest: {kind} {where}: {seconds * 1000:.1f} ms median\n{expr}\n")
    instant = max(row[3] for row in rows if row[0] == "instant")
    print(
        f"nodes={arguments.nodes} heaviest_panel_query_ms={seconds * 1000:.1f} "
        f"heaviest_instant_query_ms={instant * 1000:.1f}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
