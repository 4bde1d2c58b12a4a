"""The job's own schedule in a timeline: checkpoints (their cost under shared storage
load), evals, and the attempts the stalls divide the job into (``JobSchedule``, a part
of ``TimelineBuilder``)."""

from __future__ import annotations

from gpufleet.simulate.config import ClusterSpec, Confounders
from gpufleet.simulate.faults import Episode, Kind
from gpufleet.simulate.timeline_types import Attempt, Timeline, Window

_STARTUP_S = 180.0  # from an attempt's launch to its first step


class JobSchedule:
    """Checkpoints, evals and attempts (a part of ``TimelineBuilder``, after the faults
    and their stalls are drawn; the state it reads is the builder's)."""

    spec: ClusterSpec
    confounders: Confounders
    timeline: Timeline
    nodes: int
    _checkpoints_asked: list[float]

    def excluded(self, node: int, when: float) -> bool:
        raise NotImplementedError

    def stalled(self, when: float) -> bool:
        raise NotImplementedError

    def _add(self, episode: Episode) -> Episode:
        raise NotImplementedError

    def _schedule_checkpoints_and_evals(self) -> None:
        spec = self.spec
        timeline = self.timeline
        conf = self.confounders
        for enabled, interval, first, windows, reason, asked in (
            (conf.checkpoints, spec.checkpoint_interval_s, 0.5, timeline.checkpoints, "checkpoint",
             self._checkpoints_asked),
            (conf.evals, spec.eval_interval_s, 0.75, timeline.evals, "eval", []),
        ):  # fmt: skip
            times = [when for when in asked if timeline.start <= when < timeline.end]
            if enabled and interval > 0:
                when = timeline.start + interval * first
                while when < timeline.end:
                    times.append(when)
                    when += interval
            for when in sorted(times):
                # windows are appended in time order: only the last can still be open
                if not self.stalled(when) and not (windows and windows[-1].end > when):
                    if reason == "checkpoint":
                        duration, queue, service = self.checkpoint_cost(when)
                        windows.append(Window(when, when + duration, f"{queue}:{service}"))
                        self._add(
                            Episode(Kind.CHECKPOINT, when, when + duration, magnitude=queue,
                                    details={"queue_wait_s": queue, "service_s": service,
                                             "writers": self.writers(when)})
                        )  # fmt: skip
                    else:
                        windows.append(Window(when, when + spec.eval_duration_s, reason))
                        self._add(Episode(Kind.EVAL, when, when + spec.eval_duration_s))

    def writers(self, when: float) -> int:
        return sum(1 for node in range(self.nodes) if not self.excluded(node, when))

    def checkpoint_cost(self, when: float) -> tuple[float, float, float]:
        """Checkpoint duration, queue wait and service time of one node's write.

        Shared storage serves a fixed number of requests at once; each writer keeps
        `requests_per_writer` in flight. Below saturation nothing queues; above it,
        a writer's requests wait for slots and its write stretches with the number
        of writers, so with tens of writers most of the time is queue wait.
        """
        spec = self.spec
        writers = max(1, self.writers(when))
        unloaded = spec.checkpoint_bytes_per_node / (
            spec.requests_per_writer * spec.storage_slot_bytes_per_s
        )
        demand = writers * spec.requests_per_writer
        if demand <= spec.storage_slots:
            return unloaded, 0.0, unloaded
        duration = (
            spec.checkpoint_bytes_per_node
            * writers
            / (spec.storage_slots * spec.storage_slot_bytes_per_s)
        )
        return duration, duration - unloaded, unloaded

    def _attempts(self) -> None:
        """Job attempts and their outcomes, from the stall windows."""
        timeline = self.timeline
        stalls = sorted(timeline.stalls, key=lambda w: w.start)
        attempts = [Attempt(1, "initial", timeline.start, timeline.start)]
        for stall in stalls:
            current = attempts[-1]
            if stall.start < current.start:
                continue
            current.end = stall.start
            current.outcome = "failed"
            current.cause = stall.reason.split(": ", 1)[-1]
            trigger = "manual" if stall.reason.startswith("retry failed") else "auto"
            if stall.end < timeline.end:
                # the new attempt starts, loads and restores, then takes its first step
                begins = max(stall.start, stall.end - _STARTUP_S)
                attempts.append(Attempt(len(attempts) + 1, trigger, begins, stall.end))
        timeline.attempts = attempts
