"""Retry chains and recovery downtime on constructed attempt histories."""

from __future__ import annotations

from typing import Any

from gpufleet.fleet.chains import SUPERSEDED, job_history, settle_superseded

H = 3600.0


def attempt(
    number: int,
    trigger: str,
    start: float,
    first: float | None = None,
    end: float | None = None,
    outcome: str | None = None,
) -> dict[str, Any]:
    return {
        "training_job": "j",
        "attempt": number,
        "trigger": trigger,
        "started_at": start,
        "first_step_at": first,
        "ended_at": end,
        "outcome": outcome,
    }


def test_no_failure_no_chain() -> None:
    history = job_history([attempt(1, "initial", 0, 100, 10 * H, "success")], now=11 * H)
    assert history.chains == [] and history.recoveries == []


def test_auto_retry_that_trains_for_half_an_hour_recovers() -> None:
    history = job_history(
        [
            attempt(1, "initial", 0, 60, 5 * H, "failed"),
            attempt(2, "auto", 5 * H + 300, 5 * H + 600),
        ],
        now=7 * H,
    )
    (chain,) = history.chains
    assert (chain.outcome, chain.attempts, chain.failed_attempts) == ("recovered", [2], 0)
    assert chain.ended_at == 5 * H + 600
    (recovery,) = history.recoveries
    assert (recovery.trigger, recovery.downtime_s) == ("auto", 600)


def test_failing_auto_retries_stay_open_and_are_counted() -> None:
    history = job_history(
        [
            attempt(1, "initial", 0, 60, H, "failed"),
            attempt(2, "auto", H + 60, H + 120, H + 200, "failed"),  # ran 80 s: not healthy
            attempt(3, "auto", H + 300, None, H + 400, "failed"),  # never reached a step
            attempt(4, "auto", H + 500, None, None),  # starting
        ],
        now=H + 600,
    )
    chain = history.open_chain
    assert chain is not None
    assert chain.failed_attempts == 2 and chain.attempts == [2, 3, 4]
    assert [r.downtime_s for r in history.recoveries] == [120]


def test_a_person_stepping_in_closes_the_chain_as_manual_and_a_new_failure_opens_another() -> None:
    history = job_history(
        [
            attempt(1, "initial", 0, 60, H, "failed"),
            attempt(2, "auto", H + 60, None, H + 120, "failed"),
            attempt(3, "manual", 3 * H, 3 * H + 900, 10 * H, "failed"),
            attempt(4, "auto", 10 * H + 60, 10 * H + 300, None),
        ],
        now=11 * H,
    )
    assert [(c.outcome, c.failed_attempts) for c in history.chains] == [
        ("manual", 1),
        ("recovered", 0),
    ]
    assert [(r.trigger, r.downtime_s) for r in history.recoveries] == [
        ("manual", 3 * H + 900 - (H + 120)),
        ("auto", 300),
    ]


def test_a_short_healthy_run_does_not_recover_until_it_has_lasted() -> None:
    attempts = [attempt(1, "initial", 0, 60, H, "failed"), attempt(2, "auto", H + 60, H + 120)]
    assert job_history(attempts, now=H + 600).open_chain is not None
    assert job_history(attempts, now=H + 120 + 1800).chains[0].outcome == "recovered"


def test_a_cancelled_job_abandons_its_chain() -> None:
    history = job_history(
        [
            attempt(1, "initial", 0, 60, H, "failed"),
            attempt(2, "auto", H + 60, None, H + 90, "cancelled"),
        ],
        now=2 * H,
    )
    assert history.chains[0].outcome == "abandoned"


def test_a_launcher_that_gives_up_abandons_the_chain_and_says_which_attempt() -> None:
    last = {**attempt(3, "auto", H + 300, None, H + 400, "failed"), "restarts_exhausted": 1}
    history = job_history(
        [
            attempt(1, "initial", 0, 60, H, "failed"),
            attempt(2, "auto", H + 60, None, H + 120, "failed"),
            last,
        ],
        now=2 * H,
    )
    (chain,) = history.chains
    assert (chain.outcome, chain.failed_attempts, chain.exhausted_at) == ("abandoned", 2, 3)
    assert chain.ended_at == H + 400


def test_with_no_restarts_allowed_the_first_failure_opens_an_abandoned_chain() -> None:
    only = {**attempt(1, "initial", 0, 60, H, "failed"), "restarts_exhausted": 1}
    (chain,) = job_history([only], now=2 * H).chains
    assert (chain.outcome, chain.attempts, chain.exhausted_at) == ("abandoned", [], 1)


def test_an_attempt_with_no_end_is_failed_by_the_next_attempts_start() -> None:
    """SIGKILL or a lost node: attempt 1 never sent `ended`; attempt 2 starting ends it."""
    history = job_history(
        [
            attempt(1, "initial", 0, 60),  # no end, ever
            attempt(2, "auto", H, H + 120),
        ],
        now=H + 600,
    )
    chain = history.open_chain
    assert chain is not None and chain.started_at == H and chain.attempts == [2]
    (recovery,) = history.recoveries
    assert (recovery.failed_attempt, recovery.trigger, recovery.downtime_s) == (1, "auto", 120)


def test_settling_keeps_sent_ends_and_the_last_attempt_running() -> None:
    rows = [
        attempt(3, "auto", 3 * H),  # the newest: still running
        attempt(1, "initial", 0, 60, H / 2, "failed"),  # sent its end
        attempt(2, "auto", H, None),  # superseded by 3
    ]
    settled = settle_superseded(rows)
    assert [(a["attempt"], a["ended_at"], a["outcome"], a.get("cause")) for a in settled] == [
        (1, H / 2, "failed", None),
        (2, 3 * H, "failed", SUPERSEDED),
        (3, None, None, None),
    ]
    assert rows[2]["ended_at"] is None  # the caller's rows are not changed


def test_a_superseded_attempt_never_ends_before_it_started() -> None:
    (first, _) = settle_superseded([attempt(1, "initial", 2 * H), attempt(2, "manual", H)])
    assert first["ended_at"] == 2 * H and first["outcome"] == "failed"
