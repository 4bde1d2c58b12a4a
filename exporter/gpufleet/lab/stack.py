"""A real Prometheus holding a simulated cluster's history, a real fleet ledger the
simulator reported to, and gpufleet's rules: what the dashboard tests, the previews and
the query bench run every panel query against.

The history is backfilled with promtool, so nothing waits on a live simulator. Recording
rules only record from the moment Prometheus starts, so a panel query is run with each
recorded name replaced by the expression that records it (``gpufleet.rules.inline``),
over the whole history. ``ALERTS`` cannot be inlined: Prometheus evaluates the rules
live over the backfilled data and the ledger, and those queries run at the present.
"""

from __future__ import annotations

import math
import re
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpufleet.fleet.ledger_client import LedgerClient
from gpufleet.lab.devstack import PrometheusServer, static_scrape_config
from gpufleet.lab.processes import ManagedProcess, backfill, free_port, http_get, wait_until
from gpufleet.rules.__main__ import write_rules
from gpufleet.rules.config import RulesConfig
from gpufleet.rules.inline import Inliner
from gpufleet.schema.alerts import AlertName
from gpufleet.simulate.cluster import Cluster
from gpufleet.simulate.config import load_scenario
from gpufleet.simulate.history import write_history
from gpufleet.simulate.ledger_feed import LedgerFeed, ledger_events

STEP_S = 30.0  # history resolution (a 30 s scrape interval)
RATE_INTERVAL = "2m"  # Grafana's $__rate_interval for a 30 s scrape interval
QUERY_STEP_S = 60.0

# Times are from the start of the history; the last three count back from its end.
# Node 5 computes 30% slower for the last two hours (the straggler); node 12 fails
# twice (two exclusions: a repeat offender); node 9 flaps its NVLink, then a GPU falls
# off the bus (XID 79, a lost GPU, an exclusion); 16 nodes checkpoint at once into 16
# storage slots (a checkpoint storm). Two pipeline stages: the nodes that wait with an
# excluded node (its replica: node 1 with 9, node 4 with 12) leave the straggler's
# stage 0 seven peers.
SCENARIO = """
name: dashboards
cluster: {{nodes: {nodes}, layout: {replicas}x2x8, checkpoint_interval_s: 1800,
          storage_slots: 16, namespace: {namespace}, parallel_layout: true}}
rates: {{fail_stop_per_1000_node_days: 0, fail_slow_compute_per_node_day: 0,
        fail_slow_comm_per_node_day: 0, auto_retry_success: 1.0}}
confounders: {{cluster_slowdowns_per_day: 0, evals: false}}
episodes:
  - {{kind: fail_slow_compute, node: 5, gpu: 3, start: {slow}m, duration: 3h, magnitude: 1.3}}
  - {{kind: fail_stop, cause: hbm, node: 12, gpu: 4, start: 30m, duration: 1h}}
  - {{kind: fail_stop, cause: hbm, node: 12, gpu: 4, start: 150m, duration: 1h}}
  - {{kind: nvlink_flapping, node: 9, gpu: 1, start: {flap}m, duration: 2h}}
  - {{kind: fail_stop, cause: gpu_fell_off_bus, node: 9, gpu: 2, start: {off_bus}m, duration: 4h}}
"""
SLOW_FOR_S = 2 * 3600.0  # the straggler's slowdown covers the history's last two hours
HOURS = 6.0
SLOW_NODE = "node-005"
# The job's pods run in this namespace (tenant): every GPU is allocated while its node is up.
NAMESPACE = "ml-research"
FAULTY_NODE = "node-009"


