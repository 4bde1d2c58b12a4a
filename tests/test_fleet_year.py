"""A year of a busy cluster written through the store: every write accepted, the exposition
bounded by the caps at every checkpoint, the API answering every job's history."""

from __future__ import annotations

import random
from concurrent.futures import Future
from pathlib import Path

from gpufleet.fleet.exported import LedgerLimits
from gpufleet.fleet.models import AttemptEventIn, ExclusionIn, ReleaseIn
from gpufleet.fleet.store import LedgerStore, Stored

START = 1_800_000_000.0
DAY = 86400.0
JOBS_PER_DAY = 20
NODES = 300


class Clock:
    def __init__(self) -> None:
        self.now = START

    def __call__(self) -> float:
        return self.now


def test_a_year_of_writes_is_stored_and_the_exposition_stays_bounded(tmp_path: Path) -> None:
    clock = Clock()
    limits = LedgerLimits(max_training_jobs=500, max_exclusion_series=400, max_nodes=100)
    store = LedgerStore(tmp_path / "fleet.db", clock=clock, limits=limits)
    rng = random.Random(7)
    try:
        futures: list[Future[Stored]] = []
        excluded: set[str] = set()
        for day in range(365):
            base = START + day * DAY
            clock.now = base
            for n in range(JOBS_PER_DAY):
                job, at = f"run-{day:03d}-{n:02d}", base + n * 600
                for number, trigger in ((1, "initial"), (2, "auto")):
                    begin = at + (number - 1) * 300
                    for key, event in [
                        ("s", {"event": "started", "trigger": trigger, "at": begin}),
                        ("f", {"event": "first_step", "at": begin + 60}),
                        ("e", {"event": "ended", "at": begin + 200,
                               "outcome": "failed" if number == 1 else "success"}),
                    ]:  # fmt: skip
                        if number == 2 and key == "e" and n % 5 == 0:
                            continue  # some runs never send their end (killed)
                        futures.append(store.submit_attempt_event(
                            f"{job}-{number}-{key}",
                            AttemptEventIn(training_job=job, attempt=number, source="torchrun",
                                           **event),  # type: ignore[arg-type]
                        ))  # fmt: skip
            for index in range(8):
                node = f"node-{rng.randrange(NODES):03d}"
                key = f"ex-{day}-{index}"
                if node in excluded:
                    futures.append(store.submit_release(f"r{key}", ReleaseIn(node=node, at=base)))
                    excluded.discard(node)
                else:
                    reason = rng.choice(["xid79", "xid48", "ecc", "slow"])
                    futures.append(store.submit_exclusion(
                        key, ExclusionIn(node=node, reason=reason, source="slurm", at=base)
                    ))  # fmt: skip
                    excluded.add(node)
            assert all(f.result(60).status in (200, 201) for f in futures)
            futures.clear()
            if day % 30 == 29 or day == 364:
                snapshot = store.snapshot()
                assert len(snapshot.jobs) <= limits.max_training_jobs
                assert len(snapshot.exclusion_counts) <= limits.max_exclusion_series
                assert len(snapshot.excluded) <= limits.max_nodes
                assert all(job >= f"run-{day - 41:03d}" for job in snapshot.jobs), day
        assert len(store.attempts()) == 365 * JOBS_PER_DAY * 2
        assert len(store.attempts("run-000-00")) == 2
        assert store.snapshot().left_out["training_job"] > 0  # 40 days x 20 jobs > 500
    finally:
        store.close()
