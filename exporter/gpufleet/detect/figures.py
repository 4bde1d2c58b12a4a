"""The result of scoring a detection run, and its figures: every episode and page as
scored (``EpisodeScore``, ``PageScore``), and per fault class, magnitude band and job
the recall with its interval, the times to detect, precision and false pages a day
(``Scores``). ``gpufleet.detect.score`` fills them from the firings and the ground truth.
"""

from __future__ import annotations

import math
import statistics
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from gpufleet.detect.intervals import poisson_rate, wilson
from gpufleet.simulate.faults import Kind

FAIL_SLOW_MIN_SLOWDOWN = 1.10
# Subtle fail-slow: 5-10% slower, scored in classes of their own when they last long enough.
SUBTLE_MIN_SLOWDOWN = 1.05
# Magnitude bands of fail-slow episodes: [5%, 10%), [10%, 20%], above 20%.
BANDS = ("5-10%", "10-20%", ">20%")


@dataclass(slots=True)
class EpisodeScore:
    id: int
    klass: str
    kind: str
    cause: str | None
    node: str | None
    start: float
    end: float
    slowdown: float | None
    scored: bool
    detected: bool = False
    ttd_s: float | None = None
    detected_by: str | None = None
    note: str = ""
    job: str | None = None

    @property
    def band(self) -> str | None:
        """The magnitude band of a fail-slow episode (None for other kinds or under 5%)."""
        if self.kind not in (Kind.FAIL_SLOW_COMPUTE, Kind.FAIL_SLOW_COMM) or self.slowdown is None:
            return None
        if self.slowdown > 1.20:
            return ">20%"
        if self.slowdown >= FAIL_SLOW_MIN_SLOWDOWN:
            return "10-20%"
        return "5-10%" if self.slowdown >= SUBTLE_MIN_SLOWDOWN else None


@dataclass(slots=True)
class PageScore:
    alert: str
    severity: str
    node: str | None
    training_job: str | None
    start: float
    end: float
    explained_by: str | None
    confounders: list[str] = field(default_factory=list)
    job: str | None = None  # the job it concerns: its label, or the job holding the node


@dataclass(slots=True)
class Scores:
    days: float
    episodes: list[EpisodeScore]
    pages: list[PageScore]

    def by_class(self) -> list[dict[str, Any]]:
        rows = []
        for klass in sorted({e.klass for e in self.episodes}):
            unscored = sum(1 for e in self.episodes if e.klass == klass and not e.scored)
            rows.append({"class": klass, **_summary(self._scored(klass)), "not scored": unscored})
        return rows

    def by_band(self) -> list[dict[str, Any]]:
        """The scored episodes of the fail-slow classes (>= 10% and 5-10%, compute and
        communication) by magnitude band: recall, interval, TTD. Slow GPUs of a job that
        sends step time only have a class of their own and are not among them."""
        kinds = (("fail-slow compute", "compute"), ("fail-slow communication", "communication"))
        return [
            {
                "kind": name,
                "band": band,
                **_summary([e for e in self._scored(klass, f"{klass} 5-10%") if e.band == band]),
            }
            for klass, name in kinds
            for band in BANDS
        ]

    def by_job(self) -> list[dict[str, Any]]:
        """Every class per job (a shared cluster's jobs are its job shapes), and each
        job's pages: recall, interval and time to detect of its scored episodes."""
        rows = []
        for job in sorted({e.job for e in self.episodes if e.job is not None}):
            pages = [p for p in self.pages if p.job == job]
            for klass in sorted({e.klass for e in self.episodes if e.job == job}):
                members = [e for e in self.episodes if e.job == job and e.klass == klass]
                scored = [e for e in members if e.scored]
                rows.append(
                    {
                        "job": job,
                        "class": klass,
                        **_summary(scored),
                        "not scored": len(members) - len(scored),
                        "pages": len(pages),
                        "false pages": sum(p.explained_by is None for p in pages),
                    }
                )
        return rows

    def _scored(self, *klasses: str) -> list[EpisodeScore]:
        return [e for e in self.episodes if e.klass in klasses and e.scored]

    def detection_times(self, *klasses: str) -> list[float]:
        """Sorted times to detect of the detected, scored episodes of these classes."""
        return sorted(e.ttd_s for e in self._scored(*klasses) if e.ttd_s is not None)

    def recall(self, *klasses: str) -> float:
        """Detected / scored episodes of these classes together."""
        members = self._scored(*klasses)
        return sum(e.detected for e in members) / len(members) if members else math.nan

    def recall_interval(self, *klasses: str) -> tuple[float, float]:
        """95% Wilson interval of ``recall(*klasses)``."""
        members = self._scored(*klasses)
        return wilson(sum(e.detected for e in members), len(members))

    def ttd_median(self, *klasses: str) -> float:
        times = self.detection_times(*klasses)
        return statistics.median(times) if times else math.nan

    @property
    def false_pages(self) -> list[PageScore]:
        return [page for page in self.pages if page.explained_by is None]

    @property
    def precision(self) -> float:
        return 1 - len(self.false_pages) / len(self.pages) if self.pages else math.nan

    @property
    def false_pages_per_day(self) -> float:
        return len(self.false_pages) / self.days

    @property
    def false_pages_per_day_interval(self) -> tuple[float, float]:
        """95% exact Poisson interval of ``false_pages_per_day``."""
        return poisson_rate(len(self.false_pages), self.days)

    def confounder_node_pages(self) -> Counter[str]:
        """Node pages that no fault explains, by the confounder active when they started."""
        counts: Counter[str] = Counter()
        for page in self.false_pages:
            if page.node is None:
                continue
            for confounder in page.confounders or ["none"]:
                counts[confounder] += 1
        return counts


def _summary(members: list[EpisodeScore]) -> dict[str, Any]:
    """Count, recall with its 95% Wilson interval, and time to detect of scored episodes."""
    detected = sum(e.detected for e in members)
    low, high = wilson(detected, len(members))
    times = sorted(e.ttd_s for e in members if e.ttd_s is not None)
    return {
        "episodes": len(members),
        "detected": detected,
        "recall": detected / len(members) if members else math.nan,
        "recall_low": low,
        "recall_high": high,
        "ttd_median_s": statistics.median(times) if times else math.nan,
        "ttd_p25_s": _quantile(times, 0.25),
        "ttd_p75_s": _quantile(times, 0.75),
        "ttd_p90_s": _quantile(times, 0.9),
    }


def _quantile(values: list[float], q: float) -> float:
    if not values:
        return math.nan
    position = q * (len(values) - 1)
    low, high = math.floor(position), math.ceil(position)
    return values[low] + (values[high] - values[low]) * (position - low)
