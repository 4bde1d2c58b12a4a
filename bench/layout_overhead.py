"""What finding a rank's parallel layout costs, once per attempt (gpufleet.reporter.layout).

- ``describe_layout(mesh)`` on the calling thread, with the mesh given;
- the first step's share: the step that asks the sender thread to look (a flag), against
  the steps after it;
- the look itself, in the sender thread: Megatron-Core is not imported here, so it is the
  walk over the collector's objects that finds the job's DeviceMesh, in a process holding
  ``--objects`` more of them (a training process holds millions). The walk holds the GIL:
  the training thread's Python waits that long once, its GPU work does not.

One process, a world of one (gloo), a 1x1 mesh named (dp, tp): the cost does not grow
with the mesh, only with the objects walked.

    python bench/layout_overhead.py [--objects 1000000 5000000]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh

from gpufleet.client import Reporter
from gpufleet.lab.processes import agent_process, free_port, http_get, wait_until
from gpufleet.reporter.layout import discover, find_mesh


def best_of(runs: int, body: object) -> float:
    times = []
    for _ in range(runs):
        started = time.perf_counter()
        body()  # type: ignore[operator]
        times.append(time.perf_counter() - started)
    return min(times)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--objects", type=int, nargs="+", default=[0, 1_000_000, 5_000_000])
    args = parser.parse_args()

    port = free_port()
    agent = agent_process(Path(tempfile.mkdtemp(prefix="gpufleet-bench-layout-")), port)
    agent.start()
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        wait_until(lambda: http_get(f"http://127.0.0.1:{port}/readyz"), 30, what="agent")
        url = f"http://127.0.0.1:{port}"
        mesh = init_device_mesh("cpu", (1, 1), mesh_dim_names=("dp", "tp"))

        reporter = Reporter(url, training_job="bench-layout", rank=0)
        first = best_of(1, lambda: reporter.describe_layout(mesh))  # starts the sender too
        described = best_of(5, lambda: reporter.describe_layout(mesh))
        assert reporter.flush(10)
        reporter.close()

        reporter = Reporter(url, training_job="bench-layout-steps", rank=0)
        reporter._start_thread()  # as the first recorded event does, before and after layouts
        steps = []
        for n in range(10_001):
            started = time.perf_counter_ns()
            reporter.record_step(0.5, compute_s=0.4, step=n)
            steps.append(time.perf_counter_ns() - started)
        assert reporter.flush(10)
        reporter.close()

        print(
            f"describe_layout(mesh), calling thread: {described * 1e3:.3f} ms "
            f"(the first call, which also starts the sender thread: {first * 1e3:.3f} ms)"
        )
        print(
            f"first step (asks the sender to look): {steps[0] / 1e3:.2f} us; "
            f"steps after it: median {statistics.median(steps[1:]) / 1e3:.2f} us"
        )
        import gc

        print(f"objects the collector tracks in this process: {len(gc.get_objects())}")
        ballast: list[list[int]] = []  # lists: tracked by the collector (tuples of ints are not)
        looks: dict[int, float] = {}
        for objects in args.objects:
            ballast.extend([n] for n in range(objects - len(ballast)))
            walk = best_of(3, find_mesh)
            look = best_of(3, lambda: discover(0, {}))
            looks[len(ballast)] = look
            print(
                f"{len(ballast):>9} more objects: find_mesh {walk * 1e3:8.1f} ms, "
                f"discover {look * 1e3:8.1f} ms (sender thread, once per attempt)"
            )
        most = max(looks)
        per_million = (looks[most] - looks[min(looks)]) / (most - min(looks)) * 1e6 if most else 0
        print(
            f"layout_describe_ms={described * 1e3:.3f} layout_first_step_us={steps[0] / 1e3:.2f} "
            f"layout_later_step_median_us={statistics.median(steps[1:]) / 1e3:.2f} "
            f"layout_look_ms={looks[min(looks)] * 1e3:.1f} "
            f"layout_look_ms_per_million_objects={per_million * 1e3:.1f}"
        )
        return 0
    finally:
        dist.destroy_process_group()
        agent.stop()


if __name__ == "__main__":
    raise SystemExit(main())
