"""Multi-day history of a simulated cluster, as OpenMetrics for promtool, with ground truth.

``promtool tsdb create-blocks-from openmetrics FILE DIR`` turns each written
file into TSDB blocks; the ground truth lists every injected episode (node,
GPU, kind, cause, start, end, and the alerts that should fire).

What is written: the series the rules read, with the labels a live Prometheus
would store (``job="gpufleet-agent"``, ``instance`` = node): ``up``, per-GPU
``gpufleet_gpu_up``, the node's GPU counts and collector health, the training
and checkpoint counters, and the error counters, XIDs and throttle flags of
every GPU the timeline ever touches. Error counters of GPUs that stay healthy
for the whole history would be constant zeros; they are left out to keep the
history small, which changes no rule result: every hardware rule asks for a
counter that *rose* or a flag that is *set*. The per-rank compute and step
counters (``gpufleet_training_rank_*``, two series per reporting rank) are
written where the rules compare ranks rather than nodes: by default
(``rank_series="auto"``) for jobs with at most 4 nodes per pipeline stage.

Nodes are split into shards written by separate processes (one file each);
every process simulates the whole cluster, which is cheap, and writes only
its own nodes.
"""

from __future__ import annotations

import time
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np

from gpufleet.simulate import layout as sim_layout
from gpufleet.simulate.cluster import Cluster
from gpufleet.simulate.config import Scenario
from gpufleet.simulate.node_view import NodeView, job_view
from gpufleet.simulate.recorder import HistoryRun, Recorder, wants_rank_series
from gpufleet.simulate.series import (
    HistoryResult,
    SeriesWriter,
    touched_gpus,
    write_allocations,
    write_gpu_errors,
    write_gpu_state,
    write_ground_truth_data,
    write_node_health,
    write_recovery_action,
    write_shards,
    write_training,
    write_xids,
)
from gpufleet.simulate.shared import write_shared_history


def _write_shard(recorder: Recorder, path: Path) -> int:
    cluster = recorder.cluster
    specs = [cluster.spec]
    views = [job_view(recorder, column) for column in range(len(recorder.nodes))]
    with open(path, "w", encoding="utf-8", buffering=1 << 20) as handle:
        out = SeriesWriter(handle, recorder.times)
        write_node_health(out, views)
        write_gpu_state(out, views)
        write_allocations(out, specs, views)
        if recorder.layout:
            _write_layout(out, recorder, views)
        write_training(out, specs, views)
        touched = touched_gpus(views)
        write_gpu_errors(out, touched)
        write_recovery_action(out, touched)
        write_xids(out, views, touched)
        out.close()
        return out.samples


def _write_layout(out: SeriesWriter, recorder: Recorder, views: list[NodeView]) -> None:
    """Each node's ranks' layout series, its GPUs' NVLink bandwidth, its InfiniBand bytes."""
    cluster = recorder.cluster
    layout, spec = cluster.layout, cluster.spec
    out.declare(sim_layout.LAYOUT)
    for column, view in enumerate(views):
        visible = ~np.isnan(recorder.ckpt_ok[:, column])
        pods = spec.pod_labels(view.node)
        for gpu in range(view.gpus):
            rank = view.node * view.gpus + gpu
            for placed in sim_layout.rank_groups(layout, rank):
                labels = sim_layout.layout_labels(spec.job, view.name, rank, placed)
                values = np.where(visible, float(placed.size), np.nan)
                out.present(sim_layout.LAYOUT.name, [*labels, *pods, *view.labels], values)
    out.declare(sim_layout.NVLINK)
    for column, view in enumerate(views):
        for gpu in range(view.gpus):
            values = recorder.nvlink[:, column, gpu]
            out.present(sim_layout.NVLINK.name, view.gpu_labels(gpu), values)
    device, port = sim_layout.IB_DEVICE
    rate = sim_layout.network_rate(layout, cluster.gpus)
    for family in sim_layout.IB_FAMILIES:
        out.declare(family)
        for column, view in enumerate(views):
            labels = [
                ("device", device),
                ("port", port),
                ("instance", f"{view.name}:{sim_layout.NODE_EXPORTER_PORT}"),
                ("job", sim_layout.NODE_EXPORTER_JOB),
            ]
            counter = sim_layout.network_counter(
                recorder.training_now[:, column], recorder.times, rate
            )
            out.present(family.name, labels, counter)


