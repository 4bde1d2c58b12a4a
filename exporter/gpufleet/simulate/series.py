"""The one writer of a simulated history's series, for one job's cluster and a shared one.

A history is written node by node from ``NodeView`` s (``gpufleet.simulate.node_view``).
Each ``write_*`` function writes one group of families for every view; ``history`` and
``shared`` call them in their own order.
"""

from __future__ import annotations

import csv
import json
import multiprocessing
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

import numpy as np

from gpufleet.exposition import OpenMetricsWriter
from gpufleet.schema import agent as agent_schema
from gpufleet.schema import gpu as cat
from gpufleet.schema import training as ts
from gpufleet.schema.external import UP
from gpufleet.schema.family import MetricDef
from gpufleet.simulate.config import ClusterSpec
from gpufleet.simulate.gpu_values import (
    GPU_COUNTERS,
    HW_POWER_BRAKE,
    HW_SLOWDOWN,
    HW_THERMAL,
    MAX_SM_CLOCK_MHZ,
)
from gpufleet.simulate.node_view import NodeView, Segment
from gpufleet.simulate.recorder import (
    GPU_GAUGES,
    GPU_METRICS,
    NODE_CHECKPOINT,
    NODE_TRAINING,
    RANK_TRAINING,
)

# the labels of a GPU series that gpufleet_gpu_allocation_info keeps (its identity)
_ALLOCATION_GPU_LABELS = frozenset({cat.NODE_LABEL, "gpu", "UUID", "instance", "job"})
_THROTTLE_FLAGS = (
    ("hw_slowdown", HW_SLOWDOWN),
    ("hw_thermal_slowdown", HW_THERMAL),
    ("hw_power_brake_slowdown", HW_POWER_BRAKE),
)
# Cleared by a repair (a GPU reset): a node leaves its slot only when it is repaired.
_RESET_BY_REPAIR = frozenset(
    metric.name for metric in (cat.ECC_SBE_VOL, cat.ECC_DBE_VOL, cat.ROW_REMAP_PENDING)
)


@dataclass(frozen=True, slots=True)
class HistoryResult:
    files: list[Path]
    ground_truth: Path
    samples: int
    seconds: float
    start: float
    end: float


class SeriesWriter(OpenMetricsWriter):
    """The one OpenMetrics writer, fed from the recorder's arrays: NaN there means the
    series had no sample at that tick (the node was down, the job not yet visible)."""

    def __init__(self, handle: TextIO, times: np.ndarray) -> None:
        super().__init__(handle)
        self.stamps = [str(int(t)) for t in times]

    def declare(self, metric: MetricDef) -> None:
        self.family(*metric.openmetrics(), metric.help)

    def present(self, sample: str, labels: list[tuple[str, str]], values: np.ndarray) -> None:
        where = np.flatnonzero(~np.isnan(values))
        if len(where) == len(values):
            self.series(sample, labels, values.tolist(), self.stamps)
        elif len(where):
            stamps = self.stamps
            self.series(sample, labels, values[where].tolist(), [stamps[i] for i in where.tolist()])


def allocation_labels(
    spec: ClusterSpec, slot: int, gpu_labels: list[tuple[str, str]]
) -> list[tuple[str, str]]:
    """gpufleet_gpu_allocation_info's labels for GPU ``gpu_labels`` held by the job's pod
    on its node ``slot``: the GPU's node, index and UUID, the pod, its container and job."""
    identity = [(name, value) for name, value in gpu_labels if name in _ALLOCATION_GPU_LABELS]
    return [*identity, *spec.pod_labels(slot), ("container", "trainer"), ("training_job", spec.job)]


def write_node_health(out: SeriesWriter, views: list[NodeView]) -> None:
    """Scrape health and GPUs up: from the job a node served, or idle and healthy."""
    out.declare(UP)
    for view in views:
        out.present(UP.name, view.labels, view.hardware(_up, 1.0))
    out.declare(cat.GPU_UP)
    for view in views:
        for gpu in range(view.gpus):
            values = view.hardware(lambda s, g=gpu: s.recorder.gpu_up[:, s.column, g], 1.0)
            out.present(cat.GPU_UP.name, view.gpu_labels(gpu), values)


def write_allocations(
    out: SeriesWriter, specs: Sequence[ClusterSpec], views: list[NodeView]
) -> None:
    """The pods of jobs with a namespace hold every GPU of a node while the job is placed
    there and the node answers (a pod per job and node, named after the node)."""
    if not any(spec.namespace for spec in specs):
        return
    out.declare(cat.ALLOCATION_INFO)
    for view in views:
        for segment in view.segments:
            spec = segment.recorder.cluster.spec
            if not spec.namespace:
                continue
            up = segment.recorder.up[:, segment.column] == 1
            held = np.where(segment.mask & up, 1.0, np.nan)
            for gpu in range(view.gpus):
                labels = allocation_labels(spec, view.node, view.gpu_labels(gpu))
                out.present(cat.ALLOCATION_INFO.name, labels, held)


