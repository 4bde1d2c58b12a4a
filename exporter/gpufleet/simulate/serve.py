"""The live simulator: every virtual node is its own scrape target on one port.

``/nodes/<node>/metrics`` answers with exactly what that node's agent would
expose: the GPU families rendered by the agent's own code from a snapshot,
the training and checkpoint families rendered by the agent's aggregator code,
and the agent's self-metrics. A dead node answers 503, so Prometheus's ``up``
drops to 0 for it as for a real node.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Iterable
from pathlib import Path

from prometheus_client import generate_latest
from prometheus_client.metrics_core import Metric

from gpufleet import __version__
from gpufleet.agent.metrics_endpoint import AsgiScope, Receive, Send
from gpufleet.agent.training_render import training_families
from gpufleet.agent.training_view import CheckpointCounts, JobCounts, RankCounts, StageCounts
from gpufleet.exposition import CONTENT_TYPE, PrecompressedPart, render
from gpufleet.gpu.render import gpu_families
from gpufleet.gpu.snapshot import GpuIdentity, GpuReading, GpuSnapshot
from gpufleet.gpu.xid import XidHistory, XidView
from gpufleet.schema import agent as agent_schema
from gpufleet.schema.gpu import RETIRED_DBE, RETIRED_PENDING, RETIRED_SBE
from gpufleet.simulate.cluster import Cluster
from gpufleet.simulate.ledger_feed import LedgerFeed

log = logging.getLogger(__name__)

PCI_BUS_IDS = ("18", "2A", "3A", "5D", "9A", "AB", "BA", "DB")
MODEL = "NVIDIA H100 80GB HBM3"
_UNSUPPORTED_ON_H100 = (RETIRED_SBE.name, RETIRED_DBE.name, RETIRED_PENDING.name)


class _Metrics:
    """Lets prometheus-client render a list of families."""

    def __init__(self, metrics: Iterable[Metric]) -> None:
        self._metrics = list(metrics)

    def collect(self) -> Iterable[Metric]:
        return self._metrics


def gpu_snapshot(cluster: Cluster, node: int) -> GpuSnapshot:
    name = cluster.node_names[node]
    readings = []
    for gpu in range(cluster.gpus):
        identity = GpuIdentity(
            index=gpu,
            uuid=cluster.uuids[node][gpu],
            pci_bus_id=f"00000000:{PCI_BUS_IDS[gpu % len(PCI_BUS_IDS)]}:00.0",
            minor_number=gpu,
            model=MODEL,
            hostname=name,
        )
        up = not cluster.gpu_lost[node, gpu]
        values = cluster.gpu_values(node, gpu) if up else {}
        reasons = int(cluster.throttle[node, gpu]) if up else None
        readings.append(GpuReading(identity, up, values, reasons))
    return GpuSnapshot(
        seq=cluster.tick,
        taken_at=cluster.now,
        taken_monotonic=0.0,
        duration_seconds=0.004,
        driver_version="570.86.15",
        cuda_driver_version="12.8",
        gpus=tuple(readings),
        gpus_expected=cluster.gpus,
        unsupported=dict.fromkeys(_UNSUPPORTED_ON_H100, cluster.gpus),
    )


def xid_view(cluster: Cluster, node: int) -> XidView:
    by_uuid = {}
    for gpu in range(cluster.gpus):
        record = cluster.xids.get((node, gpu))
        if record is not None:
            by_uuid[cluster.uuids[node][gpu]] = XidHistory(
                dict(record.counts), record.last, record.last_time
            )
    return XidView(version=cluster.tick, watching=True, by_uuid=by_uuid)


def job_state(cluster: Cluster, node: int) -> dict[str, JobCounts]:
    """The node's job, read from the cluster's arrays as the agent would show it."""
    if not cluster.training_visible(node):
        return {}
    t = cluster.training
    first_rank = node * cluster.gpus
    last_step_time = float(t.last_step_time[node])
    steps, step_seconds = int(t.steps[node]), float(t.duration_s[node])
    stage = StageCounts(
        steps=steps,
        duration_s=step_seconds,
        compute_s=float(t.compute_s[node]),
        data_wait_s=float(t.data_wait_s[node]),
        comm_wait_s=float(t.comm_wait_s[node]),
        tokens=int(t.tokens[node]),
        slowest_compute_s=float(t.slowest_compute_s[node]),
        slowest_steps=int(t.slowest_steps[node]),
        split_steps=int(t.split_steps[node]),
        bucket_counts=tuple(int(count) for count in t.buckets[node]),
        last_step_time=last_step_time,
        last_step=cluster.step_number,
        active_ranks=int(t.ranks[node]),
        phase_steps={"train": steps, "eval": int(t.eval_steps[node])},
        phase_seconds={"train": step_seconds, "eval": float(t.eval_seconds[node])},
        ranks={
            first_rank + gpu: RankCounts(
                int(t.rank_steps[node, gpu]), float(t.rank_compute_s[node, gpu])
            )
            for gpu in range(cluster.gpus)
            if cluster.report_mask[node, gpu]
        },
    )
    checkpoints = CheckpointCounts(
        outcomes={"ok": int(t.ckpt_ok[node])},
        queue_wait_s=float(t.queue_wait_s[node]),
        service_s=float(t.service_s[node]),
        bytes=int(t.ckpt_bytes[node]),
        in_flight=range(int(t.ckpt_in_flight[node])),  # only their number is shown
    )
    job = JobCounts({int(cluster.stage[node]): stage}, {"save": checkpoints})
    return {cluster.spec.job: job}


def self_families(cluster: Cluster, node: int) -> list[Metric]:
    name = cluster.node_names[node]
    info = agent_schema.AGENT_INFO.gauge()
    info.add_metric([__version__, name, "simulated"], 1.0)
    started = agent_schema.AGENT_START_TIME.gauge()
    started.add_metric([], float(cluster.agent_started[node]))
    up = agent_schema.COLLECTOR_UP.gauge()
    up.add_metric(["gpu"], 0.0 if cluster.nvml_hung[node] else 1.0)
    return [info, started, up]


def node_exposition(cluster: Cluster, node: int) -> bytes:
    """Everything a real agent on this node would serve at /metrics."""
    hung = bool(cluster.nvml_hung[node])
    gpu = render(gpu_families(gpu_snapshot(cluster, node), xid_view(cluster, node), stale=hung))
    name = cluster.node_names[node]
    training = training_families(name, job_state(cluster, node), cluster.bucket_bounds)
    live = generate_latest(_Metrics([*training, *self_families(cluster, node)]))
    return gpu + live


class SimulatorServer:
    """ASGI app plus the tick thread that advances the cluster with wall time."""

    def __init__(
        self, cluster: Cluster, tick_s: float = 1.0, feed: LedgerFeed | None = None
    ) -> None:
        self.cluster = cluster
        self.feed = feed
        self.tick_s = tick_s
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._cache: dict[int, tuple[int, PrecompressedPart]] = {}
        self._forced_down: set[int] = set()
        self._index = {name: index for index, name in enumerate(cluster.node_names)}
        self.scrapes = 0

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="gpufleet-sim-tick", daemon=True)
        self._thread.start()
        if self.feed is not None:
            self.feed.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5)
        if self.feed is not None:
            self.feed.stop()

    def _run(self) -> None:
        while not self._stop.wait(self.tick_s):
            with self._lock:
                self.cluster.advance(time.time())
            if self.feed is not None:
                self.feed.advance(self.cluster.now)

    def write_targets(self, path: Path, address: str) -> None:
        """A Prometheus file_sd file: one target per node, ``instance`` = the node name."""
        targets = [
            {
                "targets": [address],
                "labels": {"__metrics_path__": f"/nodes/{name}/metrics", "instance": name},
            }
            for name in self.cluster.node_names
        ]
        temporary = path.with_suffix(path.suffix + ".tmp")
        temporary.write_text(json.dumps(targets, indent=1))
        temporary.replace(path)  # atomically, as Prometheus may read it at any moment

    def set_down(self, node: str, down: bool) -> bool:
        index = self._index.get(node)
        if index is None:
            return False
        with self._lock:
            if down:
                self._forced_down.add(index)
            else:
                self._forced_down.discard(index)
        return True

    def body(self, node: int) -> PrecompressedPart | None:
        with self._lock:
            cluster = self.cluster
            if node in self._forced_down or not cluster.agent_alive(node):
                return None
            cached = self._cache.get(node)
            if cached is None or cached[0] != cluster.tick:
                cached = (cluster.tick, PrecompressedPart.of(node_exposition(cluster, node)))
                self._cache[node] = cached
            return cached[1]

    async def __call__(self, scope: AsgiScope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await _lifespan(receive, send)
            return
        path: str = scope["path"]
        method = scope.get("method", "GET")
        parts = path.strip("/").split("/")
        if len(parts) == 3 and parts[0] == "nodes" and parts[2] == "metrics" and method == "GET":
            await self._metrics(scope, send, parts[1])
        elif len(parts) == 4 and parts[:2] == ["control", "nodes"] and method == "POST":
            if parts[3] not in ("down", "up") or not self.set_down(parts[2], parts[3] == "down"):
                await _text(send, 404, f"no node {parts[2]!r} or action {parts[3]!r}\n")
            else:
                await _text(send, 200, f"{parts[2]} is {parts[3]}\n")
        elif path == "/healthz":
            await _text(send, 200, "ok\n")
        elif path == "/":
            cluster = self.cluster
            await _text(
                send,
                200,
                f"gpufleet simulator: {cluster.nodes} nodes x {cluster.gpus} GPUs, layout "
                f"{cluster.layout}, scenario {cluster.scenario.name}, seed {cluster.seed}\n"
                f"per-node metrics: /nodes/<node>/metrics (e.g. {cluster.node_names[0]})\n"
                "kill / revive a node: POST /control/nodes/<node>/down | up\n",
            )
        else:
            await _text(send, 404, "not found\n")

    async def _metrics(self, scope: AsgiScope, send: Send, name: str) -> None:
        index = self._index.get(name)
        if index is None:
            await _text(send, 404, f"no node {name!r} in this cluster\n")
            return
        part = self.body(index)
        self.scrapes += 1
        if part is None:
            await _text(send, 503, f"{name} is down\n")
            return
        gzip = any(
            key == b"accept-encoding" and b"gzip" in value for key, value in scope["headers"]
        )
        body = part.gzip_with(b"") if gzip else part.raw
        headers = [
            (b"content-type", CONTENT_TYPE.encode()),
            (b"content-length", str(len(body)).encode()),
        ]
        if gzip:
            headers.append((b"content-encoding", b"gzip"))
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": body})


async def _text(send: Send, status: int, text: str) -> None:
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [(b"content-type", b"text/plain; charset=utf-8")],
        }
    )
    await send({"type": "http.response.body", "body": text.encode()})


async def _lifespan(receive: Receive, send: Send) -> None:
    while True:
        message = await receive()
        if message["type"] == "lifespan.startup":
            await send({"type": "lifespan.startup.complete"})
        elif message["type"] == "lifespan.shutdown":
            await send({"type": "lifespan.shutdown.complete"})
            return
