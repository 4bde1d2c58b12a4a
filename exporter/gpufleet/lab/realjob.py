"""Run one real PyTorch job against gpufleet and say what fired, for whom and when.

``run_job(JobSpec(...), workdir)`` starts, all on 127.0.0.1:

- one gpufleet agent per node (``Agent`` served by uvicorn in a thread, as ``gpufleet
  agent`` serves it), on a free port;
- a real Prometheus scraping them with gpufleet's rules, every window, ``for`` and
  time budget ``time_factor`` times shorter (``compressed_rules``);
- the job: one ``torchrun --nnodes N --nproc-per-node 1 --node-rank i`` per node, met
  at a c10d rendezvous hosted by node 0, each with ``GPUFLEET_AGENT_URL`` naming its
  node's agent (the way a real node's ranks find their agent), running
  ``gpufleet.lab.ddp_worker`` under the spec's framework.

It polls (never sleeps for a fixed span) until the job trained ``duration_s`` or the
caller's ``until`` says enough, stops the job the way every rank agrees on, and reads
back from Prometheus every alert that was pending or firing (``ALERTS`` and
``ALERTS_FOR_STATE``, sample by sample, so none is missed between polls) and each node's
compute ratio, for diagnosis. Every process is stopped by its PID.

Time: Prometheus and the workers share the machine's clock; ``JobResult`` gives epoch
seconds, and ``uncompressed()`` turns a span back into the production time it stands for.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpufleet.lab.devstack import PrometheusServer, static_scrape_config
from gpufleet.lab.processes import ManagedProcess, free_port, wait_until
from gpufleet.lab.workload import Framework, Workload
from gpufleet.rules.__main__ import write_rules
from gpufleet.rules.config import RulesConfig
from gpufleet.rules.training import TrainingSeries
from gpufleet.simulate.config import ScenarioError, parse_duration

# Rule knobs in seconds that are time budgets, compressed like the windows.
_BUDGETS_S = ("hang_min_seconds", "checkpoint_save_budget_s", "checkpoint_restore_budget_s")
PAGING_SEVERITIES = frozenset({"warning", "critical"})
# A job not stepping this long after its launch will not (imports, rendezvous, DDP set-up
# of four processes on a loaded 2-core machine take 20-60 s).
START_TIMEOUT_S = 240.0
STOP_TIMEOUT_S = 60.0

Samples = tuple[tuple[float, float], ...]


class LabError(RuntimeError):
    """The lab job could not run as specified (a process failed or never started)."""


def compressed_rules(factor: int) -> RulesConfig:
    """gpufleet's rules with every window, ``for`` duration and time budget ``factor``
    times shorter, to match ``Scenario.compressed(factor)``."""
    base = RulesConfig()
    changes: dict[str, Any] = {}
    for spec in dataclasses.fields(base):
        value = getattr(base, spec.name)
        if spec.name in _BUDGETS_S:
            changes[spec.name] = value / factor
        elif isinstance(value, str):
            try:
                seconds = parse_duration(value)
            except ScenarioError:
                continue  # a selector or a URL
            changes[spec.name] = f"{max(1, round(seconds / factor))}s"
    return dataclasses.replace(base, **changes)


@dataclass(frozen=True, slots=True)
class JobSpec:
    """One lab job: ``nodes`` nodes of one rank each, at most one slowed and one given
    longer batches (``Workload`` says what each means)."""

    framework: Framework = "ddp"
    nodes: int = 4
    device_s: float = 0.02
    # the node whose device time grows slow_factor times, slow_after_s after the first step
    slow_node: int | None = None
    slow_factor: float = 1.25
    slow_after_s: float = 60.0
    # the node whose batches are work_factor times longer (tokens and device time)
    imbalanced_node: int | None = None
    work_factor: float = 1.3
    # seconds of training after the first step, unless `until` ends it first
    duration_s: float = 150.0
    time_factor: int = 10
    scrape_interval: str = "1s"
    training_job: str = "lab-job"

    def node_name(self, index: int) -> str:
        return f"node-{index}"

    @property
    def node_names(self) -> list[str]:
        return [self.node_name(index) for index in range(self.nodes)]

    @property
    def rules(self) -> RulesConfig:
        return compressed_rules(self.time_factor)

    def uncompressed(self, seconds: float) -> float:
        """The production span a compressed one stands for."""
        return seconds * self.time_factor

    def workload(self, index: int, stop_file: Path, events_file: Path) -> Workload:
        return Workload(
            framework=self.framework,
            device_s=self.device_s,
            work_factor=self.work_factor if index == self.imbalanced_node else 1.0,
            slow_factor=self.slow_factor if index == self.slow_node else 1.0,
            slow_after_s=self.slow_after_s,
            stop_file=str(stop_file),
            # the harness stops the job; this only ends one whose harness died
            max_seconds=self.duration_s + START_TIMEOUT_S,
            events_file=str(events_file),
        )


@dataclass(frozen=True, slots=True)
class AlertRecord:
    """One alert, one spell of it: pending from ``active_at``, firing from ``fired_at``
    (None: it never fired). Epoch seconds, as Prometheus evaluated them."""

    name: str
    labels: Mapping[str, str]
    active_at: float
    fired_at: float | None

    @property
    def node(self) -> str | None:
        return self.labels.get("node")

    @property
    def severity(self) -> str:
        return self.labels.get("severity", "")

    @property
    def pages(self) -> bool:
        return self.fired_at is not None and self.severity in PAGING_SEVERITIES


@dataclass(frozen=True, slots=True)
class JobResult:
    """What a lab job did and what gpufleet said of it (epoch seconds)."""

    spec: JobSpec
    launched_at: float
    first_step_at: float
    slowed_at: float | None
    ended_at: float
    alerts: tuple[AlertRecord, ...]
    # per node: its compute against its stage median, and its compute seconds per step
    compute_ratio: Mapping[str, Samples] = field(default_factory=dict)
    compute_per_step: Mapping[str, Samples] = field(default_factory=dict)
    steps: Mapping[str, int] = field(default_factory=dict)

    def fired(self, name: str | None = None) -> list[AlertRecord]:
        """Alerts that fired (any severity), ``name`` only if given, first first."""
        found = [a for a in self.alerts if a.fired_at is not None and name in (None, a.name)]
        return sorted(found, key=lambda a: a.fired_at or 0.0)

    def pages(self) -> list[AlertRecord]:
        """Alerts that fired at a paging severity (warning, critical)."""
        return [alert for alert in self.fired() if alert.pages]

    def first_fired(self, name: str, node: str) -> AlertRecord | None:
        return next((a for a in self.fired(name) if a.node == node), None)

    def mean_ratio(self, node: str, start: float, end: float | None = None) -> float | None:
        """The node's mean compute ratio over [start, end] (None: no sample there)."""
        values = [
            value
            for at, value in self.compute_ratio.get(node, ())
            if start <= at <= (end if end is not None else self.ended_at)
        ]
        return sum(values) / len(values) if values else None


