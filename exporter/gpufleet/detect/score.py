"""Score alert firings against the simulator's ground truth.

Per fault class: recall, and time to detect (first firing of an expected alert
for the right node, or for the job when the fault is job-wide, minus the
episode's start). Per page: explained by a fault or by a condition the ground
truth records (a job stalled, a storage-bound checkpoint, a cluster-wide
slowdown), or false. A page is what the shipped Alertmanager routing notifies:
critical or warning firings of one notification group (``PAGE_GROUP_BY``) that
overlap are one page, so an HBM error's burst of XIDs (48, 94, 63, 154: one
firing each) pages once. False pages are attributed to the confounders active
at the time, so that "no node page from any confounder" can be checked.

A shared cluster's ground truth (several jobs, ``gpufleet.simulate.shared``) names
each episode's, attempt's and exclusion's job: job-wide episodes are matched to
firings for their own job, stalls and training time are their job's, and
``by_job`` gives every class per job (per job shape).
"""

from __future__ import annotations

import itertools
from dataclasses import replace
from typing import Any

from gpufleet.detect.evaluate import Firing
from gpufleet.detect.figures import (
    FAIL_SLOW_MIN_SLOWDOWN,
    SUBTLE_MIN_SLOWDOWN,
    EpisodeScore,
    PageScore,
    Scores,
)
from gpufleet.schema.alerts import AlertName
from gpufleet.simulate.faults import CONFOUNDERS, Kind

FAIL_SLOW_MIN_SECONDS = 600.0
# Subtle fail-slow episodes (5-10% slower, figures.SUBTLE_MIN_SLOWDOWN) are scored in classes of
# their own when they last this long.
SUBTLE_MIN_SECONDS = 1200.0
# A slow GPU of a job that sends step time alone: every rank's step time is the job's, so
# nothing in it names the GPU (GpuFleetStragglerDetectionInactive says so). Scored in a
# class of its own, so that "fail-slow compute" means what can be compared.
STEP_ONLY_COMPUTE = "fail-slow compute, step time only"
WARMUP_S = 20 * 60  # rates and peers need data before anything can fire
CENSOR_S = 30 * 60  # an episode this close to the end may be detected after it
FAIL_STOP_WINDOW_S = 30 * 60
# The shipped routing (deploy/alertmanager/alertmanager.yml): alerts are grouped by these
# labels, and an alert that joins an open group, or one that resolved at most a
# group_interval before, goes out in that group's next notification, not as a page of its own.
PAGE_GROUP_BY = ("alertname", "node", "training_job")
GROUP_INTERVAL_S = 60.0
# Alerts that read the fleet ledger, which a simulated history does not include.
LEDGER_ALERTS = frozenset(
    {
        AlertName.LEDGER_DOWN,
        AlertName.LEDGER_TARGET_MISSING,
        AlertName.REPEAT_OFFENDER_NODE,
        AlertName.RETRY_CHAIN_FAILING,
        AlertName.EXCLUSION_CONCENTRATION,
    }
)
NODE_FAULT_KINDS = frozenset(
    {
        Kind.FAIL_STOP,
        Kind.FAIL_SLOW_COMPUTE,
        Kind.PRECURSOR,
        Kind.XID_STORM,
        Kind.ECC_DEGRADATION,
        Kind.NVLINK_FLAPPING,
    }
)


def _job_of(record: dict[str, Any], truth: dict[str, Any]) -> str:
    """The job of an episode, attempt or exclusion (a single-job truth names none)."""
    return str(record.get("job") or truth["cluster"]["job"])


