"""Cluster shape, fault rates, confounders and scenarios (YAML files), all with defaults.

A scenario file overrides any default and may list explicit episodes::

    name: single-straggler
    description: One GPU runs 25% slow for 15 minutes.
    cluster: {nodes: 16}
    rates: {fail_stop_per_1000_node_days: 0}
    episodes:
      - {kind: fail_slow_compute, node: 5, gpu: 3, start: 2m, duration: 15m, magnitude: 1.25}

Times are relative to the start of the simulation ("90s", "2m", "1h", "1d" or
seconds); nodes are indices or names (``node-005``). ``{kind: checkpoint, start: 80s}``
makes every node checkpoint at once then, beside the periodic checkpoints (skipped,
like them, while the job is down).

A shared cluster runs several jobs, each with its own settings over ``cluster``
(see ``gpufleet.simulate.shared``); an episode then names its job, and its node
is a slot of that job (0 .. the job's nodes - 1)::

    spare_nodes: 4
    jobs:
      - {job: wide, nodes: 24, layout: 8x3x8}
      - {job: small-stages, nodes: 8, layout: 4x4x4, report_ranks: tp0}
      - {job: step-only, nodes: 8, step_only: true}
      - {job: overlapped, nodes: 8, comm_overlap: 0.6}
    episodes:
      - {kind: fail_slow_compute, job: small-stages, node: 3, gpu: 6, start: 1h, duration: 30m}

``report_ranks: tp0``: only tensor-parallel rank 0 of each TP group sends steps;
``step_only``: ranks send the step time alone; ``comm_overlap``: the share of
the collectives' time hidden behind compute (the exposed rest is what waits).
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass, field, fields, replace
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

from gpufleet.simulate.faults import CAUSES_BY_NAME, Kind

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|d)?\s*$")
_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, None: 1.0}


class ScenarioError(ValueError):
    """A scenario file or flag is unusable; the message says where and why."""


REPORT_RANKS = frozenset({"all", "tp0"})


def parse_duration(value: Any, where: str = "duration") -> float:
    if isinstance(value, int | float) and not isinstance(value, bool):
        return float(value)
    match = _DURATION.match(str(value))
    if not match:
        raise ScenarioError(f"{where}: {value!r} is not a duration like 90s, 15m, 2h or 1d")
    return float(match.group(1)) * _UNITS[match.group(2)]


@dataclass(frozen=True, slots=True)
class Layout:
    dp: int
    pp: int
    tp: int

    @classmethod
    def parse(cls, text: str) -> Layout:
        parts = re.split(r"\s*[x×*]\s*", text.strip())  # noqa: RUF001 - the multiplication sign is accepted too
        if len(parts) != 3 or not all(part.isdigit() and int(part) > 0 for part in parts):
            raise ScenarioError(f"layout {text!r} is not DPxPPxTP, for example 8x4x8")
        dp, pp, tp = (int(part) for part in parts)
        return cls(dp, pp, tp)

    def __str__(self) -> str:
        return f"{self.dp}x{self.pp}x{self.tp}"


@dataclass(frozen=True, slots=True)
class ClusterSpec:
    nodes: int = 64
    gpus_per_node: int = 8
    layout: str | None = None  # DPxPPxTP; default: TP = GPUs per node, PP up to 4
    job: str = "sim-llm"
    step_seconds: float = 2.0  # healthy lock-step step time
    compute_share: float = 0.72  # of a healthy step; the rest is data and collectives
    data_share: float = 0.03
    last_stage_skew: float = 0.12  # the last pipeline stage computes longer (loss, head)
    tokens_per_rank_step: int = 16384
    checkpoint_interval_s: float = 1800.0
    checkpoint_bytes_per_node: float = 16e9
    eval_interval_s: float = 7200.0
    eval_duration_s: float = 300.0
    # Shared storage: request slots, per-slot bandwidth, requests each writer keeps in flight.
    storage_slots: int = 64
    storage_slot_bytes_per_s: float = 0.5e9
    requests_per_writer: int = 16
    # How the job reports (the defaults: every rank, with its compute / data / collective split).
    report_ranks: str = "all"  # "all", or "tp0": only tensor-parallel rank 0 of each TP group
    step_only: bool = False  # ranks send only the step time (the agent counts it as compute)
    comm_overlap: float = 0.0  # share of the healthy collective time hidden behind compute
    # The Kubernetes namespace (tenant) of the job's pods, one pod per node: the agent's
    # gpufleet_gpu_allocation_info for each GPU the job holds, and namespace / pod on its
    # training series. Empty: no pods (a Slurm or bare-metal job), no such series.
    namespace: str = ""
    # The agents' layout series of the job's ranks (tp / pp / dp groups), each GPU's NVLink
    # bandwidth and each node's InfiniBand bytes (node_exporter): the job layout panels'
    # data (simulate/layout.py). Off: none of these series.
    parallel_layout: bool = False

    def pod_labels(self, slot: int) -> list[tuple[str, str]]:
        """The namespace and pod of the job's pod on its node ``slot``, if it has pods."""
        return (
            [("namespace", self.namespace), ("pod", f"{self.job}-{slot}")] if self.namespace else []
        )

    def check(self, where: str = "cluster") -> None:
        """Raise ScenarioError for reporting settings no job could have."""
        if self.report_ranks not in REPORT_RANKS:
            raise ScenarioError(
                f"{where}.report_ranks: {self.report_ranks!r} is not one of {sorted(REPORT_RANKS)}"
            )
        if not 0.0 <= self.comm_overlap < 1.0:
            raise ScenarioError(f"{where}.comm_overlap: {self.comm_overlap!r} is not in [0, 1)")

    @property
    def plain_reporting(self) -> bool:
        """Every rank reports its own compute / data / collective split, nothing overlapped."""
        return self.report_ranks == "all" and not self.step_only and self.comm_overlap == 0.0

    def resolved_layout(self) -> Layout:
        ranks = self.nodes * self.gpus_per_node
        if self.layout:
            layout = Layout.parse(self.layout)
            if layout.dp * layout.pp * layout.tp != ranks:
                raise ScenarioError(
                    f"layout {layout} has {layout.dp * layout.pp * layout.tp} ranks; "
                    f"{self.nodes} nodes x {self.gpus_per_node} GPUs have {ranks}"
                )
            return layout
        tp = self.gpus_per_node
        pp = next(p for p in (4, 2, 1) if self.nodes % p == 0)
        return Layout(ranks // (tp * pp), pp, tp)

    def dp_rank(self, node: int, gpu: int) -> int:
        """The data-parallel replica whose rank GPU ``gpu`` of ``node`` holds (ranks are
        numbered node by node; a stage holds DP x TP of them, a TP group TP)."""
        layout = self.resolved_layout()
        return (node * self.gpus_per_node + gpu) % (layout.dp * layout.tp) // layout.tp

    def replica_groups(self) -> list[frozenset[int]]:
        """Each node's replica group: the nodes holding a rank of a data-parallel replica it
        holds one of (itself included). A replica that loses one of them cannot step: until
        the slot is filled again the job trains without the whole group (its data-parallel
        width shrinks), as an elastic job would."""
        gpus = range(self.gpus_per_node)
        replicas = [{self.dp_rank(node, gpu) for gpu in gpus} for node in range(self.nodes)]
        holders: dict[int, set[int]] = {}
        for node, held in enumerate(replicas):
            for replica in held:
                holders.setdefault(replica, set()).add(node)
        return [frozenset().union(*(holders[replica] for replica in held)) for held in replicas]


@dataclass(frozen=True, slots=True)
class FaultRates:
    fail_stop_per_1000_node_days: float = 8.0
    bad_node_fraction: float = 0.05  # at least 3 nodes
    bad_node_multiplier: float = 30.0  # how much more often bad nodes fail
    fail_slow_compute_per_node_day: float = 0.02
    fail_slow_comm_per_node_day: float = 0.01
    compute_slowdown_min: float = 1.10
    compute_slowdown_max: float = 1.30
    compute_mean_minutes: float = 10.0
    comm_mean_minutes: float = 24.0
    # on the collectives' share of a step (~25%): 1.2x to 2x is a 5% to 25% slower step
    comm_slowdown_min: float = 1.2
    comm_slowdown_max: float = 2.0
    auto_retry_success: float = 0.8
    auto_restart_minutes_min: float = 5.0
    auto_restart_minutes_max: float = 15.0
    manual_restart_minutes_min: float = 30.0
    manual_restart_minutes_max: float = 120.0
    repair_hours_median: float = 4.0
    precursor_hours_min: float = 2.0
    precursor_hours_max: float = 12.0
    # An uncorrectable HBM error's XID burst (faults.dbe_burst): how often the error is
    # contained (XID 94, else 95: Ampere and later contain more often than not; NVIDIA
    # publishes no share, 0.7 is an assumption), how often its row could
    # not be remapped (XID 64, else 63), and the most seconds between two of its XIDs.
    hbm_contained_share: float = 0.7
    hbm_remap_failure_share: float = 0.15
    hbm_xid_gap_max_s: float = 1.0

    def check(self, where: str = "rates") -> None:
        """Raise ScenarioError for a share outside [0, 1] or a negative gap."""
        for name in ("hbm_contained_share", "hbm_remap_failure_share", "auto_retry_success"):
            value = getattr(self, name)
            if not 0.0 <= value <= 1.0:
                raise ScenarioError(f"{where}.{name}: {value!r} is not a share in [0, 1]")
        if self.hbm_xid_gap_max_s < 0:
            raise ScenarioError(
                f"{where}.hbm_xid_gap_max_s: {self.hbm_xid_gap_max_s!r} is not 0 or more seconds"
            )


@dataclass(frozen=True, slots=True)
class Confounders:
    data_loader_stalls_per_hour: float = 6.0  # cluster-wide, each on a random node
    data_loader_stall_seconds_min: float = 30.0
    data_loader_stall_seconds_max: float = 120.0
    gc_pauses_per_node_hour: float = 2.0
    seq_len_sigma: float = 0.03
    diurnal_amplitude: float = 0.015
    cluster_slowdowns_per_day: float = 0.5
    cluster_slowdown: float = 1.15
    # Uneven work across data-parallel replicas (a data shard of longer sequences): every
    # rank of one replica computes 2-8% longer for 20-120 minutes, on healthy GPUs. Per job.
    workload_imbalances_per_day: float = 3.0
    workload_imbalance_min: float = 1.02
    workload_imbalance_max: float = 1.08
    workload_imbalance_minutes_min: float = 20.0
    workload_imbalance_minutes_max: float = 120.0
    checkpoints: bool = True
    evals: bool = True
    stage_skew: bool = True


@dataclass(slots=True)
class Scenario:
    name: str = "realistic-week"
    description: str = ""
    cluster: ClusterSpec = field(default_factory=ClusterSpec)
    rates: FaultRates = field(default_factory=FaultRates)
    confounders: Confounders = field(default_factory=Confounders)
    episodes: list[dict[str, Any]] = field(default_factory=list)
    # A shared cluster: several concurrent jobs (each a ClusterSpec: its nodes, layout and
    # reporting), and idle spare nodes; empty means the one job of ``cluster``.
    jobs: list[ClusterSpec] = field(default_factory=list)
    spare_nodes: int = 0

    def with_cluster(self, **overrides: Any) -> Scenario:
        given = {key: value for key, value in overrides.items() if value is not None}
        return replace(self, cluster=replace(self.cluster, **given))

    def compressed(self, factor: float) -> Scenario:
        """The same story ``factor`` times faster, for end-to-end tests of a scenario
        written in minutes (run them with rule windows and ``for`` durations divided
        by the same factor).

        Shrinks what sets the story's pace: episode times, the checkpoint and eval
        cadence, a checkpoint's size (so a write takes 1/factor as long and queues
        just as much), restart and repair delays, fault and confounder durations;
        rates per hour or day grow by the factor. The step time does not change:
        a shrunken rate window still holds tens of steps. Durations drawn inside
        the fault model itself (a failed retry's run, a thermal lead) do not shrink.
        """
        if factor <= 0:
            raise ScenarioError(f"compression factor {factor!r} is not a positive number")

        def shorter(section: Any, names: tuple[str, ...], longer: tuple[str, ...] = ()) -> Any:
            changes = {name: getattr(section, name) / factor for name in names}
            changes |= {name: getattr(section, name) * factor for name in longer}
            return replace(section, **changes)

        cluster = shorter(
            self.cluster,
            ("checkpoint_interval_s", "checkpoint_bytes_per_node", "eval_interval_s",
             "eval_duration_s"),
        )  # fmt: skip
        rates = shorter(
            self.rates,
            ("compute_mean_minutes", "comm_mean_minutes", "auto_restart_minutes_min",
             "auto_restart_minutes_max", "manual_restart_minutes_min",
             "manual_restart_minutes_max", "repair_hours_median", "precursor_hours_min",
             "precursor_hours_max"),
            ("fail_stop_per_1000_node_days", "fail_slow_compute_per_node_day",
             "fail_slow_comm_per_node_day"),
        )  # fmt: skip
        confounders = shorter(
            self.confounders,
            ("data_loader_stall_seconds_min", "data_loader_stall_seconds_max",
             "workload_imbalance_minutes_min", "workload_imbalance_minutes_max"),
            ("data_loader_stalls_per_hour", "gc_pauses_per_node_hour", "cluster_slowdowns_per_day",
             "workload_imbalances_per_day"),
        )  # fmt: skip
        episodes = [
            {key: value / factor if key in ("start", "duration", "period") else value
             for key, value in episode.items()}
            for episode in self.episodes
        ]  # fmt: skip
        return replace(
            self,
            name=f"{self.name} ({factor:g}x faster)",
            cluster=cluster,
            rates=rates,
            confounders=confounders,
            episodes=episodes,
        )


def _overrides(section: Any, cls: type[Any], where: str) -> Any:
    if section is None:
        return cls()
    if not isinstance(section, dict):
        raise ScenarioError(f"{where}: expected a mapping of settings")
    known = {f.name: f for f in fields(cls)}
    values = {}
    for key, raw in section.items():
        value = raw
        if key not in known:
            raise ScenarioError(
                f"{where}.{key}: unknown setting; known: {', '.join(sorted(known))}"
            )
        default = known[key].default
        if isinstance(default, bool):
            if not isinstance(value, bool):
                raise ScenarioError(f"{where}.{key}: {value!r} is not true or false")
        elif isinstance(default, int | float) and not isinstance(value, int | float):
            value = parse_duration(value, f"{where}.{key}") if key.endswith("_s") else value
            if not isinstance(value, int | float):
                raise ScenarioError(f"{where}.{key}: {value!r} is not a number")
        values[key] = value
    return cls(**values)


_EPISODE_KEYS = {
    "kind", "node", "gpu", "start", "duration", "end", "cause", "xid", "magnitude", "job",
}  # fmt: skip


def _check_episode(episode: Any, index: int) -> dict[str, Any]:
    where = f"episodes[{index}]"
    if not isinstance(episode, dict):
        raise ScenarioError(f"{where}: expected a mapping")
    unknown = set(episode) - _EPISODE_KEYS - {"count", "period"}
    if unknown:
        raise ScenarioError(f"{where}: unknown keys {sorted(unknown)}")
    kinds = {str(kind) for kind in Kind}
    if episode.get("kind") not in kinds:
        raise ScenarioError(f"{where}.kind: {episode.get('kind')!r} is not one of {sorted(kinds)}")
    if episode["kind"] == Kind.FAIL_STOP and episode.get("cause") not in CAUSES_BY_NAME:
        raise ScenarioError(
            f"{where}.cause: {episode.get('cause')!r} is not one of {sorted(CAUSES_BY_NAME)}"
        )
    checked = dict(episode)
    checked["start"] = parse_duration(episode.get("start", 0), f"{where}.start")
    if "duration" in episode:
        checked["duration"] = parse_duration(episode["duration"], f"{where}.duration")
    if "period" in episode:
        checked["period"] = parse_duration(episode["period"], f"{where}.period")
    return checked


def load_scenario(source: str) -> Scenario:
    """A scenario by name (bundled) or by path to a YAML file."""
    path = Path(source)
    if path.suffix in (".yaml", ".yml") or path.exists():
        try:
            text = path.read_text(encoding="utf-8")
        except OSError as error:
            raise ScenarioError(f"cannot read scenario {source}: {error}") from None
    else:
        bundled = resources.files("gpufleet.simulate").joinpath(f"scenarios/{source}.yaml")
        if not bundled.is_file():
            raise ScenarioError(
                f"no scenario named {source!r}; bundled: {', '.join(scenario_names())}"
            )
        text = bundled.read_text(encoding="utf-8")
    try:
        data = yaml.safe_load(text) or {}
    except yaml.YAMLError as error:
        raise ScenarioError(f"scenario {source}: not valid YAML: {error}") from None
    if not isinstance(data, dict):
        raise ScenarioError(f"scenario {source}: expected a mapping at the top")
    unknown = set(data) - {
        "name", "description", "cluster", "rates", "confounders", "episodes", "jobs",
        "spare_nodes",
    }  # fmt: skip
    if unknown:
        raise ScenarioError(f"scenario {source}: unknown sections {sorted(unknown)}")
    episodes = data.get("episodes") or []
    if not isinstance(episodes, list):
        raise ScenarioError(f"scenario {source}: episodes must be a list")
    cluster = _overrides(data.get("cluster"), ClusterSpec, "cluster")
    cluster.check()
    rates = _overrides(data.get("rates"), FaultRates, "rates")
    rates.check()
    jobs = _jobs(data.get("jobs"), data.get("cluster") or {}, source)
    spares = data.get("spare_nodes", 0)
    if not isinstance(spares, int) or isinstance(spares, bool) or spares < 0:
        raise ScenarioError(f"scenario {source}: spare_nodes {spares!r} is not a count >= 0")
    if spares and not jobs:
        raise ScenarioError(f"scenario {source}: spare_nodes needs a jobs section")
    checked = [_check_episode(episode, i) for i, episode in enumerate(episodes)]
    names = [job.job for job in jobs]
    for index, episode in enumerate(checked):
        if jobs and episode.get("job") not in names:
            raise ScenarioError(
                f"episodes[{index}].job: {episode.get('job')!r} is not one of {names}"
            )
        if not jobs and "job" in episode:
            raise ScenarioError(f"episodes[{index}].job: this scenario has no jobs section")
    return Scenario(
        name=str(data.get("name", Path(source).stem)),
        description=str(data.get("description", "")).strip(),
        cluster=cluster,
        rates=rates,
        confounders=_overrides(data.get("confounders"), Confounders, "confounders"),
        episodes=checked,
        jobs=jobs,
        spare_nodes=spares,
    )


def _jobs(section: Any, cluster: dict[str, Any], source: str) -> list[ClusterSpec]:
    """The jobs of a shared cluster: each job's settings over the scenario's ``cluster``."""
    if section is None:
        return []
    if not isinstance(section, list) or not isinstance(cluster, dict):
        raise ScenarioError(f"scenario {source}: jobs must be a list of mappings")
    jobs = []
    for index, entry in enumerate(section):
        where = f"jobs[{index}]"
        if not isinstance(entry, dict) or not isinstance(entry.get("job"), str):
            raise ScenarioError(f"{where}: expected a mapping with a job name (job: ...)")
        spec = _overrides({**cluster, **entry}, ClusterSpec, where)
        spec.check(where)
        spec.resolved_layout()
        jobs.append(spec)
    names = [job.job for job in jobs]
    if len(set(names)) != len(names):
        raise ScenarioError(f"scenario {source}: job names repeat: {names}")
    return jobs


def scenario_names() -> list[str]:
    folder = resources.files("gpufleet.simulate").joinpath("scenarios")
    return sorted(
        entry.name.removesuffix(".yaml")
        for entry in folder.iterdir()
        if entry.name.endswith(".yaml")
    )


def describe(value: Any) -> dict[str, Any]:
    return dataclasses.asdict(value)