class NodeAgent:
    """A gpufleet agent for one node, served by uvicorn from a thread on a free port."""

    def __init__(self, node: str) -> None:
        import uvicorn

        from gpufleet.agent.app import Agent, AgentSettings, agent_server_config

        self.port = free_port()
        self.agent = Agent(AgentSettings(node=node, port=self.port, gpu_source="none"))
        self.agent.open()
        self.server = uvicorn.Server(agent_server_config(self.agent, "warning"))
        self._thread = threading.Thread(target=self.server.run, name=f"agent-{node}", daemon=True)

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self) -> NodeAgent:
        self._thread.start()
        wait_until(lambda: self.server.started, 30, what=f"the agent on {self.address}")
        return self

    def stop(self) -> None:
        self.server.should_exit = True
        self._thread.join(15)


def _torchrun() -> list[str]:
    """The torchrun of this interpreter's environment (its module where no script is)."""
    script = shutil.which("torchrun", path=str(Path(sys.executable).parent))
    return [script] if script else [sys.executable, "-m", "torch.distributed.run"]


def _worker_environment(agent_url: str) -> dict[str, str]:
    env = {
        name: value
        for name, value in os.environ.items()
        # the job's identity comes from torchrun, the agent from the harness
        if not name.startswith("GPUFLEET_") and name not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")
    }
    env.update(
        GPUFLEET_AGENT_URL=agent_url,
        OMP_NUM_THREADS="1",  # a rank stands for one GPU: one core's worth of threads
        GLOO_SOCKET_IFNAME="lo",  # gloo on the loopback, whatever the host name resolves to
        PYTHONUNBUFFERED="1",
    )
    return env


