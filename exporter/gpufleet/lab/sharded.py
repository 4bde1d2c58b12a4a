"""The sharded layout of docs/SCALING.md, run for real beside one Prometheus.

``ShardedLayout`` starts N Prometheus shards (each keeping the nodes of its hash and
evaluating the shard-local rule files, remote-writing only what the global files read)
and the global rulers that evaluate the other files: a Prometheus receiving the remote
write, and VictoriaMetrics with vmalert. ``story`` is the demo
scenario with a retry slow enough that the stopped job pages as hung; ``Firsts`` notes
when each alert is first seen firing, and ``compare`` holds two set-ups' alerts to each
other. The scale benchmark (bench/scale_sharded.py) and the identity test
(tests/test_scale_identity.py) run these.
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Self

import yaml

from gpufleet.lab.devstack import (
    PrometheusServer,
    VictoriaMetricsServer,
    VmalertServer,
    file_sd_scrape_config,
)
from gpufleet.lab.processes import ManagedProcess, free_port, http_get, wait_until
from gpufleet.rules.config import RulesConfig
from gpufleet.rules.sharding import (
    is_shard_local,
    remote_write_relabel_configs,
    shard_relabel_configs,
)

DEMO = Path(__file__).resolve().parents[1] / "simulate" / "scenarios" / "demo.yaml"
AGENT_JOB = "gpufleet-agent"
STRAGGLER, FAILED = 12, 40  # the demo's straggler node and the node whose GPU falls off
JOB = "sim-llm"

AlertKey = tuple[str, str]  # (alert name, node or else training job)


def story(nodes: int, path: Path, retry_minutes: float = 5.0) -> Path:
    """The demo scenario on ``nodes`` nodes, its automatic retry ``retry_minutes`` after
    the failure (the demo's 75 s is inside the hung-job alert's 2 minutes).

    The shared storage grows with the cluster, one request slot per node as the demo's
    64 on 64 nodes, so that the checkpoint storm takes as long at every size (32 s, most
    of it queued). On the demo's 64 slots 2,048 nodes would write for 17 minutes: the
    job would not step (no straggler to see), its checkpoint would not end before the
    XID (no queue wait counted) and it would never look hung (a checkpoint in flight)."""
    scenario = yaml.safe_load(DEMO.read_text())
    scenario["name"] = f"sharded-story-{nodes}"
    scenario["cluster"]["nodes"] = nodes
    scenario["cluster"]["storage_slots"] = nodes
    scenario["rates"]["auto_restart_minutes_min"] = retry_minutes
    scenario["rates"]["auto_restart_minutes_max"] = retry_minutes
    path.write_text(yaml.safe_dump(scenario))
    return path


@dataclass
class StoryServer:
    """``gpufleet simulate`` serving ``story`` on ``nodes`` nodes in its own process,
    ``compress`` times faster, updating every ``tick`` seconds; its file_sd file is
    ``workdir/targets.json`` (``instance`` = node)."""

    workdir: Path
    nodes: int
    tick: float
    compress: float = 1.0
    process: ManagedProcess | None = None
    started: float = 0.0  # when the story's clock started (Unix time)

    @property
    def targets(self) -> Path:
        return self.workdir / "targets.json"

    def start(self, timeout: float = 120.0) -> Self:
        port = free_port()
        self.process = ManagedProcess(
            [sys.executable, "-m", "gpufleet", "simulate", "--scenario",
             str(story(self.nodes, self.workdir / "story.yaml")), "--nodes", str(self.nodes),
             "--compress", f"{self.compress:g}", "--listen", f"127.0.0.1:{port}",
             "--targets-file", str(self.targets), "--tick", f"{self.tick:g}", "--horizon", "1"],
            self.workdir / "simulator.log",
        )  # fmt: skip
        self.process.start()
        wait_until(
            lambda: http_get(f"http://127.0.0.1:{port}/healthz") and self.targets.exists(),
            timeout,
            what="the simulator",
        )
        self.started = time.time()  # within a poll of the simulator's own clock
        return self

    def stop(self) -> None:
        if self.process is not None:
            self.process.stop()


def node_name(nodes: int, index: int) -> str:
    """The simulator's name of node ``index`` of ``nodes``."""
    return f"node-{index:0{max(3, len(str(nodes - 1)))}d}"


