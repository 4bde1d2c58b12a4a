"""Scrape cost of the agent vs Debian's node_exporter, measured side by side.

Starts ``gpufleet agent --gpu-source synthetic`` (8 H100s through the real
reader, sampler and renderer) and ``prometheus-node-exporter`` with its default
collectors, then scrapes them alternately over keep-alive connections with
``Accept-Encoding: gzip``, as Prometheus does. Prints median / p99 latency,
bytes per scrape, series, latency per 1,000 series, the agent's RSS and its CPU
per collection cycle.

    python bench/agent_scrape.py [--scrapes 2000]
"""

from __future__ import annotations

import argparse
import gzip
import http.client
import shutil
import statistics
import tempfile
import time
from pathlib import Path

from gpufleet.lab.processes import ManagedProcess, agent_process, free_port, http_get, wait_until
from gpufleet.lab.processes import process_cpu_seconds as cpu_seconds
from gpufleet.lab.processes import process_rss_mib as rss_mib


def series_count(text: str) -> int:
    return sum(1 for line in text.splitlines() if line and not line.startswith("#"))


class Scraper:
    def __init__(self, name: str, port: int) -> None:
        self.name = name
        self.connection = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
        self.latencies: list[float] = []
        self.wire_bytes = 0
        self.raw_bytes = 0
        self.series = 0

    def scrape(self) -> None:
        started = time.perf_counter()
        self.connection.request(
            "GET", "/metrics", headers={"Accept-Encoding": "gzip", "Connection": "keep-alive"}
        )
        response = self.connection.getresponse()
        body = response.read()
        self.latencies.append(time.perf_counter() - started)
        self.wire_bytes = len(body)
        if response.getheader("Content-Encoding") == "gzip":
            body = gzip.decompress(body)
        self.raw_bytes = len(body)
        self.series = series_count(body.decode())

    def row(self) -> dict[str, float]:
        ordered = sorted(self.latencies)
        median = statistics.median(ordered)
        return {
            "median_ms": median * 1e3,
            "p99_ms": ordered[int(len(ordered) * 0.99) - 1] * 1e3,
            "series": self.series,
            "bytes_raw": self.raw_bytes,
            "bytes_gzip": self.wire_bytes,
            "ms_per_1k_series": median * 1e3 / self.series * 1000,
        }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scrapes", type=int, default=2000)
    parser.add_argument("--cycle-window", type=float, default=20.0)
    args = parser.parse_args()

    node_exporter = shutil.which("prometheus-node-exporter")
    workdir = Path(tempfile.mkdtemp(prefix="gpufleet-bench-"))
    agent_port, node_port = free_port(), free_port()
    agent = agent_process(workdir, agent_port, "synthetic", "--gpu-interval", "1")
    processes = [agent]
    agent.start()
    if node_exporter:
        exporter = ManagedProcess(
            [node_exporter, f"--web.listen-address=127.0.0.1:{node_port}"],
            workdir / "node_exporter.log",
        )
        exporter.start()
        processes.append(exporter)
    try:
        wait_until(lambda: http_get(f"http://127.0.0.1:{agent_port}/readyz"), 30, what="agent")
        scrapers = [Scraper("gpufleet agent (8 GPUs)", agent_port)]
        if node_exporter:
            wait_until(lambda: http_get(f"http://127.0.0.1:{node_port}/metrics"), 30, what="ne")
            scrapers.append(Scraper("node_exporter (defaults)", node_port))
        for scraper in scrapers:  # warm up connections and caches
            for _ in range(50):
                scraper.scrape()
            scraper.latencies.clear()
        for _ in range(args.scrapes):
            for scraper in scrapers:
                scraper.scrape()

        # CPU per collection cycle: agent CPU over an idle window (no scrapes), 1 s interval.
        pid = agent.pid
        assert pid is not None
        before_cpu, before = cpu_seconds(pid), time.monotonic()
        time.sleep(args.cycle_window)
        cycles = (time.monotonic() - before) / 1.0
        cpu_per_cycle_ms = (cpu_seconds(pid) - before_cpu) / cycles * 1e3
        rss = rss_mib(pid)

        rows = {scraper.name: scraper.row() for scraper in scrapers}
        print(f"\n/metrics scrape cost, {args.scrapes} interleaved keep-alive gzip scrapes each")
        header = f"{'target':26} {'median ms':>9} {'p99 ms':>8} {'series':>7} "
        header += f"{'raw B':>8} {'gzip B':>7} {'ms/1k series':>12}"
        print(header)
        for name, row in rows.items():
            print(
                f"{name:26} {row['median_ms']:9.3f} {row['p99_ms']:8.3f} {row['series']:7.0f} "
                f"{row['bytes_raw']:8.0f} {row['bytes_gzip']:7.0f} {row['ms_per_1k_series']:12.3f}"
            )
        agent_row = rows[scrapers[0].name]
        print(f"\nagent RSS after the run: {rss:.1f} MiB")
        print(
            f"agent CPU per NVML collection cycle (8 GPUs, idle scrapes): {cpu_per_cycle_ms:.2f} ms"
        )
        if node_exporter:
            ne_row = rows[scrapers[1].name]
            print(
                "latency per 1,000 series, agent / node_exporter: "
                f"{agent_row['ms_per_1k_series'] / ne_row['ms_per_1k_series']:.2f}; "
                f"median latency ratio: {agent_row['median_ms'] / ne_row['median_ms']:.2f}"
            )
        print(
            f"agent_scrape_median_ms={agent_row['median_ms']:.3f} "
            f"agent_scrape_p99_ms={agent_row['p99_ms']:.3f} agent_rss_mib={rss:.1f}"
        )
        return 0
    finally:
        for process in processes:
            process.stop()
        shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    raise SystemExit(main())
