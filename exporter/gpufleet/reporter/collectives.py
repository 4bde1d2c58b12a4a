"""A rank's own work apart from its wait for peers, in PyTorch's DistributedDataParallel.

Under DDP the gradient all-reduce runs inside ``loss.backward()``, bucket by bucket,
overlapped with the rest of the backward pass. A timer around forward + backward
therefore holds each healthy rank's wait for a slow one and reads the same on every
rank. What tells the ranks apart is *when* each one had its gradients ready:

- the moment DDP hands this rank's last gradient bucket to the communication hook is
  the end of its own backward computation (nothing it waits on comes before it);
- the moment the all-reduces of that iteration complete is when the slowest rank's
  gradients arrived, plus the transfer.

The time between the two is the rank's exposed collective wait: long on a healthy rank
that waits for a slow peer, short on the slow rank itself. The step's compute is then
what is left of the step (its data wait and this wait taken off).

The mechanism is a DDP communication hook (``register_comm_hook``) that wraps the
all-reduce DDP would run anyway (``allreduce_hook`` by default, or the user's own hook):
the gradients and their averaging are unchanged. Alternatives looked at and why not:
NCCL's flight recorder and ``TORCH_NCCL_ENABLE_TIMING`` time kernels on NCCL only
(nothing on gloo or CPU) and are read from dumps, not per step; CUPTI kernel timing
(nvidia-resiliency-ext's straggler detector) needs CUDA and a native extension; section
timers (Megatron-Core's ``StragglerDetector``, resiliency-ext's ``wrap_callables``) need
the user to place them, which is what DDP makes impossible to do right.

On CUDA the hook's host-side clock is the time kernels were *launched*, not run, so two
CUDA events are recorded instead: one on the compute stream when the last bucket is
ready, one on the stream DDP's completion callback runs on. Their pairs are read when
the GPU has passed them (``Event.query()``, never ``synchronize()``), so a step's wait
is reported at the first step end after the GPU finished it, usually the next one.

Importing this module imports torch; ``gpufleet.client`` imports it only from
``Reporter.watch`` (the training process has torch by then).
"""

# No ``from __future__ import annotations``: DDP checks the hook's annotations at
# registration and takes only the real ``dist.GradBucket`` / ``Future[Tensor]``.
import logging
import time
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist
from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook

if TYPE_CHECKING:
    from gpufleet.reporter.spans import CollectiveSpans

log = logging.getLogger("gpufleet.client")

CommHook = Callable[[Any, Any], Any]  # (state, GradBucket) -> Future[Tensor], as DDP calls it