def _training_seconds(episode: dict[str, Any], truth: dict[str, Any]) -> float:
    """Seconds of the episode during which the job trained (and, for a node-scoped
    episode, the node was in the job): a slow GPU that does not train is invisible.
    Checkpoints and evals are not training either: their steps are never compared."""
    low, high = float(episode["start"]), float(episode["end"])
    job = _job_of(episode, truth)
    blocked = list(_stalls(truth, job))
    blocked += [
        (float(other["start"]), float(other["end"]))
        for other in truth["episodes"]
        if other["kind"] in (Kind.CHECKPOINT, Kind.EVAL) and _job_of(other, truth) == job
    ]
    if episode["scope"] == "node":
        blocked += [
            (float(x["start"]), float(x["end"]))
            for x in truth["exclusions"]
            if x["node"] == episode["node"]
        ]
    covered = 0.0
    cursor = low
    for raw_start, raw_end in sorted(blocked):
        block_start, block_end = max(raw_start, cursor), min(raw_end, high)
        if block_end > block_start:
            covered += block_end - block_start
            cursor = block_end
    return max(0.0, high - low - covered)


def _sends_step_time_only(episode: dict[str, Any], truth: dict[str, Any]) -> bool:
    """Whether the episode's job sends step time without a compute / collective split."""
    job = _job_of(episode, truth)
    jobs = truth["cluster"].get("jobs") or ()
    return any(spec["job"] == job and spec.get("step_only") for spec in jobs)


def _classify(
    episode: dict[str, Any], truth: dict[str, Any], start: float, end: float
) -> tuple[str, bool, str]:
    kind = episode["kind"]
    note = ""
    if kind == Kind.FAIL_STOP:
        klass = {"node": "fail-stop (node)", "job": "fail-stop (job)"}.get(
            episode["scope"], "fail-stop (invisible: silent data corruption)"
        )
        scored = episode["scope"] in ("node", "job")
        if episode["scope"] == "job" and _while_stopped(
            float(episode["start"]), truth, _job_of(episode, truth)
        ):
            # e.g. an NCCL timeout while the job is down after an earlier failure:
            # nothing runs that could time out, and the job is already paged as hung.
            scored, note = False, "the job was already stopped"
    elif kind in (Kind.FAIL_SLOW_COMPUTE, Kind.FAIL_SLOW_COMM):
        slowdown = float(episode.get("details", {}).get("slowdown", episode["magnitude"]))
        lasted = float(episode["end"]) - float(episode["start"])
        base = "fail-slow compute" if kind == Kind.FAIL_SLOW_COMPUTE else "fail-slow communication"
        if kind == Kind.FAIL_SLOW_COMPUTE and _sends_step_time_only(episode, truth):
            base = STEP_ONLY_COMPUTE
        if slowdown >= FAIL_SLOW_MIN_SLOWDOWN and lasted >= FAIL_SLOW_MIN_SECONDS:
            klass, scored, needed = base, True, FAIL_SLOW_MIN_SECONDS
        elif SUBTLE_MIN_SLOWDOWN <= slowdown < FAIL_SLOW_MIN_SLOWDOWN and (
            lasted >= SUBTLE_MIN_SECONDS
        ):
            klass, scored, needed = f"{base} 5-10%", True, SUBTLE_MIN_SECONDS
        else:
            klass, scored, needed = f"{base} (<10% or <10 min)", False, 0.0
        if scored and _training_seconds(episode, truth) < needed:
            scored = False
            note = f"the job was not training for {needed / 60:.0f} minutes of it"
    elif kind == Kind.PRECURSOR and (episode.get("details") or {}).get("left_slot"):
        # its signal on a node that held the failing slot earlier: explains that node's
        # pages, leads up to no failure of its own
        klass, scored = "precursor (on a node that left the slot)", False
    elif kind == Kind.PRECURSOR:
        klass, scored = "precursor", True
    else:
        klass, scored = kind, bool(episode["expected_alerts"])
    if scored and episode["start"] < start + WARMUP_S:
        scored, note = False, "starts before the rules have data"
    elif scored and episode["start"] > end - CENSOR_S:
        scored, note = False, "too close to the end of the history"
    return klass, scored, note


def _window(episode: dict[str, Any]) -> tuple[float, float]:
    start = float(episode["start"])
    details = episode.get("details") or {}
    if episode["kind"] == Kind.FAIL_STOP:
        early = float(details.get("slowdown_from", start))
        return min(start, early) - 60.0, start + FAIL_STOP_WINDOW_S
    if episode["kind"] == Kind.PRECURSOR:
        return start, float(episode["end"])
    return start, float(episode["end"]) + 300.0


