"""A node's series over the whole history, as the history writer reads them.

A ``NodeView`` is assembled from the ``Segment`` s (ticks) the node spent in a job's
slot, each read from the ``Recorder`` of that job. A node of one job's cluster has a
single segment covering every tick (``job_view``); a node of a shared cluster has one
per placement, and idles (healthy, no training) between them.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from gpufleet.schema.gpu import GPU_LABELS
from gpufleet.simulate.recorder import JOB_LABEL, Recorder
from gpufleet.simulate.serve import MODEL, PCI_BUS_IDS


@dataclass(slots=True)
class Segment:
    """The ticks a node spent in one job's slot, and the recorder (column) holding them."""

    recorder: Recorder
    column: int
    mask: np.ndarray  # ticks of the placement
    first: int
    last: int
    job: str
    stage: int
    slot: int


class NodeView:
    """A physical node's series over the whole history, assembled from its segments.

    ``rebase_counters``: a node moving between jobs continues its GPU counters from where
    they were (a slot's changes are added to the node's own value); a node of one job's
    cluster shows its slot's counters as they are."""

    def __init__(
        self,
        node: int,
        name: str,
        uuids: Sequence[str],
        segments: list[Segment],
        ticks: int,
        *,
        rebase_counters: bool,
    ) -> None:
        self.node = node
        self.name = name
        self.uuids = uuids
        self.gpus = len(uuids)
        self.segments = segments
        self.idle = np.ones(ticks, dtype=bool)
        for segment in segments:
            self.idle &= ~segment.mask
        self.ticks = ticks
        self.rebase_counters = rebase_counters
        self.labels = [("instance", name), ("job", JOB_LABEL)]

    def with_segments(self, segments: list[Segment]) -> NodeView:
        """The same node seen through only ``segments``."""
        return NodeView(
            self.node,
            self.name,
            self.uuids,
            segments,
            self.ticks,
            rebase_counters=self.rebase_counters,
        )

    def hardware(self, pick: Any, idle_value: float) -> np.ndarray:
        values = np.full(self.ticks, np.nan)
        for segment in self.segments:
            values[segment.mask] = pick(segment)[segment.mask]
        values[self.idle] = idle_value
        return values

    def grouped(self, key: Any, pick: Any) -> Iterator[tuple[Any, np.ndarray]]:
        """Training series, one per distinct ``key(segment)`` (job and stage, ...)."""
        groups: dict[Any, np.ndarray] = {}
        for segment in self.segments:
            values = groups.setdefault(key(segment), np.full(self.ticks, np.nan))
            values[segment.mask] = pick(segment)[segment.mask]
        yield from groups.items()

    def gpu_labels(self, gpu: int) -> list[tuple[str, str]]:
        values = (
            str(gpu),
            self.uuids[gpu],
            f"00000000:{PCI_BUS_IDS[gpu % len(PCI_BUS_IDS)]}:00.0",
            f"nvidia{gpu}",
            MODEL,
            self.name,
        )
        return [*zip(GPU_LABELS, values, strict=True), *self.labels]

    def touched(self, gpu: int) -> bool:
        return any((s.slot, gpu) in s.recorder.touched for s in self.segments)

    def gpu_series(
        self, gpu: int, pick: Any, idle_value: float, counter: bool, reset: bool = False
    ) -> np.ndarray:
        """A GPU's series across segments. With ``rebase_counters``, a counter continues
        from where it was, or from 0 if ``reset``: the repair that ended the placement
        cleared it."""
        values = np.full(self.ticks, np.nan)
        index = np.arange(self.ticks)
        base = idle_value
        cursor = 0
        for segment in self.segments:
            values[self.idle & (index >= cursor) & (index < segment.first)] = base
            cursor = segment.last + 1
            up = segment.recorder.up[:, segment.column] == 1
            slots = segment.recorder.touched
            raw = (
                pick(segment, slots.index((segment.slot, gpu)))
                if (segment.slot, gpu) in slots
                else np.where(up, 0.0, np.nan)
            )
            part = raw[segment.mask]
            present = part[~np.isnan(part)]
            if counter and self.rebase_counters and len(present):
                values[segment.mask] = base + part - present[0]
                base = 0.0 if reset else base + float(present[-1] - present[0])
            elif not counter or not self.rebase_counters:
                values[segment.mask] = part
        values[self.idle & (index >= cursor)] = base
        return values


def job_view(recorder: Recorder, column: int) -> NodeView:
    """Node ``recorder.nodes[column]`` of one job's cluster: in its slot for every tick."""
    cluster = recorder.cluster
    node = recorder.nodes[column]
    ticks = len(recorder.times)
    segment = Segment(
        recorder,
        column,
        np.ones(ticks, dtype=bool),
        0,
        ticks - 1,
        cluster.spec.job,
        int(cluster.stage[node]),
        node,
    )
    name = cluster.node_names[node]
    return NodeView(node, name, cluster.uuids[node], [segment], ticks, rebase_counters=False)