def expected_story(nodes: int) -> set[AlertKey]:
    """What the story pages: the straggler, the checkpoint queue, the XID and its lost
    GPU, the job hung until its retry."""
    return {
        ("GpuFleetStragglerNode", node_name(nodes, STRAGGLER)),
        ("GpuFleetCheckpointQueueBound", JOB),
        ("GpuFleetCriticalXid", node_name(nodes, FAILED)),
        ("GpuFleetGpuLost", node_name(nodes, FAILED)),
        ("GpuFleetJobHung", JOB),
    }


def alert_key(alert: dict[str, Any]) -> AlertKey:
    labels = alert["labels"]
    return labels["alertname"], labels.get("node") or labels.get("training_job", "-")


def scraped(server: PrometheusServer) -> int:
    """How many node targets ``server`` scrapes successfully."""
    return sum(
        target["health"] == "up" and target["labels"]["job"] == AGENT_JOB
        for target in server.active_targets()
    )


def self_scrape(port: int) -> dict[str, Any]:
    """Prometheus on ``port`` scraping itself (its rule group durations, its memory)."""
    return {"job_name": "prometheus", "static_configs": [{"targets": [f"127.0.0.1:{port}"]}]}


def prometheus(
    workdir: Path, targets: Path, interval: str, relabel: list[dict[str, Any]] | None = None,
    **fields: Any,
) -> PrometheusServer:  # fmt: skip
    """A Prometheus (not started) scraping the nodes of ``targets`` every ``interval``
    (keeping those ``relabel`` keeps) and itself, evaluating every ``interval``."""
    own_port = free_port()
    scrape = file_sd_scrape_config(AGENT_JOB, targets, refresh="5s")
    scrape["relabel_configs"] = relabel or []
    return PrometheusServer(
        workdir,
        port=own_port,
        scrape_configs=[scrape, self_scrape(own_port)],
        scrape_interval=interval,
        evaluation_interval=interval,
        **fields,
    )


RULERS = ("prometheus", "vmalert")


@dataclass
class ShardedLayout:
    """``shards`` Prometheus shards for the nodes of ``targets`` (the simulator's file_sd
    file, whose ``instance`` is the node) and the global rulers of ``rulers``, each fed
    by every shard's remote write:

    - ``prometheus``: a Prometheus receiving remote write and evaluating the global
      files itself, so a chain of recording rules runs within one evaluation, as on
      one Prometheus;
    - ``vmalert``: VictoriaMetrics, and vmalert evaluating the global files against it
      and writing recorded series back: each link of a chain waits for the write.
    """

    workdir: Path
    targets: Path
    rule_files: list[str]
    notifier_url: str
    shards: int = 2
    interval: str = "15s"
    rulers: tuple[str, ...] = RULERS
    # VictoriaMetrics serves data this old and vmalert evaluates this far back: the two
    # must match (vmalert's -rule.evalDelay)
    latency: str = "5s"
    config: RulesConfig | None = None
    shard_servers: list[PrometheusServer] = field(default_factory=list)
    ruler: PrometheusServer | None = None
    victoria: VictoriaMetricsServer | None = None
    vmalert: VmalertServer | None = None

    @property
    def global_files(self) -> list[str]:
        return [path for path in self.rule_files if not is_shard_local(Path(path).name)]

    def start(self, timeout: float = 300.0) -> Self:
        unknown = set(self.rulers) - set(RULERS)
        assert not unknown, f"no global ruler {sorted(unknown)}; known: {RULERS}"
        writes = []
        if "prometheus" in self.rulers:
            own_port = free_port()
            self.ruler = PrometheusServer(
                self.workdir / "ruler",
                port=own_port,
                scrape_configs=[self_scrape(own_port)],
                scrape_interval=self.interval,
                rule_files=self.global_files,
                alertmanager_urls=[self.notifier_url],
                evaluation_interval=self.interval,
                extra_args=["--web.enable-remote-write-receiver"],
            ).start(timeout)
            writes.append(f"{self.ruler.url}/api/v1/write")
        if "vmalert" in self.rulers:
            self.victoria = VictoriaMetricsServer(
                self.workdir / "vm", latency_offset=self.latency
            ).start()
            writes.append(f"{self.victoria.url}/api/v1/write")
        shard_files = [path for path in self.rule_files if is_shard_local(Path(path).name)]
        for index in range(self.shards):
            server = prometheus(
                self.workdir / f"shard-{index}",
                self.targets,
                self.interval,
                relabel=shard_relabel_configs(index, self.shards, "instance"),
                rule_files=shard_files,
                alertmanager_urls=[self.notifier_url],
                remote_write_urls=writes,
                remote_write_relabel=remote_write_relabel_configs(self.config),
            )
            self.shard_servers.append(server)
            server.start(timeout)
        if self.victoria is not None:
            self.vmalert = VmalertServer(
                self.workdir / "vmalert",
                self.global_files,
                self.victoria.url,
                self.notifier_url,
                evaluation_interval=self.interval,
                extra_args=[f"-rule.evalDelay={self.latency}"],
            ).start()
        return self

    def scraped(self) -> int:
        return sum(map(scraped, self.shard_servers))

    def firing_alerts(self, ruler: str) -> list[dict[str, Any]]:
        """What the shards fire and what global ruler ``ruler`` fires."""
        engine = self.ruler if ruler == "prometheus" else self.vmalert
        assert engine is not None, f"no {ruler} global ruler started"
        alerts = [alert for shard in self.shard_servers for alert in shard.firing_alerts()]
        return alerts + engine.firing_alerts()

    def stop(self) -> None:
        # the rulers and the shards before the remote-write targets: a shard whose
        # target is gone waits out its stop timeout flushing the queue
        if self.vmalert is not None:
            self.vmalert.stop()
        for server in self.shard_servers:
            server.stop()
        for target in (self.ruler, self.victoria):
            if target is not None:
                target.stop()