def write_gpu_state(out: SeriesWriter, views: list[NodeView]) -> None:
    """SM clocks (and the recorded GPU gauges), GPUs seen and expected, collector health,
    the agent's start time."""
    gauges = [
        name
        for name in GPU_GAUGES
        if any(name in s.recorder.gauges for view in views for s in view.segments)
    ]
    for family, idle_value in (
        (cat.SM_CLOCK, MAX_SM_CLOCK_MHZ),
        *((GPU_METRICS[name], np.nan) for name in gauges),
    ):
        out.declare(family)
        pick = _gpu_array(family.name)
        for view in views:
            for gpu in range(view.gpus):
                values = view.hardware(lambda s, g=gpu, p=pick: p(s)[:, s.column, g], idle_value)
                out.present(family.name, view.gpu_labels(gpu), values)
    out.declare(cat.GPUS_SEEN)
    for view in views:
        values = view.hardware(lambda s: s.recorder.seen[:, s.column], float(view.gpus))
        out.present(cat.GPUS_SEEN.name, [(cat.NODE_LABEL, view.name), *view.labels], values)
    out.declare(cat.GPUS_EXPECTED)
    for view in views:
        up = view.hardware(_up, 1.0)
        values = np.where(np.isnan(up) | (up == 0), np.nan, float(view.gpus))
        out.present(cat.GPUS_EXPECTED.name, [(cat.NODE_LABEL, view.name), *view.labels], values)
    out.declare(agent_schema.COLLECTOR_UP)
    for view in views:
        values = view.hardware(lambda s: s.recorder.collector_up[:, s.column], 1.0)
        labels = [("collector", "gpu"), *view.labels]
        out.present(agent_schema.COLLECTOR_UP.name, labels, values)
    out.declare(agent_schema.AGENT_START_TIME)
    for view in views:
        values = view.hardware(lambda s: s.recorder.agent_started[:, s.column], np.nan)
        out.present(agent_schema.AGENT_START_TIME.name, view.labels, values)


def write_training(out: SeriesWriter, specs: Sequence[ClusterSpec], views: list[NodeView]) -> None:
    """Training and checkpoint series, labelled with the job and stage served at the time."""
    by_job = {spec.job: spec for spec in specs}
    for metric, attr in NODE_TRAINING:
        out.declare(metric)
        for view in views:
            for (job, stage), values in view.grouped(_stage_key, _node_attr(attr)):
                labels = [("training_job", job), ("node", view.name), ("pp_stage", str(stage))]
                pod = by_job[job].pod_labels(view.node)
                out.present(metric.name, [*labels, *pod, *view.labels], values)
    ranked = any(s.recorder.rank_series for view in views for s in view.segments)
    for metric, attr in RANK_TRAINING if ranked else ():
        out.declare(metric)
        for view in views:
            holder = view.with_segments([s for s in view.segments if s.recorder.rank_series])
            for gpu in range(view.gpus):
                for (job, stage, slot), values in holder.grouped(_rank_key, _rank_attr(attr, gpu)):
                    labels = [
                        ("training_job", job),
                        ("node", view.name),
                        ("pp_stage", str(stage)),
                        ("rank", str(slot * view.gpus + gpu)),
                        *by_job[job].pod_labels(view.node),
                    ]
                    out.present(metric.name, [*labels, *view.labels], values)
    out.declare(ts.CHECKPOINT_OPERATIONS)
    for view in views:
        for job, values in view.grouped(_job_key, lambda s: s.recorder.ckpt_ok[:, s.column]):
            labels = [("training_job", job), ("node", view.name), ("op", "save"), ("outcome", "ok")]
            pod = by_job[job].pod_labels(view.node)
            out.present(ts.CHECKPOINT_OPERATIONS.name, [*labels, *pod, *view.labels], values)
    for metric, attr in NODE_CHECKPOINT:
        out.declare(metric)
        for view in views:
            for job, values in view.grouped(_job_key, _node_attr(attr)):
                labels = [("training_job", job), ("node", view.name), ("op", "save")]
                pod = by_job[job].pod_labels(view.node)
                out.present(metric.name, [*labels, *pod, *view.labels], values)


def touched_gpus(views: list[NodeView]) -> list[tuple[NodeView, int]]:
    """Every GPU of ``views`` a fault ever touched (see ``recorder.touched_gpus``)."""
    return [(view, gpu) for view in views for gpu in range(view.gpus) if view.touched(gpu)]


def write_gpu_errors(out: SeriesWriter, touched: list[tuple[NodeView, int]]) -> None:
    """The error counters and throttle flags of the ``touched`` GPUs."""
    for name in GPU_COUNTERS:
        out.declare(GPU_METRICS[name])
        for view, gpu in touched:
            values = view.gpu_series(
                gpu, _counter_of(name), 0.0, counter=True, reset=name in _RESET_BY_REPAIR
            )
            out.present(name, view.gpu_labels(gpu), values)
    out.declare(cat.THROTTLE_ACTIVE)
    for view, gpu in touched:
        bits = view.gpu_series(gpu, lambda s, i: s.recorder.throttle[:, i], 0.0, counter=False)
        for reason, bit in _THROTTLE_FLAGS:
            flag = np.where(
                np.isnan(bits), np.nan, (np.nan_to_num(bits).astype(np.int64) & bit) > 0
            )
            labels = [*view.gpu_labels(gpu), ("reason", reason)]
            out.present(cat.THROTTLE_ACTIVE.name, labels, flag.astype(float))


