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
   them: idle ones, slow headers, slow bodies (target p99 <= 20 ms). A patient
   attacker reopens at most 200 connections a second; a flood as fast as it
   can (a connect flood: its cost is the accept rate, which only the network
   layer can cap). The attacker connects from 127.0.0.1; the scraper from
   127.0.0.2 (another loopback address: Prometheus runs on another host than a
   flood), and, for comparison, from 127.0.0.1 too (the attacker's address).

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
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from gpufleet.lab.processes import ManagedProcess, free_port, http_get, wait_until
from gpufleet.lab.processes import process_rss_mib as rss_mib

SLOW_CONNECTIONS = 1000
PROMETHEUS = "127.0.0.2"  # the scraper's source address: another host than the flood
FLOOD = "127.0.0.1"
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


def scrape(port: int, source: str | None = None) -> tuple[float, bytes]:
    """One scrape on a new connection; ``source``: the local address to connect from."""
    started = time.perf_counter()
    connection = http.client.HTTPConnection(
        "127.0.0.1", port, timeout=60, source_address=(source, 0) if source else None
    )
    try:
        connection.request("GET", "/metrics")
        response = connection.getresponse()
        body = response.read()
        if response.status != 200:
            raise OSError(f"/metrics answered {response.status}")
    finally:
        connection.close()
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

    def __init__(self, port: int, count: int, rate: float) -> None:
        self.port = port
        self.count = count
        self.rate = rate  # reopened connections per second at most; 0: as fast as it can
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
        tick = 0.25
        while not self.stop.wait(tick):
            budget = self.rate * tick if self.rate else len(held)
            for index, connection in enumerate(held):
                if budget < 1:
                    break
                if connection is not None and not _closed(connection):
                    continue
                if connection is not None:
                    connection.close()
                held[index] = self._open(index % 3)
                budget -= 1
        for connection in held:
            if connection is not None:
                connection.close()


def hold_slow_connections(port: int, rate: float) -> int:
    """The attacker's process: hold the slow connections until SIGTERM."""
    slow = SlowConnections(port, SLOW_CONNECTIONS, rate)
    signal.signal(signal.SIGTERM, lambda *_: slow.stop.set())
    started = time.monotonic()
    slow.thread.start()
    while slow.thread.is_alive():
        slow.thread.join(0.5)
    elapsed = time.monotonic() - started
    print(
        f"{slow.opened} opened in {elapsed:.0f} s, {slow.opened / elapsed:.0f}/s; "
        f"{slow.failed} failed to open"
    )
    return 0


def under_attack(
    port: int, rate: float, seconds: float
) -> tuple[dict[str, list[float]], Counter[str], str, dict[str, str]]:
    """Scrape from both addresses while the attacker (its own process, so that it never
    takes the GIL from the scraper timed here) holds its slow connections."""
    before = closed_connections(port)
    attacker = subprocess.Popen(
        [sys.executable, __file__, "--hold-slow", str(port), "--reopen-rate", str(rate)],
        stdout=subprocess.PIPE,
        text=True,
    )
    latencies: dict[str, list[float]] = {PROMETHEUS: [], FLOOD: []}
    failures: Counter[str] = Counter()
    try:
        wait_until(lambda: open_connections(port) >= 60, 60, what="the slow connections")
        ends = time.monotonic() + seconds  # long enough for the deadlines to cut some
        while time.monotonic() < ends:
            for source in (PROMETHEUS, FLOOD):
                try:
                    latencies[source].append(scrape(port, source)[0])
                except OSError:
                    failures[source] += 1
            time.sleep(0.05)
    finally:
        attacker.terminate()
        held, _ = attacker.communicate(timeout=60)
    after = closed_connections(port)
    closed = {k: f"{v - before.get(k, 0):.0f}" for k, v in after.items()}
    return latencies, failures, held.strip(), closed


def report_row(name: str, samples: list[float], failed: int) -> None:
    if samples:
        print(
            f"   {name:52} {statistics.median(samples) * 1e3:8.2f} "
            f"{percentile(samples, 0.99) * 1e3:8.2f} {max(samples) * 1e3:8.2f} {failed:7d}"
        )


def closed_connections(port: int) -> dict[str, float]:
    return {
        line.split('reason="')[1].split('"')[0]: float(line.rsplit(" ", 1)[1])
        for line in scrape(port, PROMETHEUS)[1].decode().splitlines()
        if line.startswith("gpufleet_agent_connections_closed_total{")
    }


def open_connections(port: int) -> float:
    # From the scraper's address: the attacker's is over its share while the attack runs.
    for line in scrape(port, PROMETHEUS)[1].decode().splitlines():
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
    parser.add_argument("--slow-seconds", type=float, default=20.0, help="per attacker")
    parser.add_argument("--hold-slow", type=int, metavar="PORT", help=argparse.SUPPRESS)
    parser.add_argument("--reopen-rate", type=float, default=0.0, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.hold_slow:
        return hold_slow_connections(args.hold_slow, args.reopen_rate)

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = SLOW_CONNECTIONS + 512
    if soft < wanted and (hard == resource.RLIM_INFINITY or hard >= wanted):
        resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))
    print(f"ulimit -n: soft {soft}, hard {hard}; this process uses up to {wanted}")

    workdir = Path(tempfile.mkdtemp(prefix="gpufleet-bench-hostile-"))
    env = dict(os.environ)
    if args.agent_pythonpath:
        env["PYTHONPATH"] = args.agent_pythonpath
    run = Run(workdir, env, args)
    figures, rss = run.figures, run.rss
    try:
        attacked(run)
        abused(run)
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


