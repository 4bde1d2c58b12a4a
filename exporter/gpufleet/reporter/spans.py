"""The summed time a rank spent in collectives between two steps: what FSDP2's and
DeepSpeed's timing wrappers (``gpufleet.reporter.fsdp``, ``deepspeed_engine``) note.
Importing it imports torch."""

from __future__ import annotations

import time
from collections import deque
from typing import Any

import torch

# Spans waiting to be read past which ``timed`` adds up the finished ones itself: a loop
# of forwards with no step (evaluation) would otherwise hold every event pair
FOLD_AFTER = 256


class CollectiveSpans:
    """The summed spans of a model's collectives (FSDP2, DeepSpeed), taken per step.

    ``take()`` (training thread, at a step's end) returns the seconds spent in them
    since the previous ``take()`` (CUDA: those the GPU has finished so far)."""

    def __init__(self, *, cuda: bool) -> None:
        self.cuda = cuda
        self._wait_s = 0.0  # synchronous calls, added on the training thread
        # asynchronous calls completed (seconds, appended from the process group's thread)
        self._completed: deque[float] = deque()
        self._events: deque[tuple[Any, Any]] = deque()  # CUDA: (before, after) to read

    def timed(self, call: Any, *args: Any, **kwargs: Any) -> Any:
        """``call(*args, **kwargs)``, its span noted."""
        if len(self._events) + len(self._completed) > FOLD_AFTER:
            self._fold()  # no step took them (forwards outside steps): memory stays bounded
        if self.cuda:
            before = torch.cuda.Event(enable_timing=True)
            before.record()
            work = call(*args, **kwargs)
            after = torch.cuda.Event(enable_timing=True)
            after.record()
            self._events.append((before, after))
            return work
        started = time.perf_counter()
        work = call(*args, **kwargs)
        if work is None:
            self._wait_s += time.perf_counter() - started
        else:
            completed = self._completed

            def done(future: Any) -> Any:
                completed.append(time.perf_counter() - started)
                return future.value()

            work.get_future().then(done)
        return work

    def _fold(self) -> None:
        """Add the spans finished so far to the running sum (training thread)."""
        completed = self._completed
        while completed:
            self._wait_s += completed.popleft()
        events = self._events
        while events and events[0][1].query():
            before, after = events.popleft()
            self._wait_s += max(0.0, before.elapsed_time(after)) / 1000.0

    def take(self) -> float:
        """Seconds spent in collectives since the last call."""
        self._fold()
        wait, self._wait_s = self._wait_s, 0.0
        return wait
