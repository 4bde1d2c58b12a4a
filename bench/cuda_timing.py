"""The CUDA path of the training client's framework timing, on one GPU: the prepared
check a session lent a GPU machine runs (the tests cover the CPU path only).

Two ranks share the GPU over gloo (NCCL refuses two ranks on one device). Each trains
the same small model through ``reporter``'s ``watch`` (DDP: CUDA events on the compute
stream and the stream of DDP's completion callback; FSDP2 and DeepSpeed: events around
each collective on its stream). Rank 1 runs extra kernels before each backward, a slow
GPU. The healthy rank must report the longer wait, the slow rank the shorter. Printed
per framework and rank: the median wait per step ``watch`` reported, the median step
time, and the step time of the same loop unwatched, side by side (alternating blocks).

    python bench/cuda_timing.py [--device cuda] [--kinds ddp fsdp deepspeed]
        [--steps 200] [--out results.json]

``--device cpu`` runs the same on CPU (gloo, the slow rank sleeping instead), which is
how the script itself is checked where there is no GPU.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

SLOW_S = 0.02  # the slow rank's extra device time per step
BLOCK = 20  # steps per block, watched and unwatched alternating


def _model(device: str) -> Any:
    import torch

    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Linear(1024, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 1024),
        torch.nn.ReLU(), torch.nn.Linear(1024, 1),
    ).to(device)  # fmt: skip


def _wrapped(kind: str, device: str) -> tuple[Any, Any]:
    """(model, backward_and_step) for ``kind`` (``gpufleet.lab.parallel``)."""
    from gpufleet.lab.parallel import data_parallel

    return data_parallel(kind, _model(device), micro_batch=32)


def _slow_work(device: str) -> Any:
    """Extra device work of about SLOW_S: matmuls on a GPU (timed once), a sleep on CPU."""
    import torch

    if device == "cpu":
        return lambda: time.sleep(SLOW_S)
    a = torch.randn(4096, 4096, device=device)
    torch.cuda.synchronize()
    started = time.perf_counter()
    for _ in range(10):
        a @ a
    torch.cuda.synchronize()
    repeats = max(1, round(SLOW_S / ((time.perf_counter() - started) / 10)))
    return lambda: [a @ a for _ in range(repeats)]


def _rank(rank: int, plan: tuple[str, str, str, int], out: str) -> None:
    import torch
    import torch.distributed as dist

    from gpufleet.reporter.collectives import watch_model

    store, kind, device, steps = plan
    os.environ.update(LOCAL_RANK=str(rank), RANK=str(rank), WORLD_SIZE="2")
    torch.set_num_threads(2)
    dist.init_process_group("gloo", rank=rank, world_size=2, init_method=f"file://{store}")
    plain, plain_step = _wrapped(kind, device)
    watched, watched_step = _wrapped(kind, device)
    wait = watch_model(watched)
    slow = _slow_work(device) if rank == 1 else (lambda: None)
    x = torch.randn(32, 1024, device=device)
    times: dict[str, list[float]] = {"plain": [], "watched": []}
    waits = []
    for index in range(steps):
        name = ("plain", "watched")[(index // BLOCK) % 2]
        model, step = (plain, plain_step) if name == "plain" else (watched, watched_step)
        started = time.perf_counter()
        loss = model(x).pow(2).mean()
        slow()
        step(loss)
        if device != "cpu":
            torch.cuda.synchronize()  # the benchmark's step clock only; watch never does
        times[name].append(time.perf_counter() - started)
        if name == "watched" and wait is not None:
            waits.append(wait.take())
    result = {
        "kind": kind,
        "rank": rank,
        "timer": type(wait).__name__,
        "wait_ms": statistics.median(waits[BLOCK:]) * 1e3 if len(waits) > BLOCK else None,
        "step_ms": {name: statistics.median(t[BLOCK:]) * 1e3 for name, t in times.items()},
    }
    Path(out).write_text(json.dumps(result))
    dist.barrier()
    dist.destroy_process_group()


def _entry(rank: int, plan: tuple[str, str, str, int], outs: list[str]) -> None:
    _rank(rank, plan, outs[rank])


def check(kind: str, device: str, steps: int) -> dict[str, Any]:
    import torch.multiprocessing as mp

    with tempfile.TemporaryDirectory() as tmp:
        outs = [str(Path(tmp) / f"rank-{rank}.json") for rank in range(2)]
        try:
            mp.start_processes(
                _entry, args=((str(Path(tmp) / "store"), kind, device, steps), outs), nprocs=2
            )
        except Exception as error:  # noqa: BLE001 - one framework failing is a finding
            return {"kind": kind, "error": str(error).strip().splitlines()[-1][:300]}
        healthy, slow = (json.loads(Path(out).read_text()) for out in outs)
    waits = (healthy["wait_ms"], slow["wait_ms"])
    ok = None not in waits and waits[0] > waits[1] + 0.4 * SLOW_S * 1e3
    return {"kind": kind, "healthy": healthy, "slow": slow, "slow_rank_found": ok}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    parser.add_argument("--kinds", nargs="+", default=["ddp", "fsdp", "deepspeed"])
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    results = []
    for kind in args.kinds:
        result = check(kind, args.device, args.steps)
        results.append(result)
        if "error" in result:
            print(f"{kind}: failed: {result['error']}")
            continue
        for role in ("healthy", "slow"):
            rank = result[role]
            steps = ", ".join(f"{k} {v:.2f} ms" for k, v in rank["step_ms"].items())
            print(f"{kind} {role} rank ({rank['timer']}): wait {rank['wait_ms']:.2f} ms a "
                  f"step; step median {steps}")  # fmt: skip
        print(f"{kind}: slow rank told apart: {result['slow_rank_found']}")
    if args.out:
        args.out.write_text(json.dumps({"device": args.device, "results": results}, indent=1))
    return 0 if all(r.get("slow_rank_found") for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