@dataclass
class FedPrometheus:
    prometheus: PrometheusServer
    ledger_url: str
    start: float  # history start
    end: float  # history end (the present, to within the backfill's run time)
    job: str
    inliner: Inliner
    variables: dict[str, str] = field(default_factory=dict)
    hours: float = HOURS

    def substitute(self, expr: str, now: float, *, inline: bool = True) -> str:
        """``expr`` as Grafana would send it, with recorded names inlined (by default)."""
        span = now - self.start
        values = {
            "$__rate_interval": RATE_INTERVAL,
            "$__range_s": str(int(span)),
            "$__range": f"{int(span)}s",
            "$__interval": f"{int(QUERY_STEP_S)}s",
            **{f"${name}": value for name, value in self.variables.items()},
        }
        for name in sorted(values, key=len, reverse=True):
            expr = expr.replace(name, values[name])
        # label=~".*" (a variable set to All) matches every series, labelled or not.
        expr = re.sub(r',?\s*[a-zA-Z_]+=~"\.\*"\s*,?\s*', _comma, expr).replace("{}", "")
        if "ALERTS" in expr or not inline:
            return expr
        # (The inliner turns a range over a recorded name into a subquery.)
        return self.inliner.inline(expr)

    def run(self, expr: str, instant: bool) -> list[dict[str, Any]]:
        """The panel query's result: instant at the present, or a range over the history."""
        now = time.time()
        query = self.substitute(expr, now)
        if instant:
            return self.prometheus.query(query)
        # The last point is the present: ledger series and ALERTS exist only since Prometheus
        # started (the ledger is scraped live, the alerts evaluated live).
        span = 600.0 if "ALERTS" in query else now - self.start - 3600
        start = now - (span // QUERY_STEP_S) * QUERY_STEP_S
        return self.prometheus.query_range(query, start, now, QUERY_STEP_S)


def _comma(match: re.Match[str]) -> str:
    text = match.group(0)
    return ", " if text.lstrip().startswith(",") and text.rstrip().endswith(",") else ""


def has_data(result: list[dict[str, Any]]) -> bool:
    """At least one finite value in an instant or range result."""
    for series in result:
        points = series.get("values") or [series.get("value")]
        for point in points:
            if point and math.isfinite(float(point[1])):
                return True
    return False


@contextmanager
def fed_prometheus(
    workdir: Path,
    *,
    nodes: int = 16,
    seed: int = 1,
    hours: float = HOURS,
    live_rules: RulesConfig | None = None,
    evaluation_interval: str = "2s",
    pending: tuple[str, ...] = (AlertName.STRAGGLER,),
) -> Iterator[FedPrometheus]:
    """Simulate the scenario, backfill its history, feed its ledger, start Prometheus.

    ``live_rules`` is what Prometheus evaluates live (default: the real rules with a fast
    GPU group, so XIDs show at once); panel queries read the history through inlining.
    ``pending``: alerts to wait for (in ALERTS) before the stack is handed over.
    """
    workdir.mkdir(parents=True, exist_ok=True)
    scenario_path = workdir / "scenario.yaml"
    minutes = round(hours * 60)
    scenario_path.write_text(
        SCENARIO.format(
            nodes=nodes,
            replicas=nodes // 2,
            slow=minutes - 120,
            flap=minutes - 90,
            off_bus=minutes - 45,
            namespace=NAMESPACE,
        )
    )
    scenario = load_scenario(str(scenario_path))
    end = float(int(time.time() // STEP_S * STEP_S))
    history = write_history(
        scenario, seed, hours / 24, workdir / "history", end=end, step=STEP_S, gpu_gauges=True
    )
    ledger_port = free_port()
    ledger = ManagedProcess(
        [sys.executable, "-m", "gpufleet", "fleet", "--listen", f"127.0.0.1:{ledger_port}",
         "--db", str(workdir / "fleet.db"), "--log-level", "warning"],
        workdir / "fleet.log",
    )  # fmt: skip
    ledger.start()
    prometheus: PrometheusServer | None = None
    try:
        tsdb = workdir / "tsdb"
        backfill(history.files, tsdb)
        ledger_url = f"http://127.0.0.1:{ledger_port}"
        wait_until(lambda: http_get(f"{ledger_url}/healthz"), 60, what="the fleet ledger")
        cluster = Cluster(scenario, seed, history.start, history.end - history.start)
        events = ledger_events(cluster.timeline, cluster.node_names, cluster.spec.job, seed)
        LedgerFeed(LedgerClient(ledger_url), events).post_until(history.end)
        # Alert-only groups evaluate live (ALERTS); fast once-a-minute groups so XIDs and
        # the slow records show at once.
        live_rules = live_rules or RulesConfig(
            gpu_recording_interval="2s",
            gpu_long_window_interval="2s",
            slow_recording_interval="2s",
            dashboard_interval="2s",
            training_interval="2s",
        )
        rules = write_rules(workdir / "rules", live_rules)
        prometheus = PrometheusServer(
            workdir / "prometheus",
            scrape_configs=[
                static_scrape_config(
                    "gpufleet-fleet", [f"127.0.0.1:{ledger_port}"], scrape_interval="1s"
                )
            ],
            rule_files=[str(path) for path in rules],
            evaluation_interval=evaluation_interval,
            storage_path=tsdb,
            extra_args=["--storage.tsdb.retention.time=30d"],
        ).start()
        fed = FedPrometheus(
            prometheus,
            ledger_url,
            history.start,
            history.end,
            cluster.spec.job,
            Inliner.from_files(rules),
            {"training_job": cluster.spec.job, "pp_stage": ".*", "node": FAULTY_NODE,
             "gpu": ".*", "cluster": ".*", "source": ".*", "namespace": ".*"},
            hours,
        )  # fmt: skip
        server = prometheus
        # Grafana fills the hidden uuid variable from the node-GPU map: so does the test.
        mapped = server.query(
            fed.inliner.inline(f'gpu:gpufleet_gpu_node:info{{node="{FAULTY_NODE}"}}')
        )
        # (UUIDs hold no regex metacharacter that Grafana would escape.)
        fed.variables["uuid"] = "|".join(sorted(s["metric"]["UUID"] for s in mapped))
        # ALERTS exist once the rules have run on the history: a repeat offender fires
        # at once (from the ledger), the straggler is pending (its `for` runs live).
        wait_until(
            lambda: (
                server.query("gpufleet_fleet_node_exclusions_total")
                and server.query('ALERTS{alertstate="firing"}')
                and all(server.query(f'ALERTS{{alertname="{name}"}}') for name in pending)
            ),
            120,
            what=f"the ledger scraped, a gpufleet alert firing and {', '.join(pending)} pending",
        )
        yield fed
    finally:
        if prometheus is not None:
            prometheus.stop()
        ledger.stop()
