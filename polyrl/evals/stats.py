"""Statistics of an evaluation: success-rate intervals, paired comparisons, percentiles.

- `wilson_interval(successes, n)`: the Wilson score interval of a binomial proportion,
  which stays inside [0, 1] and is sensible at 0/n and n/n, unlike the normal one.
- `mcnemar_exact(b, c)`: two candidates graded on the same tasks, b tasks only the first
  solved and c only the second; the exact two-sided p-value of "neither is better"
  (a sign test on the b + c discordant tasks: Binomial(b + c, 1/2)).
- `percentile(values, q)`: linear interpolation between order statistics (numpy's
  default), so p50 of [1, 2, 3, 4] is 2.5.

Out of scope: multiple-comparison corrections across many model pairs, and intervals
for rewards that are not 0/1 (mean rewards are reported without one).
"""

from __future__ import annotations

import math
from typing import Sequence

Z95 = 1.959963984540054
"""The standard normal quantile of 0.975: a two-sided 95% interval."""


def wilson_interval(successes: int, n: int, z: float = Z95) -> tuple[float, float] | None:
    """(low, high) of the Wilson score interval; None when there are no trials."""
    assert 0 <= successes <= n, (successes, n)
    if n == 0:
        return None
    p = successes / n
    denominator = 1 + z * z / n
    center = (p + z * z / (2 * n)) / denominator
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denominator
    return max(0.0, center - half), min(1.0, center + half)


def mcnemar_exact(b: int, c: int) -> float:
    """Exact two-sided p-value of McNemar's test on b and c discordant pairs (1.0 when none)."""
    assert b >= 0 and c >= 0, (b, c)
    n = b + c
    if n == 0:
        return 1.0
    tail = sum(math.comb(n, k) for k in range(min(b, c) + 1)) / 2 ** n
    return min(1.0, 2 * tail)


def percentile(values: Sequence[float], q: float) -> float | None:
    """The q-th percentile (0..100) by linear interpolation; None for no values."""
    assert 0 <= q <= 100, q
    if not values:
        return None
    ordered = sorted(values)
    rank = (len(ordered) - 1) * q / 100
    low = math.floor(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)