def _shard_job(
    nodes: list[int], path: Path, *, run: HistoryRun, every_gpu: bool, gpu_gauges: bool
) -> int:
    cluster = Cluster(run.scenario, run.seed, run.start, run.end - run.start)
    ranks = wants_rank_series(run.scenario.cluster, run.rank_series)
    recorder = Recorder(cluster, nodes, run.ticks, every_gpu, gpu_gauges, rank_series=ranks)
    for tick in range(run.ticks):
        cluster.advance(run.at(tick))
        recorder.record()
    return _write_shard(recorder, path)


def write_history(
    scenario: Scenario,
    seed: int,
    days: float,
    out: Path,
    *,
    end: float | None = None,
    step: float = 30.0,
    shards: int = 2,
    every_gpu: bool = False,
    gpu_gauges: bool = False,
    rank_series: str = "auto",
) -> HistoryResult:
    """Simulate ``days`` ending at ``end`` (default: now) and write OpenMetrics + ground truth.

    ``every_gpu`` writes the error counters and throttle flags of every GPU, also the
    healthy ones (constant zeros): what a live Prometheus holds, for measuring rule cost.
    ``gpu_gauges`` adds every GPU's utilisation, activity, temperatures, power and clocks.
    ``rank_series`` writes the per-rank compute and step counters: ``auto`` for jobs with
    at most 4 nodes per pipeline stage, ``all`` or ``none``. A scenario with ``jobs``
    (a shared cluster) is written by ``gpufleet.simulate.shared``.
    """
    started = time.monotonic()
    out.mkdir(parents=True, exist_ok=True)
    end = float(int(end if end is not None else time.time()))
    start = end - days * 86400.0
    if scenario.jobs:
        return write_shared_history(
            scenario, seed, start, end, out, step=step, shards=shards, rank_series=rank_series
        )
    run = HistoryRun(scenario, seed, start, end, step, rank_series)
    worker = partial(_shard_job, run=run, every_gpu=every_gpu, gpu_gauges=gpu_gauges)
    paths, samples = write_shards(out, scenario.cluster.nodes, shards, worker)
    cluster = Cluster(scenario, seed, start, end - start)
    truth = write_ground_truth(cluster, out, start, end, step)
    return HistoryResult(paths, truth, samples, time.monotonic() - started, start, end)


def ground_truth(cluster: Cluster, start: float, end: float, step: float) -> dict[str, Any]:
    timeline = cluster.timeline
    names = cluster.node_names
    return {
        "start": start,
        "end": end,
        "step_seconds": step,
        "scenario": cluster.scenario.name,
        "seed": cluster.seed,
        "cluster": {
            "nodes": cluster.nodes,
            "gpus_per_node": cluster.gpus,
            "layout": str(cluster.layout),
            "job": cluster.spec.job,
            "node_names": names,
            "pp_stage_of_node": [int(stage) for stage in cluster.stage],
        },
        "episodes": [episode.record(names) for episode in timeline.episodes],
        "exclusions": [
            {"node": names[e.node], "start": e.start, "end": e.end, "reason": e.reason,
             "source": e.source, "episode": e.episode}
            for e in timeline.exclusions
        ],
        "attempts": [
            {"number": a.number, "trigger": a.trigger, "start": a.start, "first_step": a.first_step,
             "end": a.end, "outcome": a.outcome, "cause": a.cause}
            for a in timeline.attempts
        ],
    }  # fmt: skip


def write_ground_truth(cluster: Cluster, out: Path, start: float, end: float, step: float) -> Path:
    return write_ground_truth_data(ground_truth(cluster, start, end, step), out)