@dataclass
class Run:
    """What every phase shares: where agents log, their environment, the options, and the
    figures and RSS readings the phases add to."""

    workdir: Path
    env: dict[str, str]
    args: argparse.Namespace
    figures: dict[str, str] = field(default_factory=dict)
    rss: dict[str, float] = field(default_factory=dict)


@contextmanager
def running_agent(run: Run, name: str) -> Iterator[tuple[int, int]]:
    """A fresh agent (synthetic GPUs) for one phase, logging to ``name``.log: its port and
    pid, stopped when the phase ends."""
    agent, port = start_agent(run.workdir, run.env, name)
    try:
        assert agent.pid is not None
        yield port, agent.pid
    finally:
        agent.stop()


def attacked(run: Run) -> None:
    """Phases 1 and 2: the cardinality attack, then ingest during worst-case scrapes."""
    args, figures, rss = run.args, run.figures, run.rss
    with running_agent(run, "attacked") as (port, pid):
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


def abused(run: Run) -> None:
    """Phase 3, on a fresh agent holding what a real node holds (8 GPUs, one job of 8 ranks
    in 2 stages): /metrics with no slow connections, then with 1,000."""
    args, figures, rss = run.args, run.figures, run.rss
    with running_agent(run, "abused") as (port, pid):
        connection = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
        for stage in range(2):
            post(connection, step_events("real-job", stage, range(stage * 4, stage * 4 + 4), 0))
        connection.close()
        quiet_scrapes = [scrape(port)[0] for _ in range(args.scrapes)]
        rss["fresh_node"] = rss_mib(pid)
        print(
            f"\n3. /metrics of a real node ({args.scrapes} scrapes, a new connection each); then "
            f"for {args.slow_seconds:.0f} s per attacker, a scrape every 50 ms from each "
            f"address, while an attacker on {FLOOD} holds {SLOW_CONNECTIONS} slow connections "
            "(idle / slow header / slow body) and reopens those the agent cuts"
        )
        print(f"   {'':52} {'p50 ms':>8} {'p99 ms':>8} {'max ms':>8} {'failed':>7}")
        report_row("no slow connections", quiet_scrapes, 0)
        figures["metrics_p99_quiet_ms"] = f"{percentile(quiet_scrapes, 0.99) * 1e3:.2f}"
        for name, rate in (("patient", 200.0), ("flood", 0.0)):
            latencies, failures, held, closed = under_attack(port, rate, args.slow_seconds)
            pace = f"at most {rate:.0f}/s a tick" if rate else "as fast as it can"
            print(f"   {name} attacker (reopens {pace}; {held}); cut by reason: {closed}")
            for source in (PROMETHEUS, FLOOD):
                label = f"  scraper on {source}" + (" (the attacker's)" if source == FLOOD else "")
                report_row(label, latencies[source], failures[source])
                key = f"metrics_{name}_{'other' if source == PROMETHEUS else 'same'}_address"
                samples = latencies[source]
                figures[f"{key}_p99_ms"] = (
                    f"{percentile(samples, 0.99) * 1e3:.2f}" if samples else "nan"
                )
                figures[f"{key}_failed"] = str(failures[source])
            rss[f"after_{name}_attacker"] = rss_mib(pid)


if __name__ == "__main__":
    raise SystemExit(main())