@dataclass
class Firsts:
    """When each alert was first seen firing, seconds after ``t0``."""

    t0: float
    seen: dict[AlertKey, float] = field(default_factory=dict)

    def add(self, alerts: list[dict[str, Any]]) -> None:
        now = time.time() - self.t0
        for alert in alerts:
            self.seen.setdefault(alert_key(alert), now)


def compare(
    one: dict[AlertKey, float], sharded: dict[AlertKey, float], expected: set[AlertKey],
    allowed_s: float, each_s: float | dict[str, float] | None = None,
) -> tuple[bool, list[str]]:  # fmt: skip
    """Do the two set-ups fire exactly ``expected``, the median alert first seen within
    ``allowed_s`` of the other and every alert within ``each_s`` (default ``allowed_s``;
    a dict: per alert name, ``allowed_s`` for a name it lacks)?
    With a line per alert: when each first fired.

    A looser ``each_s`` is for a machine that is busy with more than the set-ups: a
    server starved for a few evaluations delays the one alert due then, where a layout
    that reads its inputs late delays them all, and moves the median. Per alert, it is
    for rule groups evaluated less often than ``allowed_s`` assumes: a sample that
    reaches the global ruler just after such a group's evaluation waits a whole one."""
    per_alert = each_s if isinstance(each_s, dict) else {}
    each_default = allowed_s if each_s is None or isinstance(each_s, dict) else each_s

    def bound(key: AlertKey) -> float:
        return per_alert.get(key[0], each_default)

    lines = ["alerts first seen firing (s after the start): one Prometheus | sharded"]
    for key in sorted(set(one) | set(sharded), key=lambda k: one.get(k, sharded.get(k, 0.0))):
        a, b = one.get(key), sharded.get(key)
        gap = "" if a is None or b is None else f"  ({b - a:+.0f} s)"
        mark = "" if key in expected else "   <- not in the story"
        lines.append(
            f"  {key[0]:30} {key[1]:10} {'-' if a is None else f'{a:.0f}':>6} | "
            f"{'-' if b is None else f'{b:.0f}':>6}{gap}{mark}"
        )
    both = [key for key in expected if key in one and key in sharded]
    gap_of = {key: abs(sharded[key] - one[key]) for key in both}
    gaps = sorted(gap_of.values())
    same = set(one) == set(sharded) == expected
    median = gaps[len(gaps) // 2] if gaps else float("nan")
    late = [f"{key[0]} {gap:.1f} s > {bound(key):g} s" for key, gap in gap_of.items()
            if gap > bound(key)]  # fmt: skip
    in_time = len(gaps) == len(expected) and median <= allowed_s and not late
    if per_alert:
        within = ", ".join(f"{name} {seconds:g} s" for name, seconds in sorted(per_alert.items()))
        bounds = f"allowed: median {allowed_s:g} s, each within its group's interval: {within}"
    elif each_default == allowed_s:
        bounds = f"allowed {allowed_s:g} s"
    else:
        bounds = f"allowed: median {allowed_s:g} s, each {each_default:g} s"
    if late:
        bounds += "; late: " + ", ".join(late)
    lines.append(
        f"identical: {same}; median gap {median:.1f} s, largest "
        f"{max(gaps, default=float('nan')):.1f} s ({bounds})"
    )
    return same and in_time, lines
