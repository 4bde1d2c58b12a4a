"""The agent against a hostile client: a cardinality attack, ingest during a worst-case
scrape, and /metrics while 1,000 slow connections are held open.

Everything runs on 127.0.0.1 and every loop is bounded (a few minutes in all).
The agent runs as ``gpufleet agent --gpu-source synthetic`` (8 GPUs, as on a
real node) in its own process; figures are medians and p99s of one run on a
shared machine, so read them as orders of magnitude, not as a tight figure.

1. Cardinality attack: 16 jobs x 64 stages x 256 ranks of valid step events
   (the issue's reproduction: 555,406 series and a 58 MB scrape before the caps).
   Reported: HTTP statuses, the training series and bytes of the scrape after it,
   the scrape's median time.
2. Ingest latency while worst-case scrapes run back to back (target p99 <= 50 ms),
   next to the same ingest with no scrape running.
3. /metrics latency, a new connection per scrape (the worst case for a scraper),
   while 1,000 slow connections are held open and reopened as the agent cuts
   them: idle ones, slow headers, slow bodies (target p99 <= 20 ms).

RSS of the agent after each phase.

    python bench/hostile_agent.py [--agent-pythonpath DIR]   # DIR: another checkout's exporter/
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import resource
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path

from gpufleet.devstack import ManagedProcess, free_port, http_get, wait_until
from gpufleet.devstack import process_rss_mib as rss_mib

SLOW_CONNECTIONS = 1000
BATCH = 4096


def step_events(job: str, stage: int, ranks: range, step: int) -> list[dict[str, object]]:
    return [
        {"training_job": job, "rank": rank, "pp_stage": stage, "step": step, "duration_s": 0.5}
        for rank in ranks
    ]


def post(connection: http.client.HTTPConnection, events: list[dict[str, object]]) -> int:
    body = json.dumps({"events": events}).encode()
    connection.request("POST", "/v1/steps", body, {"Content-Type": "application/json"})
    response = connection.getresponse()
    response.read()
    return response.status


def scrape(port: int) -> tuple[float, bytes]:
    started = time.perf_counter()
    body = http_get(f"http://127.0.0.1:{port}/metrics", timeout=60)
    return time.perf_counter() - started, body


def training_series(body: bytes) -> int:
    return sum(
        1
        for line in body.decode().splitlines()
        if line.startswith(("gpufleet_training", "gpufleet_checkpoint"))
    )


def percentile(samples: list[float], fraction: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(len(ordered) * fraction))]


def cardinality_attack(port: int) -> tuple[Counter[int], Counter[int]]:
    """The issue's reproduction in full batches, then an attacker that knows the caps and
    sends what each cap still admits (64 ranks of one (job, stage) per request)."""
    naive: Counter[int] = Counter()
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    pending: list[dict[str, object]] = []
    for job in range(16):
        for stage in range(64):
            pending += step_events(f"attack-{job:02d}", stage, range(256), 0)
            if len(pending) >= BATCH:
                naive[post(connection, pending[:BATCH])] += 1
                pending = pending[BATCH:]
    if pending:
        naive[post(connection, pending)] += 1
    aware: Counter[int] = Counter()
    for job in range(16):
        for stage in range(64):
            for first in range(0, 256, 64):
                events = step_events(f"attack-{job:02d}", stage, range(first, first + 64), 0)
                aware[post(connection, events)] += 1
    connection.close()
    return naive, aware


def ingest_latencies(port: int, requests: int, job: str) -> list[float]:
    """Small batches (8 ranks, one step) on series that exist: what a node's ranks send."""
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    latencies = []
    for n in range(requests):
        started = time.perf_counter()
        status = post(connection, step_events(job, 0, range(8), n + 1))
        latencies.append(time.perf_counter() - started)
        if status != 202:
            raise RuntimeError(f"ingest answered {status}")
    connection.close()
    return latencies


class SlowConnections:
    """Holds `count` slow connections open, reopening each one the agent cuts."""

    KINDS = (
        b"",  # idle: connects and never sends
        b"GET /metrics HTTP/1.1\r\nHost: x\r\nX-Slow: ",  # a header that never ends
        b"POST /v1/steps HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        b"Content-Length: 2000000\r\n\r\n" + b'{"events": [',  # a body that never ends
    )

    def __init__(self, port: int, count: int) -> None:
        self.port = port
        self.count = count
        self.stop = threading.Event()
        self.opened = 0
        self.failed = 0
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _open(self, kind: int) -> socket.socket | None:
        try:
            connection = socket.create_connection(("127.0.0.1", self.port), timeout=5)
            connection.setblocking(False)
            if self.KINDS[kind]:
                connection.send(self.KINDS[kind])
            self.opened += 1
            return connection
        except OSError:
            self.failed += 1
            return None

    def _run(self) -> None:
        held: list[socket.socket | None] = [self._open(n % 3) for n in range(self.count)]
        while not self.stop.wait(0.5):
            for index, connection in enumerate(held):
                if connection is not None and not _closed(connection):
                    continue
                if connection is not None:
                    connection.close()
                held[index] = self._open(index % 3)
        for connection in held:
            if connection is not None:
                connection.close()


