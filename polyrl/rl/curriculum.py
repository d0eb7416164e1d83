"""Domain shares of each batch. `static` keeps the run file's weights; the
capability-curve curriculum will move them from held-out progress (a later issue)."""

from __future__ import annotations

import math


def allocate(total: int, weights: dict[str, float]) -> dict[str, int]:
    """Split `total` prompts across domains in proportion to `weights` (largest remainder).

    Every domain with a positive weight gets at least one prompt when total allows it, so
    a small domain is never starved by rounding.
    """
    assert total > 0 and weights and all(w > 0 for w in weights.values())
    names = sorted(weights)
    s = sum(weights.values())
    exact = {d: total * weights[d] / s for d in names}
    counts = {d: math.floor(exact[d]) for d in names}
    if total >= len(names):
        for d in names:
            counts[d] = max(counts[d], 1)
    while sum(counts.values()) > total:  # the floor-of-one bumps may overshoot
        d = max((d for d in names if counts[d] > 1), key=lambda d: counts[d] - exact[d])
        counts[d] -= 1
    for d in sorted(names, key=lambda d: (counts[d] - exact[d], d)):
        if sum(counts.values()) == total:
            break
        counts[d] += 1
    return counts