class CollectiveWait:
    """The exposed collective wait of a DDP model's backward passes, taken per step.

    ``hook`` is registered as the model's communication hook; ``take()`` (training
    thread, at a step's end) returns the seconds waited since the previous ``take()``.
    """

    def __init__(self, inner: CommHook | None, *, cuda: bool) -> None:
        self._inner = inner
        self._cuda = cuda
        self._wait_s = 0.0
        # CPU: this iteration's last bucket handed over, and its latest all-reduce done
        self._ready = 0.0
        self._done = 0.0
        # CUDA: the last bucket's ready event of this iteration, and pairs to read
        self._ready_event: Any = None
        self._pending: deque[tuple[Any, Any]] = deque()

    def hook(self, state: Any, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
        # Buckets are handed over in index order; index 0 opens a new iteration.
        if bucket.index() == 0:
            self._close_iteration()
        if self._cuda:
            if not bucket.is_last():
                return self._reduce(state, bucket)
            ready = torch.cuda.Event(enable_timing=True)
            ready.record()
            self._ready_event = ready
            return self._reduce(state, bucket).then(self._arrived_cuda)
        self._ready = time.perf_counter()
        if self._inner is None:
            # DDP's own averaging all-reduce with the timing in its one callback: a second
            # callback per bucket would cost as much again (bench/real_pytorch.py)
            group = state if state is not None else dist.group.WORLD
            tensor = bucket.buffer()
            tensor.div_(group.size())
            return (
                dist.all_reduce(tensor, group=group, async_op=True).get_future().then(self._reduced)
            )
        return self._inner(state, bucket).then(self._arrived)

    def _reduce(self, state: Any, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
        return (self._inner or allreduce_hook)(state, bucket)

    def _reduced(self, future: Any) -> Any:
        # Runs in the process group's thread when this bucket's all-reduce completed;
        # DDP's backward waits for the returned future, so this ran before backward ends.
        self._done = max(self._done, time.perf_counter())
        return future.value()[0]

    def _arrived(self, future: Any) -> Any:
        # The same, after the job's own hook's future.
        self._done = max(self._done, time.perf_counter())
        return future.value()

    def _arrived_cuda(self, future: Any) -> Any:
        # Runs with the current stream ordered after the last bucket's all-reduce.
        done = torch.cuda.Event(enable_timing=True)
        done.record()
        self._pending.append((self._ready_event, done))
        return future.value()

    def _close_iteration(self) -> None:
        if self._done > self._ready > 0.0:
            self._wait_s += self._done - self._ready
        self._ready = self._done = 0.0

    def take(self) -> float:
        """Seconds of exposed collective wait since the last call (GPU: those read so far)."""
        if self._cuda:
            pending = self._pending
            while pending and pending[0][1].query():
                ready, done = pending.popleft()
                self._wait_s += max(0.0, ready.elapsed_time(done)) / 1000.0
        else:
            self._close_iteration()
        wait, self._wait_s = self._wait_s, 0.0
        return wait


class NoCollectives:
    """A model that waits on no peer (one process): all of a step but its data wait is
    compute."""

    def take(self) -> float:
        return 0.0


def is_data_parallel(model: object) -> bool:
    return isinstance(model, torch.nn.parallel.DistributedDataParallel)


def data_parallel_wrapper(module: object) -> object:
    """The DDP model or DeepSpeed engine that wraps ``module``, else ``module``. The Hugging
    Face Trainer hands its callbacks the bare model, while the wrapper that accelerate made
    holds it as ``.module``; the wrapper is found among the objects the collector tracks (once, at
    the start of training: a walk over every tracked object, tens of milliseconds)."""
    from gpufleet.reporter.deepspeed_engine import engine_class

    engine = engine_class("DeepSpeedEngine")
    wrappers = (torch.nn.parallel.DistributedDataParallel, *([engine] if engine else []))
    if isinstance(module, wrappers):
        return module
    import gc

    for candidate in gc.get_objects():
        # type(), not isinstance(): some torch objects warn when their __class__ is read
        if issubclass(type(candidate), wrappers) and candidate.module is module:
            return candidate
    return module


def watch_model(
    model: object, comm_hook: CommHook | None = None, state: object = None
) -> "CollectiveWait | CollectiveSpans | NoCollectives | None":
    """Register a timing communication hook on a DDP ``model``, or time the collectives
    of an FSDP2 (``fully_shard``) model (``gpufleet.reporter.fsdp``) or a DeepSpeed
    engine (``gpufleet.reporter.deepspeed_engine``); None where it cannot be.

    ``comm_hook`` / ``state``: the hook the job would register itself (DDP takes only
    one); it runs inside the timing hook, unchanged. Default: DDP's own all-reduce.
    A model of a job of one process has no collective to wait on: NoCollectives.
    """
    if not is_data_parallel(model):
        if not dist.is_available() or not dist.is_initialized() or dist.get_world_size() == 1:
            return NoCollectives()
        # past is_available(): torch.distributed's submodules exist
        from gpufleet.reporter.deepspeed_engine import is_deepspeed_engine, watch_deepspeed
        from gpufleet.reporter.fsdp import fsdp_units, watch_fsdp

        if is_deepspeed_engine(model):
            return watch_deepspeed(model)
        if fsdp_units(model):
            return watch_fsdp(model)
        log.warning(
            "gpufleet: watch() times DistributedDataParallel, FSDP2 (fully_shard) models and "
            "DeepSpeed engines; %s is none of them (FSDP1 and pipeline engines are not timed "
            "yet), so its steps report step time only: time comm() yourself to localise a "
            "slow rank",
            type(model).__name__,
        )
        return None
    watched = getattr(model, "_gpufleet_wait", None)
    if isinstance(watched, CollectiveWait):  # watched before: its hook is gpufleet's
        return watched
    device = next(iter(model.parameters()), torch.empty(0)).device  # type: ignore[attr-defined]
    wait = CollectiveWait(comm_hook, cuda=device.type == "cuda")
    if comm_hook is None:
        state = getattr(model, "process_group", None)
    try:
        model.register_comm_hook(state, wait.hook)  # type: ignore[attr-defined]
    except RuntimeError as error:  # a hook is registered already: DDP takes only one
        log.warning(
            "gpufleet: cannot time collectives (%s); pass your hook as "
            "watch(model, comm_hook=..., state=...) so that it runs inside gpufleet's",
            error,
        )
        return None
    model._gpufleet_wait = wait  # type: ignore[attr-defined]
    return wait
