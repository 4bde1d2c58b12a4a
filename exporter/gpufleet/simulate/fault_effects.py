"""What faults do to the simulated cluster's hardware, tick by tick: XIDs, error
counters, lost GPUs, down nodes, throttling and slowdowns, hung NVML, and the repair
that ends an exclusion (``FaultEffects``, a part of ``Cluster``)."""

from __future__ import annotations

import numpy as np

from gpufleet.schema import gpu as cat
from gpufleet.simulate.faults import (
    CAUSES_BY_NAME,
    DBE,
    RECOVERY_ACTION_CHANGED,
    RECOVERY_GPU_RESET,
    REMAP_FAILED,
    REMAP_RECORDED,
    Effect,
    Episode,
    Kind,
)
from gpufleet.simulate.gpu_values import (
    HW_POWER_BRAKE,
    HW_SLOWDOWN,
    HW_THERMAL,
    VOLATILE_COUNTERS,
    XidRecord,
)
from gpufleet.simulate.timeline_types import Timeline
from gpufleet.simulate.training_model import NodeTraining


class FaultEffects:
    """The active episodes' effects on GPUs and nodes (a part of ``Cluster``; the state
    it changes is set by ``Cluster.__init__``)."""

    nodes: int
    gpus: int
    rng: np.random.Generator
    timeline: Timeline
    training: NodeTraining
    counters: dict[str, np.ndarray]
    xids: dict[tuple[int, int], XidRecord]
    recovery_action: np.ndarray
    agent_started: np.ndarray
    gpu_lost: np.ndarray
    node_down: np.ndarray
    nvml_hung: np.ndarray
    excluded: np.ndarray
    throttle: np.ndarray
    slowdown: np.ndarray
    _active: list[Episode]
    _storms: dict[int, float]

    def _instant_events(self, start: float, end: float) -> None:
        for episode in self._active:
            if episode.kind == Kind.FAIL_STOP:
                if start <= episode.start < end:
                    self._apply_fail_stop(episode)
                if "xid_burst" in episode.details:
                    self._dbe_incident(episode, episode.start, start, end)
            elif episode.kind == Kind.XID_STORM:
                self._xid_storm(episode, start, end)
            elif episode.kind == Kind.ECC_DEGRADATION:
                self._ecc_degradation(episode, start, end)

    def _record_xid(self, node: int, gpu: int, xid: int, when: float) -> None:
        record = self.xids.setdefault((node, gpu), XidRecord())
        record.counts[xid] = record.counts.get(xid, 0) + 1
        record.last = xid
        record.last_time = when

    def _dbe_incident(self, episode: Episode, at: float, start: float, end: float) -> None:
        """The XIDs of the episode's uncorrectable HBM error that fall in [start, end), the
        burst starting at ``at``, each with what it reports: 48 the double-bit error
        counted; 63 (or 64) its row remapped, the remap pending a reset (or the remap
        failed); 154 the GPU's recovery action turned to GPU reset."""
        assert episode.node is not None and episode.gpu is not None
        node, gpu = episode.node, episode.gpu
        counters = self.counters
        for offset, code in episode.details["xid_burst"]:
            when = at + float(offset)
            if not start <= when < end:
                continue
            self._record_xid(node, gpu, int(code), when)
            if code == DBE:
                counters[cat.ECC_DBE_VOL.name][node, gpu] += 1
                counters[cat.ECC_DBE_AGG.name][node, gpu] += 1
            elif code in (REMAP_RECORDED, REMAP_FAILED):
                counters[cat.UNCORRECTABLE_REMAPPED_ROWS.name][node, gpu] += 1
                counters[cat.ROW_REMAP_PENDING.name][node, gpu] = 1
                if code == REMAP_FAILED:
                    counters[cat.ROW_REMAP_FAILURE.name][node, gpu] = 1
            elif code == RECOVERY_ACTION_CHANGED:
                self.recovery_action[node, gpu] = RECOVERY_GPU_RESET

    def _apply_fail_stop(self, episode: Episode) -> None:
        assert episode.node is not None and episode.gpu is not None and episode.cause
        node, gpu = episode.node, episode.gpu
        cause = CAUSES_BY_NAME[episode.cause]
        rng = self.rng
        effect = cause.effect
        if episode.xid is not None and effect != Effect.HBM_ECC:  # HBM: the whole burst
            self._record_xid(node, gpu, episode.xid, episode.start)
        counters = self.counters
        if effect == Effect.GPU_LOST:
            self.gpu_lost[node, gpu] = True
        elif effect == Effect.NVLINK:
            counters[cat.NVLINK_REPLAY.name][node, gpu] += rng.integers(50, 500)
            counters[cat.NVLINK_RECOVERY.name][node, gpu] += rng.integers(1, 10)
            counters[cat.NVLINK_CRC_FLIT.name][node, gpu] += rng.integers(100, 5000)
            counters[cat.NVLINK_CRC_DATA.name][node, gpu] += rng.integers(10, 500)
        elif effect == Effect.SRAM_ECC:
            counters[cat.ECC_DBE_VOL.name][node, gpu] += 1
            counters[cat.ECC_DBE_AGG.name][node, gpu] += 1
        elif effect in (Effect.NODE_DOWN, Effect.POWER_BRAKE):
            self.node_down[node] = True
        if cause.excludes_node:
            self.excluded[node] = True

    def _xid_storm(self, episode: Episode, start: float, end: float) -> None:
        assert episode.node is not None and episode.gpu is not None
        period = float(episode.details.get("period", 30.0))
        count = int(episode.details.get("count", 12))
        xid = episode.xid or 94
        fired = self._storms.get(episode.id, 0.0)
        while fired < count:
            when = episode.start + fired * period
            if when >= end:
                break
            if when >= start:
                self._record_xid(episode.node, episode.gpu, xid, when)
            fired += 1
        self._storms[episode.id] = fired

    def _ecc_degradation(self, episode: Episode, start: float, end: float) -> None:
        """Correctable remaps climb; at 70% an uncorrectable error; at the end remapping fails."""
        assert episode.node is not None and episode.gpu is not None
        node, gpu = episode.node, episode.gpu
        span = max(1.0, episode.end - episode.start)
        counters = self.counters
        climb_end = episode.start + 0.7 * span
        climbed = min(end, climb_end) - max(start, episode.start)
        if climbed > 0:
            counters[cat.CORRECTABLE_REMAPPED_ROWS.name][node, gpu] += self.rng.poisson(
                climbed / 120.0
            )
            counters[cat.ECC_SBE_VOL.name][node, gpu] += self.rng.poisson(climbed / 20.0)
        self._dbe_incident(episode, climb_end, start, end)
        if start <= episode.end < end:
            self._record_xid(node, gpu, REMAP_FAILED, episode.end)
            counters[cat.ROW_REMAP_FAILURE.name][node, gpu] = 1

    def _continuous_effects(self, start: float, end: float, dt: float) -> None:
        rng = self.rng
        slowdown = np.ones((self.nodes, self.gpus))
        throttle = np.zeros((self.nodes, self.gpus), dtype=np.int64)
        self.nvml_hung[:] = False
        still_active = []
        for episode in self._active:
            if episode.end <= start and episode.kind != Kind.FAIL_STOP:
                continue
            if episode.kind == Kind.FAIL_STOP and episode.end <= start:
                continue
            still_active.append(episode)
            share = max(0.0, min(episode.end, end) - max(episode.start, start)) / dt
            node, gpu = episode.node, episode.gpu
            if episode.kind == Kind.FAIL_SLOW_COMPUTE and node is not None and gpu is not None:
                slowdown[node, gpu] *= 1.0 + (episode.magnitude - 1.0) * share
            elif episode.kind == Kind.PRECURSOR and node is not None and gpu is not None:
                signal = episode.details.get("signal")
                if signal == "remaps":
                    self.counters[cat.CORRECTABLE_REMAPPED_ROWS.name][node, gpu] += rng.poisson(
                        share * dt / 1800.0
                    )
                else:
                    self.counters[cat.PCIE_REPLAY.name][node, gpu] += rng.poisson(share * dt / 60.0)
            elif episode.kind == Kind.NVLINK_FLAPPING and node is not None and gpu is not None:
                if share > 0 and rng.random() < 0.5:
                    self.counters[cat.NVLINK_REPLAY.name][node, gpu] += rng.integers(5, 60)
                    self.counters[cat.NVLINK_RECOVERY.name][node, gpu] += 1
                    if rng.random() < 0.2:
                        self._record_xid(node, gpu, 74, start)
            elif episode.kind == Kind.FAIL_STOP and node is not None:
                self._fail_stop_window(episode, start, end, slowdown, throttle)
        self._active = still_active
        self.slowdown = slowdown
        self.throttle = throttle

    def _fail_stop_window(
        self,
        episode: Episode,
        start: float,
        end: float,
        slowdown: np.ndarray,
        throttle: np.ndarray,
    ) -> None:
        assert episode.node is not None and episode.gpu is not None and episode.cause
        effect = CAUSES_BY_NAME[episode.cause].effect
        node, gpu = episode.node, episode.gpu
        slow_from = episode.details.get("slowdown_from")
        if isinstance(slow_from, float) and slow_from < end and start < episode.start:
            if effect == Effect.THERMAL:
                throttle[node, gpu] |= HW_THERMAL | HW_SLOWDOWN
                slowdown[node, gpu] *= 1.45
            else:
                throttle[node, :] |= HW_POWER_BRAKE | HW_SLOWDOWN
                slowdown[node, :] *= 1.3
        hang_from = episode.details.get("hang_from")
        if isinstance(hang_from, float) and hang_from < end and start < episode.end:
            self.nvml_hung[node] = True

    def _repairs(self, start: float, end: float) -> None:
        for exclusion in self.timeline.exclusions:
            if start <= exclusion.end < end:
                node = exclusion.node
                self.excluded[node] = False
                self.node_down[node] = False
                self.gpu_lost[node, :] = False
                self.counters[cat.ROW_REMAP_PENDING.name][node, :] = 0
                # a GPU whose remap failed has no spare rows: the repair replaced it
                self.counters[cat.ROW_REMAP_FAILURE.name][node, :] = 0
                self.recovery_action[node, :] = 0
                for name in VOLATILE_COUNTERS:
                    self.counters[name][node, :] = 0
                # The node was rebooted: its agent starts afresh.
                self.agent_started[node] = exclusion.end
                self.training.reset_node(node)
                for gpu in range(self.gpus):
                    self.xids.pop((node, gpu), None)
