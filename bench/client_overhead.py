"""Cost of recording a step on the training thread, agent up and agent down.

Each recorded call is timed on its own with perf_counter_ns; a bare loop
iteration is timed the same way in the same run, so the timer's own cost is
visible (and subtracted in the "net" column). The agent runs in its own process,
as on a node.

    python bench/client_overhead.py [--calls 200000]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from gpufleet.client import Reporter
from gpufleet.lab.processes import agent_process, free_port, http_get, wait_until


def timed(calls: int, body: Callable[[int], None]) -> list[int]:
    samples = [0] * calls
    clock = time.perf_counter_ns
    for n in range(calls):
        started = clock()
        body(n)
        samples[n] = clock() - started
    return samples


def summary(samples: list[int]) -> tuple[float, float]:
    ordered = sorted(samples)
    return statistics.median(ordered) / 1e3, ordered[int(len(ordered) * 0.99) - 1] / 1e3


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=200_000)
    args = parser.parse_args()

    port = free_port()
    workdir = Path(tempfile.mkdtemp(prefix="gpufleet-bench-client-"))
    agent = agent_process(workdir, port)
    agent.start()
    try:
        wait_until(lambda: http_get(f"http://127.0.0.1:{port}/readyz"), 30, what="agent")
        results: dict[str, tuple[float, float]] = {}
        bare = timed(args.calls, lambda n: None)
        results["bare loop iteration"] = summary(bare)

        for state, url in (
            ("up", f"http://127.0.0.1:{port}"),
            ("down", f"http://127.0.0.1:{free_port()}"),
        ):
            reporter = Reporter(url, training_job="bench", rank=0, timeout=0.2, buffer_size=1 << 20)

            def record(n: int, reporter: Reporter = reporter) -> None:
                reporter.record_step(0.5, compute_s=0.4, step=n)

            def with_context(n: int, reporter: Reporter = reporter) -> None:
                with reporter.step(tokens=4096):
                    pass

            results[f"record_step, agent {state}"] = summary(timed(args.calls, record))

            results[f"with step(), agent {state}"] = summary(timed(args.calls, with_context))
            sent, dropped = reporter.sent, reporter.dropped_total
            reporter.flush(10 if state == "up" else 0.1)
            reporter.close()
            print(
                f"agent {state}: sent {reporter.sent} (when timing ended {sent}), dropped {dropped}"
            )

        bare_median = results["bare loop iteration"][0]
        print(f"\nclient cost per recorded step ({args.calls} calls each, one run)")
        print(f"{'call':28} {'median us':>10} {'p99 us':>8} {'net median us':>14}")
        for name, (median, p99) in results.items():
            print(f"{name:28} {median:10.3f} {p99:8.3f} {median - bare_median:14.3f}")
        up = results["with step(), agent up"]
        down = results["with step(), agent down"]
        print(
            f"client_step_median_us_up={up[0]:.3f} client_step_p99_us_up={up[1]:.3f} "
            f"client_step_median_us_down={down[0]:.3f} client_step_p99_us_down={down[1]:.3f}"
        )
        return 0
    finally:
        agent.stop()


if __name__ == "__main__":
    raise SystemExit(main())