def write_recovery_action(out: SeriesWriter, touched: list[tuple[NodeView, int]]) -> None:
    """The recovery action the driver asks for, of the ``touched`` GPUs."""
    out.declare(GPU_METRICS[cat.RECOVERY_ACTION.name])
    for view, gpu in touched:
        values = view.gpu_series(
            gpu, lambda s, i: s.recorder.recovery_action[:, i], 0.0, counter=False
        )
        out.present(cat.RECOVERY_ACTION.name, view.gpu_labels(gpu), values)


def write_xids(
    out: SeriesWriter, views: list[NodeView], touched: list[tuple[NodeView, int]]
) -> None:
    """The last XID of the ``touched`` GPUs, and every GPU's XID counts."""
    out.declare(cat.XID_LAST)
    for view, gpu in touched:
        values = view.gpu_series(gpu, lambda s, i: s.recorder.xid_last[:, i], 0.0, counter=False)
        out.present(cat.XID_LAST.name, view.gpu_labels(gpu), values)
    out.declare(cat.XID_TOTAL)
    for view in views:
        counts: dict[tuple[int, int], np.ndarray] = {}
        for segment in view.segments:
            for (slot, gpu, xid), values in segment.recorder.xid_counts.items():
                if slot != segment.slot:
                    continue
                merged = counts.setdefault((gpu, xid), np.full(view.ticks, np.nan))
                merged[segment.mask] = values[segment.mask]
        for (gpu, xid), values in sorted(counts.items()):
            labels = [*view.gpu_labels(gpu), ("xid", str(xid))]
            out.present(cat.XID_TOTAL.name, labels, values)


def _up(segment: Segment) -> np.ndarray:
    return np.asarray(segment.recorder.up[:, segment.column])


def _gpu_array(name: str) -> Callable[[Segment], np.ndarray]:
    def pick(segment: Segment) -> np.ndarray:
        recorder = segment.recorder
        return recorder.sm_clock if name == cat.SM_CLOCK.name else recorder.gauges[name]

    return pick


def _node_attr(attr: str) -> Callable[[Segment], np.ndarray]:
    def pick(segment: Segment) -> np.ndarray:
        return np.asarray(segment.recorder.node_series[attr][:, segment.column])

    return pick


def _rank_attr(attr: str, gpu: int) -> Callable[[Segment], np.ndarray]:
    def pick(segment: Segment) -> np.ndarray:
        return np.asarray(segment.recorder.rank_series[attr][:, segment.column, gpu])

    return pick


def _counter_of(name: str) -> Callable[[Segment, int], np.ndarray]:
    def pick(segment: Segment, slot: int) -> np.ndarray:
        return np.asarray(segment.recorder.gpu_counters[name][:, slot])

    return pick


def _stage_key(segment: Segment) -> tuple[str, int]:
    return segment.job, segment.stage


def _rank_key(segment: Segment) -> tuple[str, int, int]:
    return segment.job, segment.stage, segment.slot


def _job_key(segment: Segment) -> str:
    return segment.job


def write_shards(
    out: Path, nodes: int, shards: int, worker: Callable[[list[int], Path], int]
) -> tuple[list[Path], int]:
    """Nodes dealt round-robin to at most ``shards`` processes, each running ``worker`` on
    its nodes and its file ``history-NN.om`` (one file per process keeps writing parallel
    and each file small for promtool): the files and the samples written in all."""
    shards = max(1, min(shards, nodes))
    paths = [out / f"history-{index:02d}.om" for index in range(shards)]
    work = [(list(range(nodes))[index::shards], path) for index, path in enumerate(paths)]
    if shards == 1:
        return paths, worker(*work[0])
    with multiprocessing.get_context("fork").Pool(shards) as pool:
        return paths, sum(pool.starmap(worker, work))


def write_ground_truth_data(truth: dict[str, Any], out: Path) -> Path:
    """``ground_truth.json`` and ``ground_truth.csv`` (one row per episode) under ``out``."""
    path = out / "ground_truth.json"
    path.write_text(json.dumps(truth, indent=1))
    with open(out / "ground_truth.csv", "w", newline="", encoding="utf-8") as handle:
        writer = csv.writer(handle)
        writer.writerow(["id", "kind", "fault", "cause", "node", "gpu", "xid", "start", "end",
                         "magnitude", "scope", "expected_alerts"])  # fmt: skip
        for row in _rows(truth):
            writer.writerow(row)
    return path


def _rows(truth: dict[str, Any]) -> Iterator[list[Any]]:
    for e in truth["episodes"]:
        alerts = " ".join(e["expected_alerts"])
        yield [e["id"], e["kind"], e["fault"], e["cause"], e["node"], e["gpu"], e["xid"],
               e["start"], e["end"], e["magnitude"], e["scope"], alerts]  # fmt: skip
