"""Agent ingest throughput with batched POSTs, and its memory under a long 64-rank run.

The agent runs in its own process pinned to one core (taskset); the sender is
pinned to another and keeps a few keep-alive connections busy with batches of
4,096 step events (64 ranks x 64 steps, 4 pipeline stages). Throughput is
events per second of wall time and per second of the agent's own CPU time.
Memory: RSS after one simulated hour of 64 ranks at 2 steps/s (460,800 step
events plus checkpoints), then again after five more hours, to show the steady
state (no series or memory per step).

    python bench/ingest_throughput.py
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import shutil
import tempfile
import threading
import time
from pathlib import Path

from gpufleet.lab.processes import agent_process, free_port, http_get, wait_until
from gpufleet.lab.processes import process_cpu_seconds as cpu_seconds
from gpufleet.lab.processes import process_rss_mib as rss_mib

RANKS = 64
STAGES = 4
STEPS_PER_BODY = 64  # x 64 ranks = 4,096 events per POST


def body(first_step: int) -> bytes:
    events = [
        {
            "training_job": "bench-job",
            "rank": rank,
            "pp_stage": rank % STAGES,
            "step": step,
            "duration_s": 0.5,
            "compute_s": 0.35,
            "data_wait_s": 0.01,
            "comm_wait_s": 0.12,
            "tokens": 8192,
        }
        for step in range(first_step, first_step + STEPS_PER_BODY)
        for rank in range(RANKS)
    ]
    return json.dumps({"events": events}).encode()


def checkpoint_body(ident: int) -> bytes:
    events = [
        {
            "training_job": "bench-job",
            "rank": rank,
            "op": "save",
            "event": kind,
            "id": f"c{ident}",
            **(
                {"queue_wait_s": 20.0, "service_s": 2.0, "bytes": 2 * 10**9}
                if kind == "end"
                else {}
            ),
        }
        for kind in ("begin", "end")
        for rank in range(RANKS)
    ]
    return json.dumps({"events": events}).encode()


def send_all(port: int, bodies: list[bytes], connections: int) -> float:
    """POST every body over `connections` keep-alive connections; returns wall seconds."""
    queue = list(reversed(bodies))
    lock = threading.Lock()
    failures: list[str] = []

    def worker() -> None:
        connection = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
        while True:
            with lock:
                if not queue:
                    return
                payload = queue.pop()
            path = "/v1/checkpoints" if b'"op"' in payload[:200] else "/v1/steps"
            connection.request("POST", path, payload, {"Content-Type": "application/json"})
            response = connection.getresponse()
            response.read()
            if response.status != 202:
                failures.append(f"{response.status}")

    started = time.perf_counter()
    threads = [threading.Thread(target=worker) for _ in range(connections)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if failures:
        raise RuntimeError(f"{len(failures)} batches refused: {failures[:3]}")
    return time.perf_counter() - started


def simulated_hour(offset_steps: int) -> list[bytes]:
    """64 ranks x 7,200 steps (2 steps/s for an hour) and a checkpoint every 30 min."""
    bodies = [body(offset_steps + first) for first in range(0, 7200, STEPS_PER_BODY)]
    bodies += [checkpoint_body(offset_steps + n) for n in range(2)]
    return bodies


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--connections", type=int, default=4)
    parser.add_argument("--hours", type=int, default=6)
    args = parser.parse_args()

    port = free_port()
    workdir = Path(tempfile.mkdtemp(prefix="gpufleet-bench-ingest-"))
    pin = (
        ["taskset", "-c", "0"]
        if shutil.which("taskset") and os.cpu_count() and os.cpu_count() > 1
        else []
    )  # type: ignore[operator]
    agent = agent_process(workdir, port, prefix=pin)
    agent.start()
    if pin:
        os.sched_setaffinity(0, {1})
    try:
        wait_until(lambda: http_get(f"http://127.0.0.1:{port}/readyz"), 30, what="agent")
        pid = agent.pid
        assert pid is not None
        rss_start = rss_mib(pid)
        rows = []
        for hour in range(args.hours):
            bodies = simulated_hour(hour * 7200)
            events = sum(payload.count(b'"training_job"') for payload in bodies)
            cpu_before = cpu_seconds(pid)
            wall = send_all(port, bodies, args.connections)
            cpu = cpu_seconds(pid) - cpu_before
            rows.append((hour + 1, events, wall, cpu, rss_mib(pid)))
        scrape = http_get(f"http://127.0.0.1:{port}/metrics")
        series = sum(
            1 for line in scrape.decode().splitlines() if line and not line.startswith("#")
        )

        print(
            f"\nagent ingest: {RANKS} ranks, {STAGES} stages, 4,096-event batches, "
            f"{args.connections} connections, agent pinned to one core: {bool(pin)}"
        )
        print(
            f"{'sim. hour':>9} {'events':>8} {'wall s':>7} {'agent CPU s':>11} "
            f"{'events/s':>9} {'events/CPU-s':>12} {'RSS MiB':>8}"
        )
        for hour, events, wall, cpu, rss in rows:
            print(
                f"{hour:9d} {events:8d} {wall:7.2f} {cpu:11.2f} {events / wall:9.0f} "
                f"{events / cpu:12.0f} {rss:8.1f}"
            )
        total_events = sum(row[1] for row in rows)
        total_wall = sum(row[2] for row in rows)
        total_cpu = sum(row[3] for row in rows)
        print(f"RSS at start {rss_start:.1f} MiB; /metrics series after the run: {series}")
        print(
            f"ingest_events_per_s={total_events / total_wall:.0f} "
            f"ingest_events_per_cpu_s={total_events / total_cpu:.0f} "
            f"agent_rss_after_1h_mib={rows[0][4]:.1f} "
            f"agent_rss_after_{args.hours}h_mib={rows[-1][4]:.1f}"
        )
        return 0
    finally:
        agent.stop()
        shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    raise SystemExit(main())
