"""Everything that will happen to the simulated cluster, drawn up front from a seed.

The timeline is generated once for the whole horizon, so the live simulator
and the history writer, given the same seed and start, see the same cluster:
the same failures on the same nodes at the same times.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from gpufleet.simulate.config import Scenario, ScenarioError
from gpufleet.simulate.faults import (
    CAUSES,
    CAUSES_BY_NAME,
    Cause,
    Effect,
    Episode,
    Kind,
    Scope,
    dbe_burst,
    forced_dbe_variant,
    slow_episode_expectations,
)
from gpufleet.simulate.schedule import JobSchedule
from gpufleet.simulate.timeline_types import Exclusion, Timeline, Window

DAY = 86400.0


def _pick(rng: np.random.Generator, weighted: tuple[tuple[int, float], ...]) -> int | None:
    if not weighted:
        return None
    codes = [code for code, _ in weighted]
    weights = np.array([weight for _, weight in weighted])
    return int(rng.choice(codes, p=weights / weights.sum()))


def _poisson_times(rng: np.random.Generator, rate: float, start: float, end: float) -> list[float]:
    """Event times of a Poisson process with `rate` per second over [start, end)."""
    if rate <= 0:
        return []
    count = rng.poisson(rate * (end - start))
    return sorted(float(t) for t in rng.uniform(start, end, count))


class TimelineBuilder(JobSchedule):
    def __init__(self, scenario: Scenario, seed: int, start: float, end: float) -> None:
        self.scenario = scenario
        self.spec = scenario.cluster
        self.rates = scenario.rates
        self.confounders = scenario.confounders
        self.seed = seed
        self.rng = np.random.default_rng(np.random.SeedSequence([seed, 1]))
        # HBM errors' XID bursts draw from a stream of their own, so that every other
        # episode of a seed is what it was before the bursts existed.
        self.burst_rng = np.random.default_rng(np.random.SeedSequence([seed, 5]))
        self.timeline = Timeline(start=start, end=end)
        self.nodes = self.spec.nodes
        self.gpus = self.spec.gpus_per_node
        self._excluded: list[list[tuple[float, float]]] = [[] for _ in range(self.nodes)]
        self._replica_groups = self.spec.replica_groups()
        self._checkpoints_asked: list[float] = []  # explicit `checkpoint` episodes

    # -- helpers ----------------------------------------------------------------

    def excluded(self, node: int, when: float) -> bool:
        return any(start <= when < end for start, end in self._excluded[node])

    def next_exclusion(self, node: int, when: float) -> float:
        """When ``node`` is next excluded after ``when`` (inf if never)."""
        return min((start for start, _ in self._excluded[node] if start > when), default=math.inf)

    def sidelined(self, node: int, when: float) -> bool:
        """Whether ``node`` is out of training at ``when``: it or a replica mate is excluded."""
        return any(self.excluded(mate, when) for mate in self._replica_groups[node])

    def next_sidelining(self, node: int, when: float) -> float:
        """When ``node`` next stops training for an exclusion in its replica (inf if never)."""
        return min(self.next_exclusion(mate, when) for mate in self._replica_groups[node])

    def stalled(self, when: float) -> bool:
        return any(w.start <= when < w.end for w in self.timeline.stalls)

    def _add(self, episode: Episode) -> Episode:
        self.timeline.episodes.append(episode)
        return episode

    def _node_index(self, value: object, where: str) -> int:
        if isinstance(value, int) and 0 <= value < self.nodes:
            return value
        if isinstance(value, str) and value.startswith("node-") and value[5:].isdigit():
            index = int(value[5:])
            if 0 <= index < self.nodes:
                return index
        raise ScenarioError(f"{where}: node {value!r} is not in this cluster of {self.nodes}")

    # -- building ---------------------------------------------------------------------

    def build(self) -> Timeline:
        self._node_multipliers()
        self._explicit_episodes()
        self._random_fail_stops()
        self._random_fail_slow()
        self._confounders()
        self._schedule_checkpoints_and_evals()
        self._attempts()
        timeline = self.timeline
        timeline.episodes.sort(key=lambda e: (e.start, e.kind))
        for number, episode in enumerate(timeline.episodes):
            episode.id = number
        timeline.stalls.sort(key=lambda w: w.start)
        return timeline

    def _node_multipliers(self) -> None:
        """A few bad nodes fail far more often: failures concentrate, as in production."""
        rng = self.rng
        multiplier = rng.lognormal(0.0, 0.3, self.nodes)
        bad_count = min(self.nodes, max(3, round(self.rates.bad_node_fraction * self.nodes)))
        bad = rng.choice(self.nodes, size=bad_count, replace=False)
        multiplier[bad] *= self.rates.bad_node_multiplier
        self.timeline.node_multiplier = multiplier / multiplier.mean()

    def _explicit_episodes(self) -> None:
        start = self.timeline.start
        for index, raw in enumerate(self.scenario.episodes):
            where = f"episodes[{index}]"
            kind = Kind(raw["kind"])
            begin = start + float(raw["start"])
            node = self._node_index(raw["node"], where) if "node" in raw else None
            gpu = int(raw["gpu"]) if "gpu" in raw else None
            if gpu is not None and not 0 <= gpu < self.gpus:
                raise ScenarioError(f"{where}.gpu: {gpu} is not in 0..{self.gpus - 1}")
            duration = float(raw.get("duration", 0.0))
            if kind == Kind.CHECKPOINT:
                # Every node writes at once, when the job is running: scheduled with the
                # periodic checkpoints, once every fail-stop's stall is known.
                if node is not None or gpu is not None:
                    raise ScenarioError(f"{where}: a checkpoint is the whole job's, not a node's")
                self._checkpoints_asked.append(begin)
                continue
            if kind == Kind.FAIL_STOP:
                if node is None:
                    raise ScenarioError(f"{where}: a fail_stop needs a node")
                cause = CAUSES_BY_NAME[raw["cause"]]
                self._fail_stop(
                    node,
                    begin,
                    cause,
                    gpu=gpu,
                    xid=raw.get("xid"),
                    repair=duration or None,
                    where=where,
                )
                continue
            if kind in (Kind.FAIL_SLOW_COMPUTE, Kind.FAIL_SLOW_COMM) and node is None:
                raise ScenarioError(f"{where}: a {kind} needs a node")
            if kind in (Kind.XID_STORM, Kind.ECC_DEGRADATION, Kind.NVLINK_FLAPPING) and (
                node is None or gpu is None
            ):
                raise ScenarioError(f"{where}: a {kind} needs a node and a gpu")
            expected, scope = slow_episode_expectations(kind)
            magnitude = float(raw.get("magnitude", self._default_magnitude(kind)))
            details: dict[str, Any] = {k: raw[k] for k in ("count", "period") if k in raw}
            if kind == Kind.WORKLOAD_IMBALANCE:
                replicas = self.spec.resolved_layout().dp
                replica = raw.get("dp_rank", 0)
                if not isinstance(replica, int) or not 0 <= replica < replicas:
                    raise ScenarioError(
                        f"{where}.dp_rank: {replica!r} is not a data-parallel rank of "
                        f"this job (0..{replicas - 1})"
                    )
                details["dp_rank"] = replica
            if kind in (Kind.FAIL_SLOW_COMPUTE, Kind.FAIL_SLOW_COMM):
                details["slowdown"] = self.slowdown_of(kind, magnitude)
            if kind == Kind.ECC_DEGRADATION:
                # its uncorrectable error (at 70% of it) finds a spare row; the remap
                # that fails is the last one, for a correctable error (XID 64 alone)
                details["xid_burst"] = self._dbe_burst(None, where, remap_failed=False)
            if kind == Kind.XID_STORM:
                details.setdefault("count", 12)
                details.setdefault("period", 30.0)
                duration = duration or details["count"] * details["period"]
            self._add(
                Episode(
                    kind,
                    begin,
                    begin + duration,
                    node,
                    gpu,
                    raw.get("cause"),
                    raw.get("xid"),
                    magnitude,
                    tuple(expected),
                    scope,
                    details,
                )
            )

    def _default_magnitude(self, kind: Kind) -> float:
        return {
            Kind.FAIL_SLOW_COMPUTE: 1.2,
            Kind.FAIL_SLOW_COMM: 1.5,
            Kind.CLUSTER_SLOWDOWN: self.confounders.cluster_slowdown,
            Kind.DATA_LOADER_STALL: 1.0,
            Kind.XID_STORM: 1.0,
            Kind.WORKLOAD_IMBALANCE: 1.05,
        }.get(kind, 1.0)

    def _fail_stop(
        self,
        node: int,
        when: float,
        cause: Cause,
        *,
        gpu: int | None = None,
        xid: int | None = None,
        repair: float | None = None,
        where: str = "episodes",
    ) -> None:
        rng = self.rng
        rates = self.rates
        if self.excluded(node, when):
            return
        gpu = int(rng.integers(self.gpus)) if gpu is None else gpu
        code = xid if xid is not None else _pick(rng, cause.xids)
        repair = repair or float(rates.repair_hours_median * 3600 * rng.lognormal(0.0, 0.7))
        end = when + repair if cause.excludes_node else when
        details: dict[str, object] = {}
        if cause.effect == Effect.HBM_ECC:
            burst = self._dbe_burst(xid, where)
            details["xid_burst"] = burst
            code = int(burst[0][1])
        if cause.effect in (Effect.THERMAL, Effect.POWER_BRAKE):
            details["slowdown_from"] = when - float(rng.uniform(600, 1800))
        if cause.effect == Effect.NVML_HANG:
            details["hang_from"] = when + 30.0
        episode = self._add(
            Episode(
                Kind.FAIL_STOP,
                when,
                end,
                node,
                gpu,
                cause.name,
                code,
                1.0,
                tuple(cause.expected_alerts),
                cause.scope,
                details,
            )
        )
        if cause.precursor and rng.random() < cause.precursor_probability:
            lead = float(rng.uniform(rates.precursor_hours_min, rates.precursor_hours_max)) * 3600
            expected, scope = slow_episode_expectations(Kind.PRECURSOR)
            self._add(
                Episode(
                    Kind.PRECURSOR,
                    max(self.timeline.start, when - lead),
                    when,
                    node,
                    gpu,
                    cause.name,
                    None,
                    1.0,
                    tuple(expected),
                    scope,
                    {"signal": cause.precursor},
                )
            )
        if cause.excludes_node:
            self._excluded[node].append((when, end))
            self.timeline.exclusions.append(
                Exclusion(node, when, end, cause.name, "auto", len(self.timeline.episodes) - 1)
            )
        if cause.effect != Effect.SILENT and not self.stalled(when):
            self._interrupt(when, cause.name, episode)

    def _dbe_burst(
        self, xid: int | None, where: str, *, remap_failed: bool | None = None
    ) -> list[list[float | int]]:
        """An uncorrectable HBM error's XIDs as [seconds after the first, code] pairs (the
        ground truth's JSON form); a scenario naming one of them fixes that variant."""
        rates = self.rates
        try:
            forced = forced_dbe_variant(xid)
        except ValueError as error:
            raise ScenarioError(f"{where}.xid: {error}") from None
        if remap_failed is not None:
            forced["remap_failed"] = remap_failed
        burst = dbe_burst(
            self.burst_rng,
            rates.hbm_contained_share,
            rates.hbm_remap_failure_share,
            rates.hbm_xid_gap_max_s,
            **forced,
        )
        return [[offset, code] for offset, code in burst]

    def _interrupt(self, when: float, cause: str, episode: Episode) -> None:
        """The job stops; the automatic retry restarts it, or fails and someone does."""
        rng = self.rng
        rates = self.rates
        auto = float(rng.uniform(rates.auto_restart_minutes_min, rates.auto_restart_minutes_max))
        restart = when + auto * 60
        retry_works = rng.random() < rates.auto_retry_success
        if not retry_works:
            # The automatic attempt dies quickly (e.g. the same fault), then an operator acts.
            ran = float(rng.uniform(60, 300))
            manual = float(
                rng.uniform(rates.manual_restart_minutes_min, rates.manual_restart_minutes_max)
            )
            self.timeline.stalls.append(Window(when, restart, f"interrupted: {cause}"))
            self.timeline.stalls.append(
                Window(restart + ran, restart + ran + manual * 60, f"retry failed: {cause}")
            )
            episode.details["auto_retry"] = "failed"
            episode.details["restarted_at"] = restart + ran + manual * 60
        else:
            self.timeline.stalls.append(Window(when, restart, f"interrupted: {cause}"))
            episode.details["auto_retry"] = "succeeded"
            episode.details["restarted_at"] = restart

    def _random_fail_stops(self) -> None:
        rng = self.rng
        timeline = self.timeline
        per_node_rate = self.rates.fail_stop_per_1000_node_days / 1000 / DAY
        weights = np.array([cause.weight for cause in CAUSES])
        events: list[tuple[float, int]] = []
        for node in range(self.nodes):
            rate = per_node_rate * float(timeline.node_multiplier[node])
            events += [(t, node) for t in _poisson_times(rng, rate, timeline.start, timeline.end)]
        for when, node in sorted(events):
            cause = CAUSES[int(rng.choice(len(CAUSES), p=weights / weights.sum()))]
            self._fail_stop(node, when, cause)

    def _random_fail_slow(self) -> None:
        rng = self.rng
        rates = self.rates
        timeline = self.timeline
        for kind, rate_per_day, mean_minutes, low, high in (
            (
                Kind.FAIL_SLOW_COMPUTE,
                rates.fail_slow_compute_per_node_day,
                rates.compute_mean_minutes,
                rates.compute_slowdown_min,
                rates.compute_slowdown_max,
            ),
            (
                Kind.FAIL_SLOW_COMM,
                rates.fail_slow_comm_per_node_day,
                rates.comm_mean_minutes,
                rates.comm_slowdown_min,
                rates.comm_slowdown_max,
            ),
        ):
            expected, scope = slow_episode_expectations(kind)
            for node in range(self.nodes):
                for when in _poisson_times(rng, rate_per_day / DAY, timeline.start, timeline.end):
                    if self.sidelined(node, when):
                        continue
                    duration = max(60.0, float(rng.exponential(mean_minutes * 60)))
                    magnitude = float(rng.uniform(low, high))
                    self._add(
                        Episode(
                            kind,
                            when,
                            # A slow GPU or link is the node's: pulled from the job for a
                            # fail-stop, it takes its slowness to the repair bench, and the
                            # slot comes back on a healthy node (in a shared cluster,
                            # another one). A node whose replica lost a node to an
                            # exclusion stops training, and the episode ends there.
                            min(when + duration, self.next_sidelining(node, when)),
                            node,
                            int(rng.integers(self.gpus))
                            if kind == Kind.FAIL_SLOW_COMPUTE
                            else None,
                            None,
                            None,
                            magnitude,
                            tuple(expected),
                            scope,
                            {"slowdown": self.slowdown_of(kind, magnitude)},
                        )
                    )

    def _confounders(self) -> None:
        rng = self.rng
        conf = self.confounders
        timeline = self.timeline
        step = self.spec.step_seconds
        for when in _poisson_times(
            rng, conf.data_loader_stalls_per_hour / 3600, timeline.start, timeline.end
        ):
            node = int(rng.integers(self.nodes))
            duration = float(
                rng.uniform(conf.data_loader_stall_seconds_min, conf.data_loader_stall_seconds_max)
            )
            self._add(
                Episode(Kind.DATA_LOADER_STALL, when, when + duration, node, None,
                        magnitude=float(rng.uniform(0.5, 1.5)) * step)
            )  # fmt: skip
        for when in _poisson_times(
            rng, conf.cluster_slowdowns_per_day / DAY, timeline.start, timeline.end
        ):
            duration = float(rng.uniform(1200, 2400))
            self._add(
                Episode(Kind.CLUSTER_SLOWDOWN, when, when + duration,
                        magnitude=conf.cluster_slowdown, expected_alerts=(), scope=Scope.JOB)
            )  # fmt: skip
        self._workload_imbalances()

    def _workload_imbalances(self) -> None:
        """One data-parallel replica at a time given more work: drawn from a stream of its
        own, so that every other episode of a seed is what it was before it existed."""
        conf = self.confounders
        rng = np.random.default_rng(np.random.SeedSequence([self.seed, 4]))
        replicas = self.spec.resolved_layout().dp
        for when in _poisson_times(
            rng, conf.workload_imbalances_per_day / DAY, self.timeline.start, self.timeline.end
        ):
            low, high = conf.workload_imbalance_minutes_min, conf.workload_imbalance_minutes_max
            minutes = float(rng.uniform(low, high))
            magnitude = float(rng.uniform(conf.workload_imbalance_min, conf.workload_imbalance_max))
            replica = int(rng.integers(replicas))
            self._add(
                Episode(Kind.WORKLOAD_IMBALANCE, when, when + minutes * 60,
                        magnitude=magnitude, details={"dp_rank": replica})
            )  # fmt: skip

    def slowdown_of(self, kind: Kind, magnitude: float) -> float:
        """How much slower the episode makes what it slows: the node's compute for a
        compute episode, the whole job's step for a communication one."""
        if kind != Kind.FAIL_SLOW_COMM:
            return magnitude
        spec = self.spec
        comm_share = 1.0 - spec.compute_share - spec.data_share
        # overlapped collectives make the healthy step shorter, the added time the same
        return 1.0 + (magnitude - 1.0) * comm_share / (1.0 - spec.comm_overlap * comm_share)


def build_timeline(scenario: Scenario, seed: int, start: float, end: float) -> Timeline:
    return TimelineBuilder(scenario, seed, start, end).build()
