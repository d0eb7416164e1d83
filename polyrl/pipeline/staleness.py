"""Which weight version each step's rollout samples with, and how stale a batch is.

With max_staleness K, rollout for step t samples with the weights of version t - K (the
trainer's weights after step t - K - 1 is committed), never older than the version the
run (re)started from. So the rollout role may start step t as soon as step t - K - 1 is
committed: that is the admission rule, and it bounds every sample used by the update of
step t to exactly K versions behind (less for the first K steps of a run or a resume).
K = 0 is the synchronous loop: rollout t waits for update t - 1.

Pinning the version (rather than taking whatever is newest) keeps a run reproducible:
with the same seed the same steps see the same weights, whatever the timing. A sample
whose oldest token is more than K versions behind still cannot reach the update: it is
dropped and counted (`dropped_stale`), a backstop that should read 0.
"""

from __future__ import annotations

from collections import Counter
from typing import Iterable


def behaviour_version(step: int, max_staleness: int, first_version: int) -> int:
    """The weight version rollout for `step` samples with."""
    return max(step - max_staleness, first_version)


def admitting_commit(step: int, max_staleness: int, first_version: int) -> int:
    """Rollout for `step` may start once this many steps are committed (trainer version)."""
    return behaviour_version(step, max_staleness, first_version)


def staleness_stats(trainer_version: int, sample_versions: Iterable[int]) -> dict:
    """max, mean and histogram ({versions behind: samples}) of trainer_version - v over the
    oldest token version v of each sample."""
    behind = [trainer_version - v for v in sample_versions]
    if not behind:
        return {"max": 0, "mean": 0.0, "hist": {}}
    return {"max": max(behind), "mean": round(sum(behind) / len(behind), 4),
            "hist": {str(k): n for k, n in sorted(Counter(behind).items())}}
