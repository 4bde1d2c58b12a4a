"""The benchmark's 95% intervals against published reference values."""

from __future__ import annotations

import math

import pytest

from gpufleet.detect.intervals import poisson_rate, wilson


@pytest.mark.parametrize(
    ("successes", "trials", "low", "high"),
    [
        (22, 23, 0.7901, 0.9923),  # the published fail-slow recall: "roughly 78-99%"
        (0, 10, 0.0, 0.2775),
        (10, 10, 0.7225, 1.0),
        (81, 263, 0.2553, 0.3662),  # Newcombe (1998), example f
    ],
)
def test_wilson_matches_reference_values(
    successes: int, trials: int, low: float, high: float
) -> None:
    got = wilson(successes, trials)
    assert got == pytest.approx((low, high), abs=1e-4)


def test_wilson_without_trials_is_undefined() -> None:
    assert all(math.isnan(bound) for bound in wilson(0, 0))


@pytest.mark.parametrize(
    ("events", "low", "high"),
    [(0, 0.0, 3.689), (1, 0.0253, 5.572), (6, 2.202, 13.06), (10, 4.795, 18.39)],
)
def test_exact_poisson_matches_garwood_tables(events: int, low: float, high: float) -> None:
    assert poisson_rate(events, 1.0) == pytest.approx((low, high), abs=2e-3)


def test_poisson_rate_scales_with_exposure_and_narrows_with_events() -> None:
    low, high = poisson_rate(6, 9.0)  # the published run: 6 false pages in 9 days
    assert (low, high) == pytest.approx((2.202 / 9, 13.06 / 9), abs=1e-3)
    assert high > 0.67  # six in nine days cannot rule out 0.67 per day
    # 300 pages over 1,000 days pins a rate of 0.3 per day well below 0.67
    low, high = poisson_rate(300, 1000.0)
    assert 0.26 < low < 0.3 < high < 0.34
