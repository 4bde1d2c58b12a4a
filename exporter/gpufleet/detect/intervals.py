"""95% intervals for the benchmark's figures: Wilson for recall, exact Poisson for rates.

A recall of 22/23 or a false-page rate from three days says little without its
interval; both are computed here with the standard library only.
"""

from __future__ import annotations

import math

Z95 = 1.959963984540054  # the standard normal's 97.5th percentile


def wilson(successes: int, trials: int, z: float = Z95) -> tuple[float, float]:
    """Wilson score interval of a proportion (NaN, NaN with no trials)."""
    if trials <= 0:
        return math.nan, math.nan
    p = successes / trials
    denominator = 1 + z * z / trials
    centre = (p + z * z / (2 * trials)) / denominator
    spread = z * math.sqrt(p * (1 - p) / trials + z * z / (4 * trials * trials)) / denominator
    return max(0.0, centre - spread), min(1.0, centre + spread)


def _poisson_cdf(count: int, mean: float) -> float:
    """P(X <= count) for X ~ Poisson(mean), summed in log space (no overflow at large means)."""
    if mean <= 0:
        return 1.0
    log_terms = [i * math.log(mean) - mean - math.lgamma(i + 1) for i in range(count + 1)]
    top = max(log_terms)
    return min(1.0, math.exp(top) * sum(math.exp(t - top) for t in log_terms))


def _solve(target: float, cdf_count: int, low: float, high: float) -> float:
    """The mean at which P(X <= cdf_count) equals target (the CDF falls as the mean grows)."""
    for _ in range(200):
        middle = (low + high) / 2
        if _poisson_cdf(cdf_count, middle) > target:
            low = middle
        else:
            high = middle
    return (low + high) / 2


def poisson_rate(events: int, exposure: float, alpha: float = 0.05) -> tuple[float, float]:
    """Exact (Garwood) interval of a rate: ``events`` seen over ``exposure`` (e.g. days)."""
    if exposure <= 0:
        return math.nan, math.nan
    ceiling = 10.0 * (events + 10)
    lower = 0.0 if events == 0 else _solve(1 - alpha / 2, events - 1, 0.0, ceiling)
    upper = _solve(alpha / 2, events, 0.0, ceiling)
    return lower / exposure, upper / exposure
