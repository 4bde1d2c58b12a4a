"""The fleet ledger as its history grows and as writers pile on, optionally beside an older build.

Phases, each against a real ``gpufleet fleet`` process on 127.0.0.1:

1. ``/metrics`` latency at 0, 10k and 100k stored rows (80% exclusions, 20% job
   attempts, always the same 128 nodes x 4 reasons and 20 jobs, so the series
   count is the same at 10k and 100k rows and any growth is the history's cost).
   The rows are written straight into the SQLite file (a v2 database, as an
   older ledger left it), so the new ledger's startup includes its migration.
2. Write throughput with fsync (``synchronous=FULL``): one client posting
   sequentially, then ``--concurrency`` clients at once (exclusion + release
   pairs, each with its own Idempotency-Key, keep-alive connections).
3. ``/healthz`` latency while those concurrent writers run: whether a write or
   its fsync holds the event loop.

``--baseline-ref REF`` runs the same phases on the ledger of a git revision
(its ``exporter/`` unpacked into a temporary folder), side by side. Figures are
medians (and p99) on a machine other jobs share: expect noise, compare ratios.
Exits 1 when a target is missed (scrape at 100k rows above 10 ms, or more than
3x the 10k-row figure, or /healthz p99 during writes above 50 ms).

    python bench/hostile_ledger.py [--rows 0,10000,100000] [--baseline-ref 2dc4b02]
"""

from __future__ import annotations

import argparse
import http.client
import os
import shutil
import sqlite3
import statistics
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

from gpufleet.fleet.exported import LedgerLimits
from gpufleet.fleet.migrations import MIGRATIONS
from gpufleet.lab.processes import ManagedProcess, free_port, http_get, ledger_post, wait_until

REPO = Path(__file__).resolve().parent.parent
NODES, REASONS, JOBS = 128, ("xid79", "ecc", "nvlink", "slow"), 20
T0 = 1_700_000_000.0
TARGET_SCRAPE_MS, TARGET_FLATNESS, TARGET_HEALTHZ_MS = 10.0, 3.0, 50.0