def _launchers(spec: JobSpec, workdir: Path, agents: list[NodeAgent]) -> list[ManagedProcess]:
    rendezvous = f"127.0.0.1:{free_port()}"
    stop_file = workdir / "stop"
    stop_file.unlink(missing_ok=True)  # a workdir used before: not this job's
    launchers = []
    for index, agent in enumerate(agents):
        node_dir = workdir / spec.node_name(index)
        node_dir.mkdir(parents=True, exist_ok=True)
        events_file = node_dir / "events.jsonl"
        events_file.unlink(missing_ok=True)
        workload = spec.workload(index, stop_file, events_file)
        argv = [
            *_torchrun(),
            f"--nnodes={spec.nodes}",
            "--nproc-per-node=1",
            f"--node-rank={index}",
            "--rdzv-backend=c10d",
            f"--rdzv-endpoint={rendezvous}",
            f"--rdzv-id={spec.training_job}",
            # node 0 hosts the rendezvous store; the others only connect to it
            f"--rdzv-conf=is_host={int(index == 0)}",
            "--local-addr=127.0.0.1",
            "--max-restarts=0",
            "-m",
            "gpufleet.lab.ddp_worker",
            *workload.argv(),
        ]
        env = _worker_environment(f"http://{agent.address}")
        launchers.append(ManagedProcess(argv, node_dir / "torchrun.log", env=env))
    return launchers


def _events(spec: JobSpec, workdir: Path) -> dict[str, list[dict[str, Any]]]:
    found: dict[str, list[dict[str, Any]]] = {}
    for node in spec.node_names:
        path = workdir / node / "events.jsonl"
        try:
            lines = path.read_text(encoding="utf-8").splitlines()
        except FileNotFoundError:
            lines = []
        # a line being written is not whole yet: only whole ones count
        found[node] = [json.loads(line) for line in lines if line.endswith("}")]
    return found


def _first(events: dict[str, list[dict[str, Any]]], kind: str) -> float | None:
    times = [e["at"] for node in events.values() for e in node if e["event"] == kind]
    return min(times) if times else None


def _steps(events: list[dict[str, Any]]) -> int:
    return sum(int(event["steps"]) for event in events if event["event"] == "end")


def observed_alerts(prometheus: PrometheusServer, since: float) -> tuple[AlertRecord, ...]:
    """Every alert pending or firing since ``since``, read sample by sample from
    ``ALERTS_FOR_STATE`` (its value is the alert's activeAt) and ``ALERTS``."""
    now = time.time()
    span = f"{int(now - since) + 2}s"
    firing: dict[tuple[tuple[str, str], ...], list[float]] = {}
    for series in prometheus.client.query(f'ALERTS{{alertstate="firing"}}[{span}]', now):
        labels = {k: v for k, v in series["metric"].items() if k not in ("__name__", "alertstate")}
        firing[tuple(sorted(labels.items()))] = [float(at) for at, _ in series["values"]]
    records: list[AlertRecord] = []
    covered: set[tuple[tuple[tuple[str, str], ...], float]] = set()
    for series in prometheus.client.query(f"ALERTS_FOR_STATE[{span}]", now):
        labels = {k: v for k, v in series["metric"].items() if k != "__name__"}
        key = tuple(sorted(labels.items()))
        spells: dict[float, list[float]] = {}
        for at, active_at in series["values"]:
            spells.setdefault(float(active_at), []).append(float(at))
        for active_at, times in sorted(spells.items()):
            inside = [t for t in firing.get(key, []) if times[0] <= t <= times[-1]]
            covered.update((key, t) for t in inside)
            records.append(_record(labels, active_at, min(inside) if inside else None))
    # Rules without a `for` have no pending state; their firing samples stand alone.
    for key, times in firing.items():
        alone = [t for t in times if (key, t) not in covered]
        if alone:
            records.append(_record(dict(key), alone[0], alone[0]))
    return tuple(sorted(records, key=lambda r: (r.active_at, r.name)))


def _record(labels: dict[str, str], active_at: float, fired_at: float | None) -> AlertRecord:
    return AlertRecord(labels["alertname"], labels, active_at, fired_at)


