"""Run ``torch.distributed`` code in spawned processes, never in pytest's own.

A process group made inside the pytest process lives on in C++ after the test (DDP's
reducer holds it until the collector reaches the model), and gloo's worker threads,
torn down later, may wait on the GIL the main thread holds: the test run then hangs
where pytest-timeout's alarm cannot reach it (issue 39's CI ran out of time so).
Here every rank is a child with a deadline; past it the children are killed and the
test fails, naming what did not finish.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import torch.multiprocessing as mp


def run_ranks(
    entry: Callable[..., None], args: tuple[Any, ...], nprocs: int, *, timeout_s: float = 120.0
) -> None:
    """``entry(rank, *args)`` in ``nprocs`` spawned processes; raises if one fails, or
    if they have not all finished within ``timeout_s``."""
    context = mp.start_processes(entry, args=args, nprocs=nprocs, join=False, start_method="spawn")
    deadline = time.monotonic() + timeout_s
    while not context.join(timeout=1.0):
        if time.monotonic() > deadline:
            alive = [rank for rank, p in enumerate(context.processes) if p.is_alive()]
            for process in context.processes:
                process.kill()
            raise AssertionError(f"ranks {alive} of {entry.__name__} still ran after {timeout_s} s")


def end_distributed() -> None:
    """End a rank's distributed work while the interpreter is whole. Call it after the
    peers' last collective (a barrier) and after dropping what holds the process group (a
    DDP model's reducer and its hook's futures). Left to interpreter exit, gloo's threads
    release Python objects after Python is gone and the rank aborts ("terminate called
    without an active exception", seen once in a CI run)."""
    import gc

    import torch.distributed as dist

    gc.collect()
    dist.destroy_process_group()
