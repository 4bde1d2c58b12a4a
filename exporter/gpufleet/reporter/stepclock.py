"""Step timing shared by the framework callbacks (Hugging Face, Lightning): the time of
a step and the data wait before it, from one hook at the step's start and one at its end."""

from __future__ import annotations

import time
from collections.abc import Callable

# A longer gap between one step's end and the next one's start is a pause (evaluation,
# saving a checkpoint), not data loading: the step then counts from its own start.
MAX_DATA_WAIT_S = 60.0


class StepClock:
    def __init__(self) -> None:
        self.sync: Callable[[], object] | None = None  # torch.cuda.synchronize on a GPU
        self._last_end: float | None = None
        self._started = 0.0

    def begin(self) -> None:
        self._started = time.perf_counter()
        if self._last_end is None:
            self._last_end = self._started

    def end(self) -> tuple[float, float]:
        """(step seconds, data wait seconds) of the step that just ended."""
        if self.sync is not None:
            self.sync()  # queued GPU work belongs to this step
        ended = time.perf_counter()
        previous = self._last_end if self._last_end is not None else self._started
        self._last_end = ended
        data_wait = max(0.0, self._started - previous)
        if data_wait > MAX_DATA_WAIT_S:
            previous, data_wait = self._started, 0.0
        return ended - previous, data_wait