def score(truth: dict[str, Any], firings: list[Firing]) -> Scores:
    start, end = float(truth["start"]), float(truth["end"])
    shared = "jobs" in truth["cluster"]
    episodes: list[EpisodeScore] = []
    relevant = [f for f in firings if f.alert not in LEDGER_ALERTS]
    for episode in truth["episodes"]:
        if episode["kind"] in CONFOUNDERS:
            continue
        klass, scored, note = _classify(episode, truth, start, end)
        result = EpisodeScore(
            episode["id"],
            klass,
            episode["kind"],
            episode["cause"],
            episode["node"],
            float(episode["start"]),
            float(episode["end"]),
            (episode.get("details") or {}).get("slowdown"),
            scored,
            note=note,
            job=episode.get("job") if shared else None,
        )
        job = _job_of(episode, truth)
        low, high = _window(episode)
        expected = set(episode["expected_alerts"])
        for firing in relevant:
            if firing.alert not in expected or firing.start > high or firing.end < low:
                continue
            if episode["scope"] == "node" and firing.node != episode["node"]:
                continue
            if episode["scope"] == "job" and firing.node is not None:
                continue
            if episode["scope"] == "job" and firing.training_job not in (None, job):
                continue
            ttd = max(0.0, firing.start - float(episode["start"]))
            if result.ttd_s is None or ttd < result.ttd_s:
                result.detected, result.ttd_s, result.detected_by = True, ttd, firing.alert
        episodes.append(result)
    pages = [_explain(firing, truth) for firing in notification_groups(relevant)]
    days = (end - start - WARMUP_S) / 86400.0
    return Scores(days, episodes, pages)


def _group_key(firing: Firing) -> tuple[str | None, ...]:
    labels = dict(firing.labels) | {"alertname": firing.alert}
    return tuple(labels.get(name) for name in PAGE_GROUP_BY)


def notification_groups(firings: list[Firing]) -> list[Firing]:
    """The pages that critical and warning firings make under the shipped routing: the
    firings of one group whose times overlap (or meet within a group_interval) are one
    page, from the first one's start to the last one's end, with the labels of the
    first; pages keep the order of their first firings in ``firings``."""
    pages: dict[int, Firing] = {}  # by the position of its first firing
    open_pages: dict[tuple[str | None, ...], int] = {}
    candidates = [(i, f) for i, f in enumerate(firings) if f.is_page]
    for position, firing in sorted(candidates, key=lambda item: item[1].start):
        key = _group_key(firing)
        first = open_pages.get(key)
        if first is not None and firing.start <= pages[first].end + GROUP_INTERVAL_S:
            pages[first] = replace(pages[first], end=max(pages[first].end, firing.end))
            continue
        open_pages[key] = position
        pages[position] = firing
    return [pages[position] for position in sorted(pages)]


def _stalls(truth: dict[str, Any], job: str | None = None) -> list[tuple[float, float]]:
    """When ``job`` (default: the truth's one job) was stopped between attempts."""
    job = job or truth["cluster"]["job"]
    attempts = sorted(
        (a for a in truth["attempts"] if _job_of(a, truth) == job), key=lambda a: a["number"]
    )
    stalls = []
    for previous, following in itertools.pairwise(attempts):
        if previous["end"] is not None:
            stalls.append((float(previous["end"]), float(following["first_step"])))
    if attempts and attempts[-1]["end"] is not None:
        stalls.append((float(attempts[-1]["end"]), float(truth["end"])))
    return stalls


def _while_stopped(when: float, truth: dict[str, Any], job: str | None = None) -> bool:
    """Whether the job was already stopped (by an earlier failure) at ``when``."""
    return any(stop < when - 1.0 and when < resume for stop, resume in _stalls(truth, job))