def history_database(
    path: Path, rows: int, *, nodes: int = NODES, jobs: int = JOBS, distinct: bool = False
) -> None:
    """A v2 ledger (the schema before materialised counters) holding ``rows`` rows, 80%
    exclusions; with ``distinct``, every exclusion is a series of its own (filling a cap)."""
    database = sqlite3.connect(path)
    for script in MIGRATIONS[:2]:
        for statement in filter(str.strip, script.split(";")):
            database.execute(statement)
    database.execute("PRAGMA user_version = 2")
    exclusions, attempts = rows * 4 // 5, rows - rows * 4 // 5

    def reason(i: int) -> str:
        return REASONS[i // nodes % 4] if distinct else REASONS[i % 4]

    database.executemany(
        "INSERT INTO exclusions (node, reason, source, excluded_at, released_at, "
        "idempotency_key) VALUES (?, ?, ?, ?, ?, ?)",
        (
            (f"node-{i % nodes:05d}", reason(i),
             ("auto", "manual")[i // (4 * nodes) % 2 if distinct else i % 2],
             T0 + i * 60, T0 + i * 60 + 30, f"history-exclusion-{i}")
            for i in range(exclusions)
        ),
    )  # fmt: skip
    JOBS_ = jobs  # noqa: N806 - the generator below reads it
    per_job = -(-attempts // JOBS_)
    database.executemany(
        "INSERT INTO attempts (training_job, attempt, trigger, started_at, first_step_at, "
        "ended_at, outcome, cause) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
        (
            (f"job-{i % JOBS_:03d}", i // JOBS_ + 1,
             "initial" if i < JOBS_ else ("manual" if i // JOBS_ % 5 == 0 else "auto"),
             T0 + (i // JOBS_) * 7200, T0 + (i // JOBS_) * 7200 + 300,
             T0 + (i // JOBS_) * 7200 + 3600, "failed", "xid79")
            for i in range(min(attempts, per_job * JOBS_))
        ),
    )  # fmt: skip
    database.commit()
    database.close()


class Ledger:
    def __init__(self, name: str, source: Path, workdir: Path, db: Path) -> None:
        self.name = name
        self.port = free_port()
        env = {**os.environ, "PYTHONPATH": str(source)}
        self.process = ManagedProcess(
            [sys.executable, "-m", "gpufleet", "fleet", "--listen", f"127.0.0.1:{self.port}",
             "--db", str(db), "--log-level", "warning"],
            workdir / f"{name}-{db.stem}.log",
            env,
        )  # fmt: skip
        started = time.monotonic()
        self.process.start()
        wait_until(lambda: http_get(f"http://127.0.0.1:{self.port}/readyz"), 600, what=name)
        self.startup_s = time.monotonic() - started

    def connection(self) -> http.client.HTTPConnection:
        return http.client.HTTPConnection("127.0.0.1", self.port, timeout=120)

    def stop(self) -> None:
        self.process.stop()


def timed(call: Callable[[], None], times: int) -> list[float]:
    latencies = []
    for _ in range(times):
        started = time.perf_counter()
        call()
        latencies.append((time.perf_counter() - started) * 1e3)
    return latencies


def p99(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[max(0, int(len(ordered) * 0.99) - 1)]


def scrape_phase(
    name: str, source: Path, workdir: Path, rows: int, scrapes: int, *, at_caps: bool = False
) -> dict[str, float]:
    db = workdir / f"{name}-{rows}{'-caps' if at_caps else ''}.db"
    if at_caps:  # LedgerLimits' defaults: 10,000 exclusion series on 10,000 nodes, 500 jobs
        history_database(db, rows, nodes=10_000, jobs=500, distinct=True)
    else:
        history_database(db, rows)
    ledger = Ledger(name, source, workdir, db)
    try:
        connection = ledger.connection()
        body = b""

        def scrape() -> None:
            nonlocal body
            connection.request("GET", "/metrics")
            response = connection.getresponse()
            body = response.read()
            assert response.status == 200, response.status

        timed(scrape, 3)  # warm up
        latencies = timed(scrape, scrapes)
        series = sum(1 for line in body.decode().splitlines() if line and line[0] != "#")
        return {
            "median_ms": statistics.median(latencies),
            "p99_ms": p99(latencies),
            "series": series,
            "bytes": len(body),
            "startup_s": ledger.startup_s,
        }
    finally:
        ledger.stop()


def post(
    connection: http.client.HTTPConnection, path: str, body: dict[str, object], key: str
) -> None:
    status = ledger_post(connection, path, body, key)
    assert status in (200, 201), (status, key)


def writer(ledger: Ledger, worker: int, pairs: int) -> None:
    connection = ledger.connection()
    for number in range(pairs):
        node = f"w{worker}-node-{number % 50}"
        post(
            connection,
            "/v1/exclusions",
            {"node": node, "reason": "xid79"},
            f"bench-x-{worker}-{number}",
        )
        post(connection, "/v1/releases", {"node": node}, f"bench-r-{worker}-{number}")


def write_phase(
    name: str, source: Path, workdir: Path, writes: int, concurrency: int
) -> dict[str, float]:
    ledger = Ledger(name, source, workdir, workdir / f"{name}-writes.db")
    try:
        pairs = writes // 2
        started = time.perf_counter()
        writer(ledger, 0, pairs)
        sequential = pairs * 2 / (time.perf_counter() - started)

        per_worker = max(1, pairs // concurrency)
        threads = [
            threading.Thread(target=writer, args=(ledger, worker, per_worker))
            for worker in range(1, concurrency + 1)
        ]
        probe = ledger.connection()
        healthz: list[float] = []
        started = time.perf_counter()
        for thread in threads:
            thread.start()

        def ping() -> None:
            probe.request("GET", "/healthz")
            probe.getresponse().read()

        while any(thread.is_alive() for thread in threads):
            healthz += timed(ping, 1)
            time.sleep(0.005)
        for thread in threads:
            thread.join()
        concurrent = per_worker * 2 * concurrency / (time.perf_counter() - started)
        return {
            "sequential_per_s": sequential,
            "concurrent_per_s": concurrent,
            "healthz_median_ms": statistics.median(healthz),
            "healthz_p99_ms": p99(healthz),
        }
    finally:
        ledger.stop()


def unpack(ref: str, workdir: Path) -> Path:
    """The ``exporter/`` tree of a git revision, unpacked beside the current one."""
    archive = subprocess.run(
        ["git", "-C", str(REPO), "archive", ref, "exporter"], check=True, capture_output=True
    ).stdout
    target = workdir / f"src-{ref}"
    archive_path = workdir / "source.tar"
    archive_path.write_bytes(archive)
    with tarfile.open(archive_path) as tar:
        tar.extractall(target, filter="data")
    return target / "exporter"


def label(rows: int) -> str:
    return f"{rows // 1000}k" if rows >= 1000 else str(rows)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", default="0,10000,100000", help="history sizes, comma-separated")
    parser.add_argument("--scrapes", type=int, default=50, help="scrapes per history size")
    parser.add_argument("--writes", type=int, default=600, help="writes per throughput phase")
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--baseline-ref", help="also measure the ledger of this git revision")
    parser.add_argument(
        "--baseline-scrapes", type=int, default=10, help="scrapes per size for the baseline"
    )
    parser.add_argument(
        "--skip-caps", action="store_true", help="skip the scrape of a ledger filled to its caps"
    )
    args = parser.parse_args()
    sizes = [int(text) for text in args.rows.split(",")]
    workdir = Path(tempfile.mkdtemp(prefix="gpufleet-bench-ledger-"))
    builds = [("current", REPO / "exporter", args.scrapes)]
    try:
        if args.baseline_ref:
            builds.append(
                (args.baseline_ref, unpack(args.baseline_ref, workdir), args.baseline_scrapes)
            )
        scrapes: dict[str, dict[int, dict[str, float]]] = {}
        writes: dict[str, dict[str, float]] = {}
        for name, source, count in builds:
            scrapes[name] = {
                rows: scrape_phase(name, source, workdir, rows, count) for rows in sizes
            }
            writes[name] = write_phase(name, source, workdir, args.writes, args.concurrency)
        caps = None
        if not args.skip_caps:
            # 10,000 exclusions (one series each) and 2,500 attempts (5 per job)
            caps = scrape_phase("current", REPO / "exporter", workdir, 12_500, 5, at_caps=True)

        print("\nledger /metrics by stored rows (keep-alive, medians; a shared, noisy machine)")
        print(f"{'build':12} {'rows':>7} {'median ms':>10} {'p99 ms':>8} {'series':>7} "
              f"{'bytes':>8} {'startup s':>9}")  # fmt: skip
        for name, by_rows in scrapes.items():
            for rows, row in by_rows.items():
                print(
                    f"{name:12} {rows:7d} {row['median_ms']:10.2f} {row['p99_ms']:8.2f} "
                    f"{row['series']:7.0f} {row['bytes']:8.0f} {row['startup_s']:9.2f}"
                )
        if caps is not None:
            print(
                f"\nfilled to the default caps (10,000 exclusion series, 10,000 nodes, 500 jobs): "
                f"{caps['series']:.0f} series, {caps['bytes'] / 1e6:.1f} MB, scrape median "
                f"{caps['median_ms']:.0f} ms; LedgerLimits().worst_case_series = "
                f"{LedgerLimits().worst_case_series}"
            )
        print(f"\nwrites with fsync ({args.writes} sequential, then {args.concurrency} clients)")
        print(f"{'build':12} {'seq/s':>8} {'conc/s':>8} {'healthz med ms':>14} {'p99 ms':>8}")
        for name, row in writes.items():
            print(
                f"{name:12} {row['sequential_per_s']:8.0f} {row['concurrent_per_s']:8.0f} "
                f"{row['healthz_median_ms']:14.2f} {row['healthz_p99_ms']:8.2f}"
            )
        current = scrapes["current"]
        figures = {f"scrape_ms_{label(rows)}": row["median_ms"] for rows, row in current.items()}
        figures |= {
            "writes_per_s_seq": writes["current"]["sequential_per_s"],
            "writes_per_s_conc": writes["current"]["concurrent_per_s"],
            "healthz_p99_ms_writing": writes["current"]["healthz_p99_ms"],
        }
        if caps is not None:
            figures["caps_series"] = caps["series"]
            figures["caps_scrape_ms"] = caps["median_ms"]
        if args.baseline_ref:
            base = scrapes[args.baseline_ref]
            print(f"\nbefore ({args.baseline_ref}) / after, medians:")
            for rows in sizes:
                ratio = base[rows]["median_ms"] / current[rows]["median_ms"]
                print(f"  /metrics at {rows:>7} rows: {ratio:6.1f}x faster")
                figures[f"before_scrape_ms_{label(rows)}"] = base[rows]["median_ms"]
            for key in ("sequential_per_s", "concurrent_per_s"):
                ratio = writes["current"][key] / writes[args.baseline_ref][key]
                print(f"  writes {key.split('_')[0]:10}: {ratio:6.2f}x the throughput")
            figures["before_healthz_p99_ms_writing"] = writes[args.baseline_ref]["healthz_p99_ms"]
        missed = []
        largest = max(sizes)
        if largest >= 100_000 and current[largest]["median_ms"] > TARGET_SCRAPE_MS:
            missed.append(f"/metrics at {largest} rows above {TARGET_SCRAPE_MS} ms")
        if 10_000 in current and largest > 10_000:
            growth = current[largest]["median_ms"] / current[10_000]["median_ms"]
            if growth > TARGET_FLATNESS:
                missed.append(f"/metrics {growth:.1f}x slower at {largest} rows than at 10k")
        if writes["current"]["healthz_p99_ms"] > TARGET_HEALTHZ_MS:
            missed.append(f"/healthz p99 above {TARGET_HEALTHZ_MS} ms while writes run")
        print("\ntargets: " + ("all met" if not missed else "MISSED: " + "; ".join(missed)))
        print(" ".join(f"{key}={value:.2f}" for key, value in figures.items()))
        return 1 if missed else 0
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    raise SystemExit(main())