def hold_slow_connections(port: int) -> int:
    """The attacker's process: hold the slow connections until SIGTERM."""
    slow = SlowConnections(port, SLOW_CONNECTIONS)
    signal.signal(signal.SIGTERM, lambda *_: slow.stop.set())
    slow.thread.start()
    while slow.thread.is_alive():
        slow.thread.join(0.5)
    print(f"{slow.opened} opened in all, {slow.failed} failed to open")
    return 0


def open_connections(port: int) -> float:
    for line in http_get(f"http://127.0.0.1:{port}/metrics").decode().splitlines():
        if line.startswith("gpufleet_agent_connections "):
            return float(line.split()[1])
    return 0.0


def _closed(connection: socket.socket) -> bool:
    try:
        return connection.recv(4096, socket.MSG_PEEK) == b""
    except BlockingIOError:
        return False
    except OSError:
        return True


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ingest-requests", type=int, default=300)
    parser.add_argument("--scrapes", type=int, default=200)
    parser.add_argument(
        "--agent-pythonpath", help="run the agent from another checkout's exporter/ (a before)"
    )
    parser.add_argument("--hold-slow", type=int, metavar="PORT", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.hold_slow:
        return hold_slow_connections(args.hold_slow)

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = SLOW_CONNECTIONS + 512
    if soft < wanted and (hard == resource.RLIM_INFINITY or hard >= wanted):
        resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))
    print(f"ulimit -n: soft {soft}, hard {hard}; this process uses up to {wanted}")

    workdir = Path(tempfile.mkdtemp(prefix="gpufleet-bench-hostile-"))
    env = dict(os.environ)
    if args.agent_pythonpath:
        env["PYTHONPATH"] = args.agent_pythonpath
    figures: dict[str, str] = {}
    rss: dict[str, float] = {}
    try:
        attacked(workdir, env, args, figures, rss)
        abused(workdir, env, args, figures, rss)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    print("\nagent RSS MiB: " + ", ".join(f"{k} {v:.1f}" for k, v in rss.items()))
    for key, value in rss.items():
        figures[f"rss_{key}_mib"] = f"{value:.1f}"
    print(" ".join(f"{key}={value}" for key, value in figures.items()))
    return 0


def start_agent(workdir: Path, env: dict[str, str], name: str) -> tuple[ManagedProcess, int]:
    port = free_port()
    agent = ManagedProcess(
        [
            sys.executable,
            "-m",
            "gpufleet",
            "agent",
            "--gpu-source",
            "synthetic",
            "--gpu-interval",
            "5",
            "--listen",
            f"127.0.0.1:{port}",
            "--log-level",
            "warning",
        ],
        workdir / f"{name}.log",
        env,
    )
    agent.start()
    wait_until(lambda: http_get(f"http://127.0.0.1:{port}/readyz"), 30, what="agent")
    return agent, port


