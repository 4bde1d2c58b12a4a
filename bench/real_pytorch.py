"""Fail-slow detection on real multi-process PyTorch, and what the timing hook costs.

Each job is real: 4 "nodes" of one rank each, launched by ``torchrun`` (one per node,
c10d rendezvous), ``torch.distributed`` with gloo on CPU, the framework instrumented
only with gpufleet's integration lines, one gpufleet agent per node and a real
Prometheus running the generated rules compressed in time (``gpufleet.lab.realjob``).
A rank's GPU kernels are a sleep (``Workload``): on a 2-core machine, four ranks' real
matmuls share the cores and a slow rank's extra work would fill its peers' idle time.

Classes:
- ``slow x1.NN node-K``: node K's device time grows by NN% a minute (compressed) after
  the first step; found when ``GpuFleetStragglerNode`` fires for node K after that.
- ``healthy`` and ``imbalanced`` (one node's batches 1.3x longer: tokens and device
  time): any page is false.
In every run a page before the slowdown, or one naming another node, is false.
Times are uncompressed (the production time the compressed span stands for).

Then the hook's cost: two gloo ranks train one model through three DDP wrappers, one
watched, one with DDP's all-reduce as a plain Python hook, one built in, in
alternating blocks, so all are measured side by side. With ``--framework fsdp``: two
FSDP2 copies of the model (``fully_shard`` per layer), one watched, one not.

    python bench/real_pytorch.py [--factors 1.05 1.10 1.20 1.40] [--placements 1 3]
        [--repeats 1] [--framework ddp] [--skip-jobs] [--skip-overhead]
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpufleet.detect.intervals import wilson
from gpufleet.lab.realjob import JobResult, JobSpec, run_job
from gpufleet.lab.workload import FRAMEWORKS

STRAGGLER = "GpuFleetStragglerNode"
# the hook's cost: DDP's built-in all-reduce, the same as a Python hook, and watched
VARIANTS = ("plain", "python hook", "watched")
FSDP_VARIANTS = ("plain", "watched")
# after the slow node paged, the job runs this much longer (compressed) so that a page
# for another node, or a late false one, still has time to show
AFTER_PAGE_S = 20.0


@dataclass
class Outcome:
    label: str
    slow: bool
    found: bool
    detect_min: float | None  # uncompressed minutes from slowdown to the page
    false_pages: list[str]
    job_pages: list[str]
    ratio: float | None  # the slow node's mean compute ratio once slowed


def judge(label: str, result: JobResult) -> Outcome:
    spec = result.spec
    slow_node = spec.node_name(spec.slow_node) if spec.slow_node is not None else None
    slowed = result.slowed_at
    found_at = None
    false_pages, job_pages = [], []
    for alert in result.pages():
        assert alert.fired_at is not None
        if alert.node is None:
            # a job-level page is true for a slowed job once it is slow, else false
            true = slowed is not None and alert.fired_at >= slowed
            (job_pages if true else false_pages).append(f"{alert.name}@job")
            continue
        true = (
            alert.name == STRAGGLER
            and alert.node == slow_node
            and slowed is not None
            and alert.fired_at >= slowed
        )
        if true:
            found_at = alert.fired_at if found_at is None else min(found_at, alert.fired_at)
        else:
            false_pages.append(f"{alert.name}@{alert.node}")
    detect = spec.uncompressed(found_at - slowed) / 60 if found_at is not None and slowed else None
    ratio = result.mean_ratio(slow_node, slowed) if slow_node and slowed else None
    return Outcome(label, slow_node is not None, found_at is not None, detect, false_pages,
                   job_pages, ratio)  # fmt: skip


def run_jobs(args: argparse.Namespace, workdir: Path) -> list[Outcome]:
    base = JobSpec(
        framework=args.framework,
        device_s=args.device_s,
        duration_s=args.duration,
        slow_after_s=args.slow_after,
    )
    plans: list[tuple[str, JobSpec]] = [
        ("healthy", base),
        ("imbalanced", JobSpec(**{**_fields(base), "imbalanced_node": 2})),
    ]
    for factor in args.factors:
        for node in args.placements:
            for _ in range(args.repeats):
                spec = JobSpec(**{**_fields(base), "slow_node": node, "slow_factor": factor})
                plans.append((f"slow x{factor:.2f}", spec))
    outcomes = []
    for index, (label, spec) in enumerate(plans):
        started = time.monotonic()
        slow_node = spec.node_name(spec.slow_node) if spec.slow_node is not None else None

        def enough(result: JobResult, slow_node: str | None = slow_node) -> bool:
            page = result.first_fired(STRAGGLER, slow_node) if slow_node else None
            return page is not None and page.fired_at is not None and (
                result.ended_at - page.fired_at >= AFTER_PAGE_S
            )  # fmt: skip

        result = run_job(spec, workdir / f"job-{index}", until=enough)
        outcome = judge(label, result)
        outcomes.append(outcome)
        print(
            f"{label:<14} node={slow_node or '-':<7} found={outcome.found!s:<5} "
            f"detect_min={_fmt(outcome.detect_min)} ratio={_fmt(outcome.ratio, 3)} "
            f"false={outcome.false_pages} job_pages={outcome.job_pages} "
            f"({time.monotonic() - started:.0f} s)",
            flush=True,
        )
    return outcomes


def _fields(spec: JobSpec) -> dict[str, Any]:
    return {name: getattr(spec, name) for name in JobSpec.__dataclass_fields__}


def _fmt(value: float | None, digits: int = 1) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def report(outcomes: list[Outcome], time_factor: int) -> dict[str, str]:
    print(f"\n{'class':<14} {'recall':>8} {'95% interval':>15} {'detect median':>14} "
          f"{'max':>6} {'false pages':>12}")  # fmt: skip
    for label in dict.fromkeys(o.label for o in outcomes):
        group = [o for o in outcomes if o.label == label]
        false = sum(len(o.false_pages) for o in group)
        if group[0].slow:
            found = sum(o.found for o in group)
            low, high = wilson(found, len(group))
            times = [o.detect_min for o in group if o.detect_min is not None]
            median = _fmt(statistics.median(times)) if times else "-"
            worst = _fmt(max(times)) if times else "-"
            print(f"{label:<14} {found:>3}/{len(group):<4} [{low:.2f}-{high:.2f}]{'':>3} "
                  f"{median + ' min':>14} {worst:>6} {false:>12}")  # fmt: skip
        else:
            print(f"{label:<14} {'-':>8} {'':>15} {'':>14} {'':>6} {false:>12}")
    total_false = sum(len(o.false_pages) for o in outcomes)
    slow = [o for o in outcomes if o.slow]
    print(f"(times uncompressed: the rules ran {time_factor}x compressed)")
    return {
        "real_pytorch_runs": str(len(outcomes)),
        "slow_found": f"{sum(o.found for o in slow)}/{len(slow)}",
        "false_pages": str(total_false),
    }


# -- the hook's cost ------------------------------------------------------------------


def _overhead_model() -> Any:
    import torch

    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Linear(256, 256), torch.nn.ReLU(), torch.nn.Linear(256, 256),
        torch.nn.ReLU(), torch.nn.Linear(256, 1),
    )  # fmt: skip


def _variants(kind: str) -> dict[str, tuple[Any, Any]]:
    """Copies of one model (a wrapper takes a module once), each with its step: for DDP
    with DDP's built-in all-reduce, it as a plain Python hook (what any Python comm hook
    costs by itself) and watched; for FSDP2 plain and watched. DDP's buckets are small,
    so that the hook runs several times a step as in a large model."""
    from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook

    from gpufleet.lab.parallel import data_parallel

    if kind == "fsdp":
        return {name: data_parallel("fsdp", _overhead_model(), lr=0.01) for name in FSDP_VARIANTS}
    ddps = {name: data_parallel("ddp", _overhead_model(), lr=0.01, bucket_cap_mb=0.1)
            for name in VARIANTS}  # fmt: skip
    ddps["python hook"][0].register_comm_hook(None, allreduce_hook)
    return ddps


def _overhead_rank(rank: int, port: int, steps: int, block: int, out: str, *, kind: str) -> None:
    import torch
    import torch.distributed as dist

    from gpufleet.reporter.collectives import watch_model

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=2)
    ddps = _variants(kind)
    variants = tuple(ddps)
    wait = watch_model(ddps["watched"][0])
    assert wait is not None
    x, y = torch.randn(32, 256), torch.randn(32, 1)
    times: dict[str, list[float]] = {name: [] for name in variants}
    for index in range(steps):
        name = variants[(index // block) % len(variants)]
        ddp, step = ddps[name]
        started = time.perf_counter()
        step(torch.nn.functional.mse_loss(ddp(x), y))
        if name == "watched":
            wait.take()
        times[name].append(time.perf_counter() - started)
    torch.save({"times": times}, out)
    dist.destroy_process_group()


def overhead(steps: int, block: int, kind: str) -> dict[str, str]:
    import torch
    import torch.multiprocessing as mp

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    with tempfile.TemporaryDirectory() as tmp:
        outs = [str(Path(tmp) / f"rank-{rank}.pt") for rank in range(2)]
        plan = (steps, block, kind)
        mp.start_processes(_overhead_entry, args=(port, plan, outs), nprocs=2)
        results = [torch.load(out) for out in outs]
    if kind == "fsdp":
        print(
            "\ntiming cost: 2 gloo ranks, two FSDP2 copies of one model (fully_shard per "
            f"layer; plain, watched) in alternating blocks of {block} steps ({steps} steps)"
        )
    else:
        print(
            "\nhook cost: 2 gloo ranks, three DDP wrappers of one model (built-in all-reduce, "
            f"it as a Python hook, watched) in alternating blocks of {block} steps ({steps} steps)"
        )
    added = []
    for rank, result in enumerate(results):
        median = {name: statistics.median(times[block:]) * 1e3
                  for name, times in result["times"].items()}  # fmt: skip
        plain = median["plain"]
        shown = ", ".join(
            f"{name} {value:.3f} ms ({(value - plain) * 1e3:+.0f} us)"
            for name, value in median.items()
        )
        print(f"rank {rank}: step median {shown}")
        added.append((median["watched"] - median.get("python hook", plain)) * 1e3)
    if kind == "fsdp":
        return {"watched_over_plain_us": f"{statistics.median(added):+.0f}"}
    return {"hook_over_python_hook_us": f"{statistics.median(added):+.0f}"}


def _overhead_entry(rank: int, port: int, plan: tuple[int, int, str], outs: list[str]) -> None:
    steps, block, kind = plan
    _overhead_rank(rank, port, steps, block, outs[rank], kind=kind)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--framework", choices=FRAMEWORKS, default="ddp")
    parser.add_argument("--factors", type=float, nargs="+", default=[1.05, 1.10, 1.20, 1.40])
    parser.add_argument("--placements", type=int, nargs="+", default=[1, 3])
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--duration", type=float, default=150.0, help="compressed seconds")
    parser.add_argument("--slow-after", type=float, default=60.0, help="compressed seconds")
    parser.add_argument("--device-s", type=float, default=0.05, help="GPU time a step")
    parser.add_argument("--overhead-steps", type=int, default=2000)
    parser.add_argument("--skip-jobs", action="store_true")
    parser.add_argument("--skip-overhead", action="store_true")
    args = parser.parse_args()
    figures: dict[str, str] = {}
    if not args.skip_jobs:
        with tempfile.TemporaryDirectory(prefix="gpufleet-real-") as tmp:
            outcomes = run_jobs(args, Path(tmp))
        figures |= report(outcomes, JobSpec().time_factor)
    if not args.skip_overhead:
        if args.framework == "deepspeed":
            print("\ntiming cost: not measured for DeepSpeed (bench/real_pytorch.py times DDP "
                  "and FSDP2 side by side)")  # fmt: skip
        else:
            kind = "fsdp" if "fsdp" in args.framework else "ddp"
            figures |= overhead(args.overhead_steps, 100, kind)
    print(" ".join(f"{key}={value}" for key, value in figures.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
