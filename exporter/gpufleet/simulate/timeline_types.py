"""What a timeline holds: every episode, the job's stalls, exclusions and attempts, its
checkpoint and eval windows (``Timeline``), drawn up front by ``gpufleet.simulate.timeline``."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field

import numpy as np

from gpufleet.simulate.faults import Episode


@dataclass(slots=True)
class Window:
    start: float
    end: float
    reason: str

    def overlap(self, start: float, end: float) -> float:
        return max(0.0, min(self.end, end) - max(self.start, start))


@dataclass(slots=True)
class Attempt:
    """One attempt of the training job: from (re)start to the interruption that ended it."""

    number: int
    trigger: str  # "initial", "auto" or "manual"
    start: float
    first_step: float
    end: float | None = None
    outcome: str = "running"  # success, failed, cancelled, running
    cause: str | None = None


@dataclass(slots=True)
class Exclusion:
    node: int
    start: float
    end: float
    reason: str
    source: str  # "auto" (the job's retry logic) or "manual" (an operator)
    episode: int


@dataclass(slots=True)
class Timeline:
    start: float
    end: float
    episodes: list[Episode] = field(default_factory=list)
    stalls: list[Window] = field(default_factory=list)  # the job makes no progress
    exclusions: list[Exclusion] = field(default_factory=list)
    attempts: list[Attempt] = field(default_factory=list)
    checkpoints: list[Window] = field(default_factory=list)
    evals: list[Window] = field(default_factory=list)
    node_multiplier: np.ndarray = field(default_factory=lambda: np.ones(0))

    def faults(self) -> Iterator[Episode]:
        return (episode for episode in self.episodes if episode.is_fault)