def _per_node(
    prometheus: PrometheusServer, expr: str, start: float, end: float
) -> dict[str, Samples]:
    series = prometheus.query_range(expr, start, end, 1.0)
    return {
        s["metric"].get("node", "?"): tuple((float(t), float(v)) for t, v in s["values"])
        for s in series
    }


def run_job(
    spec: JobSpec, workdir: Path, until: Callable[[JobResult], bool] | None = None
) -> JobResult:
    """Run ``spec`` for real and report what fired; ``until(result so far)`` may end the
    job before ``duration_s`` (it sees the alerts, not yet the ratio series)."""
    workdir.mkdir(parents=True, exist_ok=True)
    shutil.rmtree(workdir / "prometheus", ignore_errors=True)  # an earlier job's samples
    rules = spec.rules
    rule_paths = [str(path) for path in write_rules(workdir / "rules", rules)]
    agents: list[NodeAgent] = []
    prometheus: PrometheusServer | None = None
    launchers: list[ManagedProcess] = []
    try:
        agents = [NodeAgent(node).start() for node in spec.node_names]
        # The job starts first: its imports and rendezvous take far longer than
        # Prometheus's start, which is over before the first step.
        launched = time.time()
        launchers = _launchers(spec, workdir, agents)
        for launcher in launchers:
            launcher.start()
        prometheus = PrometheusServer(
            workdir / "prometheus",
            scrape_configs=[
                static_scrape_config(rules_job(rules), [agent.address for agent in agents])
            ],
            rule_files=rule_paths,
            scrape_interval=spec.scrape_interval,
        ).start()
        prometheus.wait_for_targets_up(spec.nodes)
        result = _watch(
            spec,
            workdir=workdir,
            prometheus=prometheus,
            launchers=launchers,
            launched=launched,
            until=until,
        )
        # Every rank stops within check_every steps; torchrun takes seconds more to exit,
        # which the queries overlap.
        (workdir / "stop").touch()
        series = TrainingSeries.of(rules)
        end = time.time()
        result = dataclasses.replace(
            result,
            alerts=observed_alerts(prometheus, launched),
            compute_ratio=_per_node(prometheus, series.compute_ratio, launched, end),
            compute_per_step=_per_node(prometheus, series.slowest, launched, end),
        )
        _wait_stopped(launchers)
        events = _events(spec, workdir)
        return dataclasses.replace(
            result, steps={node: _steps(found) for node, found in events.items()}
        )
    finally:
        for launcher in launchers:
            launcher.stop()
        if prometheus is not None:
            prometheus.stop()
        for agent in agents:
            agent.stop()


def rules_job(rules: RulesConfig) -> str:
    """The scrape job name the rules' agent selector expects (``job="gpufleet-agent"``)."""
    return rules.agent_selector.split('"')[1]


def _watch(
    spec: JobSpec,
    *,
    workdir: Path,
    prometheus: PrometheusServer,
    launchers: list[ManagedProcess],
    launched: float,
    until: Callable[[JobResult], bool] | None,
) -> JobResult:
    """Poll the job until it trained ``duration_s`` or ``until`` is satisfied."""
    while True:
        for index, launcher in enumerate(launchers):
            if not launcher.running():
                code = launcher.process.returncode if launcher.process else None
                raise LabError(
                    f"{spec.node_name(index)}'s torchrun exited (status {code}) before the "
                    f"job was stopped:\n{launcher.log_tail(40)}"
                )
        events = _events(spec, workdir)
        first_step = _first(events, "first_step")
        now = time.time()
        if first_step is None:
            if now - launched > START_TIMEOUT_S:
                tails = "\n".join(launcher.log_tail(15) for launcher in launchers)
                raise LabError(f"the job took no step in {START_TIMEOUT_S:.0f}s:\n{tails}")
        else:
            slowed = _first(events, "slow")
            alerts = observed_alerts(prometheus, launched)
            result = JobResult(spec, launched, first_step, slowed, now, alerts)
            if now - first_step >= spec.duration_s or (until is not None and until(result)):
                return result
        time.sleep(1.0)


def _wait_stopped(launchers: list[ManagedProcess]) -> None:
    """Wait for the launchers of a job asked to stop to exit; ``run_job`` kills any left
    by PID."""
    deadline = time.monotonic() + STOP_TIMEOUT_S
    for launcher in launchers:
        if launcher.process is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                launcher.process.wait(max(0.1, deadline - time.monotonic()))