def _holder(node: str, when: float, truth: dict[str, Any]) -> str | None:
    """The job a shared cluster's node served at ``when`` (None while it was a spare)."""
    for placement in truth.get("placements", ()):
        if placement["node"] == node and placement["start"] <= when < placement["end"]:
            return str(placement["job"])
    return None


def _slowed_job(episode: dict[str, Any]) -> tuple[float, float] | None:
    """When an episode made its job slower, if it did: a fail-slow or a cluster-wide
    slowdown while it lasts; a thermal or power-brake fail-stop over its lead, the
    10-30 min its GPU throttles before the failure (a job that times only its steps can
    show that as nothing but a slower job)."""
    kind, start = episode["kind"], float(episode["start"])
    if kind in (Kind.FAIL_SLOW_COMPUTE, Kind.FAIL_SLOW_COMM, Kind.CLUSTER_SLOWDOWN):
        return start, float(episode["end"])
    lead = (episode.get("details") or {}).get("slowdown_from")
    if kind == Kind.FAIL_STOP and lead is not None:
        return float(lead), start
    return None


def _overlaps(a0: float, a1: float, b0: float, b1: float) -> bool:
    return a0 <= b1 and b0 <= a1


def _explain(firing: Firing, truth: dict[str, Any]) -> PageScore:
    page = PageScore(
        firing.alert,
        firing.severity,
        firing.node,
        firing.training_job,
        firing.start,
        firing.end,
        None,
    )
    at = firing.start
    shared = "jobs" in truth["cluster"]
    if shared:
        page.job = firing.training_job or (
            _holder(firing.node, at, truth) if firing.node is not None else None
        )
    job = firing.training_job or truth["cluster"]["job"]
    for episode in truth["episodes"]:
        kind = episode["kind"]
        low, high = float(episode["start"]), float(episode["end"])
        details = episode.get("details") or {}
        low = min(low, float(details.get("slowdown_from", low)))
        if firing.node is not None:
            if (
                kind in NODE_FAULT_KINDS
                and episode["node"] == firing.node
                and low - 600 <= at <= high + 1800
            ):
                page.explained_by = f"{kind}:{episode['id']}"
                return page
            if kind in (Kind.FAIL_SLOW_COMM,) and low <= at <= high + 600:
                continue
        elif _job_of(episode, truth) == job:
            slowed = _slowed_job(episode)
            if (
                firing.alert == AlertName.JOB_SLOWDOWN
                and slowed is not None
                and _overlaps(slowed[0], slowed[1] + 900, at - 900, at)
            ):
                page.explained_by = f"{kind}:{episode['id']}"
                return page
            if firing.alert in (AlertName.CHECKPOINT_QUEUE_BOUND, AlertName.CHECKPOINT_SLOW) and (
                kind == Kind.CHECKPOINT and _overlaps(low, high + 3600, at - 3600, at)
            ):
                queue = float(details.get("queue_wait_s", 0.0))
                service = float(details.get("service_s", 0.0))
                storage_bound = queue / (queue + service) > 0.9 if queue + service else False
                slow = queue + service > 600
                if (firing.alert == AlertName.CHECKPOINT_QUEUE_BOUND and storage_bound) or (
                    firing.alert == AlertName.CHECKPOINT_SLOW and slow
                ):
                    page.explained_by = f"{Kind.CHECKPOINT}:{episode['id']}"
                    return page
    if firing.node is None and firing.alert == AlertName.JOB_HUNG:
        for stall_start, stall_end in _stalls(truth, job):
            if stall_start - 60 <= at <= stall_end + 600:
                page.explained_by = "job stalled"
                return page
    for episode in truth["episodes"]:
        kind = episode["kind"]
        if kind not in CONFOUNDERS:
            continue
        if kind == Kind.DATA_LOADER_STALL and episode["node"] != firing.node:
            continue
        if _overlaps(float(episode["start"]) - 900, float(episode["end"]) + 900, at, at):
            page.confounders.append(kind)
    page.confounders = sorted(set(page.confounders))
    return page
