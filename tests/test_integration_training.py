"""End to end: 16 ranks in 2 pipeline stages on 2 nodes report through the client to
two agents; a real Prometheus scrapes both and the per-node figures come back right."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import pytest

from gpufleet.agent.app import Agent, AgentSettings
from gpufleet.client import Reporter
from gpufleet.lab.devstack import PrometheusServer, static_scrape_config
from gpufleet.lab.processes import wait_until

pytestmark = pytest.mark.integration

STEP_S = 0.1  # each rank runs 10 steps per second
# per node: (ranks, pp_stage, compute share of a step, checkpoint queue-wait share)
LAYOUT = {"node-a": (range(0, 8), 0, 0.7, 0.9), "node-b": (range(8, 16), 1, 0.5, 0.2)}


def drive(
    reporter: Reporter,
    compute_share: float,
    queue_share: float,
    stop: threading.Event,
    recorded: dict[int, int],
) -> None:
    deadline = time.monotonic()
    step = 0
    while not stop.is_set():
        reporter.record_step(
            STEP_S,
            compute_s=STEP_S * compute_share,
            data_wait_s=STEP_S * 0.1,
            comm_wait_s=STEP_S * (0.9 - compute_share),
            tokens=2048,
            step=step,
        )
        if step % 10 == 9:
            reporter.record_checkpoint("save", queue_wait_s=queue_share, service_s=1 - queue_share)
        step += 1
        recorded[reporter.rank] = step
        deadline += STEP_S
        time.sleep(max(0.0, deadline - time.monotonic()))


def by_node(result: list[dict[str, Any]]) -> dict[str, float]:
    return {series["metric"]["node"]: float(series["value"][1]) for series in result}


def test_two_nodes_two_stages_sixteen_ranks(
    serve_asgi: Callable[..., Any], prometheus_factory: Callable[..., PrometheusServer]
) -> None:
    urls, agents = {}, {}
    for node in LAYOUT:
        agent = Agent(AgentSettings(node=node, gpu_source="none"))
        agent.open()
        agents[node] = agent
        urls[node] = serve_asgi(agent.asgi()).url
    prometheus = prometheus_factory(
        scrape_configs=[
            static_scrape_config(
                "gpufleet-agent", [url.removeprefix("http://") for url in urls.values()]
            )
        ]
    )
    prometheus.wait_for_targets_up(2)

    stop = threading.Event()
    recorded: dict[int, int] = {}
    reporters, threads = [], []
    for node, (ranks, stage, compute_share, queue_share) in LAYOUT.items():
        for rank in ranks:
            reporter = Reporter(
                urls[node], training_job="llama-70b", rank=rank, pp_stage=stage, flush_interval=0.25
            )
            reporters.append(reporter)
            thread = threading.Thread(
                target=drive, args=(reporter, compute_share, queue_share, stop, recorded)
            )
            threads.append(thread)
    for thread in threads:
        thread.start()
    try:
        time.sleep(8)
        step_rate = by_node(
            prometheus.query(
                "sum by (node) (rate(gpufleet_training_steps_total[5s]))"
                " / sum by (node) (gpufleet_training_ranks)"
            )
        )
        compute_share = by_node(
            prometheus.query(
                "sum by (node) (rate(gpufleet_training_compute_seconds_total[5s]))"
                " / sum by (node) (rate(gpufleet_training_step_seconds_total[5s]))"
            )
        )
        queue_share = by_node(
            prometheus.query(
                "sum by (node) (rate(gpufleet_checkpoint_queue_wait_seconds_total[5s]))"
                " / (sum by (node) (rate(gpufleet_checkpoint_queue_wait_seconds_total[5s]))"
                " + sum by (node) (rate(gpufleet_checkpoint_service_seconds_total[5s])))"
            )
        )
    finally:
        stop.set()
        for thread in threads:
            thread.join()
        for reporter in reporters:
            assert reporter.flush(10)
            reporter.close()

    assert set(step_rate) == {"node-a", "node-b"}
    for node, rate in step_rate.items():
        assert rate == pytest.approx(1 / STEP_S, rel=0.3), (node, rate)
    assert compute_share == pytest.approx({"node-a": 0.7, "node-b": 0.5}, rel=1e-6)
    assert queue_share == pytest.approx({"node-a": 0.9, "node-b": 0.2}, rel=1e-6)

    stages = {
        series["metric"]["node"]: series["metric"]["pp_stage"]
        for series in prometheus.query("gpufleet_training_ranks")
    }
    assert stages == {"node-a": "0", "node-b": "1"}
    steps = {node: float(sum(recorded[rank] for rank in LAYOUT[node][0])) for node in LAYOUT}
    wait_until(
        lambda: by_node(prometheus.query("sum by (node) (gpufleet_training_steps_total)")) == steps,
        20,
        what=f"every recorded step ({steps}) to be counted in Prometheus",
    )
    assert all(r.dropped_total == 0 and r.rejected == 0 for r in reporters)