def attacked(
    workdir: Path,
    env: dict[str, str],
    args: argparse.Namespace,
    figures: dict[str, str],
    rss: dict[str, float],
) -> None:
    """Phases 1 and 2: the cardinality attack, then ingest during worst-case scrapes."""
    agent, port = start_agent(workdir, env, "attacked")
    try:
        pid = agent.pid
        assert pid is not None
        rss["start"] = rss_mib(pid)

        # 1. Cardinality attack.
        started = time.perf_counter()
        naive, aware = cardinality_attack(port)
        attack_s = time.perf_counter() - started
        times, body = [], b""
        for _ in range(5):
            took, body = scrape(port)
            times.append(took)
        series = training_series(body)
        rss["after_attack"] = rss_mib(pid)
        print(
            f"\n1. cardinality attack: 16 jobs x 64 stages x 256 ranks = 262,144 step events, "
            f"twice, in {attack_s:.1f} s: in 4,096-event batches, statuses "
            f"{dict(sorted(naive.items()))}; then 64 events a request, statuses "
            f"{dict(sorted(aware.items()))}"
        )
        print(
            f"   after it: {series} training series, scrape {len(body):,} bytes, "
            f"scrape median {statistics.median(times) * 1e3:.1f} ms (5 scrapes)"
        )
        figures["attack_series"] = str(series)
        figures["attack_scrape_bytes"] = str(len(body))
        figures["attack_scrape_ms"] = f"{statistics.median(times) * 1e3:.1f}"

        # 2. Ingest while worst-case scrapes run back to back.
        job = "attack-00"
        quiet = ingest_latencies(port, args.ingest_requests, job)
        stop = threading.Event()
        scrape_times: list[float] = []

        def scraper() -> None:
            while not stop.is_set():
                scrape_times.append(scrape(port)[0])

        thread = threading.Thread(target=scraper)
        thread.start()
        try:
            wait_until(lambda: bool(scrape_times), 60, what="a first scrape")
            busy = ingest_latencies(port, args.ingest_requests, job)
        finally:
            stop.set()
            thread.join(120)
        rss["after_scrape_phase"] = rss_mib(pid)
        print(
            f"\n2. ingest (8-event batches, {args.ingest_requests} requests) "
            f"while scrapes run back to back ({len(scrape_times)} scrapes, median "
            f"{statistics.median(scrape_times) * 1e3:.1f} ms)"
        )
        print(f"   {'':16} {'p50 ms':>8} {'p99 ms':>8} {'max ms':>8}")
        for name, samples in (("no scrape", quiet), ("during scrapes", busy)):
            print(
                f"   {name:16} {statistics.median(samples) * 1e3:8.2f} "
                f"{percentile(samples, 0.99) * 1e3:8.2f} {max(samples) * 1e3:8.2f}"
            )
        figures["ingest_p99_quiet_ms"] = f"{percentile(quiet, 0.99) * 1e3:.2f}"
        figures["ingest_p99_during_scrape_ms"] = f"{percentile(busy, 0.99) * 1e3:.2f}"
    finally:
        agent.stop()


def abused(
    workdir: Path,
    env: dict[str, str],
    args: argparse.Namespace,
    figures: dict[str, str],
    rss: dict[str, float],
) -> None:
    """Phase 3, on a fresh agent holding what a real node holds (8 GPUs, one job of 8 ranks
    in 2 stages): /metrics with no slow connections, then with 1,000."""
    agent, port = start_agent(workdir, env, "abused")
    try:
        pid = agent.pid
        assert pid is not None
        connection = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
        for stage in range(2):
            post(connection, step_events("real-job", stage, range(stage * 4, stage * 4 + 4), 0))
        connection.close()
        quiet_scrapes = [scrape(port)[0] for _ in range(args.scrapes)]
        rss["fresh_node"] = rss_mib(pid)
        # The attacker runs in its own process, so that it never takes the GIL from the
        # scraper being timed here.
        attacker = subprocess.Popen(
            [sys.executable, __file__, "--hold-slow", str(port)],
            stdout=subprocess.PIPE,
            text=True,
        )
        latencies: list[float] = []
        failures = 0
        try:
            wait_until(
                lambda: open_connections(port) >= SLOW_CONNECTIONS // 2,
                60,
                what="the slow connections",
            )
            for _ in range(args.scrapes):
                try:
                    latencies.append(scrape(port)[0])
                except OSError:
                    failures += 1
        finally:
            attacker.terminate()
            held, _ = attacker.communicate(timeout=60)
        rss["after_slow_connections"] = rss_mib(pid)
        closed = {
            line.split('reason="')[1].split('"')[0]: line.rsplit(" ", 1)[1]
            for line in http_get(f"http://127.0.0.1:{port}/metrics").decode().splitlines()
            if line.startswith("gpufleet_agent_connections_closed_total{")
        }
        print(
            f"\n3. /metrics of a real node ({args.scrapes} scrapes, a new connection each), "
            f"then again while {SLOW_CONNECTIONS} slow connections are held (idle / slow "
            f"header / slow body, reopened as they are cut; {held.strip()})"
        )
        print(f"   {'':24} {'p50 ms':>8} {'p99 ms':>8} {'max ms':>8}")
        for name, samples in (
            ("no slow connections", quiet_scrapes),
            ("1,000 slow ones", latencies),
        ):
            if samples:
                print(
                    f"   {name:24} {statistics.median(samples) * 1e3:8.2f} "
                    f"{percentile(samples, 0.99) * 1e3:8.2f} {max(samples) * 1e3:8.2f}"
                )
        print(f"   scrapes that failed under the slow connections: {failures}")
        print(f"   connections the agent cut, by reason: {closed}")
        figures["metrics_p99_quiet_ms"] = f"{percentile(quiet_scrapes, 0.99) * 1e3:.2f}"
        figures["metrics_p99_under_slow_ms"] = (
            f"{percentile(latencies, 0.99) * 1e3:.2f}" if latencies else "nan"
        )
        figures["metrics_failed_under_slow"] = str(failures)
    finally:
        agent.stop()


if __name__ == "__main__":
    raise SystemExit(main())
